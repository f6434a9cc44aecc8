//! Pod status generation (upstream `generateAPIPodStatus` in `pkg/kubelet/kubelet_pods.go` and
//! `pkg/kubelet/status/generate.go`): turns the runtime's view of a pod, the last start failures
//! ([`ReasonCache`]) and the probe results ([`ContainerReadiness`]) into the `v1.PodStatus` the
//! API server gets: phase, conditions, container statuses, IPs, QoS class, start time.
//!
//! Pure: the caller supplies the time and the node IP. The status manager ([`manager`]) keeps
//! what is generated and pushes it to the API server. Not here: probing (its results come in
//! through [`ContainerReadiness`]).

mod conditions;
mod containers;
mod generate;
pub mod manager;
mod phase;
mod reasons;
mod terminate;

#[cfg(test)]
mod tests;

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use conditions::{
    CONTAINERS_READY, INITIALIZED, POD_READY_TO_START_CONTAINERS, POD_SCHEDULED, READY,
    owned_by_kubelet,
};
pub use generate::{generate_api_pod_status, generate_terminal_api_pod_status};
pub use manager::{PodWithStatus, StatusManager};
pub use phase::{PodPhase, pod_phase};
pub use reasons::{MAX_ENTRIES, ReasonCache, StartFailure, StartFailureReason};
pub use terminate::terminated_status;

use crate::container::ContainerId;

/// Probe results for status (upstream the startup and readiness `proberesults.Manager`s). Only
/// asked about running containers.
pub trait ContainerReadiness {
    /// Whether the container has passed its startup probe (true when it has none).
    fn started(&self, pod: &Pod, container: &Container, id: &ContainerId) -> bool;
    /// Whether the started container passes its readiness probe (true when it has none).
    fn ready(&self, pod: &Pod, container: &Container, id: &ContainerId) -> bool;
}

/// For tests of status generation without probes: a container is started and ready as soon as
/// it runs (the agent asks the probe manager).
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RunningIsReady;

#[cfg(test)]
impl ContainerReadiness for RunningIsReady {
    fn started(&self, _: &Pod, _: &Container, _: &ContainerId) -> bool {
        true
    }

    fn ready(&self, _: &Pod, _: &Container, _: &ContainerId) -> bool {
        true
    }
}

/// An API timestamp; `None` for times the API cannot represent.
fn api_time(t: SystemTime) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::try_from(t).ok().map(Time)
}
