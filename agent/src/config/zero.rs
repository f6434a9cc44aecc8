//! Zero values in the file that upstream turns into defaults: `SetDefaults_KubeletConfiguration`
//! replaces a zero duration, a zero integer or an empty string of many fields by the field's
//! default, so `syncFrequency: 0s` (which kubeadm writes for every duration it leaves alone) means
//! "the default", not "zero". [`clear_zero_values`] forgets such values before the rules run, as if
//! the file had not written them. Fields whose zero means something (a pointer upstream:
//! `eventRecordQPS: 0` is no limit, `healthzPort: 0` and `readOnlyPort: 0` are off,
//! `kubeAPIQPS: 0` is client-go's own default) keep it. Flags are not affected: a zero given on
//! the command line is still checked by the rules.
//!
//! Not here: the defaults themselves (`defaults.rs`, the settings table). Upstream:
//! `pkg/kubelet/apis/config/v1beta1/defaults.go`.

use super::{duration::GoDuration, settings::FileConfig};

/// Forgets the file's values that upstream's defaulting replaces.
pub(super) fn clear_zero_values(file: &mut FileConfig) {
    for duration in [
        &mut file.sync_frequency,
        &mut file.file_check_frequency,
        &mut file.runtime_request_timeout,
        &mut file.node_status_update_frequency,
        &mut file.node_status_report_frequency,
        &mut file.image_minimum_gc_age,
        &mut file.eviction_pressure_transition_period,
        &mut file.cpu_manager_reconcile_period,
    ] {
        clear_zero_duration(duration);
    }
    if let Some(authn) = file
        .authentication
        .as_mut()
        .and_then(|a| a.webhook.as_mut())
    {
        clear_zero_duration(&mut authn.cache_ttl);
    }
    if let Some(authz) = file.authorization.as_mut() {
        clear_empty(&mut authz.mode);
        if let Some(webhook) = authz.webhook.as_mut() {
            clear_zero_duration(&mut webhook.cache_authorized_ttl);
            clear_zero_duration(&mut webhook.cache_unauthorized_ttl);
        }
    }
    for int in [
        &mut file.max_pods,
        &mut file.node_lease_duration_seconds,
        &mut file.kube_api_burst,
        &mut file.event_burst,
        &mut file.registry_burst,
        // Upstream's `port: 0` is 10250; `enableServer: false` turns the server off.
        &mut file.port,
    ] {
        if *int == Some(0) {
            *int = None;
        }
    }
    for text in [
        &mut file.container_runtime_endpoint,
        &mut file.address,
        &mut file.healthz_bind_address,
        &mut file.cgroup_root,
        &mut file.cpu_manager_policy,
        &mut file.config_map_and_secret_change_detection_strategy,
        &mut file.container_log_max_size,
        &mut file.tls_min_version,
    ] {
        clear_empty(text);
    }
    if file
        .pod_logs_dir
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        file.pod_logs_dir = None;
    }
}

/// A duration that parses as zero is forgotten; one that does not parse is left for its rule to
/// report.
fn clear_zero_duration(value: &mut Option<String>) {
    if value
        .as_deref()
        .and_then(|text| text.parse::<GoDuration>().ok())
        .is_some_and(|d| d.0.is_zero())
    {
        *value = None;
    }
}

fn clear_empty(value: &mut Option<String>) {
    if value.as_deref().is_some_and(str::is_empty) {
        *value = None;
    }
}
