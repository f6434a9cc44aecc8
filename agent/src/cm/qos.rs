//! OOM score adjustments (upstream `GetContainerOOMScoreAdjust` in `pkg/kubelet/qos/policy.go`).
//! Pure: the caller writes the result to `/proc/<pid>/oom_score_adj` (through the runtime). The
//! QoS class itself is a fact about the pod ([`crate::pod::qos`], re-exported here).

use std::num::NonZeroU64;

use k8s_openapi::api::core::v1::{Container, Pod};

pub use crate::pod::qos::{
    QosClass, QosError, compute_pod_qos, is_critical, is_node_critical, pod_qos,
};
use crate::pod::{qos::memory_request, spec};

/// OOM score adjustment of the kubelet itself (and so of swiftlet).
pub const KUBELET_OOM_SCORE_ADJ: i32 = -999;
/// Guaranteed containers and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
/// Best-effort containers: the first the kernel kills.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;

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
