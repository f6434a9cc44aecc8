//! The configuration file as written: a YAML mapping in the style of the kubelet's
//! `KubeletConfiguration` (camelCase, the kubelet's field names where one exists), plus swiftlet's
//! own fields. Every field is optional and kept in its written form (durations and addresses as
//! strings), so the loader can name the field and the bad value in one message; unknown fields are
//! rejected here by serde.
//!
//! Not here: defaults, validation, flags (`load.rs`). Upstream: `KubeletConfiguration` in
//! `staging/src/k8s.io/kubelet/config/v1beta1/types.go`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use super::ConfigError;

/// The `kind` a file may declare (optional; checked when present).
pub const KIND: &str = "KubeletConfiguration";
/// The `apiVersion` a file may declare (optional; checked when present).
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    pub kind: Option<String>,
    pub api_version: Option<String>,

    // The kubelet's fields.
    pub static_pod_path: Option<PathBuf>,
    pub sync_frequency: Option<String>,
    pub file_check_frequency: Option<String>,
    pub max_pods: Option<i64>,
    pub pod_pids_limit: Option<i64>,
    pub runtime_request_timeout: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub read_only_port: Option<i64>,
    pub address: Option<String>,
    pub port: Option<i64>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub tls_min_version: Option<String>,
    pub tls_cipher_suites: Option<Vec<String>>,
    pub enable_debugging_handlers: Option<bool>,
    pub authentication: Option<super::server::FileAuthentication>,
    pub authorization: Option<super::server::FileAuthorization>,
    pub healthz_port: Option<i64>,
    pub healthz_bind_address: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub cgroup_driver: Option<String>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub node_status_update_frequency: Option<String>,
    pub node_lease_duration_seconds: Option<i64>,
    /// A kubelet flag upstream, accepted in the file here (same meaning as `nodeName`).
    pub hostname_override: Option<String>,
    /// Signal → value, the operator implied (`memory.available: 100Mi`). Scalars are kept as
    /// written, so `memory.pressure.some.avg10: 40` needs no quotes.
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: Option<BTreeMap<String, String>>,
    /// Signal → Go duration.
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub eviction_pressure_transition_period: Option<String>,
    pub merge_default_eviction_settings: Option<bool>,
    /// Resource (`cpu`, `memory`, `ephemeral-storage`, `pid`) → quantity.
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub cpu_manager_policy: Option<String>,
    pub cpu_manager_policy_options: Option<BTreeMap<String, String>>,
    pub cpu_manager_reconcile_period: Option<String>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    /// A quantity (`10Mi`); negative disables rotation.
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<i64>,
    pub container_log_monitor_interval: Option<String>,
    pub pod_logs_dir: Option<PathBuf>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    pub seccomp_default: Option<bool>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    #[serde(rename = "oomScoreAdj")]
    pub oom_score_adj: Option<i64>,

    // swiftlet's own.
    pub node_name: Option<String>,
    pub pleg: Option<String>,
    pub pleg_relist_period: Option<String>,
    pub root_dir: Option<PathBuf>,
    pub grpc_socket: Option<PathBuf>,
    /// The read-only port's bind address (the kubelet binds it to `address`).
    pub read_only_address: Option<String>,
    pub eviction_monitoring_period: Option<String>,
    pub eviction_wakeups: Option<Vec<String>>,
    pub cpu_manager_apply: Option<String>,
    /// The kubelet's flags `--minimum-container-ttl-duration`,
    /// `--maximum-dead-containers-per-container` and `--maximum-dead-containers`, as fields.
    #[serde(rename = "minimumContainerTTLDuration")]
    pub minimum_container_ttl_duration: Option<String>,
    pub maximum_dead_containers_per_container: Option<i32>,
    pub maximum_dead_containers: Option<i32>,
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
