//! Container statuses for the API (upstream `convertToAPIContainerStatuses` in
//! `kubelet_pods.go`, and the `Started`/`Ready` part of the prober manager's `UpdatePodStatus`).
//!
//! Per spec container: the newest runtime instance gives `state`, the one before it `lastState`;
//! a container the runtime has not created yet waits as `ContainerCreating` (`PodInitializing`
//! in a pod with init containers); one whose last start failed waits with that failure's reason
//! from the [`ReasonCache`]. The previous API status fills what the runtime cannot know (restart
//! count and last state of a container that vanished).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus as ApiContainerStatus, Pod,
};

use super::{ContainerReadiness, ReasonCache, api_time};
use crate::container::{ContainerState, ContainerStatus, PodStatus};
use crate::pod::{restart::should_container_be_restarted, spec};

const CONTAINER_CREATING: &str = "ContainerCreating";
const POD_INITIALIZING: &str = "PodInitializing";
const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// What a lost container is reported to have exited with (SIGKILL).
const LOST_EXIT_CODE: i32 = 137;

/// The API statuses of `specs` (the init containers when `is_init`, else the regular ones).
pub(super) fn convert(
    pod: &Pod,
    runtime: &PodStatus,
    reasons: &ReasonCache,
    previous: &[ApiContainerStatus],
    specs: &[Container],
    is_init: bool,
) -> Vec<ApiContainerStatus> {
    let old: HashMap<&str, &ApiContainerStatus> =
        previous.iter().map(|s| (s.name.as_str(), s)).collect();
    let default_reason = if spec::init_containers(pod).is_empty() {
        CONTAINER_CREATING
    } else {
        POD_INITIALIZING
    };
    let mut statuses: Vec<ApiContainerStatus> = specs
        .iter()
        .map(|c| default_status(c, old.get(c.name.as_str()).copied(), default_reason))
        .collect();

    for (c, status) in specs.iter().zip(statuses.iter_mut()) {
        if runtime.latest(&c.name).is_none() {
            infer_vanished(
                pod,
                old.get(c.name.as_str()).copied(),
                status,
                default_reason,
            );
        }
    }

    // The newest instance is the state, the one before it the last state.
    for (c, status) in specs.iter().zip(statuses.iter_mut()) {
        let mut instances = runtime.instances(&c.name);
        if let Some(newest) = instances.next() {
            *status = from_runtime(newest, old.get(c.name.as_str()).copied());
            if let Some(previous) = instances.next() {
                status.last_state = from_runtime(previous, None).state;
            }
        }
    }

    // Containers that will be started again wait, with the reason their last start failed.
    for (c, status) in specs.iter().zip(statuses.iter_mut()) {
        let latest = runtime.latest(&c.name);
        let completed_init = is_init
            && latest.is_some_and(|l| {
                l.state == ContainerState::Exited && l.exit_code.unwrap_or(0) == 0
            });
        if completed_init || !should_container_be_restarted(c, pod, runtime) {
            continue;
        }
        let Some(failure) = reasons.get(&runtime.uid, &c.name) else {
            continue;
        };
        if status
            .state
            .as_ref()
            .is_some_and(|s| s.terminated.is_some())
        {
            status.last_state = status.state.take();
        }
        status.state = Some(waiting(
            failure.reason.as_str(),
            (!failure.message.is_empty()).then(|| failure.message.clone()),
        ));
    }

    if !is_init {
        // Regular containers are listed by name, init containers in spec order.
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
    }
    statuses
}

/// Fills `started` and `ready`: a running container has started once its startup probe passed,
/// and is ready once started and its readiness probe passed; an init container that is not a
/// sidecar is ready once it succeeded.
pub(super) fn apply_readiness(
    pod: &Pod,
    runtime: &PodStatus,
    readiness: &dyn ContainerReadiness,
    statuses: &mut [ApiContainerStatus],
    specs: &[Container],
) {
    for status in statuses {
        let Some(c) = specs.iter().find(|c| c.name == status.name) else {
            continue;
        };
        let running = running_instance(runtime, status);
        let started = running.is_some_and(|r| readiness.started(pod, c, &r.id));
        status.started = Some(started);
        let is_plain_init =
            spec::init_containers(pod).iter().any(|i| i.name == c.name) && !spec::is_sidecar(c);
        status.ready = if is_plain_init {
            let terminated = status.state.as_ref().and_then(|s| s.terminated.as_ref());
            terminated.is_some_and(|t| t.exit_code == 0)
        } else {
            started && running.is_some_and(|r| readiness.ready(pod, c, &r.id))
        };
    }
}

/// The runtime instance behind a running API status.
fn running_instance<'a>(
    runtime: &'a PodStatus,
    status: &ApiContainerStatus,
) -> Option<&'a ContainerStatus> {
    status.state.as_ref()?.running.as_ref()?;
    let id = status.container_id.as_deref()?;
    runtime.containers.iter().find(|i| {
        i.name == status.name && i.state == ContainerState::Running && i.id.to_string() == id
    })
}

fn waiting(reason: &str, message: Option<String>) -> ApiContainerState {
    ApiContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            message,
        }),
        ..ApiContainerState::default()
    }
}

/// Not created yet: waiting, keeping what the previous status knew.
fn default_status(
    c: &Container,
    old: Option<&ApiContainerStatus>,
    default_reason: &str,
) -> ApiContainerStatus {
    if let Some(old) = old.filter(|o| o.state.as_ref().is_some_and(|s| s.terminated.is_some())) {
        return old.clone();
    }
    ApiContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        state: Some(waiting(default_reason, None)),
        restart_count: old.map_or(0, |o| o.restart_count),
        last_state: old.and_then(|o| o.last_state.clone()),
        ..ApiContainerStatus::default()
    }
}

/// A container that was running and is now unknown to the runtime ended somehow: say so, rather
/// than showing it as never started (which would send the pod back to Pending).
fn infer_vanished(
    pod: &Pod,
    old: Option<&ApiContainerStatus>,
    status: &mut ApiContainerStatus,
    default_reason: &str,
) {
    let was_running = old
        .and_then(|o| o.state.as_ref())
        .is_some_and(|s| s.running.is_some() && s.terminated.is_none());
    let default_waiting = status
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
    let has_last_exit = status
        .last_state
        .as_ref()
        .is_some_and(|l| l.terminated.is_some());
    if !was_running || !default_waiting || has_last_exit {
        return;
    }
    status.last_state = Some(lost(
        "The container could not be located when the pod was deleted.  The container used to be Running",
    ));
    if !spec::is_deleted(pod) {
        status.restart_count = status.restart_count.saturating_add(1);
    }
}

fn lost(message: &str) -> ApiContainerState {
    ApiContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(CONTAINER_STATUS_UNKNOWN.to_owned()),
            message: Some(message.to_owned()),
            exit_code: LOST_EXIT_CODE,
            ..ContainerStateTerminated::default()
        }),
        ..ApiContainerState::default()
    }
}

/// One runtime instance as an API status.
fn from_runtime(c: &ContainerStatus, old: Option<&ApiContainerStatus>) -> ApiContainerStatus {
    let id = c.id.to_string();
    let mut status = ApiContainerStatus {
        name: c.name.clone(),
        restart_count: i32::try_from(c.restart_count).unwrap_or(i32::MAX),
        image: c.image.clone(),
        image_id: c.image_ref.clone(),
        container_id: Some(id.clone()),
        ..ApiContainerStatus::default()
    };
    status.state = Some(match c.state {
        ContainerState::Running => ApiContainerState {
            running: Some(ContainerStateRunning {
                started_at: c.started_at.and_then(api_time),
            }),
            ..ApiContainerState::default()
        },
        // Created but not running is waiting to run.
        ContainerState::Created => waiting("", None),
        ContainerState::Exited => {
            let exit_code = c.exit_code.unwrap_or(0);
            ApiContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code,
                    reason: Some(exit_reason(c, exit_code)),
                    message: (!c.message.is_empty()).then(|| c.message.clone()),
                    started_at: c.started_at.and_then(api_time),
                    finished_at: c.finished_at.and_then(api_time),
                    container_id: Some(id),
                    ..ContainerStateTerminated::default()
                }),
                ..ApiContainerState::default()
            }
        }
        // Lost after it was seen running: it terminated, it did not "never run".
        ContainerState::Unknown
            if old
                .and_then(|o| o.state.as_ref())
                .is_some_and(|s| s.running.is_some()) =>
        {
            status.restart_count = old.map_or(0, |o| o.restart_count).saturating_add(1);
            lost("The container could not be located when the pod was terminated")
        }
        ContainerState::Unknown => waiting("", None),
    });
    status
}

/// The runtime's reason, or the one containerd would have given.
fn exit_reason(c: &ContainerStatus, exit_code: i32) -> String {
    match (c.reason.as_str(), exit_code) {
        ("", 0) => "Completed".to_owned(),
        ("", _) => "Error".to_owned(),
        (reason, _) => reason.to_owned(),
    }
}
