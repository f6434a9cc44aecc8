//! The validated [`Config`] of `swiftlet run`: built once at start from the built-in defaults, the
//! configuration file (`--config`) and the flags, in that order of increasing precedence, and
//! rejected with the field's name, where it came from and the bad value when anything is wrong.
//! The settings table (`settings.rs`) resolves and checks each setting; this file reads the file,
//! has the sections check what spans settings, and assembles `Config`: the table's `config`
//! settings as they are, plus the fields assembled here (listed in `with_settings!(config ...)`).
//!
//! Not here: the flags and file keys (`settings.rs`). Upstream: `cmd/kubelet/app/server.go`
//! (`loadConfigFile`, flags over file), `pkg/kubelet/apis/config/v1beta1/defaults.go` (defaults)
//! and `validation/validation.go`.
//!
//! Deliberate differences from the kubelet, each for a reason:
//! - The read-only port binds `127.0.0.1`, not `address`: it is unauthenticated, so exposing it
//!   is an explicit choice, made by naming it: swiftlet's `readOnlyAddress`
//!   (`--read-only-address`), or `address` together with an explicit `readOnlyPort` (the
//!   kubelet's binding, when the user asked for both). The agent warns when it is not loopback.
//! - `readOnlyPort` defaults to 10255 (the kubelet's historical flag default; `0` disables it).
//! - `address` binds the full server (default `0.0.0.0`, as upstream).
//! - `authentication.anonymous.enabled` with `authorization.mode: AlwaysAllow` is turned off with
//!   a warning, as the kube-apiserver does (`AnonymousAuth is not allowed with the AllowAll
//!   authorizer`): it would let anyone who reaches the port run commands in every container. The
//!   kubelet keeps the pair only as its legacy command-line default; swiftlet's default is
//!   anonymous off, so it has no such compatibility to keep.
//! - A zero duration or `maxPods: 0` on the command line is an error; in the file it means the
//!   default where upstream's defaulting says so (`zero.rs`), as kubeadm's `0s` values expect.
//! - `port: 0` in the file is upstream's 10250 (`enableServer: false` turns the server off);
//!   `--port 0` turns it off.
//! - Upstream fields swiftlet does not act on are accepted and warned about once at start
//!   ([`Config::warn_no_effect`], `no_effect.rs`); a key upstream does not define is an error
//!   naming it. Upstream's v1beta1 loader falls back to lenient decoding with one warning
//!   (`DecodeKubeletConfiguration`); swiftlet keeps the strict decoding, so a misspelt key is not
//!   silently dropped.
//! - An unknown feature gate is a warning, not upstream's `unrecognized feature gate` error
//!   (`feature_gates.rs`).
//! - `fileCheckFrequency` is only the static pods' safety-net rescan: inotify drives changes.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    cfs,
    cpumanager::{self, CpuManagerConfig},
    defaults,
    error::{ConfigError, Origin, invalid},
    eviction,
    feature_gates::{self, FeatureGates},
    file,
    housekeeping::{self, GcConfig, LogsConfig},
    image_pulls,
    input::{self, Given, HOSTNAME_FILE, Input, is_dns1123_subdomain, system_hostname},
    kernel::KernelArgs,
    logging::{self, LoggingConfig},
    no_effect::{self, NoEffect},
    qos_reserved,
    reserved::{self, Reserved},
    security::{self, SecurityConfig},
    server::{self, ServerConfig},
    settings::{FileConfig, RunArgs, Settings, with_settings},
    shutdown,
    types::{CgroupDriver, ChangeDetectionStrategy, Cidr, PlegMode},
    zero,
};
use k8s_openapi::api::core::v1::Taint;

use crate::eviction::thresholds::EvictionConfig;

/// Generates [`Config`] from the table: a field for each `config` setting, then the fields
/// assembled in [`Config::resolve`] (given as the generator's own tokens).
macro_rules! config {
    ({ $($assembled:tt)* } $($table:tt)*) => {
        // The name the accumulated field moves and the function share (hygiene).
        config!(@munch [settings] { $($assembled)* } [] [] $($table)*);
    };
    (@munch [$s:ident] {
        $( $(#[doc = $adoc:literal])* $aname:ident: $aty:ty, )*
    } [$($fields:tt)*] [$($moves:tt)*]) => {
        /// Everything `swiftlet run` is configured with, defaults applied and validated.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            $($fields)*
            $( $(#[doc = $adoc])* pub $aname: $aty, )*
        }

        /// The fields of [`Config`] that are not one setting each.
        struct Assembled {
            $( $aname: $aty, )*
        }

        impl Config {
            fn assemble($s: Settings, assembled: Assembled) -> Config {
                Config {
                    $($moves)*
                    $( $aname: assembled.$aname, )*
                }
            }
        }
    };
    (@munch [$s:ident] $assembled:tt [$($fields:tt)*] [$($moves:tt)*]
        $(#[doc = $doc:literal])*
        config $name:ident : [$($out:tt)*] = $field:literal
        $(, flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?)?
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        => $resolve:expr $(, default $default:expr)?;
        $($rest:tt)*
    ) => {
        config!(@munch [$s] $assembled
            [$($fields)* $(#[doc = $doc])* pub $name: $($out)*,]
            [$($moves)* $name: $s.$name,]
            $($rest)*);
    };
    (@munch [$s:ident] $assembled:tt [$($fields:tt)*] [$($moves:tt)*]
        $(#[doc = $doc:literal])*
        $dest:ident $name:ident $(: [$($out:tt)*])? = $field:literal
        $(, flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?)?
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        $(=> $resolve:expr $(, default $default:expr)?)?;
        $($rest:tt)*
    ) => {
        config!(@munch [$s] $assembled [$($fields)*] [$($moves)*] $($rest)*);
    };
}

with_settings!(config {
    /// The configuration file it was read from, if any.
    file: Option<PathBuf>,
    /// This node's name: `--node-name`/`nodeName`/`hostnameOverride`, else the hostname; always
    /// lowercase.
    node_name: String,
    /// The unauthenticated read-only HTTP endpoint; `None` when `readOnlyPort` is 0. Loopback
    /// unless `readOnlyAddress` (or `address` with an explicit `readOnlyPort`) says otherwise.
    read_only_address: Option<SocketAddr>,
    /// `/healthz` only; `None` when `healthzPort` is 0.
    healthz_address: Option<SocketAddr>,
    pleg: PlegMode,
    /// Whether `pleg` was asked for (flag or file) rather than defaulted: an asked-for `ebpf`
    /// that cannot load stops the agent; a defaulted one falls back to `relist`.
    pleg_explicit: bool,
    /// The relist period: the relist PLEG's period, or the kernel-event PLEG's safety net.
    pleg_relist_period: Duration,
    /// Kernel program options (flags only).
    kernel: KernelArgs,
    /// Thresholds and the eviction manager's periods (`eviction.rs`).
    eviction: EvictionConfig,
    /// `kubeReserved`, `systemReserved`, `enforceNodeAllocatable` (`reserved.rs`); the CPU of
    /// `reservedSystemCPUs` replaces theirs.
    reserved: Reserved,
    /// `cpuManagerPolicy` and its settings (`cpumanager.rs`).
    cpu_manager: CpuManagerConfig,
    /// The kubelet server: address, TLS, authentication, authorization (`server.rs`).
    server: ServerConfig,
    /// Container log rotation and `podLogsDir` (`housekeeping.rs`).
    logs: LogsConfig,
    /// Container and image garbage collection (`housekeeping.rs`).
    gc: GcConfig,
    /// `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS`, `registryBurst`
    /// (`image_pulls.rs`).
    image_pulls: crate::kuberuntime::image_pulls::PullLimits,
    /// `seccompDefault` and `allowedUnsafeSysctls` (`security.rs`).
    security: SecurityConfig,
    /// `nodeStatusReportFrequency`: how often an unchanged node status is still sent.
    node_status_report_frequency: Duration,
    /// Graceful node shutdown's priority rows (`shutdown.rs`); none: shut down at once.
    shutdown: crate::nodeshutdown::ShutdownConfig,
    /// `cpuCFSQuota` and `cpuCFSQuotaPeriod` (`cfs.rs`).
    cfs_quota: crate::cm::helpers::CfsQuota,
    /// `qosReserved`'s memory percentage, with its gate on (`qos_reserved.rs`).
    qos_reserved_memory: Option<i64>,
    /// `featureGates` over upstream's defaults (`feature_gates.rs`).
    feature_gates: FeatureGates,
    /// The file's `logging` block; the global flags win over it (`logging.rs`).
    logging: LoggingConfig,
    /// The effective configuration as `/configz` serves it (`configz.rs`).
    configz: serde_json::Value,
    /// Upstream fields (and feature gates, and parts of `logging`) the file sets to values
    /// swiftlet does not act on, each once: [`Config::warn_no_effect`] reports them.
    no_effect: Vec<NoEffect>,
});

impl Config {
    /// Where the pods' cgroups are, from `cgroupDriver`, `cgroupRoot` and `cgroupsPerQOS`.
    pub fn pod_cgroups(&self) -> crate::cgroup::PodCgroupLayout {
        crate::cgroup::PodCgroupLayout::for_driver(
            self.cgroup_driver,
            &self.cgroup_root,
            self.cgroups_per_qos,
        )
    }

    /// Reads `--config` (if given), applies defaults and the flags, and validates the result.
    pub fn load(args: &RunArgs) -> Result<Config, ConfigError> {
        Self::load_with(args, &system_hostname)
    }

    /// [`Config::load`] with the hostname lookup injected (tests run without touching the host).
    pub fn load_with(
        args: &RunArgs,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Config, ConfigError> {
        match &args.config {
            Some(path) => {
                let mut file = FileConfig::read(path)?;
                if let Some(dir) = path.parent() {
                    file.resolve_relative_paths(dir);
                }
                zero::clear_zero_values(&mut file);
                Self::resolve(&file, Origin::File(path.to_owned()), args, hostname)
            }
            None => Self::resolve(&FileConfig::default(), Origin::Default, args, hostname),
        }
    }

    /// Merges one parsed file (or an empty one) with the flags.
    pub fn resolve(
        file: &FileConfig,
        file_origin: Origin,
        args: &RunArgs,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Config, ConfigError> {
        check_header(file, &file_origin)?;
        let settings = Settings::resolve(args, file, &file_origin)?;

        let node_name = node_name(file, &settings, &file_origin, hostname)?;
        let pleg = settings.pleg.unwrap_or_default();
        let pleg_relist_period = settings.pleg_relist_period.unwrap_or(match pleg {
            PlegMode::Relist => defaults::PLEG_RELIST_PERIOD,
            PlegMode::Ebpf => defaults::EBPF_PLEG_RELIST_PERIOD,
            PlegMode::Evented => defaults::EVENTED_PLEG_RELIST_PERIOD,
        });
        let mut reserved = reserved::resolve(&settings)?;
        let cpu_manager = cpumanager::resolve(&settings)?;
        if let Some(cpus) = &cpu_manager.reserved_system_cpus {
            // Upstream refuses the pair: the reserved CPUs are a cpuset, not the reserved
            // cgroups' shares.
            for (field, name) in [
                ("systemReservedCgroup", &settings.system_reserved_cgroup),
                ("kubeReservedCgroup", &settings.kube_reserved_cgroup),
            ] {
                if let Some(name) = name {
                    return Err(invalid(
                        &name.origin,
                        field,
                        "cgroup",
                        &name.value,
                        "cannot be used with reservedSystemCPUs (--reserved-cpus)",
                    ));
                }
            }
            // As upstream: the reserved CPUs overwrite the cpu of both reservations, so that
            // node allocatable and the static policy agree on what pods may use.
            reserved.kube.cpu_millis = 0;
            reserved.system.cpu_millis = i64::try_from(cpus.len()).unwrap_or(i64::MAX) * 1000;
        }
        let healthz_address = healthz_address(&settings, &file_origin)?;
        let (feature_gates, gates_without_effect) =
            feature_gates::resolve(file.feature_gates.as_ref(), &file_origin)?;
        let (logging, logging_without_effect) =
            logging::resolve(file.logging.as_ref(), &file_origin)?;
        let mut no_effect = no_effect::set_without_effect(file, &file_origin)?;
        no_effect.extend(gates_without_effect);
        no_effect.extend(logging_without_effect);
        let node_shutdown = shutdown::resolve(&settings, &feature_gates, &file_origin)?;
        let cfs_quota = cfs::resolve(&settings, &feature_gates, &file_origin)?;
        let (qos_reserved_memory, qos_reserved_unused) =
            qos_reserved::resolve(&settings, &feature_gates, &file_origin)?;
        no_effect.extend(qos_reserved_unused);
        let mut kubelet_config = settings.configz();
        // What the sections decided over the settings as written.
        kubelet_config.insert("nodeName".to_owned(), node_name.clone().into());
        if let Some(addr) = healthz_address {
            kubelet_config.insert(
                "healthzBindAddress".to_owned(),
                addr.ip().to_string().into(),
            );
            kubelet_config.insert("healthzPort".to_owned(), addr.port().into());
        }
        kubelet_config.insert(
            "featureGates".to_owned(),
            serde_json::to_value(feature_gates.explicit()).unwrap_or_default(),
        );
        let assembled = Assembled {
            configz: super::configz::document(kubelet_config),
            file: match file_origin {
                Origin::File(p) => Some(p),
                _ => None,
            },
            node_name,
            read_only_address: read_only_address(&settings),
            healthz_address,
            pleg,
            pleg_explicit: settings.pleg.is_some(),
            pleg_relist_period,
            kernel: args.kernel.clone(),
            eviction: eviction::resolve(&settings, reserved.enforce_pods)?,
            reserved,
            cpu_manager,
            server: server::resolve(&settings)?,
            logs: housekeeping::logs(&settings),
            gc: housekeeping::gc(&settings)?,
            image_pulls: image_pulls::resolve(&settings)?,
            security: security::resolve(&settings),
            node_status_report_frequency: node_status_report_frequency(file, &settings),
            shutdown: node_shutdown,
            cfs_quota,
            qos_reserved_memory,
            feature_gates,
            logging,
            no_effect,
        };
        Ok(Config::assemble(settings, assembled))
    }
}

impl Config {
    /// One warning per field the file sets without effect in swiftlet. Called once at start, after
    /// telemetry is set up, so the warnings come in the configured format.
    pub fn warn_no_effect(&self) {
        for NoEffect { field, why } in &self.no_effect {
            tracing::warn!(
                field = %field,
                "config field {field} has no effect in swiftlet: {why}"
            );
        }
    }
}

fn check_header(file: &FileConfig, origin: &Origin) -> Result<(), ConfigError> {
    if let Some(kind) = &file.kind
        && kind != file::KIND
    {
        return Err(invalid(
            origin,
            "kind",
            "value",
            kind,
            format!("expected {:?}", file::KIND),
        ));
    }
    if let Some(version) = &file.api_version
        && version != file::API_VERSION
    {
        return Err(invalid(
            origin,
            "apiVersion",
            "value",
            version,
            format!("expected {:?}", file::API_VERSION),
        ));
    }
    Ok(())
}

/// Upstream `nodeutil.GetHostname`: the override or the hostname, trimmed and lowercased.
fn node_name(
    file: &FileConfig,
    settings: &Settings,
    file_origin: &Origin,
    hostname: &dyn Fn() -> Result<String, ConfigError>,
) -> Result<String, ConfigError> {
    // The file's two names must agree even when the flag overrides both.
    if let (Some(a), Some(b)) = (&file.node_name, &file.hostname_override)
        && a.trim().to_lowercase() != b.trim().to_lowercase()
    {
        return Err(invalid(
            file_origin,
            "nodeName",
            "value",
            a,
            format!("conflicts with hostnameOverride {b:?}; set one of them"),
        ));
    }
    let Given { value: raw, origin } = match (&settings.node_name, &settings.hostname_override) {
        (Some(name), _) => name.clone(),
        (None, Some(name)) => Given {
            value: name.clone(),
            origin: file_origin.clone(),
        },
        (None, None) => Given {
            value: hostname()?,
            origin: Origin::Hostname(PathBuf::from(HOSTNAME_FILE)),
        },
    };
    let name = raw.trim().to_lowercase();
    if !is_dns1123_subdomain(&name) {
        return Err(invalid(
            &origin,
            "nodeName",
            "node name",
            raw,
            "must be a DNS subdomain (lowercase letters, digits, '-' and '.'), e.g. node-1",
        ));
    }
    Ok(name)
}

/// Upstream's default: `nodeStatusUpdateFrequency` when that was written (for backward
/// compatibility), else 5 minutes.
fn node_status_report_frequency(file: &FileConfig, settings: &Settings) -> Duration {
    settings.node_status_report_frequency.unwrap_or(
        if file.node_status_update_frequency.is_some() {
            settings.node_status_update_frequency
        } else {
            defaults::NODE_STATUS_REPORT_FREQUENCY
        },
    )
}

/// The read-only port's address: `readOnlyAddress` when given; else `address` when both it
/// and the port were given (the kubelet binds the port to `address`); else loopback. The
/// port is unauthenticated, so it leaves loopback only when the user names it.
fn read_only_address(settings: &Settings) -> Option<SocketAddr> {
    let port = settings.read_only_port.unwrap_or(defaults::READ_ONLY_PORT);
    let ip = settings
        .read_only_address
        .or(settings
            .address
            .filter(|_| settings.read_only_port.is_some()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    (port != 0).then_some(SocketAddr::new(ip, port))
}

/// `--http-address` when changed from its default; else `healthzBindAddress:healthzPort`, each
/// defaulting to the flag's default. The file's fields are checked only when they are used.
fn healthz_address(
    settings: &Settings,
    file_origin: &Origin,
) -> Result<Option<SocketAddr>, ConfigError> {
    if let Some(address) = settings.http_address {
        return Ok(Some(address));
    }
    let port = input::port(Input {
        field: "healthzPort",
        flag: None,
        file: settings.healthz_port.as_ref(),
        file_origin,
    })?
    .unwrap_or(defaults::HEALTHZ_PORT);
    let ip = input::ip(Input {
        field: "healthzBindAddress",
        flag: None,
        file: settings.healthz_bind_address.as_ref(),
        file_origin,
    })?
    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    Ok((port != 0).then_some(SocketAddr::new(ip, port)))
}

impl FileConfig {
    /// Reads and parses `path`. An empty file is an empty configuration (all defaults).
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
        // serde_yaml rejects a document with no content, which an operator means as "defaults".
        if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            return Ok(FileConfig::default());
        }
        serde_yaml_ng::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Relative paths in a file are relative to the file's directory, as the kubelet resolves them
    /// (`resolveRelativePaths`), so a file means the same from any working directory.
    pub fn resolve_relative_paths(&mut self, base: &Path) {
        let client_ca = self
            .authentication
            .as_mut()
            .and_then(|a| a.x509.as_mut())
            .map(|x| &mut x.client_ca_file);
        for path in [
            &mut self.static_pod_path,
            &mut self.root_dir,
            &mut self.grpc_socket,
            &mut self.tls_cert_file,
            &mut self.tls_private_key_file,
            &mut self.resolv_conf,
        ]
        .into_iter()
        .chain(client_ca)
        .flatten()
        {
            if path.is_relative() && !path.as_os_str().is_empty() {
                *path = base.join(&*path);
            }
        }
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "load_upstream_tests.rs"]
mod upstream_tests;
