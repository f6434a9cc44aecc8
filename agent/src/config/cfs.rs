//! `cpuCFSQuota` and `cpuCFSQuotaPeriod`: whether CPU limits become CFS quotas, and in which
//! period, checked against the feature gate `CustomCPUCFSQuotaPeriod` as upstream's
//! `ValidateKubeletConfiguration` does (a period other than 100ms needs the gate; with it, the
//! period must be within 1ms..1s). The result is [`CfsQuota`], which the containers' CRI
//! resources (`kuberuntime::container_config`) and the pod cgroups (`cm::pod_cgroups`) share.

use std::time::Duration;

use super::{
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
    feature_gates::FeatureGates,
    settings::Settings,
};
use crate::cm::helpers::{CPU_PERIOD_US, CfsQuota, MAX_QUOTA_PERIOD_US, MIN_QUOTA_US};

/// The feature gate a period other than 100ms needs (upstream `features.CPUCFSQuotaPeriod`).
pub const CUSTOM_PERIOD_GATE: &str = "CustomCPUCFSQuotaPeriod";

const FIELD: &str = "cpuCFSQuotaPeriod";

pub(super) fn resolve(
    settings: &Settings,
    gates: &FeatureGates,
    origin: &Origin,
) -> Result<CfsQuota, ConfigError> {
    let default = Duration::from_micros(CPU_PERIOD_US as u64);
    let period = settings.cpu_cfs_quota_period.unwrap_or(default);
    let shown = GoDuration(period);
    if period != default && !gates.enabled(CUSTOM_PERIOD_GATE) {
        return Err(invalid(
            origin,
            FIELD,
            "duration",
            shown,
            format!("a period other than 100ms requires the feature gate {CUSTOM_PERIOD_GATE}"),
        ));
    }
    let micros = i64::try_from(period.as_micros()).unwrap_or(i64::MAX);
    let within = Duration::from_micros(MIN_QUOTA_US as u64)
        ..=Duration::from_micros(MAX_QUOTA_PERIOD_US as u64);
    if !within.contains(&period) {
        return Err(invalid(
            origin,
            FIELD,
            "duration",
            shown,
            "must be between 1ms and 1s, inclusive",
        ));
    }
    Ok(CfsQuota {
        enforce: settings.cpu_cfs_quota,
        period_us: micros,
    })
}
