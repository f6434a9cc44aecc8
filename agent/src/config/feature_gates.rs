//! `featureGates`: the file's map of gate name to bool, and [`FeatureGates`], which answers
//! `enabled(name)` from it over upstream's defaults for the gates whose behaviour swiftlet has.
//! A gate swiftlet does not implement is accepted with one startup warning naming it; a gate whose
//! behaviour swiftlet always has, set against it, is warned about likewise. A value that is not a
//! bool is an error naming `featureGates.<gate>`.
//!
//! Not here: what the gates change (their users consult [`FeatureGates::enabled`]). Upstream:
//! `pkg/features/kube_features.go` (gates and defaults), `cmd/kubelet/app/server.go` (the file's
//! `featureGates` applied with `SetFromMap`, which rejects an unknown gate; swiftlet, knowing only
//! its own gates, warns instead so that a file written for any kubelet version loads).

use std::collections::BTreeMap;

use super::{
    error::{ConfigError, Origin},
    no_effect::NoEffect,
};

/// Whether swiftlet lets a gate be switched or always has the gate's behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Implemented {
    /// Consulted through [`FeatureGates::enabled`].
    Switchable,
    /// swiftlet always behaves as the gate at this value.
    Always(bool),
    /// swiftlet has the gate's behaviour, chosen by another setting (named here): the gate
    /// switched on alone has no effect.
    ChosenBy(&'static str),
}

/// The gates swiftlet implements, with upstream's default (v1.35).
const GATES: &[(&str, bool, Implemented)] = &[
    // The serving certificate from the cluster (`serverTLSBootstrap`) needs it on, as upstream.
    (
        "RotateKubeletServerCertificate",
        true,
        Implemented::Switchable,
    ),
    // The runtime's cgroup driver over `cgroupDriver` (`kuberuntime::cgroup_driver`); GA and
    // locked on upstream since v1.34.
    (
        "KubeletCgroupDriverFromCRI",
        true,
        Implemented::Always(true),
    ),
    // Restartable init containers.
    ("SidecarContainers", true, Implemented::Always(true)),
    // `hostUsers: false` pods (`kuberuntime/userns`).
    ("UserNamespacesSupport", true, Implemented::Always(true)),
    // Graceful node shutdown (`nodeshutdown`), and its priority groups
    // (`shutdownGracePeriodByPodPriority`).
    ("GracefulNodeShutdown", true, Implemented::Switchable),
    (
        "GracefulNodeShutdownBasedOnPodPriority",
        true,
        Implemented::Switchable,
    ),
    // `qosReserved` (`config/qos_reserved.rs`); alpha and off upstream.
    ("QOSReserved", false, Implemented::Switchable),
    // The pod-resources API's `Get` (`server/podresources.rs`); alpha and off upstream.
    ("KubeletPodResourcesGet", false, Implemented::Switchable),
    // A `cpuCFSQuotaPeriod` other than 100ms (`config/cfs.rs`); alpha and off upstream.
    ("CustomCPUCFSQuotaPeriod", false, Implemented::Switchable),
    // Upstream's Evented PLEG (`pleg/evented`), alpha and off upstream.
    (
        "EventedPLEG",
        false,
        Implemented::ChosenBy(
            "swiftlet's Evented PLEG is chosen with pleg: evented (--pleg evented)",
        ),
    ),
];

/// The feature gates as configured: the file's values over upstream's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<String, bool>,
}

impl FeatureGates {
    /// Whether `name` is on: the file's value, else upstream's default for a gate swiftlet
    /// implements, else off.
    /// The gates set explicitly, as the file's `featureGates` holds them.
    pub fn explicit(&self) -> &BTreeMap<String, bool> {
        &self.set
    }

    pub fn enabled(&self, name: &str) -> bool {
        self.set.get(name).copied().unwrap_or_else(|| {
            GATES
                .iter()
                .find(|(gate, _, _)| *gate == name)
                .is_some_and(|(_, default, _)| *default)
        })
    }
}

/// Checks the file's `featureGates` and lists the gates that have no effect in swiftlet.
pub(super) fn resolve(
    written: Option<&BTreeMap<String, serde_yaml_ng::Value>>,
    origin: &Origin,
) -> Result<(FeatureGates, Vec<NoEffect>), ConfigError> {
    let mut gates = FeatureGates::default();
    let mut no_effect = Vec::new();
    for (name, value) in written.into_iter().flatten() {
        let serde_yaml_ng::Value::Bool(on) = value else {
            return Err(ConfigError::FeatureGate {
                origin: origin.clone(),
                gate: name.clone(),
                value: serde_yaml_ng::to_string(value)
                    .map(|s| s.trim_end().to_owned())
                    .unwrap_or_default(),
            });
        };
        match GATES.iter().find(|(gate, _, _)| gate == name) {
            None => no_effect.push(NoEffect {
                field: format!("featureGates.{name}"),
                why: "swiftlet does not implement this feature gate",
            }),
            Some((_, _, Implemented::Always(always))) if always != on => no_effect.push(NoEffect {
                field: format!("featureGates.{name}"),
                why: if *always {
                    "swiftlet always has this feature"
                } else {
                    "swiftlet never has this feature"
                },
            }),
            Some((_, _, Implemented::ChosenBy(how))) if *on => no_effect.push(NoEffect {
                field: format!("featureGates.{name}"),
                why: how,
            }),
            Some(_) => {}
        }
        gates.set.insert(name.clone(), *on);
    }
    Ok((gates, no_effect))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn parse(yaml: &str) -> Result<(FeatureGates, Vec<NoEffect>), ConfigError> {
        let map: BTreeMap<String, serde_yaml_ng::Value> =
            serde_yaml_ng::from_str(yaml).expect("yaml");
        resolve(Some(&map), &Origin::File(PathBuf::from("c.yaml")))
    }

    #[test]
    fn defaults_apply_to_implemented_gates_only() {
        let gates = FeatureGates::default();
        assert!(gates.enabled("RotateKubeletServerCertificate"));
        assert!(!gates.enabled("KubeletTracing"));
    }

    #[test]
    fn file_values_win_and_unknown_gates_are_reported_once_each() {
        let (gates, no_effect) = parse(
            "RotateKubeletServerCertificate: false\nCSIMigration: true\nKubeletTracing: false\n\
             SidecarContainers: true\nUserNamespacesSupport: false\n",
        )
        .expect("parses");
        assert!(!gates.enabled("RotateKubeletServerCertificate"));
        assert!(gates.enabled("CSIMigration"));
        let fields: Vec<&str> = no_effect.iter().map(|n| n.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "featureGates.CSIMigration",
                "featureGates.KubeletTracing",
                "featureGates.UserNamespacesSupport",
            ]
        );
    }

    #[test]
    fn the_evented_pleg_gate_points_at_the_pleg_setting() {
        let (gates, no_effect) = parse("EventedPLEG: true\n").expect("parses");
        assert!(gates.enabled("EventedPLEG"));
        assert_eq!(no_effect.len(), 1);
        assert_eq!(no_effect[0].field, "featureGates.EventedPLEG");
        assert!(
            no_effect[0].why.contains("--pleg evented"),
            "{}",
            no_effect[0].why
        );
        let (_, no_effect) = parse("EventedPLEG: false\n").expect("parses");
        assert!(no_effect.is_empty());
    }

    #[test]
    fn a_non_bool_names_the_gate() {
        let msg = parse("KubeletTracing: yes please\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            msg,
            "config file c.yaml: field `featureGates.KubeletTracing`: invalid value \"yes please\": expected true or false"
        );
    }
}
