//! Admission under pressure (upstream `managerImpl.Admit`): with no pressure condition every pod
//! is admitted; under memory pressure alone, every pod but BestEffort ones (unless they tolerate
//! the `node.kubernetes.io/memory-pressure` taint); under any other pressure, only critical pods.
//! A rejected pod is Failed with reason `Evicted` and "The node had condition: [...]".

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

use super::{NodeCondition, manager::is_critical};
use crate::{
    cm::qos::{QosClass, pod_qos},
    pod::Rejection,
};

const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

pub fn admit(pod: &Pod, conditions: &BTreeSet<NodeCondition>) -> Result<(), Rejection> {
    if conditions.is_empty() || is_critical(pod) {
        return Ok(());
    }
    if conditions.len() == 1 && conditions.contains(&NodeCondition::MemoryPressure) {
        let best_effort = matches!(pod_qos(pod), Ok(QosClass::BestEffort));
        if !best_effort || tolerates_memory_pressure(pod) {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    Err(Rejection {
        reason: "Evicted".into(),
        message: format!("The node had condition: [{}]. ", names.join(", ")),
    })
}

/// Whether a toleration matches the taint `memory-pressure:NoSchedule` (upstream
/// `TolerationsTolerateTaint`).
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|t| {
            let effect_ok = t
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "NoSchedule");
            let key_ok = match t.key.as_deref() {
                None | Some("") => t.operator.as_deref() == Some("Exists"),
                Some(k) => k == MEMORY_PRESSURE_TAINT,
            };
            let value_ok = match t.operator.as_deref() {
                Some("Exists") => true,
                _ => t.value.as_deref().unwrap_or_default().is_empty(),
            };
            effect_ok && key_ok && value_ok
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, ResourceRequirements, Toleration},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(memory: Option<&str>, tolerations: Option<Vec<Toleration>>) -> Pod {
        let requests = memory
            .map(|m| std::collections::BTreeMap::from([("memory".to_owned(), Quantity(m.into()))]));
        crate::testing::pod()
            .container(Container {
                resources: Some(ResourceRequirements {
                    requests,
                    ..Default::default()
                }),
                ..crate::testing::container("c")
            })
            .spec(|s| s.tolerations = tolerations)
            .build()
    }

    #[test]
    fn memory_pressure_turns_away_best_effort_pods_only() {
        let memory = BTreeSet::from([NodeCondition::MemoryPressure]);
        assert!(admit(&pod(None, None), &BTreeSet::new()).is_ok());
        assert!(
            admit(&pod(Some("64Mi"), None), &memory).is_ok(),
            "burstable"
        );
        let rejected = admit(&pod(None, None), &memory).expect_err("best effort");
        assert_eq!(rejected.reason, "Evicted");
        assert_eq!(
            rejected.message,
            "The node had condition: [MemoryPressure]. "
        );
        let tolerant = pod(
            None,
            Some(vec![Toleration {
                key: Some(MEMORY_PRESSURE_TAINT.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
        );
        assert!(admit(&tolerant, &memory).is_ok());
    }

    #[test]
    fn disk_pressure_turns_away_every_pod_but_critical_ones() {
        let disk = BTreeSet::from([NodeCondition::DiskPressure]);
        assert!(admit(&pod(Some("64Mi"), None), &disk).is_err());
        let mut critical = pod(None, None);
        if let Some(spec) = critical.spec.as_mut() {
            spec.priority_class_name = Some("system-node-critical".into());
        }
        assert!(admit(&critical, &disk).is_ok());
    }
}
