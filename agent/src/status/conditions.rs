//! The pod conditions the kubelet owns (upstream `pkg/kubelet/status/generate.go`):
//! `PodReadyToStartContainers`, `Initialized`, `Ready`, `ContainersReady`, `PodScheduled`.
//! Transition times and observed generations are stamped by the caller.

use k8s_openapi::api::core::v1::{ContainerStatus as ApiContainerStatus, Pod, PodCondition};

use super::PodPhase;
use crate::container::PodStatus;
use crate::pod::{sandbox::pod_sandbox_changed, spec};

pub const POD_SCHEDULED: &str = "PodScheduled";
pub const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
pub const INITIALIZED: &str = "Initialized";
pub const READY: &str = "Ready";
pub const CONTAINERS_READY: &str = "ContainersReady";

/// Condition types the kubelet generates; others (`DisruptionTarget`, readiness gates) are kept
/// from the previous status (upstream `PodConditionsByKubelet`).
pub fn owned_by_kubelet(condition_type: &str) -> bool {
    matches!(
        condition_type,
        POD_SCHEDULED
            | READY
            | INITIALIZED
            | CONTAINERS_READY
            | POD_READY_TO_START_CONTAINERS
            | "PodResizeInProgress"
            | "PodResizePending"
    )
}

fn condition(type_: &str, status: bool, reason: Option<&str>, message: String) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        message: (!message.is_empty()).then_some(message),
        ..PodCondition::default()
    }
}

/// Go prints a `[]string` as `[a b]`; the messages keep that form.
fn names(list: &[&str]) -> String {
    format!("[{}]", list.join(" "))
}

/// True once a sandbox with networking exists: exactly when no new sandbox is needed.
pub fn ready_to_start_containers(pod: &Pod, runtime: &PodStatus) -> PodCondition {
    let ready = pod_sandbox_changed(pod, runtime).change.is_none();
    condition(POD_READY_TO_START_CONTAINERS, ready, None, String::new())
}

fn find<'a>(statuses: &'a [ApiContainerStatus], name: &str) -> Option<&'a ApiContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// True when every init container succeeded (a sidecar: started), or a regular container has run.
pub fn initialized(pod: &Pod, statuses: &[ApiContainerStatus], phase: PodPhase) -> PodCondition {
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in spec::init_containers(pod) {
        match find(statuses, &c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) => {
                let done = if spec::is_sidecar(c) {
                    s.started == Some(true)
                } else {
                    s.ready
                };
                if !done {
                    incomplete.push(c.name.as_str());
                }
            }
        }
    }
    if phase == PodPhase::Succeeded && unknown.is_empty() {
        return condition(INITIALIZED, true, Some("PodCompleted"), String::new());
    }
    // A regular container that ran means initialization completed, even while sidecars restart.
    let regular_started = spec::containers(pod).iter().any(|c| {
        find(statuses, &c.name)
            .and_then(|s| s.state.as_ref())
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    });
    if regular_started {
        return condition(INITIALIZED, true, None, String::new());
    }
    let mut parts = Vec::new();
    if !unknown.is_empty() {
        parts.push(format!(
            "containers with unknown status: {}",
            names(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        parts.push(format!(
            "containers with incomplete status: {}",
            names(&incomplete)
        ));
    }
    if parts.is_empty() {
        return condition(INITIALIZED, true, None, String::new());
    }
    condition(
        INITIALIZED,
        false,
        Some("ContainersNotInitialized"),
        parts.join(", "),
    )
}

/// True when every sidecar and regular container is ready.
pub fn containers_ready(
    pod: &Pod,
    statuses: &[ApiContainerStatus],
    phase: PodPhase,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec::init_containers(pod)
        .iter()
        .filter(|c| spec::is_sidecar(c));
    for c in sidecars.chain(spec::containers(pod)) {
        match find(statuses, &c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
        }
    }
    match phase {
        PodPhase::Succeeded if unknown.is_empty() => {
            return condition(CONTAINERS_READY, false, Some("PodCompleted"), String::new());
        }
        // Containers of a failed pod may still be terminating: not ready.
        PodPhase::Failed => {
            return condition(CONTAINERS_READY, false, Some("PodFailed"), String::new());
        }
        _ => {}
    }
    let mut parts = Vec::new();
    if !unknown.is_empty() {
        parts.push(format!(
            "containers with unknown status: {}",
            names(&unknown)
        ));
    }
    if !unready.is_empty() {
        parts.push(format!(
            "containers with unready status: {}",
            names(&unready)
        ));
    }
    if parts.is_empty() {
        condition(CONTAINERS_READY, true, None, String::new())
    } else {
        condition(
            CONTAINERS_READY,
            false,
            Some("ContainersNotReady"),
            parts.join(", "),
        )
    }
}

/// Ready: containers ready and every readiness gate's condition (among `conditions`) True.
pub fn ready(
    pod: &Pod,
    conditions: &[PodCondition],
    statuses: &[ApiContainerStatus],
    phase: PodPhase,
) -> PodCondition {
    let containers = containers_ready(pod, statuses, phase);
    if containers.status != "True" {
        return PodCondition {
            type_: READY.to_owned(),
            ..containers
        };
    }
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or(&[]);
    let unmet: Vec<String> = gates
        .iter()
        .filter_map(|gate| {
            let gate_type = &gate.condition_type;
            match conditions.iter().find(|c| &c.type_ == gate_type) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{gate_type}\" does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{gate_type}\" is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    if unmet.is_empty() {
        condition(READY, true, None, String::new())
    } else {
        condition(
            READY,
            false,
            Some("ReadinessGatesNotReady"),
            unmet.join(", "),
        )
    }
}

/// The pod is on this node, so it was scheduled.
pub fn scheduled() -> PodCondition {
    condition(POD_SCHEDULED, true, None, String::new())
}
