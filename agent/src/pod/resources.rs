//! A pod's effective requests (upstream `component-helpers/resource.PodRequests`, the part the
//! kubelet's admission and the eviction ranking use): CPU in millis, memory in bytes.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::quantity::{self, QuantityError};

/// A container's request that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("container {container}: {source}")]
pub struct RequestError {
    pub container: String,
    #[source]
    pub source: QuantityError,
}

/// The pod's effective requests (upstream: the larger of the sum of regular containers and the
/// largest init container), CPU in millis and memory in bytes.
pub fn pod_requests(pod: &Pod) -> Result<(i64, i64), RequestError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let of = |c: &Container| -> Result<(i64, i64), RequestError> {
        let r = c.resources.clone().unwrap_or_default();
        let get = |key: &str| {
            r.requests
                .as_ref()
                .and_then(|m| m.get(key))
                .or_else(|| r.limits.as_ref().and_then(|m| m.get(key)))
                .map(|q| q.0.clone())
        };
        let bad = |source| RequestError {
            container: c.name.clone(),
            source,
        };
        let cpu = get("cpu")
            .map(|q| quantity::cpu_millis(&q))
            .transpose()
            .map_err(bad)?;
        let memory = get("memory")
            .map(|q| quantity::memory_bytes(&q))
            .transpose()
            .map_err(bad)?;
        Ok((cpu.unwrap_or(0), memory.unwrap_or(0)))
    };
    let mut cpu = 0;
    let mut memory = 0;
    for c in &spec.containers {
        let (c, m) = of(c)?;
        cpu += c;
        memory += m;
    }
    for c in spec.init_containers.iter().flatten() {
        let (c, m) = of(c)?;
        cpu = cpu.max(c);
        memory = memory.max(m);
    }
    Ok((cpu, memory))
}

/// A `spec.overhead` entry that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("spec.overhead[{resource}]: {source}")]
pub struct OverheadError {
    pub resource: &'static str,
    #[source]
    pub source: QuantityError,
}

/// The pod's `spec.overhead` (what its RuntimeClass costs beyond its containers), CPU in
/// millis and memory in bytes; upstream `PodRequests` adds it to the requests and `PodLimits`
/// to the limits that are set.
pub fn pod_overhead(pod: &Pod) -> Result<(i64, i64), OverheadError> {
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.as_ref());
    let of = |resource: &'static str, parse: fn(&str) -> Result<i64, QuantityError>| {
        overhead
            .and_then(|o| o.get(resource))
            .map(|q| parse(&q.0).map_err(|source| OverheadError { resource, source }))
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok((
        of("cpu", quantity::cpu_millis)?,
        of("memory", quantity::memory_bytes)?,
    ))
}
