//! Graceful node shutdown's settings (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`), checked together as upstream's validation checks them,
//! into the priority rows the node shutdown manager runs by.
//!
//! Not here: what is done with them (`nodeshutdown`). Upstream:
//! `pkg/kubelet/apis/config/validation/validation.go` and `migrateConfig` in
//! `pkg/kubelet/nodeshutdown/nodeshutdown_manager.go`.

use std::time::Duration;

use serde::Deserialize;

use super::{
    duration::GoDuration,
    error::{ConfigError, Origin, invalid},
    feature_gates::FeatureGates,
    settings::Settings,
};
use crate::nodeshutdown::{PriorityGrace, ShutdownConfig};

/// An entry of `shutdownGracePeriodByPodPriority` as written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileShutdownGrace {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

const PERIOD: &str = "shutdownGracePeriod";
const CRITICAL: &str = "shutdownGracePeriodCriticalPods";
const BY_PRIORITY: &str = "shutdownGracePeriodByPodPriority";

/// The rows to shut down by; none when no grace is configured.
pub(super) fn resolve(
    settings: &Settings,
    gates: &FeatureGates,
    origin: &Origin,
) -> Result<ShutdownConfig, ConfigError> {
    let total = settings.shutdown_grace_period.unwrap_or_default();
    let critical = settings
        .shutdown_grace_period_critical_pods
        .unwrap_or_default();
    let rows = settings
        .shutdown_grace_period_by_pod_priority
        .clone()
        .unwrap_or_default();
    let shown = |d: Duration| GoDuration(d).to_string();
    let pair_set = !total.is_zero() || !critical.is_zero();
    if gates.enabled("GracefulNodeShutdown") {
        if critical > total {
            return Err(invalid(
                origin,
                CRITICAL,
                "duration",
                shown(critical),
                format!("must be <= shutdownGracePeriod {}", shown(total)),
            ));
        }
        for (field, d) in [(PERIOD, total), (CRITICAL, critical)] {
            if !d.is_zero() && d < Duration::from_secs(1) {
                return Err(invalid(
                    origin,
                    field,
                    "duration",
                    shown(d),
                    "must be either zero or otherwise >= 1 sec",
                ));
            }
        }
    } else if pair_set {
        return Err(invalid(
            origin,
            if total.is_zero() { CRITICAL } else { PERIOD },
            "duration",
            shown(if total.is_zero() { critical } else { total }),
            "specifying shutdownGracePeriod or shutdownGracePeriodCriticalPods requires feature \
             gate GracefulNodeShutdown",
        ));
    }
    let by_priority = gates.enabled("GracefulNodeShutdownBasedOnPodPriority");
    if !rows.is_empty() {
        if !by_priority {
            return Err(invalid(
                origin,
                BY_PRIORITY,
                "value",
                format!("{} entries", rows.len()),
                "Specifying shutdownGracePeriodByPodPriority requires feature gate \
                 GracefulNodeShutdownBasedOnPodPriority",
            ));
        }
        if pair_set {
            return Err(invalid(
                origin,
                BY_PRIORITY,
                "value",
                format!("{} entries", rows.len()),
                "Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at \
                 the same time",
            ));
        }
        if let Some(row) = rows.iter().find(|r| r.shutdown_grace_period_seconds < 0) {
            return Err(invalid(
                origin,
                BY_PRIORITY,
                "shutdownGracePeriodSeconds",
                row.shutdown_grace_period_seconds,
                format!("must not be negative (priority {})", row.priority),
            ));
        }
    }
    if !gates.enabled("GracefulNodeShutdown") {
        return Ok(ShutdownConfig::default());
    }
    Ok(if rows.is_empty() {
        ShutdownConfig::from_periods(total, critical)
    } else {
        ShutdownConfig::from_rows(
            rows.iter()
                .map(|r| PriorityGrace {
                    priority: r.priority,
                    grace_seconds: r.shutdown_grace_period_seconds,
                })
                .collect(),
        )
    })
}
