//! Configuration: the command-line arguments (here), the KubeletConfiguration-style file
//! (`file.rs`), and the validated [`Config`] that `swiftlet run` builds from both (`load.rs`,
//! `fields.rs`, `eviction.rs`, `reserved.rs`, `error.rs`), with Go-syntax durations
//! (`duration.rs`). Each error names the flag or field and the bad value.
//!
//! Not here: what the components do with their settings. Upstream: `cmd/kubelet/app/options` and
//! `pkg/kubelet/apis/config`.

mod cpumanager;
mod duration;
mod error;
mod eviction;
mod fields;
mod file;
mod housekeeping;
mod load;
mod reserved;
mod security;
mod server;
mod types;

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

pub use cpumanager::{CpuApply, CpuManagerConfig, CpuManagerPolicy};
pub use duration::{DurationError, DurationErrorReason, GoDuration};
pub use error::{ConfigError, Origin};
pub use file::FileConfig;
pub use housekeeping::{GcConfig, LogsConfig};
pub use load::{Config, defaults};
pub use reserved::{Reserved, ReservedResources};
pub use security::SecurityConfig;
pub use server::{Authentication, Authorization, AuthorizationMode, ServerConfig, TlsVersion};
pub use types::{CgroupDriver, Cidr, PlegMode};

use crate::kernel::LoadOptions;

/// Default of `--grpc-socket`.
pub const DEFAULT_GRPC_SOCKET: &str = "/run/swiftlet/swiftlet.sock";
/// Default of `--http-address` (the kubelet's healthzBindAddress:healthzPort).
pub const DEFAULT_HTTP_ADDRESS: &str = "127.0.0.1:10248";

/// swiftlet: a Kubernetes node agent that learns what happens to containers from kernel events.
#[derive(Debug, Parser)]
#[command(name = "swiftlet", version, about, propagate_version = true)]
pub struct Args {
    /// Log filter, in `RUST_LOG` syntax (e.g. `info`, `swiftlet=debug`); RUST_LOG wins if set.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start; boxing `RunArgs` would only add noise at every use"
)]
pub enum Command {
    /// Run the node agent: load the kernel programs and serve the API and metrics.
    Run(RunArgs),
    /// Print kernel events (exits, execs, OOM kills, cgroup changes) as they happen.
    Events(EventsArgs),
}

/// Flags shared by every command that loads the kernel programs.
#[derive(Clone, Debug, PartialEq, Eq, ClapArgs)]
pub struct KernelArgs {
    /// Only events of this cgroup subtree (repeatable): a directory on the cgroup2 mount, or a
    /// path relative to it. Without any, the whole machine.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<PathBuf>,
    /// Size of the kernel's events ring buffer in bytes: a power-of-two multiple of the page size.
    #[arg(long, value_name = "BYTES", default_value_t = swiftlet_common::DEFAULT_RING_BYTES)]
    pub ring_buffer_bytes: u32,
}

impl KernelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            ring_bytes: self.ring_buffer_bytes,
            watch: self.cgroups.clone(),
            ..LoadOptions::default()
        }
    }
}

#[derive(Debug, ClapArgs)]
pub struct EventsArgs {
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit after this many events.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// Flags of `swiftlet run`. Those that also exist in the configuration file override it; see
/// [`Config::load`] for the merged, validated result.
#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// Unix socket of swiftlet's gRPC API (swiftlet.v1). Overrides `grpcSocket` unless left at
    /// its default.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_GRPC_SOCKET)]
    pub grpc_socket: PathBuf,
    /// Address of the HTTP endpoints /healthz and /metrics. Overrides `healthzBindAddress` and
    /// `healthzPort` unless left at its default.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_HTTP_ADDRESS)]
    pub http_address: SocketAddr,
    /// Configuration file (YAML, KubeletConfiguration field names); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of static pod manifests (`staticPodPath`).
    #[arg(long, value_name = "DIR", alias = "pod-manifest-path")]
    pub manifests: Option<PathBuf>,
    /// The CRI runtime's socket (`containerRuntimeEndpoint`), e.g.
    /// unix:///run/containerd/containerd.sock.
    #[arg(long, value_name = "ENDPOINT", alias = "container-runtime-endpoint")]
    pub runtime_endpoint: Option<String>,
    /// This node's name (`nodeName`); defaults to the hostname, lowercased.
    #[arg(long, value_name = "NAME", visible_alias = "hostname-override")]
    pub node_name: Option<String>,
    /// How container changes are detected (`pleg`).
    #[arg(long, value_enum, value_name = "MODE")]
    pub pleg: Option<PlegMode>,
    /// Period of the runtime relist (`plegRelistPeriod`), e.g. 1s.
    #[arg(long, value_name = "DURATION")]
    pub pleg_relist_period: Option<GoDuration>,
    /// Period of the full pod resync (`syncFrequency`), e.g. 1m.
    #[arg(long, value_name = "DURATION")]
    pub sync_frequency: Option<GoDuration>,
    /// Most pods this node runs (`maxPods`).
    #[arg(long, value_name = "N")]
    pub max_pods: Option<u32>,
    /// Port of the unauthenticated read-only endpoint (`readOnlyPort`); 0 disables it.
    #[arg(long, value_name = "PORT")]
    pub read_only_port: Option<u16>,
    /// Bind address of the read-only endpoint (`readOnlyAddress`, default 127.0.0.1). Only this,
    /// or `--address` together with an explicit `--read-only-port`, puts the unauthenticated port
    /// beyond loopback.
    #[arg(long, value_name = "IP")]
    pub read_only_address: Option<IpAddr>,
    /// Bind address of the kubelet server (`address`, default 0.0.0.0); also of the read-only
    /// endpoint when its port is given explicitly.
    #[arg(long, value_name = "IP")]
    pub address: Option<IpAddr>,
    /// Port of the kubelet server, TLS and authenticated (`port`, default 10250); 0 disables it.
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// The kubelet server's certificate (`tlsCertFile`), PEM, with its chain.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The kubelet server's private key (`tlsPrivateKeyFile`), PEM.
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Lowest TLS version of the kubelet server (`tlsMinVersion`): VersionTLS12 or VersionTLS13.
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,
    /// TLS 1.2 cipher suites of the kubelet server (`tlsCipherSuites`), comma-separated Go names,
    /// e.g. `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`.
    #[arg(long, value_name = "LIST")]
    pub tls_cipher_suites: Vec<String>,
    /// Where a self-signed certificate is kept when no --tls-cert-file is given (default
    /// `<root-dir>/pki`).
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Serve exec, attach, port-forward, run and container logs on the kubelet server
    /// (`enableDebuggingHandlers`, default true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_debugging_handlers: Option<bool>,
    /// CA bundle of the client certificates the kubelet server accepts
    /// (`authentication.x509.clientCAFile`): CN is the user, O the groups.
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Let requests without credentials in as `system:anonymous`
    /// (`authentication.anonymous.enabled`, default false).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// Check bearer tokens with a TokenReview (`authentication.webhook.enabled`; default: on with
    /// --kubeconfig).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub authentication_token_webhook: Option<bool>,
    /// How long TokenReview answers are kept (`authentication.webhook.cacheTTL`, default 2m).
    #[arg(long, value_name = "DURATION")]
    pub authentication_token_webhook_cache_ttl: Option<GoDuration>,
    /// `AlwaysAllow` or `Webhook` (SubjectAccessReview) (`authorization.mode`; default: Webhook
    /// with --kubeconfig, else AlwaysAllow).
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,
    /// swiftlet's state directory (`rootDir`).
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// The agent's own oom_score_adj (`oomScoreAdj`, -1000 to 1000, default -999); lowering it
    /// needs CAP_SYS_RESOURCE.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,
    /// kubeconfig of the API server; without it swiftlet runs standalone.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Hard eviction thresholds (`evictionHard`), comma-separated, e.g.
    /// `memory.available<100Mi,nodefs.available<10%` or swiftlet's
    /// `memory.pressure.some.avg10>40`. Repeatable; replaces the file's.
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_hard: Vec<String>,
    /// Soft eviction thresholds (`evictionSoft`), as `--eviction-hard`; each needs a grace period.
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_soft: Vec<String>,
    /// Grace periods of the soft thresholds (`evictionSoftGracePeriod`), e.g.
    /// `memory.available=1m30s`.
    #[arg(long, value_name = "SIGNAL=DURATION,...")]
    pub eviction_soft_grace_period: Vec<String>,
    /// Minimum reclaims (`evictionMinimumReclaim`), e.g.
    /// `memory.available=0Mi,nodefs.available=500Mi`.
    #[arg(long, value_name = "SIGNAL=VALUE,...")]
    pub eviction_minimum_reclaim: Vec<String>,
    /// Most grace a soft eviction grants a pod, in seconds (`evictionMaxPodGracePeriod`).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i32>,
    /// How long a pressure condition outlives its threshold (`evictionPressureTransitionPeriod`).
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<GoDuration>,
    /// Resources reserved for Kubernetes daemons (`kubeReserved`), e.g. `cpu=100m,memory=1Gi`.
    #[arg(long, value_name = "RESOURCE=QUANTITY,...")]
    pub kube_reserved: Vec<String>,
    /// Resources reserved for the OS (`systemReserved`), as `--kube-reserved`.
    #[arg(long, value_name = "RESOURCE=QUANTITY,...")]
    pub system_reserved: Vec<String>,
    /// What node allocatable is enforced on (`enforceNodeAllocatable`): `pods` or `none`.
    #[arg(long, value_name = "LIST")]
    pub enforce_node_allocatable: Vec<String>,
    /// Period of the eviction manager's safety-net check (`evictionMonitoringPeriod`).
    #[arg(long, value_name = "DURATION")]
    pub eviction_monitoring_period: Option<GoDuration>,
    /// Kernel signals that wake the eviction manager between checks (`evictionWakeups`): any of
    /// `psi`, `kernel`, `memcg`; empty or `none` for the periodic check alone.
    #[arg(long, value_name = "LIST")]
    pub eviction_wakeups: Vec<String>,
    /// CPU manager policy (`cpuManagerPolicy`): `none` or `static` (exclusive CPUs for
    /// Guaranteed containers with whole CPUs).
    #[arg(long, value_name = "POLICY")]
    pub cpu_manager_policy: Option<String>,
    /// Options of the static policy (`cpuManagerPolicyOptions`), e.g. `full-pcpus-only=true`,
    /// `distribute-cpus-across-numa=true`.
    #[arg(long, value_name = "OPTION=BOOL,...")]
    pub cpu_manager_policy_options: Vec<String>,
    /// CPUs kept for the system and Kubernetes daemons (`reservedSystemCPUs`), e.g. `0` or
    /// `0-1,4`; replaces the cpu of `--kube-reserved`/`--system-reserved`.
    #[arg(long, value_name = "CPULIST")]
    pub reserved_cpus: Option<String>,
    /// Period of the CPU manager's safety-net reconcile (`cpuManagerReconcilePeriod`).
    #[arg(long, value_name = "DURATION")]
    pub cpu_manager_reconcile_period: Option<GoDuration>,
    /// When CPU assignments reach containers (`cpuManagerApply`): `events` (at once) or
    /// `reconcile` (only every reconcile period, as the kubelet).
    #[arg(long, value_name = "MODE")]
    pub cpu_manager_apply: Option<String>,
    /// Move a corrupt or other-policy CPU manager checkpoint aside and start with fresh
    /// assignments, instead of refusing to start. Drain the node first: running containers'
    /// exclusive CPUs are forgotten.
    #[arg(long)]
    pub cpu_manager_reset_state: bool,
    /// Size at which a container's log is rotated (`containerLogMaxSize`), a quantity such as
    /// `10Mi`; negative disables rotation.
    #[arg(long, value_name = "QUANTITY", allow_negative_numbers = true)]
    pub container_log_max_size: Option<String>,
    /// Most log files kept per container, the current one included (`containerLogMaxFiles`);
    /// at least 2.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub container_log_max_files: Option<i32>,
    /// Where pods' container logs go (`podLogsDir`), e.g. /var/log/pods. Garbage collection
    /// removes the directories there of pods this agent does not run: agents sharing a machine
    /// need one each.
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,
    /// Dead containers younger than this are not collected (`minimumContainerTTLDuration`).
    #[arg(long, value_name = "DURATION")]
    pub minimum_container_ttl_duration: Option<GoDuration>,
    /// Dead instances kept per container of a pod; negative for no limit
    /// (`maximumDeadContainersPerContainer`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i32>,
    /// Dead containers kept on the node; negative for no limit (`maximumDeadContainers`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i32>,
    /// Image filesystem usage (percent) at which unused images are removed
    /// (`imageGCHighThresholdPercent`); 100 disables image GC.
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i32>,
    /// Usage (percent) image GC frees down to (`imageGCLowThresholdPercent`).
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i32>,
    /// Images first seen less than this ago are not collected (`imageMinimumGCAge`).
    #[arg(long, value_name = "DURATION")]
    pub minimum_image_ttl_duration: Option<GoDuration>,
    /// Give containers that ask for no seccomp profile the runtime's default (`seccompDefault`,
    /// default false: none, as upstream).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub seccomp_default: Option<bool>,
    /// Unsafe sysctls pods may set beyond the safe set (`allowedUnsafeSysctls`), comma-separated
    /// names or `prefix*` patterns of namespaced sysctls, e.g. `kernel.msg*,net.core.somaxconn`.
    /// Repeatable; replaces the file's.
    #[arg(long, value_name = "LIST")]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The runtime's sandbox image, which image GC never removes (default
    /// `registry.k8s.io/pause:3.10`; empty for none). The runtime's own setting decides which
    /// image sandboxes use.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_flags() {
        let args = Args::try_parse_from([
            "swiftlet", "events", "--json", "--cgroup", "/a", "--cgroup", "b", "--count", "3",
        ])
        .expect("parses");
        let Command::Events(events) = args.command else {
            panic!("not events")
        };
        assert!(events.json);
        assert_eq!(events.count, Some(3));
        assert_eq!(
            events.kernel.cgroups,
            vec![PathBuf::from("/a"), PathBuf::from("b")]
        );
        assert_eq!(events.kernel.load_options().watch.len(), 2);
    }

    #[test]
    fn rejects_a_bad_address_naming_the_flag() {
        let err = Args::try_parse_from(["swiftlet", "run", "--http-address", "nope"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--http-address"), "{err}");
    }
}
