//! Whether a pod needs a new sandbox, and with which attempt number (upstream
//! `pkg/kubelet/kuberuntime/util.PodSandboxChanged`). Shared by `kuberuntime::compute_pod_actions`
//! and by the status generator, whose `PodReadyToStartContainers` condition is exactly "no new
//! sandbox is needed".

use std::fmt;

use k8s_openapi::api::core::v1::Pod;

use super::spec;
use crate::container::{PodStatus, SandboxState};

/// Why the pod's sandbox has to be (re)created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxChange {
    /// The runtime has no sandbox for the pod: a new pod, or everything was removed.
    NoSandbox,
    /// More than one sandbox is ready; they are all replaced by one.
    MultipleReady,
    /// The newest sandbox is not ready (it died, or the node rebooted).
    NotReady,
    /// The sandbox's network namespace mode no longer matches `hostNetwork`.
    NetworkChanged,
    /// A pod-network sandbox without an IP address.
    NoIp,
}

impl fmt::Display for SandboxChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxChange::NoSandbox => "no sandbox for the pod can be found",
            SandboxChange::MultipleReady => "multiple sandboxes are ready",
            SandboxChange::NotReady => "the pod sandbox is not ready",
            SandboxChange::NetworkChanged => "the pod sandbox's network namespace changed",
            SandboxChange::NoIp => "the pod sandbox has no IP address",
        })
    }
}

/// The verdict on a pod's sandboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxCheck {
    /// `Some` when a new sandbox is needed.
    pub change: Option<SandboxChange>,
    /// The attempt number for a new sandbox (one above the highest seen), or the current one's.
    pub attempt: u32,
    /// The newest sandbox, which a new one replaces (`None` when there is none, and on a network
    /// mode change, where upstream does not report it either).
    pub sandbox_id: Option<String>,
}

/// Decides whether `pod` needs a new sandbox given the runtime's view (`status.sandboxes`,
/// newest first).
pub fn pod_sandbox_changed(pod: &Pod, status: &PodStatus) -> SandboxCheck {
    let Some(newest) = status.sandboxes.first() else {
        return SandboxCheck {
            change: Some(SandboxChange::NoSandbox),
            attempt: 0,
            sandbox_id: None,
        };
    };
    let max_attempt = status
        .sandboxes
        .iter()
        .map(|s| s.attempt)
        .max()
        .unwrap_or(0);
    let ready = status
        .sandboxes
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    let host_network = spec::host_network(pod);
    let change = if ready > 1 {
        Some(SandboxChange::MultipleReady)
    } else if newest.state != SandboxState::Ready {
        Some(SandboxChange::NotReady)
    } else if newest.host_network != host_network {
        Some(SandboxChange::NetworkChanged)
    } else if !host_network && newest.ips.is_empty() {
        Some(SandboxChange::NoIp)
    } else {
        None
    };
    SandboxCheck {
        change,
        attempt: if change.is_some() {
            max_attempt.saturating_add(1)
        } else {
            max_attempt
        },
        sandbox_id: (change != Some(SandboxChange::NetworkChanged)).then(|| newest.id.clone()),
    }
}
