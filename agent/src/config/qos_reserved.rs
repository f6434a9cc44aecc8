//! `qosReserved` (feature gate `QOSReserved`, alpha and off upstream): the share of the higher
//! QoS levels' memory requests the lower levels' cgroups must leave free, parsed as upstream's
//! `ParseQOSReserved` does (only `memory`, a whole percentage from 0 to 100). Without the gate
//! the value is still checked, and reported once as having no effect.
//!
//! Not here: the limits it gives (`cm::pod_cgroups::QosMemoryReserve`).

use super::{
    error::{ConfigError, Origin, invalid},
    feature_gates::FeatureGates,
    no_effect::NoEffect,
    settings::Settings,
};

pub const GATE: &str = "QOSReserved";
const FIELD: &str = "qosReserved";

/// The memory percentage in force (`None`: nothing reserved), and a warning when the gate leaves
/// a written value without effect.
pub(super) fn resolve(
    settings: &Settings,
    gates: &FeatureGates,
    origin: &Origin,
) -> Result<(Option<i64>, Option<NoEffect>), ConfigError> {
    let Some(written) = settings.qos_reserved.as_ref().filter(|m| !m.is_empty()) else {
        return Ok((None, None));
    };
    let mut percent = None;
    for (resource, value) in written {
        if resource != "memory" {
            return Err(invalid(
                origin,
                FIELD,
                "resource",
                resource,
                "cannot reserve it: only memory can be reserved",
            ));
        }
        let bad = |reason: &str| invalid(origin, "qosReserved.memory", "percentage", value, reason);
        let number = value
            .strip_suffix('%')
            .ok_or_else(|| bad("expected a percentage, e.g. 50%"))?;
        let parsed: i64 = number
            .parse()
            .map_err(|_| bad("expected a whole percentage, e.g. 50%"))?;
        if !(0..=100).contains(&parsed) {
            return Err(bad("must be between 0% and 100%"));
        }
        percent = Some(parsed);
    }
    if !gates.enabled(GATE) {
        let warning = NoEffect {
            field: FIELD.to_owned(),
            why: "it needs the feature gate QOSReserved (alpha, off by default), as upstream",
        };
        return Ok((None, Some(warning)));
    }
    if !settings.cgroups_per_qos {
        return Err(invalid(
            origin,
            FIELD,
            "setting",
            "memory",
            "needs cgroupsPerQOS: true (it limits the QoS levels' cgroups)",
        ));
    }
    Ok((percent, None))
}
