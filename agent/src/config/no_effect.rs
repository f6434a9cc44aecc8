//! The upstream KubeletConfiguration fields swiftlet accepts but does not act on: one row each in
//! [`with_no_effect!`] (its file key, its upstream type, the values that ask for upstream's default
//! behaviour, and why swiftlet has no use for it). The rows become fields of the file form
//! ([`FileConfig`](super::FileConfig), typed as upstream types them, so a wrong type is still an
//! error naming the field) and the startup warnings of [`set_without_effect`].
//!
//! The rule for a warning: a field is reported when the file writes it with a value that, after
//! upstream's defaulting (`SetDefaults_KubeletConfiguration`, which turns most zero values into the
//! default), differs from upstream's default. Such a value asks for behaviour upstream would change
//! and swiftlet will not; writing the default (as kubeadm does with `0s` and `{}`) asks for nothing
//! and stays quiet. Each reported field is warned about once, at start.
//!
//! Not here: the fields swiftlet honours (`settings.rs`), `featureGates` (`feature_gates.rs`),
//! `logging` (`logging.rs`). Upstream: `staging/src/k8s.io/kubelet/config/v1beta1/types.go`
//! (fields) and `pkg/kubelet/apis/config/v1beta1/defaults.go` (defaults).

use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;

use super::{
    duration::{DurationError, GoDuration},
    error::{ConfigError, Origin, invalid},
    settings::FileConfig,
};

/// Passes the table of accepted-but-unused fields to `$generator` (after `$extra`): `settings.rs`
/// makes them fields of the file form; this file makes the warnings. A row reads
/// `name: [upstream type] = "fileKey" => |value| is upstream's default, "why no effect";`.
macro_rules! with_no_effect {
    ($generator:ident { $($extra:tt)* }) => {
        $generator! {
            { $($extra)* }
            enable_contention_profiling: [bool] = "enableContentionProfiling"
                => |v| !v, "swiftlet serves no profiling endpoints";
            http_check_frequency: [DurationText] = "httpCheckFrequency"
                => |d| zero_or(d, 20), "swiftlet has no HTTP pod source (staticPodURL)";
            static_pod_url: [String] = "staticPodURL"
                => |v| v.is_empty(), "swiftlet has no HTTP pod source; use staticPodPath";
            static_pod_url_header: [BTreeMap<String, Vec<String>>] = "staticPodURLHeader"
                => |v| v.is_empty(), "swiftlet has no HTTP pod source";
            tls_curve_preferences: [Vec<i32>] = "tlsCurvePreferences"
                => |v| v.is_empty(), "the kubelet server offers its TLS library's key exchange groups";
            image_pull_credentials_verification_policy: [String] = "imagePullCredentialsVerificationPolicy"
                => |v| v.is_empty() || v == "NeverVerifyPreloadedImages", "swiftlet does not re-verify pull credentials of present images";
            preloaded_images_verification_allowlist: [Vec<String>] = "preloadedImagesVerificationAllowlist"
                => |v| v.is_empty(), "swiftlet does not re-verify pull credentials of present images";
            streaming_connection_idle_timeout: [DurationText] = "streamingConnectionIdleTimeout"
                => |d| zero_or(d, 4 * 3600), "deprecated upstream, where it has no effect either";
            image_maximum_gc_age: [DurationText] = "imageMaximumGCAge"
                => |d| d.0.is_zero(), "image garbage collection is by disk usage only";
            volume_stats_agg_period: [DurationText] = "volumeStatsAggPeriod"
                => |d| zero_or(d, 60), "swiftlet keeps no periodic cache of volume usage";
            kubelet_cgroups: [String] = "kubeletCgroups"
                => |v| v.is_empty(), "swiftlet does not move itself into a cgroup";
            system_cgroups: [String] = "systemCgroups"
                => |v| v.is_empty(), "swiftlet does not move system processes into a cgroup";
            single_process_oom_kill: [bool] = "singleProcessOOMKill"
                => |v| !v, "swiftlet does not set memory.oom.group itself";
            dra_manager_reconcile_period: [DurationText] = "draManagerReconcilePeriod"
                => |d| zero_or(d, 60), "swiftlet has no dynamic resource allocation";
            memory_manager_policy: [String] = "memoryManagerPolicy"
                => |v| v.is_empty() || v.eq_ignore_ascii_case("none"), "swiftlet has no memory manager";
            topology_manager_policy: [String] = "topologyManagerPolicy"
                => |v| v.is_empty() || v == "none", "swiftlet has no topology manager";
            topology_manager_scope: [String] = "topologyManagerScope"
                => |v| v.is_empty() || v == "container", "swiftlet has no topology manager";
            topology_manager_policy_options: [BTreeMap<String, String>] = "topologyManagerPolicyOptions"
                => |v| v.is_empty(), "swiftlet has no topology manager";
            hairpin_mode: [String] = "hairpinMode"
                => |v| v.is_empty() || v == "promiscuous-bridge", "hairpin traffic is the CNI plugin's to configure";
            run_once: [bool] = "runOnce"
                => |v| !v, "swiftlet has no run-once mode";
            node_status_max_images: [i32] = "nodeStatusMaxImages"
                => |v| *v == 50, "the node status's image list is swiftlet's own";
            max_open_files: [i64] = "maxOpenFiles"
                => |v| *v == 0 || *v == 1_000_000, "swiftlet raises its open files limit to the hard limit";
            content_type: [String] = "contentType"
                => |v| v.is_empty() || v == "application/vnd.kubernetes.protobuf", "swiftlet talks JSON to the API server";
            pods_per_core: [i32] = "podsPerCore"
                => |v| *v == 0, "only maxPods limits the pods of a node";
            enable_controller_attach_detach: [bool] = "enableControllerAttachDetach"
                => |v| *v, "swiftlet never attaches volumes itself";
            protect_kernel_defaults: [bool] = "protectKernelDefaults"
                => |v| !v, "swiftlet neither checks nor sets the kernel tunables the kubelet does";
            make_iptables_util_chains: [bool] = "makeIPTablesUtilChains"
                => |v| *v, "swiftlet writes no iptables rules";
            iptables_masquerade_bit: [i32] = "iptablesMasqueradeBit"
                => |v| *v == 14, "deprecated upstream, where it has no effect either";
            iptables_drop_bit: [i32] = "iptablesDropBit"
                => |v| *v == 15, "deprecated upstream, where it has no effect either";
            fail_swap_on: [bool] = "failSwapOn"
                => |v| *v, "swiftlet does not check for swap";
            memory_swap: [super::no_effect::MemorySwap] = "memorySwap"
                => |v| v.is_default(), "containers get no swap from swiftlet";
            container_log_max_workers: [i32] = "containerLogMaxWorkers"
                => |v| *v == 1, "one task rotates the container logs";
            show_hidden_metrics_for_version: [String] = "showHiddenMetricsForVersion"
                => |v| v.is_empty(), "swiftlet has no hidden metrics";
            volume_plugin_dir: [String] = "volumePluginDir"
                => |v| v.is_empty() || v == "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/", "swiftlet has no FlexVolume plugins";
            provider_id: [String] = "providerID"
                => |v| v.is_empty(), "swiftlet does not set the Node's providerID";
            kernel_memcg_notification: [bool] = "kernelMemcgNotification"
                => |v| !v, "use swiftlet's evictionWakeups (memcg) instead";
            enable_system_log_handler: [bool] = "enableSystemLogHandler"
                => |v| *v, "swiftlet serves no /logs endpoint";
            enable_system_log_query: [bool] = "enableSystemLogQuery"
                => |v| !v, "swiftlet serves no /logs endpoint";
            crash_loop_back_off: [super::no_effect::CrashLoopBackOff] = "crashLoopBackOff"
                => |v| v.is_default(), "swiftlet's restart back-off has upstream's fixed 5m cap";
            reserved_memory: [Vec<super::no_effect::MemoryReservation>] = "reservedMemory"
                => |v| v.is_empty(), "swiftlet has no memory manager";
            enable_profiling_handler: [bool] = "enableProfilingHandler"
                => |v| *v, "swiftlet serves no /debug/pprof endpoint";
            enable_debug_flags_handler: [bool] = "enableDebugFlagsHandler"
                => |v| *v, "swiftlet serves no /debug/flags endpoint";
            memory_throttling_factor: [f64] = "memoryThrottlingFactor"
                => |v| (*v - 0.9).abs() < f64::EPSILON, "swiftlet does not set memory.high (MemoryQoS)";
            memory_reservation_policy: [String] = "memoryReservationPolicy"
                => |v| v.is_empty() || v == "None", "swiftlet does not set memory.min or memory.low";
            tracing: [super::no_effect::Tracing] = "tracing"
                => |v| v.is_default(), "swiftlet exports no OpenTelemetry traces";
            local_storage_capacity_isolation: [bool] = "localStorageCapacityIsolation"
                => |v| *v, "swiftlet always accounts local ephemeral storage";
            image_service_endpoint: [String] = "imageServiceEndpoint"
                => |v| v.is_empty(), "images go through containerRuntimeEndpoint";
            fail_cgroup_v1: [bool] = "failCgroupV1"
                => |v| !v, "swiftlet runs on cgroup v1 and v2 alike";
            user_namespaces: [super::no_effect::UserNamespaces] = "userNamespaces"
                => |v| v.is_default(), "pods' user namespaces get 65536 IDs each";
            pod_housekeeping_period: [DurationText] = "podHousekeepingPeriod"
                => |d| d.0 == Duration::from_secs(2), "swiftlet's housekeeping runs on its own schedule";
        }
    };
}
pub(super) use with_no_effect;

/// An accepted field the file sets to a value swiftlet does not act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoEffect {
    /// The file key (`featureGates.<gate>`, `logging.vmodule`, ... for nested ones).
    pub field: String,
    /// Why swiftlet does not act on it.
    pub why: &'static str,
}

/// Generates [`NO_EFFECT`] and [`set_without_effect`] from the table.
macro_rules! generate_warnings {
    ({} $(
        $name:ident : [$($ty:tt)*] = $key:literal => $neutral:expr, $why:literal;
    )*) => {
        /// Every accepted field without effect, with why (for the tests).
        #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
        pub(super) const NO_EFFECT: &[(&str, &str)] = &[$(($key, $why)),*];

        /// Checks the accepted fields' values as upstream would parse them, and lists those the
        /// file sets to something other than upstream's default, in the table's order.
        pub(super) fn set_without_effect(
            file: &FileConfig,
            origin: &Origin,
        ) -> Result<Vec<NoEffect>, ConfigError> {
            let mut found = Vec::new();
            $(
                if let Some(written) = &file.$name {
                    let value = written.checked($key, origin)?;
                    let is_default: fn(&<$($ty)* as Written>::Value) -> bool = $neutral;
                    if !is_default(&value) {
                        found.push(NoEffect { field: $key.to_owned(), why: $why });
                    }
                }
            )*
            Ok(found)
        }
    };
}

/// A field's value as written, checked as upstream's type.
pub(super) trait Written {
    type Value;
    fn checked(&self, key: &'static str, origin: &Origin) -> Result<Self::Value, ConfigError>;
}

/// Values serde already checked completely.
macro_rules! written_as_is {
    ($($ty:ty),* $(,)?) => {$(
        impl Written for $ty {
            type Value = $ty;
            fn checked(&self, _: &'static str, _: &Origin) -> Result<$ty, ConfigError> {
                Ok(self.clone())
            }
        }
    )*};
}

written_as_is!(
    bool,
    i32,
    i64,
    f64,
    String,
    Vec<i32>,
    Vec<String>,
    BTreeMap<String, String>,
    BTreeMap<String, Vec<String>>,
    MemorySwap,
    CrashLoopBackOff,
    Vec<MemoryReservation>,
    Tracing,
    UserNamespaces,
);

/// A duration (upstream `metav1.Duration`) as written, parsed after serde so that an error names
/// the field (serde_yaml_ng does not add the field to a value's own error).
#[derive(Clone, Debug, Deserialize)]
#[serde(transparent)]
pub struct DurationText(String);

impl Written for DurationText {
    type Value = GoDuration;
    fn checked(&self, key: &'static str, origin: &Origin) -> Result<GoDuration, ConfigError> {
        self.0.parse().map_err(|e: DurationError| {
            invalid(origin, key, "duration", &self.0, e.reason.to_string())
        })
    }
}

with_no_effect!(generate_warnings {});

/// Zero, or `secs` seconds: a duration upstream defaults from zero.
fn zero_or(d: &GoDuration, secs: u64) -> bool {
    d.0.is_zero() || d.0 == Duration::from_secs(secs)
}

/// `memorySwap` (upstream `MemorySwapConfiguration`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MemorySwap {
    pub swap_behavior: Option<String>,
}

impl MemorySwap {
    fn is_default(&self) -> bool {
        matches!(self.swap_behavior.as_deref(), None | Some("" | "NoSwap"))
    }
}

/// `crashLoopBackOff` (upstream `CrashLoopBackOffConfig`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CrashLoopBackOff {
    pub max_container_restart_period: Option<GoDuration>,
}

impl CrashLoopBackOff {
    fn is_default(&self) -> bool {
        self.max_container_restart_period
            .is_none_or(|d| d.0 == Duration::from_secs(300))
    }
}

/// An entry of `reservedMemory` (upstream `MemoryReservation`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MemoryReservation {
    pub numa_node: i32,
    pub limits: BTreeMap<String, Quantity>,
}

/// A resource quantity as YAML may write it (`1Gi`, `1024`, `0.5`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Text(String),
    Integer(i64),
    Decimal(f64),
}

/// `tracing` (upstream `TracingConfiguration` of k8s.io/component-base/tracing/api/v1).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tracing {
    pub endpoint: Option<String>,
    pub sampling_rate_per_million: Option<i32>,
}

impl Tracing {
    fn is_default(&self) -> bool {
        self.endpoint.is_none() && self.sampling_rate_per_million.is_none()
    }
}

/// `userNamespaces` (upstream `UserNamespaces`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserNamespaces {
    pub ids_per_pod: Option<i64>,
}

impl UserNamespaces {
    fn is_default(&self) -> bool {
        self.ids_per_pod.is_none_or(|n| n == 65536)
    }
}
