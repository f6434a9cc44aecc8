//! The pod phase from its container statuses (upstream `getPhase` in `kubelet_pods.go`).
//!
//! Init containers that are not sidecars must all succeed first (pending until they have; a
//! failure with `restartPolicy: Never` fails the pod). Sidecars count as running containers but
//! never make a pod Failed or Succeeded. Then: any container still waiting keeps the pod Pending;
//! one running makes it Running; all stopped makes it Succeeded or Failed unless the restart
//! policy will start them again.

use std::fmt;

use k8s_openapi::api::core::v1::{ContainerStatus as ApiContainerStatus, Pod};

use crate::pod::spec::{self, RestartPolicy};

/// A pod's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            PodPhase::Pending => "Pending",
            PodPhase::Running => "Running",
            PodPhase::Succeeded => "Succeeded",
            PodPhase::Failed => "Failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }

    /// Succeeded and Failed are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

impl fmt::Display for PodPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Default)]
struct Counts {
    pending_init: usize,
    pending_sidecar: usize,
    failed_init: usize,
    unknown: usize,
    running: usize,
    waiting: usize,
    stopped: usize,
    succeeded: usize,
}

/// Computes the phase. `statuses` holds the init and regular container statuses;
/// `pod_is_terminal` says the pod worker has decided no container will run again;
/// `pod_has_initialized` says a regular container exists in the current sandbox (so restarting
/// sidecars do not push the pod back to Pending).
pub fn pod_phase(
    pod: &Pod,
    statuses: &[ApiContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> PodPhase {
    let find = |name: &str| statuses.iter().find(|s| s.name == name);
    let mut n = Counts::default();
    for c in spec::init_containers(pod) {
        let status = find(&c.name);
        let state = status.and_then(|s| s.state.as_ref());
        let last_exit = status
            .and_then(|s| s.last_state.as_ref())
            .and_then(|l| l.terminated.as_ref())
            .map(|t| t.exit_code);
        if spec::is_sidecar(c) {
            match state {
                None if status.is_none() => n.unknown += 1,
                Some(s) if s.running.is_some() => {
                    if status.and_then(|s| s.started) != Some(true) {
                        n.pending_sidecar += 1;
                    }
                    n.running += 1;
                }
                // A stopped sidecar says nothing about the pod's outcome.
                Some(s) if s.terminated.is_some() => {}
                Some(s) if s.waiting.is_some() => {
                    if last_exit.is_none() {
                        n.pending_sidecar += 1;
                        n.waiting += 1;
                    }
                }
                _ => {
                    n.pending_sidecar += 1;
                    n.unknown += 1;
                }
            }
            continue;
        }
        match state {
            Some(s) if s.running.is_some() => n.pending_init += 1,
            Some(s) if let Some(t) = &s.terminated => {
                if t.exit_code != 0 {
                    n.failed_init += 1;
                }
            }
            Some(s) if s.waiting.is_some() => match last_exit {
                Some(code) if code != 0 => n.failed_init += 1,
                Some(_) => {}
                None => n.pending_init += 1,
            },
            _ => n.pending_init += 1,
        }
    }
    for c in spec::containers(pod) {
        let status = find(&c.name);
        match status.and_then(|s| s.state.as_ref()) {
            _ if status.is_none() => n.unknown += 1,
            Some(s) if s.running.is_some() => n.running += 1,
            Some(s) if let Some(t) = &s.terminated => {
                n.stopped += 1;
                if t.exit_code == 0 {
                    n.succeeded += 1;
                }
            }
            Some(s) if s.waiting.is_some() => {
                let restarting = status
                    .and_then(|s| s.last_state.as_ref())
                    .is_some_and(|l| l.terminated.is_some());
                if restarting {
                    n.stopped += 1;
                } else {
                    n.waiting += 1;
                }
            }
            _ => n.unknown += 1,
        }
    }

    let policy = spec::restart_policy(pod);
    if n.failed_init > 0 && policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if n.pending_init > 0 || (n.pending_sidecar > 0 && !pod_has_initialized) || n.waiting > 0 {
        return PodPhase::Pending;
    }
    if n.running > 0 && n.unknown == 0 {
        return PodPhase::Running;
    }
    if n.running == 0 && n.stopped > 0 && n.unknown == 0 {
        // A terminal pod's containers will not restart whatever the policy says (static pods
        // excepted upstream, k/k#116484).
        if pod_is_terminal && !spec::is_static_pod(pod) {
            return if n.stopped == n.succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        return match policy {
            RestartPolicy::Always => PodPhase::Running,
            _ if n.stopped == n.succeeded => PodPhase::Succeeded,
            RestartPolicy::Never => PodPhase::Failed,
            RestartPolicy::OnFailure => PodPhase::Running,
        };
    }
    PodPhase::Pending
}
