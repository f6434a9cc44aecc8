//! Quality-of-service classes and OOM score adjustments (upstream `GetPodQOS`/`ComputePodQOS` in
//! `pkg/apis/core/v1/helper/qos` and `GetContainerOOMScoreAdjust` in `pkg/kubelet/qos/policy.go`).
//! Pure: the caller writes the result to `/proc/<pid>/oom_score_adj` (through the runtime) and the
//! QoS cgroup tree.
//!
//! Requests default to limits per resource, as the API server's defaulting does; applying it here
//! keeps static pods (which the kubelet decodes itself) and hand-built pods consistent.

use std::{collections::BTreeMap, num::NonZeroU64};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::quantity::{Quantity, QuantityError};
use crate::kuberuntime::spec;

/// OOM score adjustment of the kubelet itself (and so of swiftlet).
pub const KUBELET_OOM_SCORE_ADJ: i32 = -999;
/// Guaranteed containers and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
/// Best-effort containers: the first the kernel kills.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;

const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// A pod's QoS class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The API spelling (`status.qosClass`, and the QoS cgroup names in lower case).
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    fn from_api(s: &str) -> Option<Self> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// A resource quantity in a pod spec that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("container {container:?}, {resource}: {source}")]
pub struct QosError {
    /// The container, or `"<pod>"` for pod-level resources.
    pub container: String,
    pub resource: &'static str,
    #[source]
    pub source: QuantityError,
}

/// The pod's QoS class: `status.qosClass` once set (it never changes), else computed.
pub fn pod_qos(pod: &Pod) -> Result<QosClass, QosError> {
    let recorded = pod.status.as_ref().and_then(|s| s.qos_class.as_deref());
    match recorded.and_then(QosClass::from_api) {
        Some(class) => Ok(class),
        None => compute_pod_qos(pod),
    }
}

/// Computes the QoS class from the spec: pod-level resources when set; otherwise every init and
/// regular container decides: all with CPU and memory requests equal to (non-zero) limits is
/// Guaranteed, none with any is BestEffort, anything else Burstable. Ephemeral containers do not
/// count.
pub fn compute_pod_qos(pod: &Pod) -> Result<QosClass, QosError> {
    if let Some(resources) = pod.spec.as_ref().and_then(|s| s.resources.as_ref()) {
        return resource_qos("<pod>", resources);
    }
    let mut pod_class = None;
    for c in spec::init_containers(pod)
        .iter()
        .chain(spec::containers(pod))
    {
        let class = match c.resources.as_ref() {
            Some(r) => resource_qos(&c.name, r)?,
            None => QosClass::BestEffort,
        };
        if class == QosClass::Burstable {
            return Ok(class);
        }
        match pod_class {
            None => pod_class = Some(class),
            Some(seen) if seen != class => return Ok(QosClass::Burstable),
            Some(_) => {}
        }
    }
    Ok(pod_class.unwrap_or(QosClass::BestEffort))
}

/// The class of one set of requirements (upstream `resourceQOS`).
fn resource_qos(owner: &str, resources: &ResourceRequirements) -> Result<QosClass, QosError> {
    // Both parsed first, so a bad quantity is reported whatever the other one says.
    let pairs = [
        request_and_limit(owner, resources, "cpu")?,
        request_and_limit(owner, resources, "memory")?,
    ];
    let mut class = None;
    for (request, limit) in pairs {
        if request != limit {
            return Ok(QosClass::Burstable);
        }
        let this = if limit.is_zero() {
            QosClass::BestEffort
        } else {
            QosClass::Guaranteed
        };
        if class.is_some_and(|c| c != this) {
            return Ok(QosClass::Burstable);
        }
        class = Some(this);
    }
    Ok(class.unwrap_or(QosClass::BestEffort))
}

/// A resource's (request, limit), the request defaulting to the limit; absent ones are zero.
fn request_and_limit(
    owner: &str,
    resources: &ResourceRequirements,
    resource: &'static str,
) -> Result<(Quantity, Quantity), QosError> {
    let parse = |list: &Option<BTreeMap<String, ApiQuantity>>| {
        list.as_ref()
            .and_then(|l| l.get(resource))
            .map(|q| Quantity::parse(&q.0))
            .transpose()
            .map_err(|source| QosError {
                container: owner.to_owned(),
                resource,
                source,
            })
    };
    let limit = parse(&resources.limits)?;
    let request = parse(&resources.requests)?.or(limit);
    Ok((request.unwrap_or_default(), limit.unwrap_or_default()))
}

/// The memory request of a container in bytes (defaulted from its limit, 0 when unset).
fn memory_request(container: &Container) -> Result<i64, QosError> {
    match container.resources.as_ref() {
        Some(r) => Ok(request_and_limit(&container.name, r, "memory")?.0.value()),
        None => Ok(0),
    }
}

/// A static or mirror pod, or one with a system-critical priority (upstream `IsCriticalPod`).
pub fn is_critical(pod: &Pod) -> bool {
    let priority = pod.spec.as_ref().and_then(|s| s.priority);
    spec::is_static_pod(pod)
        || spec::is_mirror_pod(pod)
        || priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// A critical pod in the `system-node-critical` priority class: protected like Guaranteed.
pub fn is_node_critical(pod: &Pod) -> bool {
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    is_critical(pod) && class == Some(SYSTEM_NODE_CRITICAL)
}

/// The `oom_score_adj` for the processes of `container` in `pod` on a node with
/// `memory_capacity` bytes: -997 for node-critical and Guaranteed pods, 1000 for BestEffort;
/// Burstable gets `1000 - 1000 * request / capacity` clamped to `[3, 999]` (3 stays above any
/// Guaranteed process's score, 999 below BestEffort), and a sidecar never scores above the
/// regular container with the smallest request, so it is not killed before what it serves.
pub fn container_oom_score_adj(
    pod: &Pod,
    container: &Container,
    memory_capacity: NonZeroU64,
) -> Result<i32, QosError> {
    if is_node_critical(pod) {
        return Ok(GUARANTEED_OOM_SCORE_ADJ);
    }
    match pod_qos(pod)? {
        QosClass::Guaranteed => return Ok(GUARANTEED_OOM_SCORE_ADJ),
        QosClass::BestEffort => return Ok(BEST_EFFORT_OOM_SCORE_ADJ),
        QosClass::Burstable => {}
    }
    let capacity = i128::from(memory_capacity.get());
    let score = |request: i64| 1000 - (1000 * i128::from(request)) / capacity;
    let mut adj = score(memory_request(container)?);
    let is_sidecar = spec::is_sidecar(container)
        && spec::init_containers(pod)
            .iter()
            .any(|c| c.name == container.name);
    if is_sidecar {
        let mut smallest: Option<i64> = None;
        for c in spec::containers(pod) {
            let request = memory_request(c)?;
            smallest = Some(smallest.map_or(request, |s| s.min(request)));
        }
        if let Some(smallest) = smallest {
            adj = adj.min(score(smallest));
        }
    }
    let floor = i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ);
    let ceiling = i128::from(BEST_EFFORT_OOM_SCORE_ADJ - 1);
    // Within [3, 999] after the clamp, so the conversion cannot fail.
    Ok(i32::try_from(adj.clamp(floor, ceiling)).unwrap_or(BEST_EFFORT_OOM_SCORE_ADJ - 1))
}

/// An OOM score adjustment as it can actually be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomScoreAdj {
    pub value: i32,
    /// The wanted value was negative and had to be raised to 0: the caller logs it once.
    pub clamped: bool,
}

/// Without `CAP_SYS_RESOURCE` a process may only raise `oom_score_adj` above its own minimum
/// (0 for an unprivileged swiftlet), so negative values are written as 0.
pub fn clamp_for_unprivileged(adj: i32, has_cap_sys_resource: bool) -> OomScoreAdj {
    if has_cap_sys_resource || adj >= 0 {
        OomScoreAdj {
            value: adj,
            clamped: false,
        }
    } else {
        OomScoreAdj {
            value: 0,
            clamped: true,
        }
    }
}

#[cfg(test)]
mod tests;
