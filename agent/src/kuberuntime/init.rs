//! Init containers and sidecars (upstream `computeInitContainerActions` in
//! `kuberuntime_container.go`): start the next init container once the previous one succeeded or,
//! for a sidecar, started; keep sidecars running (restart them when they exit, fail a probe or
//! change spec); and tell whether the pod is initialized, so regular containers may start.
//!
//! The walk goes backwards through `spec.initContainers`: completed init containers may have been
//! garbage-collected, so the furthest one the runtime still knows says how far initialization
//! got.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    ContainerProbeResults, KillReason, PodActions, ProbeOutcome,
    spec::{self, RestartPolicy},
};
use crate::{
    container::{ContainerState, ContainerStatus, PodStatus, container_hash},
    pod::restart::exit_code,
};

/// Adds the init-container part of the plan to `actions`; returns whether the pod is initialized.
/// Sets `actions.kill_pod` when a failed init container must not be retried.
pub(super) fn compute_init_container_actions(
    pod: &Pod,
    status: &PodStatus,
    probes: &dyn ContainerProbeResults,
    actions: &mut PodActions,
) -> bool {
    let inits = spec::init_containers(pod);
    if inits.is_empty() {
        return true;
    }
    // A created or running regular container means initialization finished once, even if the
    // runtime has since forgotten the init containers. Exited ones do not count: after a
    // reboot every container is exited and the new sandbox must initialize again.
    let mut initialized = spec::containers(pod).iter().any(|c| {
        status
            .latest(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously_initialized = initialized;
    let restart_on_failure = spec::restart_policy(pod) != RestartPolicy::Never;
    let last = inits.len() - 1;
    // Collected backwards, reversed at the end.
    let mut to_start = Vec::new();

    for (i, container) in inits.iter().enumerate().rev() {
        let sidecar = spec::is_sidecar(container);
        let Some(latest) = status.latest(&container.name) else {
            // Its instance was removed; a sidecar of an initialized pod must run again.
            if previously_initialized && sidecar {
                to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match latest.state {
            // Created but never started: most likely the runtime failed to start it.
            ContainerState::Created => to_start.push(i),
            ContainerState::Running if sidecar => {
                let at = Position {
                    index: i,
                    last,
                    previously_initialized,
                };
                initialized |=
                    running_sidecar(at, container, latest, probes, actions, &mut to_start);
            }
            // A running init container: wait for it to finish.
            ContainerState::Running => {}
            ContainerState::Exited if sidecar => to_start.push(i),
            ContainerState::Exited => {
                if init_container_failed(latest) {
                    if !restart_on_failure {
                        return fail_pod(actions);
                    }
                    to_start.push(i);
                } else if i == last {
                    initialized = true;
                } else {
                    to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                if !sidecar && !restart_on_failure {
                    return fail_pod(actions);
                }
                actions.kill(
                    latest,
                    KillReason::UnknownState,
                    "Init container is in \"unknown\" state, try killing it before restart".into(),
                );
                to_start.push(i);
            }
        }
        previously_initialized = true;
    }

    if !previously_initialized {
        // No init container has run yet.
        to_start.push(0);
    }
    to_start.reverse();
    actions.init_containers_to_start = to_start;
    initialized
}

/// Where a container stands in the backwards walk.
#[derive(Clone, Copy)]
struct Position {
    index: usize,
    last: usize,
    previously_initialized: bool,
}

/// A running sidecar gates the next init container until its startup probe passes, and is
/// restarted when it fails a probe or its spec changed. Returns whether it completes the pod's
/// initialization (the last init container, started).
fn running_sidecar(
    at: Position,
    container: &Container,
    latest: &ContainerStatus,
    probes: &dyn ContainerProbeResults,
    actions: &mut PodActions,
    to_start: &mut Vec<usize>,
) -> bool {
    let name = &container.name;
    let i = at.index;
    if container.startup_probe.is_some() {
        match probes.startup(&latest.id) {
            // Not started yet: the next init container waits.
            None => return false,
            Some(ProbeOutcome::Failure) => {
                actions.kill(
                    latest,
                    KillReason::StartupProbe,
                    format!("Init container {name} failed startup probe"),
                );
                to_start.push(i);
                return false;
            }
            Some(ProbeOutcome::Success) => {}
        }
    }
    let initialized = i == at.last;
    if !initialized && !at.previously_initialized {
        // Started for the first time: the next init container may run.
        to_start.push(i + 1);
    }
    if latest.hash != container_hash(container) {
        actions.kill(
            latest,
            KillReason::SpecChanged,
            format!("Init container {name} definition changed"),
        );
        to_start.push(i);
        return initialized;
    }
    // Unlike startup, liveness does not gate the next init container.
    if container.liveness_probe.is_some()
        && probes.liveness(&latest.id) == Some(ProbeOutcome::Failure)
    {
        actions.kill(
            latest,
            KillReason::LivenessProbe,
            format!("Init container {name} failed liveness probe"),
        );
        to_start.push(i);
    }
    initialized
}

/// A failed init container with `restartPolicy: Never`: the pod is done.
fn fail_pod(actions: &mut PodActions) -> bool {
    actions.kill_pod = true;
    actions.init_containers_to_start.clear();
    false
}

/// Upstream `isInitContainerFailed`: OOM-killed, exited non-zero, or lost (unknown state).
fn init_container_failed(instance: &ContainerStatus) -> bool {
    instance.reason == "OOMKilled"
        || (instance.state == ContainerState::Exited && exit_code(instance) != 0)
        || instance.state == ContainerState::Unknown
}
