//! Pod admission (upstream `pkg/kubelet/lifecycle/predicate.go` `GeneralPredicates` as the
//! kubelet runs them on admit): a pod the node cannot take is rejected before anything starts,
//! and its status says why (phase Failed, reason and message as upstream words them).

use k8s_openapi::api::core::v1::Pod;

pub use crate::pod::Rejection;
use crate::pod::resources::pod_requests;

/// What the node offers.
#[derive(Clone, Debug)]
pub struct NodeCapacity {
    pub max_pods: usize,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
}

/// Decides whether `pod` fits next to `active` (the admitted pods that are not terminal).
pub fn admit(
    pod: &Pod,
    active: &[&Pod],
    node: &NodeCapacity,
    node_name: &str,
) -> Result<(), Rejection> {
    if let Some(wanted) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
        && !wanted.is_empty()
        && wanted != node_name
    {
        return Err(Rejection {
            reason: "NodeName".into(),
            message: format!(
                "Predicate NodeName failed: node({node_name}) didn't satisfy the pod's nodeName({wanted})"
            ),
        });
    }
    if active.len() + 1 > node.max_pods {
        return Err(out_of("pods", 1, active.len() as i64, node.max_pods as i64));
    }
    let requests = |p: &Pod| -> Result<(i64, i64), Rejection> {
        pod_requests(p).map_err(|e| Rejection {
            reason: "UnexpectedAdmissionError".into(),
            message: e.to_string(),
        })
    };
    let (cpu, memory) = requests(pod)?;
    let mut used_cpu = 0;
    let mut used_memory = 0;
    for other in active {
        let (c, m) = requests(other)?;
        used_cpu += c;
        used_memory += m;
    }
    if cpu > 0 && used_cpu + cpu > node.cpu_millis {
        return Err(out_of("cpu", cpu, used_cpu, node.cpu_millis));
    }
    if memory > 0 && used_memory + memory > node.memory_bytes {
        return Err(out_of("memory", memory, used_memory, node.memory_bytes));
    }
    Ok(())
}

fn out_of(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, \
             capacity: {capacity}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(cpu: Option<&str>, memory: Option<&str>) -> Pod {
        let mut requests = std::collections::BTreeMap::new();
        if let Some(c) = cpu {
            requests.insert("cpu".to_owned(), Quantity(c.into()));
        }
        if let Some(m) = memory {
            requests.insert("memory".to_owned(), Quantity(m.into()));
        }
        crate::testing::pod()
            .container(Container {
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    ..Default::default()
                }),
                ..crate::testing::container("c")
            })
            .build()
    }

    fn node() -> NodeCapacity {
        NodeCapacity {
            max_pods: 2,
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn rejects_beyond_max_pods_and_resources_with_upstream_reasons() {
        let small = pod(Some("500m"), Some("100Mi"));
        assert_eq!(admit(&small, &[], &node(), "n"), Ok(()));
        let full = admit(&small, &[&small, &small], &node(), "n").err();
        assert_eq!(full.as_ref().map(|r| r.reason.as_str()), Some("OutOfpods"));
        assert!(full.is_some_and(|r| {
            r.message
                .contains("pods, requested: 1, used: 2, capacity: 2")
        }));
        let big = pod(Some("3"), None);
        assert_eq!(
            admit(&big, &[], &node(), "n").err().map(|r| r.reason),
            Some("OutOfcpu".into())
        );
        let hungry = pod(None, Some("2Gi"));
        assert_eq!(
            admit(&hungry, &[], &node(), "n").err().map(|r| r.reason),
            Some("OutOfmemory".into())
        );
        let mut elsewhere = pod(None, None);
        if let Some(spec) = elsewhere.spec.as_mut() {
            spec.node_name = Some("other".into());
        }
        assert_eq!(
            admit(&elsewhere, &[], &node(), "n").err().map(|r| r.reason),
            Some("NodeName".into())
        );
    }
}
