//! The validated [`Config`] of `swiftlet run`: built once at start from the built-in defaults, the
//! configuration file (`--config`) and the flags, in that order of increasing precedence, and
//! rejected with the field's name, where it came from and the bad value when anything is wrong.
//!
//! Not here: the clap flags (`mod.rs`) and the file's syntax (`file.rs`). Upstream:
//! `cmd/kubelet/app/server.go` (`loadConfigFile`, flags over file), `pkg/kubelet/apis/config/
//! v1beta1/defaults.go` (defaults) and `validation/validation.go`.
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
//! - A zero duration or `maxPods: 0` is an error instead of silently meaning "default" (a Go
//!   zero-value artefact upstream).
//! - `fileCheckFrequency` is only the static pods' safety-net rescan: inotify drives changes.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    DEFAULT_GRPC_SOCKET, KernelArgs, RunArgs,
    cpumanager::{self, CpuManagerConfig},
    error::{ConfigError, Origin, invalid},
    eviction,
    fields::{Resolver, is_dns1123_subdomain, runtime_endpoint, system_hostname},
    file::FileConfig,
    housekeeping::{self, GcConfig, LogsConfig},
    reserved::{self, Reserved},
    security::{self, SecurityConfig},
    server::{self, ServerConfig},
    types::{CgroupDriver, Cidr, PlegMode},
};
use crate::eviction::thresholds::EvictionConfig;

/// Everything `swiftlet run` is configured with, defaults applied and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The configuration file it was read from, if any.
    pub file: Option<PathBuf>,
    /// This node's name: `--node-name`/`nodeName`/`hostnameOverride`, else the hostname; always
    /// lowercase.
    pub node_name: String,
    /// Directory of static pod manifests (`staticPodPath`); `None` disables the file source.
    pub static_pod_path: Option<PathBuf>,
    pub sync_frequency: Duration,
    pub file_check_frequency: Duration,
    pub max_pods: u32,
    /// Per-pod PID limit; `-1` means no pod-level limit.
    pub pod_pids_limit: i64,
    pub runtime_request_timeout: Duration,
    /// The CRI socket as `unix:///path`.
    pub container_runtime_endpoint: String,
    /// The unauthenticated read-only HTTP endpoint; `None` when `readOnlyPort` is 0. Loopback
    /// unless `readOnlyAddress` (or `address` with an explicit `readOnlyPort`) says otherwise.
    pub read_only_address: Option<SocketAddr>,
    /// `/healthz` only; `None` when `healthzPort` is 0.
    pub healthz_address: Option<SocketAddr>,
    /// The agent's own oom_score_adj (`oomScoreAdj`).
    pub oom_score_adj: i32,
    /// The cgroup (absolute, in the cgroup hierarchy) under which pod cgroups are made.
    pub cgroup_root: PathBuf,
    pub cgroups_per_qos: bool,
    pub cgroup_driver: CgroupDriver,
    pub pod_cidr: Option<Cidr>,
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: Option<String>,
    pub node_status_update_frequency: Duration,
    pub node_lease_duration_seconds: u32,
    pub pleg: PlegMode,
    /// Whether `pleg` was asked for (flag or file) rather than defaulted: an asked-for `ebpf`
    /// that cannot load stops the agent; a defaulted one falls back to `relist`.
    pub pleg_explicit: bool,
    /// The relist period: the relist PLEG's period, or the kernel-event PLEG's safety net.
    pub pleg_relist_period: Duration,
    /// swiftlet's state directory (the kubelet's `--root-dir`).
    pub root_dir: PathBuf,
    pub grpc_socket: PathBuf,
    /// The API server's kubeconfig; `None` runs standalone (static pods only).
    pub kubeconfig: Option<PathBuf>,
    /// Kernel program options (flags only).
    pub kernel: KernelArgs,
    /// Thresholds and the eviction manager's periods (`eviction.rs`).
    pub eviction: EvictionConfig,
    /// `kubeReserved`, `systemReserved`, `enforceNodeAllocatable` (`reserved.rs`); the CPU of
    /// `reservedSystemCPUs` replaces theirs.
    pub reserved: Reserved,
    /// `cpuManagerPolicy` and its settings (`cpumanager.rs`).
    pub cpu_manager: CpuManagerConfig,
    /// The kubelet server: address, TLS, authentication, authorization (`server.rs`).
    pub server: ServerConfig,
    /// Container log rotation and `podLogsDir` (`housekeeping.rs`).
    pub logs: LogsConfig,
    /// Container and image garbage collection (`housekeeping.rs`).
    pub gc: GcConfig,
    /// `seccompDefault` and `allowedUnsafeSysctls` (`security.rs`).
    pub security: SecurityConfig,
}

/// Built-in defaults (the kubelet's where it has one).
pub mod defaults {
    use std::time::Duration;

    pub const SYNC_FREQUENCY: Duration = Duration::from_secs(60);
    pub const FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
    pub const MAX_PODS: u32 = 110;
    pub const POD_PIDS_LIMIT: i64 = -1;
    pub const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
    pub const CONTAINER_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
    pub const READ_ONLY_PORT: u16 = 10255;
    pub const HEALTHZ_PORT: u16 = 10248;
    /// The agent's own oom_score_adj (upstream `qos.KubeletOOMScoreAdj`).
    pub const OOM_SCORE_ADJ: i32 = -999;
    pub const CGROUP_ROOT: &str = "/";
    pub const NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
    pub const NODE_LEASE_DURATION_SECONDS: u32 = 40;
    pub const PLEG_RELIST_PERIOD: Duration = Duration::from_secs(1);
    /// The relist under the kernel-event PLEG: only a safety net (upstream's evented PLEG: 300 s).
    pub const EBPF_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(300);
    pub const ROOT_DIR: &str = "/var/lib/swiftlet";
    pub const EVICTION_MAX_POD_GRACE_PERIOD_SECS: i64 = 0;
    pub const EVICTION_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
    /// The eviction manager's safety-net check (upstream's fixed monitoring period).
    pub const EVICTION_MONITORING_PERIOD: Duration = Duration::from_secs(10);
}

impl Config {
    /// Reads `--config` (if given), applies defaults and the flags, and validates the result.
    pub fn load(args: &RunArgs) -> Result<Config, ConfigError> {
        Self::load_with(args, &system_hostname)
    }

    /// [`Config::load`] with the hostname lookup injected (tests run without touching the host).
    pub fn load_with(
        args: &RunArgs,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let mut file = FileConfig::read(path)?;
                if let Some(dir) = path.parent() {
                    file.resolve_relative_paths(dir);
                }
                Some((path.as_path(), file))
            }
            None => None,
        };
        match file {
            Some((path, file)) => {
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
        let r = Resolver { file: &file_origin };
        r.check_header(file)?;

        let sync_frequency = r.duration(
            "syncFrequency",
            (args.sync_frequency, "--sync-frequency"),
            &file.sync_frequency,
            defaults::SYNC_FREQUENCY,
        )?;
        let file_check_frequency = r.duration(
            "fileCheckFrequency",
            (None, ""),
            &file.file_check_frequency,
            defaults::FILE_CHECK_FREQUENCY,
        )?;
        let runtime_request_timeout = r.duration(
            "runtimeRequestTimeout",
            (None, ""),
            &file.runtime_request_timeout,
            defaults::RUNTIME_REQUEST_TIMEOUT,
        )?;
        let node_status_update_frequency = r.duration(
            "nodeStatusUpdateFrequency",
            (None, ""),
            &file.node_status_update_frequency,
            defaults::NODE_STATUS_UPDATE_FREQUENCY,
        )?;

        let max_pods = match (args.max_pods, file.max_pods) {
            (Some(n), _) => r.max_pods(&Origin::Flag("--max-pods"), i64::from(n))?,
            (None, Some(n)) => r.max_pods(r.file, n)?,
            (None, None) => defaults::MAX_PODS,
        };
        // Any negative limit means "none", as upstream defaults it.
        let pod_pids_limit = file
            .pod_pids_limit
            .map_or(defaults::POD_PIDS_LIMIT, |n| n.max(-1));
        let node_lease_duration_seconds = match file.node_lease_duration_seconds {
            None => defaults::NODE_LEASE_DURATION_SECONDS,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=i32::MAX as u32).contains(n))
                .ok_or_else(|| {
                    invalid(
                        r.file,
                        "nodeLeaseDurationSeconds",
                        "value",
                        n,
                        "must be at least 1",
                    )
                })?,
        };

        let container_runtime_endpoint =
            match (&args.runtime_endpoint, &file.container_runtime_endpoint) {
                (Some(e), _) => runtime_endpoint(&Origin::Flag("--runtime-endpoint"), e)?,
                (None, Some(e)) => runtime_endpoint(r.file, e)?,
                (None, None) => defaults::CONTAINER_RUNTIME_ENDPOINT.to_owned(),
            };

        let read_only_address = r.read_only_address(args, file)?;
        let healthz_address = r.healthz_address(args, file)?;
        let oom_score_adj = r.oom_score_adj(args, file)?;

        let cgroup_root =
            PathBuf::from(file.cgroup_root.as_deref().unwrap_or(defaults::CGROUP_ROOT));
        if !cgroup_root.is_absolute() {
            return Err(invalid(
                r.file,
                "cgroupRoot",
                "cgroup",
                cgroup_root.display(),
                "must be absolute in the cgroup hierarchy, e.g. / or /kubepods",
            ));
        }
        let cgroup_driver = match file.cgroup_driver.as_deref() {
            None | Some("cgroupfs") => CgroupDriver::Cgroupfs,
            Some(other @ "systemd") => {
                return Err(invalid(
                    r.file,
                    "cgroupDriver",
                    "value",
                    other,
                    "not supported yet: only \"cgroupfs\" is",
                ));
            }
            Some(other) => {
                return Err(invalid(
                    r.file,
                    "cgroupDriver",
                    "value",
                    other,
                    "expected \"cgroupfs\"",
                ));
            }
        };
        let pod_cidr = match &file.pod_cidr {
            None => None,
            Some(s) if s.is_empty() => None,
            Some(s) => Some(
                s.parse::<Cidr>()
                    .map_err(|why| invalid(r.file, "podCIDR", "CIDR", s, why))?,
            ),
        };
        let cluster_dns = file
            .cluster_dns
            .iter()
            .flatten()
            .map(|s| {
                s.parse::<IpAddr>().map_err(|_| {
                    invalid(
                        r.file,
                        "clusterDNS",
                        "IP address",
                        s,
                        "expected e.g. 10.96.0.10",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster_domain = match &file.cluster_domain {
            None => None,
            Some(d) if d.is_empty() => None,
            Some(d) if is_dns1123_subdomain(d.trim_end_matches('.')) => Some(d.clone()),
            Some(d) => {
                return Err(invalid(
                    r.file,
                    "clusterDomain",
                    "domain",
                    d,
                    "must be a lowercase DNS name, e.g. cluster.local",
                ));
            }
        };

        let pleg = match (args.pleg, &file.pleg) {
            (Some(mode), _) => mode,
            (None, Some(s)) => s.parse::<PlegMode>().map_err(|()| {
                invalid(
                    r.file,
                    "pleg",
                    "value",
                    s,
                    "expected \"relist\" or \"ebpf\"",
                )
            })?,
            (None, None) => PlegMode::default(),
        };
        let pleg_explicit = args.pleg.is_some() || file.pleg.is_some();
        let pleg_relist_period = r.duration(
            "plegRelistPeriod",
            (args.pleg_relist_period, "--pleg-relist-period"),
            &file.pleg_relist_period,
            match pleg {
                PlegMode::Relist => defaults::PLEG_RELIST_PERIOD,
                PlegMode::Ebpf => defaults::EBPF_PLEG_RELIST_PERIOD,
            },
        )?;

        let static_pod_path = args
            .manifests
            .clone()
            .or_else(|| file.static_pod_path.clone())
            .filter(|p| !p.as_os_str().is_empty());
        let root_dir = args
            .root_dir
            .clone()
            .or_else(|| file.root_dir.clone())
            .unwrap_or_else(|| PathBuf::from(defaults::ROOT_DIR));
        if root_dir.as_os_str().is_empty() {
            return Err(invalid(r.file, "rootDir", "path", "", "must not be empty"));
        }
        // The flag has a clap default; a value equal to it counts as "not given" so the file wins.
        let grpc_socket = match &file.grpc_socket {
            Some(p) if args.grpc_socket == Path::new(DEFAULT_GRPC_SOCKET) => p.clone(),
            _ => args.grpc_socket.clone(),
        };

        let node_name = r.node_name(args, file, hostname)?;
        let cgroups_per_qos = file.cgroups_per_qos.unwrap_or(true);
        let mut reserved = reserved::resolve(&r, args, file, cgroups_per_qos)?;
        let cpu_manager = cpumanager::resolve(&r, args, file)?;
        if let Some(cpus) = &cpu_manager.reserved_system_cpus {
            // As upstream: the reserved CPUs overwrite the cpu of both reservations, so that
            // node allocatable and the static policy agree on what pods may use.
            reserved.kube.cpu_millis = 0;
            reserved.system.cpu_millis = i64::try_from(cpus.len()).unwrap_or(i64::MAX) * 1000;
        }
        let eviction = eviction::resolve(&r, args, file, reserved.enforce_pods)?;
        let server = server::resolve(&r, args, file, &root_dir)?;
        let (logs, gc) = housekeeping::resolve(&r, args, file)?;
        let security = security::resolve(&r, args, file)?;

        Ok(Config {
            file: match file_origin {
                Origin::File(ref p) => Some(p.clone()),
                _ => None,
            },
            node_name,
            static_pod_path,
            sync_frequency,
            file_check_frequency,
            max_pods,
            pod_pids_limit,
            runtime_request_timeout,
            container_runtime_endpoint,
            read_only_address,
            healthz_address,
            oom_score_adj,
            cgroup_root,
            cgroups_per_qos,
            cgroup_driver,
            pod_cidr,
            cluster_dns,
            cluster_domain,
            node_status_update_frequency,
            node_lease_duration_seconds,
            pleg,
            pleg_explicit,
            pleg_relist_period,
            root_dir,
            grpc_socket,
            kubeconfig: args.kubeconfig.clone(),
            kernel: args.kernel.clone(),
            eviction,
            reserved,
            cpu_manager,
            server,
            logs,
            gc,
            security,
        })
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
