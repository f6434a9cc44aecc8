//! Quality-of-service classes (upstream `GetPodQOS`/`ComputePodQOS` in
//! `pkg/apis/core/v1/helper/qos`) and criticality (upstream `IsCriticalPod`). Pure.
//!
//! Requests default to limits per resource, as the API server's defaulting does; applying it here
//! keeps static pods (which the kubelet decodes itself) and hand-built pods consistent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::{
    quantity::{Quantity, QuantityError},
    spec,
};

pub(crate) const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
pub(crate) const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

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
pub fn memory_request(container: &Container) -> Result<i64, QosError> {
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
