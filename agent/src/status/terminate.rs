//! The status a pod ends with (upstream `status_manager.go` `TerminatePod`, run as
//! `SyncTerminatedPod` ends): the runtime can have lost a container (garbage collection, an
//! admin, a restart of the node), and a pod deleted while it started has containers that never
//! ran, so every container without a terminated state is reported terminated with an unknown
//! status (exit 137: not a success), and an API pod's phase becomes terminal (Pending or Running
//! become Failed). Without it a pod deleted before its containers ran would stay Pending — and
//! `Terminating` on the API server for ever, since the final DELETE waits for a terminal phase.
//!
//! Regular containers are changed only once the pod has initialized (`hasPodInitialized`); of
//! the init containers, all but the trailing ones that never started (always at least the
//! first), as upstream's `initializedContainers`. Static pods keep their phase, as upstream's.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};

use crate::pod::spec;

const UNKNOWN_REASON: &str = "ContainerStatusUnknown";
const UNKNOWN_MESSAGE: &str = "The container could not be located when the pod was terminated";
const UNKNOWN_EXIT_CODE: i32 = 137;

/// `status` made final for `pod`, whose termination is complete.
pub fn terminated_status(pod: &Pod, mut status: PodStatus) -> PodStatus {
    if has_initialized(pod, &status) {
        for c in status.container_statuses.iter_mut().flatten() {
            mark_unknown(c);
        }
    }
    if let Some(inits) = status.init_container_statuses.as_mut() {
        let attempted = attempted_len(inits);
        for c in inits.iter_mut().take(attempted) {
            mark_unknown(c);
        }
    }
    if !spec::is_static_pod(pod) && !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        status.phase = Some("Failed".to_owned());
    }
    status
}

fn mark_unknown(c: &mut ContainerStatus) {
    if c.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
        return;
    }
    c.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(UNKNOWN_REASON.to_owned()),
            message: Some(UNKNOWN_MESSAGE.to_owned()),
            exit_code: UNKNOWN_EXIT_CODE,
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
}

fn waiting(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.waiting.is_some())
}

fn ever_exited(c: &ContainerStatus) -> bool {
    c.last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
}

/// How many init container statuses, from the first, have attempted to start: all but the
/// trailing ones still waiting for their first start, and at least one.
fn attempted_len(inits: &[ContainerStatus]) -> usize {
    match inits.iter().rposition(|c| !waiting(c) || ever_exited(c)) {
        Some(last) => last + 1,
        None => inits.len().min(1),
    }
}

/// Upstream `hasPodInitialized`: no init containers, a regular container that left waiting, or
/// the last init container done (exit 0) or, a sidecar, started.
fn has_initialized(pod: &Pod, status: &PodStatus) -> bool {
    let inits = spec::init_containers(pod);
    if inits.is_empty() {
        return true;
    }
    if status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| ever_exited(c) || !waiting(c))
    {
        return true;
    }
    let Some(last) = status
        .init_container_statuses
        .as_ref()
        .and_then(|s| s.last())
    else {
        return false;
    };
    let Some(container) = inits.iter().find(|c| c.name == last.name) else {
        return false;
    };
    if spec::is_sidecar(container) {
        return last.state.as_ref().is_some_and(|s| s.running.is_some())
            && last.started == Some(true);
    }
    let exited_ok = |s: Option<&ContainerState>| {
        s.and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    };
    exited_ok(last.last_state.as_ref()) || exited_ok(last.state.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerStateWaiting;

    fn state_waiting() -> Option<ContainerState> {
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..ContainerState::default()
        })
    }

    fn exited(code: i32) -> Option<ContainerState> {
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        })
    }

    fn status(name: &str, state: Option<ContainerState>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state,
            ..ContainerStatus::default()
        }
    }

    fn exit_of(c: &ContainerStatus) -> Option<(i32, Option<String>)> {
        let t = c.state.as_ref()?.terminated.as_ref()?;
        Some((t.exit_code, t.reason.clone()))
    }

    #[test]
    fn a_pod_deleted_before_its_container_ran_ends_failed_with_an_unknown_exit() {
        let pod = crate::testing::pod()
            .named("default", "hasty", "u1")
            .container(crate::testing::container("main"))
            .build();
        let pending = PodStatus {
            phase: Some("Pending".into()),
            container_statuses: Some(vec![status("main", state_waiting())]),
            ..PodStatus::default()
        };
        let done = terminated_status(&pod, pending);
        assert_eq!(done.phase.as_deref(), Some("Failed"));
        let main = &done.container_statuses.unwrap_or_default()[0];
        assert_eq!(
            exit_of(main),
            Some((137, Some("ContainerStatusUnknown".into())))
        );
    }

    #[test]
    fn what_exited_keeps_its_exit_and_a_terminal_phase_stays() {
        let pod = crate::testing::pod()
            .named("default", "done", "u1")
            .container(crate::testing::container("main"))
            .build();
        let succeeded = PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![status("main", exited(0))]),
            ..PodStatus::default()
        };
        let done = terminated_status(&pod, succeeded.clone());
        assert_eq!(done, succeeded);
    }

    #[test]
    fn init_containers_that_never_started_after_the_first_stay_waiting() {
        let pod = crate::testing::pod()
            .named("default", "init", "u1")
            .init_containers(vec![
                crate::testing::container("i1"),
                crate::testing::container("i2"),
                crate::testing::container("i3"),
            ])
            .container(crate::testing::container("main"))
            .build();
        let initializing = PodStatus {
            phase: Some("Pending".into()),
            init_container_statuses: Some(vec![
                status("i1", exited(0)),
                status("i2", Some(ContainerState::default())),
                status("i3", state_waiting()),
            ]),
            container_statuses: Some(vec![status("main", state_waiting())]),
            ..PodStatus::default()
        };
        let done = terminated_status(&pod, initializing);
        assert_eq!(done.phase.as_deref(), Some("Failed"));
        let inits = done.init_container_statuses.unwrap_or_default();
        assert_eq!(exit_of(&inits[0]), Some((0, None)));
        assert_eq!(exit_of(&inits[1]).map(|e| e.0), Some(137));
        assert!(waiting(&inits[2]), "never attempted: {:?}", inits[2]);
        // The pod never initialized: its regular container never ran and stays waiting.
        assert!(waiting(&done.container_statuses.unwrap_or_default()[0]));
    }

    #[test]
    fn a_static_pod_keeps_its_phase() {
        let pod = crate::testing::pod()
            .named("kube-system", "etcd", "u1")
            .annotation(spec::CONFIG_SOURCE_ANNOTATION, "file")
            .container(crate::testing::container("main"))
            .build();
        let running = PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![status("main", state_waiting())]),
            ..PodStatus::default()
        };
        let done = terminated_status(&pod, running);
        assert_eq!(done.phase.as_deref(), Some("Running"));
        assert_eq!(
            exit_of(&done.container_statuses.unwrap_or_default()[0]).map(|e| e.0),
            Some(137)
        );
    }
}
