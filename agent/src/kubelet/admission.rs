//! Pod admission (upstream `pkg/kubelet/lifecycle/predicate.go`, `predicateAdmitHandler.Admit`
//! with `generalFilter`, which runs the scheduler's `AdmissionCheck`): a pod the node cannot take
//! is rejected before anything starts, and its status says why (phase Failed, reason and message
//! as upstream words them). In upstream's order:
//! 1. the pod's `kubernetes.io/os` label and `spec.os` against the node's OS
//!    (`PodOSSelectorNodeLabelDoesNotMatch`, `PodOSNotSupported`);
//! 2. then every check of `generalFilter`, the first failure being the answer: resources
//!    (`OutOfpods`, `OutOfcpu`, `OutOfmemory`: requests plus `spec.overhead`, of the pod and of
//!    the active pods, within allocatable), node affinity (`NodeAffinity`: `nodeSelector` and the
//!    required node affinity, `admission/node_affinity.rs`), the node name (`NodeName`), host
//!    ports (`NodePorts`, `admission/host_ports.rs`), and for pods that are not static the
//!    node's `NoExecute` taints (`TaintToleration`: the kubelet leaves the other effects to the
//!    scheduler).
//!
//! The node's labels and taints are those it registers with (`crate::node::Registration`):
//! upstream reads its Node from the API server, which starts as those; swiftlet does not watch
//! its Node, so labels or taints others add later do not count here.
//!
//! Not here: the eviction manager's, the security and the CPU manager's admission (called after
//! this one by the kubelet core).

mod host_ports;
mod node_affinity;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::{Pod, Taint};

pub use crate::pod::Rejection;
use crate::{
    cm::hugepages,
    node::{
        Registration,
        labels::{LABEL_OS, OS},
        taints::{NO_EXECUTE, first_untolerated},
    },
    pod::{
        resources::{pod_overhead, pod_requests},
        spec::is_static_pod,
    },
};

/// What the node offers.
#[derive(Clone, Debug)]
pub struct NodeCapacity {
    pub max_pods: usize,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// Bytes of huge pages by page size; a size the node does not have is absent.
    pub hugepages: std::collections::BTreeMap<u64, u64>,
}

/// The node a pod is admitted to (upstream's `NodeInfo` with its Node).
#[derive(Clone, Copy, Debug)]
pub struct AdmissionNode<'a> {
    pub name: &'a str,
    pub capacity: &'a NodeCapacity,
    pub registration: &'a Registration,
}

/// Upstream's `PredicateFailureError` names and descriptions.
const NODE_AFFINITY: (&str, &str) = (
    "NodeAffinity",
    "node(s) didn't match Pod's node affinity/selector",
);
const NODE_NAME: (&str, &str) = ("NodeName", "node(s) didn't match the requested node name");
const NODE_PORTS: (&str, &str) = (
    "NodePorts",
    "node(s) didn't have free ports for the requested pod ports",
);
const TAINT_TOLERATION: (&str, &str) = (
    "TaintToleration",
    "node(s) had taints that the pod didn't tolerate",
);

/// Decides whether `pod` fits next to `active` (the admitted pods that are not terminal).
pub fn admit(pod: &Pod, active: &[&Pod], node: &AdmissionNode<'_>) -> Result<(), Rejection> {
    admit_os(pod)?;
    fits_resources(pod, active, node.capacity)?;
    let labels = &node.registration.labels;
    if !node_affinity::matches(pod, node.name, labels) {
        return Err(predicate(NODE_AFFINITY));
    }
    if let Some(wanted) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
        && !wanted.is_empty()
        && wanted != node.name
    {
        return Err(predicate(NODE_NAME));
    }
    if !host_ports::UsedPorts::of(active.iter().copied()).fits(pod) {
        return Err(predicate(NODE_PORTS));
    }
    if !is_static_pod(pod) && untolerated(pod, &node.registration.taints).is_some() {
        return Err(predicate(TAINT_TOLERATION));
    }
    Ok(())
}

/// Upstream `PredicateFailureError`: the predicate's name as reason, `Predicate <name> failed:
/// <description>` as message.
fn predicate((name, description): (&str, &str)) -> Rejection {
    Rejection {
        reason: name.to_owned(),
        message: format!("Predicate {name} failed: {description}"),
    }
}

/// Upstream `rejectPodAdmissionBasedOnOSSelector` (the pod's `kubernetes.io/os` label against the
/// node's, which upstream takes to be the OS it runs whatever the Node's label says) and
/// `rejectPodAdmissionBasedOnOSField`.
fn admit_os(pod: &Pod) -> Result<(), Rejection> {
    let pod_os = pod.metadata.labels.as_ref().and_then(|l| l.get(LABEL_OS));
    if pod_os.is_some_and(|os| os != OS) {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .into(),
        });
    }
    let os_field = pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os_field.is_some_and(|os| os.name != OS) {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    Ok(())
}

/// The first of the node's `NoExecute` taints the pod does not tolerate.
fn untolerated<'a>(pod: &Pod, taints: &'a [Taint]) -> Option<&'a Taint> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    first_untolerated(taints, tolerations, |t| t.effect == NO_EXECUTE)
}

/// A pod's CPU (millis) and memory (bytes) requests with its `spec.overhead` (upstream
/// `resource.PodRequests`, overhead included as the scheduler and the kubelet count it).
fn requests_with_overhead(pod: &Pod) -> Result<(i64, i64), Rejection> {
    let unexpected = |message: String| Rejection {
        reason: "UnexpectedAdmissionError".into(),
        message,
    };
    let (cpu, memory) = pod_requests(pod).map_err(|e| unexpected(e.to_string()))?;
    let (cpu_overhead, memory_overhead) =
        pod_overhead(pod).map_err(|e| unexpected(e.to_string()))?;
    Ok((
        cpu.saturating_add(cpu_overhead),
        memory.saturating_add(memory_overhead),
    ))
}

/// Upstream `noderesources.Fits` (`fitsRequest`): the pod count, then CPU and memory, each
/// within allocatable after what the active pods request.
fn fits_resources(pod: &Pod, active: &[&Pod], node: &NodeCapacity) -> Result<(), Rejection> {
    if active.len() + 1 > node.max_pods {
        return Err(out_of("pods", 1, active.len() as i64, node.max_pods as i64));
    }
    let (cpu, memory) = requests_with_overhead(pod)?;
    let mut used_cpu: i64 = 0;
    let mut used_memory: i64 = 0;
    for other in active {
        let (c, m) = requests_with_overhead(other)?;
        used_cpu = used_cpu.saturating_add(c);
        used_memory = used_memory.saturating_add(m);
    }
    if cpu > 0 && cpu > node.cpu_millis.saturating_sub(used_cpu) {
        return Err(out_of("cpu", cpu, used_cpu, node.cpu_millis));
    }
    if memory > 0 && memory > node.memory_bytes.saturating_sub(used_memory) {
        return Err(out_of("memory", memory, used_memory, node.memory_bytes));
    }
    fits_hugepages(pod, active, node)
}

/// `fitsRequest` for the `hugepages-<size>` resources: a size the node does not have has no
/// capacity, so a pod asking for one is `OutOfhugepages-<size>`, as upstream rejects it.
fn fits_hugepages(pod: &Pod, active: &[&Pod], node: &NodeCapacity) -> Result<(), Rejection> {
    let requests = |p: &Pod| {
        hugepages::pod_requests(p).map_err(|e| Rejection {
            reason: "UnexpectedAdmissionError".into(),
            message: e.to_string(),
        })
    };
    let wanted = requests(pod)?;
    if wanted.is_empty() {
        return Ok(());
    }
    let mut used: std::collections::BTreeMap<u64, i64> = std::collections::BTreeMap::new();
    for other in active {
        for (size, bytes) in requests(other)? {
            let sum = used.entry(size).or_default();
            *sum = sum.saturating_add(bytes);
        }
    }
    for (size, bytes) in wanted {
        let capacity = node
            .hugepages
            .get(&size)
            .map_or(0, |b| i64::try_from(*b).unwrap_or(i64::MAX));
        let used = used.get(&size).copied().unwrap_or(0);
        if bytes > capacity.saturating_sub(used) {
            return Err(out_of(
                &hugepages::resource_name(size),
                bytes,
                used,
                capacity,
            ));
        }
    }
    Ok(())
}

/// Upstream `InsufficientResourceError`.
fn out_of(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, \
             capacity: {capacity}"
        ),
    }
}
