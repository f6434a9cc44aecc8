//! Built-in defaults of the settings (the kubelet's where it has one), named once here and used
//! by the settings table (`settings.rs`), the clap flags with a default, and the sections.
//!
//! Not here: the defaults that depend on other settings (the relist period under each PLEG mode
//! is chosen in `load.rs`). Upstream: `pkg/kubelet/apis/config/v1beta1/defaults.go`.

use std::time::Duration;

/// Default of `--grpc-socket`.
pub const GRPC_SOCKET: &str = "/run/swiftlet/swiftlet.sock";
/// Default of `--http-address` (the kubelet's healthzBindAddress:healthzPort).
pub const HTTP_ADDRESS: &str = "127.0.0.1:10248";
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
/// Upstream's `nodeStatusReportFrequency` when `nodeStatusUpdateFrequency` is not written.
pub const NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
pub const NODE_LEASE_DURATION_SECONDS: u32 = 40;
/// Upstream's `kubeAPIQPS` and `kubeAPIBurst` (since 1.27).
pub const KUBE_API_QPS: u32 = 50;
pub const KUBE_API_BURST: u32 = 100;
/// Upstream's `eventRecordQPS` and `eventBurst`.
pub const EVENT_RECORD_QPS: u32 = 50;
pub const EVENT_BURST: u32 = 100;
pub const PLEG_RELIST_PERIOD: Duration = Duration::from_secs(1);
/// The relist under the kernel-event PLEG: only a safety net (upstream's evented PLEG: 300 s).
pub const EBPF_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(300);
/// The relist under the Evented PLEG (upstream `eventedPlegRelistPeriod`).
pub const EVENTED_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(300);
pub const ROOT_DIR: &str = "/var/lib/swiftlet";
pub const EVICTION_MAX_POD_GRACE_PERIOD_SECS: i64 = 0;
pub const EVICTION_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// The eviction manager's safety-net check (upstream's fixed monitoring period).
pub const EVICTION_MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// Upstream's `KubeletPort`.
pub const PORT: u16 = 10250;
/// Upstream's `authentication.webhook.cacheTTL`.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// Upstream's `authorization.webhook.cacheAuthorizedTTL`.
pub const AUTHORIZED_TTL: Duration = Duration::from_secs(300);
/// Upstream's `authorization.webhook.cacheUnauthorizedTTL`.
pub const UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);
/// Upstream's default `cpuManagerReconcilePeriod`.
pub const CPU_MANAGER_RECONCILE_PERIOD: Duration = Duration::from_secs(10);
/// Upstream's default `podLogsDir`.
pub const POD_LOGS_DIR: &str = "/var/log/pods";
/// Upstream's `resolvConf` default.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
