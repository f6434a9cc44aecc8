//! The runtime manager's decisions (upstream `pkg/kubelet/kuberuntime`): given a pod's spec and
//! what the runtime reports about it, what must be killed, created and started
//! ([`compute_pod_actions`]), and when a restart or an image pull has to wait ([`Backoff`]).
//! Everything here is pure: no I/O, no clock; the pod workers call it and carry the plan out
//! through the CRI.
//!
//! Also the translation of a pod into CRI configs (`sandbox_config`, `container_config`, `env`,
//! `security_context`, with the pods' user namespaces from `userns`)
//! and, over the CRI, carrying a plan out (`manager`, `images`), and collecting what the runtime
//! no longer needs: dead containers, sandboxes and pod logs (`gc`), unused images (`image_gc`).
//!
//! Not here: probing itself (its results come in through [`ContainerProbeResults`]), pod status
//! (`status`), cgroups and OOM scores (`cm`).

mod actions;
mod backoff;
pub mod container_config;
pub mod env;
pub mod gc;
pub mod hooks;
pub mod image_gc;
pub mod images;
mod init;
pub mod lifecycle;
pub mod manager;
pub mod mounts;
mod sandbox;
pub mod sandbox_config;
pub mod security_context;
pub mod security_profiles;
pub mod spec;
pub mod userns;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

pub use actions::{
    ContainerToKill, KillReason, PodActions, compute_pod_actions, should_container_be_restarted,
};
pub use backoff::{
    Backoff, CRASH_LOOP_INITIAL, CRASH_LOOP_MAX, ContainerBackoffKey, CrashLoopBackoff,
    IMAGE_PULL_INITIAL, IMAGE_PULL_MAX, ImageBackoffKey, ImagePullBackoff, InBackoff,
    last_finished_at,
};
pub use lifecycle::{ContainerLifecycle, NoLifecycle};
pub use mounts::{ContainerMounts, MountsError, NoMounts};
pub use sandbox::{SandboxChange, SandboxCheck, pod_sandbox_changed};

use crate::container::ContainerId;

/// The settled result of a probe (upstream `proberesults.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    Failure,
}

/// The probe results the decisions depend on, per container instance (upstream the liveness and
/// startup `proberesults.Manager`s). `None` means no result yet.
pub trait ContainerProbeResults {
    /// A failed liveness probe gets the container killed and, unless `restartPolicy: Never`,
    /// restarted.
    fn liveness(&self, id: &ContainerId) -> Option<ProbeOutcome>;
    /// A failed startup probe gets the container killed; a sidecar with a startup probe holds the
    /// next init container back until it succeeds.
    fn startup(&self, id: &ContainerId) -> Option<ProbeOutcome>;
}

/// For pods before the probe manager exists: nothing ever fails, and every startup probe counts
/// as passed so that a sidecar with one does not hold its pod back forever.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbes;

impl ContainerProbeResults for NoProbes {
    fn liveness(&self, _: &ContainerId) -> Option<ProbeOutcome> {
        None
    }

    fn startup(&self, _: &ContainerId) -> Option<ProbeOutcome> {
        Some(ProbeOutcome::Success)
    }
}
