//! What one sync of a pod must do to the runtime (upstream `computePodActions` in
//! `kuberuntime_manager.go`): kill the pod, (re)create its sandbox, start init containers and
//! sidecars, start or restart regular containers, kill containers that must go. A pure function of
//! the spec, the runtime's view and the probe results; the caller executes the plan and applies
//! the crash-loop back-off ([`super::Backoff::check_restart`]) to each start.
//!
//! Ephemeral containers (`kubectl debug`) are started once each, before the init containers and
//! even while the pod initializes, and never restarted; adding one changes no other container's
//! hash, so it is an update of the running pod, not a recreation.
//!
//! Not supported: in-place resize (a changed `resources`, like any change to a container's spec,
//! kills and recreates the container).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    ContainerProbeResults, ProbeOutcome, SandboxChange, init::compute_init_container_actions,
    pod_sandbox_changed,
};
use crate::{
    container::{ContainerId, ContainerState, ContainerStatus, PodStatus, container_hash},
    pod::{
        restart::{exit_code, should_container_be_restarted},
        spec::{self, RestartPolicy},
    },
};

/// Why a running container is killed; the grace period depends on it (a probe can carry its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec changed (upstream leaves the reason empty).
    SpecChanged,
    LivenessProbe,
    StartupProbe,
    /// The runtime reports it in an unknown state: it is killed before being started again so
    /// that two instances never run at once.
    UnknownState,
}

/// A container instance to stop before anything is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    pub id: ContainerId,
    /// The spec container's name.
    pub name: String,
    pub reason: KillReason,
    /// For the `Killing` event, e.g. "Container app failed liveness probe, will be restarted".
    pub message: String,
}

/// The plan for one sync of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod (before creating a new sandbox, or because
    /// nothing should run any more).
    pub kill_pod: bool,
    /// Create a new sandbox (after the kill), then start from the first init container.
    pub create_sandbox: bool,
    /// Why a new sandbox is needed, when it is.
    pub sandbox_change: Option<SandboxChange>,
    /// The current (or replaced) sandbox.
    pub sandbox_id: Option<String>,
    /// Attempt number for a new sandbox, else the current sandbox's.
    pub attempt: u32,
    /// Indexes into `spec.initContainers`, in spec order: the next init container to run and the
    /// sidecars to (re)start. Upstream runs them in this order and stops at the first failing
    /// non-sidecar.
    pub init_containers_to_start: Vec<usize>,
    /// Indexes into `spec.containers`, in spec order.
    pub containers_to_start: Vec<usize>,
    /// Instances to stop first (each id at most once).
    pub containers_to_kill: Vec<ContainerToKill>,
    /// Indexes into `spec.ephemeralContainers`, in spec order: those the runtime has no
    /// instance of yet (upstream `EphemeralContainersToStart`).
    pub ephemeral_containers_to_start: Vec<usize>,
    /// Ephemeral containers that will not be started, with why.
    pub ephemeral_containers_refused: Vec<RefusedEphemeral>,
}

/// An ephemeral container the agent refuses to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedEphemeral {
    /// Its index in `spec.ephemeralContainers`.
    pub index: usize,
    pub name: String,
    /// For the warning event and the log.
    pub message: String,
}

impl PodActions {
    /// Whether the sync has nothing to do.
    pub fn is_noop(&self) -> bool {
        !self.kill_pod
            && !self.create_sandbox
            && self.init_containers_to_start.is_empty()
            && self.containers_to_start.is_empty()
            && self.containers_to_kill.is_empty()
            && self.ephemeral_containers_to_start.is_empty()
            && self.ephemeral_containers_refused.is_empty()
    }

    pub(super) fn kill(&mut self, instance: &ContainerStatus, reason: KillReason, message: String) {
        self.containers_to_kill.retain(|k| k.id != instance.id);
        self.containers_to_kill.push(ContainerToKill {
            id: instance.id.clone(),
            name: instance.name.clone(),
            reason,
            message,
        });
    }
}

/// Computes what to do for `pod` given the runtime's view of it and the probe results.
pub fn compute_pod_actions(
    pod: &Pod,
    status: &PodStatus,
    probes: &dyn ContainerProbeResults,
) -> PodActions {
    let sandbox = pod_sandbox_changed(pod, status);
    let create = sandbox.change.is_some();
    let mut actions = PodActions {
        kill_pod: create,
        create_sandbox: create,
        sandbox_change: sandbox.change,
        sandbox_id: sandbox.sandbox_id,
        attempt: sandbox.attempt,
        ..PodActions::default()
    };
    if create {
        plan_new_sandbox(pod, status, &mut actions);
        return actions;
    }

    // Ephemeral containers may start while the pod initializes.
    plan_ephemeral_containers(pod, status, &mut actions);
    let initialized = compute_init_container_actions(pod, status, probes, &mut actions);
    if actions.kill_pod {
        // A pod that is killed gets nothing new.
        actions.ephemeral_containers_to_start.clear();
    }
    if actions.kill_pod || !initialized {
        // Initialization failed or is still in progress: regular containers wait.
        return actions;
    }

    let mut keep = 0_usize;
    for (index, container) in spec::containers(pod).iter().enumerate() {
        let latest = status.latest(&container.name);
        let Some(running) = latest.filter(|c| c.state == ContainerState::Running) else {
            if should_container_be_restarted(container, pod, status) {
                actions.containers_to_start.push(index);
                if let Some(unknown) = latest.filter(|c| c.state == ContainerState::Unknown) {
                    actions.kill(
                        unknown,
                        KillReason::UnknownState,
                        "Container is in \"unknown\" state, try killing it before restart".into(),
                    );
                }
            }
            continue;
        };
        let name = &container.name;
        let mut restart = spec::container_restart_policy(pod, container) != RestartPolicy::Never;
        let (reason, message) = if running.hash != container_hash(container) {
            // A changed spec is applied whatever the restart policy says.
            restart = true;
            (
                KillReason::SpecChanged,
                format!("Container {name} definition changed"),
            )
        } else if probes.liveness(&running.id) == Some(ProbeOutcome::Failure) {
            (
                KillReason::LivenessProbe,
                format!("Container {name} failed liveness probe"),
            )
        } else if probes.startup(&running.id) == Some(ProbeOutcome::Failure) {
            (
                KillReason::StartupProbe,
                format!("Container {name} failed startup probe"),
            )
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            actions.containers_to_start.push(index);
            format!("{message}, will be restarted")
        } else {
            message
        };
        actions.kill(running, reason, message);
    }

    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
        // Sidecars alone must not keep a finished pod alive, nor may debuggers.
        actions.init_containers_to_start.clear();
        actions.ephemeral_containers_to_start.clear();
    }
    actions
}

/// The ephemeral containers to start (upstream `computePodActions`: one with no status yet is
/// started, one that has any is never started again; none once the pod is being deleted, as
/// upstream's terminating pods are no longer synced). The API server keeps names unique across
/// all of a pod's containers, but the agent does not rely on it: an ephemeral container named
/// like a regular or init container, or like an earlier ephemeral one, would be taken for it
/// (its status, its kills, its logs), so it is refused.
fn plan_ephemeral_containers(pod: &Pod, status: &PodStatus, actions: &mut PodActions) {
    if spec::is_deleted(pod) {
        return;
    }
    let mut names: HashSet<&str> = spec::containers(pod)
        .iter()
        .chain(spec::init_containers(pod))
        .map(|c| c.name.as_str())
        .collect();
    for (index, ephemeral) in spec::ephemeral_containers(pod).iter().enumerate() {
        let name = ephemeral.name.as_str();
        if !names.insert(name) {
            actions.ephemeral_containers_refused.push(RefusedEphemeral {
                index,
                name: name.to_owned(),
                message: format!(
                    "ephemeral container {name:?} (spec.ephemeralContainers[{index}]) is not started: its name is already another container's in the pod"
                ),
            });
            continue;
        }
        if status.latest(name).is_none() {
            actions.ephemeral_containers_to_start.push(index);
        }
    }
}

/// The pod needs a new sandbox: everything restarts from the first init container, unless the
/// pod is done and should not run again.
fn plan_new_sandbox(pod: &Pod, status: &PodStatus, actions: &mut PodActions) {
    let policy = spec::restart_policy(pod);
    // A `Never` pod whose containers already ran is not given a second sandbox; with no
    // container at all, sandbox creation itself failed before and is retried.
    if policy == RestartPolicy::Never && actions.attempt != 0 && !status.containers.is_empty() {
        actions.create_sandbox = false;
        return;
    }
    let to_start: Vec<usize> = spec::containers(pod)
        .iter()
        .enumerate()
        .filter(|(_, c)| !(policy == RestartPolicy::OnFailure && container_succeeded(c, status)))
        .map(|(i, _)| i)
        .collect();
    if to_start.is_empty() && any_regular_container_created(pod, status) {
        // Initialized and nothing left to run: just kill what remains.
        actions.create_sandbox = false;
        return;
    }
    if spec::init_containers(pod).is_empty() {
        actions.containers_to_start = to_start;
    } else {
        actions.init_containers_to_start = vec![0];
    }
}

fn container_succeeded(container: &Container, status: &PodStatus) -> bool {
    status
        .latest(&container.name)
        .is_some_and(|c| c.state == ContainerState::Exited && exit_code(c) == 0)
}

/// Whether any regular container has an instance, which means initialization completed once.
fn any_regular_container_created(pod: &Pod, status: &PodStatus) -> bool {
    spec::containers(pod).iter().any(|c| {
        status.latest(&c.name).is_some_and(|s| {
            matches!(
                s.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
}
