//! The runtime manager's decisions (upstream `pkg/kubelet/kuberuntime`): given a pod's spec and
//! what the runtime reports about it, what must be killed, created and started
//! ([`compute_pod_actions`]), and when a restart or an image pull has to wait ([`Backoff`]).
//! Everything here is pure: no I/O, no clock; the pod workers call it and carry the plan out
//! through the CRI.
//!
//! Also the translation of a pod into CRI configs (`sandbox_config` with the pod's resolver from
//! `dns`, `container_config`, `env` with what it reads of the cluster, `security_context`, with
//! the pods' user namespaces from `userns`)
//! and, over the CRI, carrying a plan out (`manager`, `images` with the registry credentials of
//! `credentials`, the pod's runtime handler from its
//! RuntimeClass in `runtime_class`), and collecting what the runtime
//! no longer needs: dead containers, sandboxes and pod logs (`gc`), unused images (`image_gc`).
//! At start, the runtime's own cgroup driver over the configuration's (`cgroup_driver`). When a
//! whole pod is killed, sidecars outlive its main containers and stop in reverse order
//! (`termination_order`).
//!
//! Not here: probing itself (its results come in through [`ContainerProbeResults`]), pod status
//! (`status`), cgroups and OOM scores (`cm`).

mod actions;
mod backoff;
pub mod cgroup_driver;
pub mod container_config;
pub mod credentials;
pub mod dns;
pub mod env;
pub mod gc;
pub mod hooks;
pub mod image_gc;
pub mod image_pulls;
pub mod images;
mod init;
pub mod lifecycle;
pub mod manager;
pub mod mounts;
pub mod runtime_class;
pub mod sandbox_config;
pub mod security_context;
pub mod security_profiles;
pub mod termination_message;
pub mod termination_order;
pub mod userns;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

pub use actions::{ContainerToKill, KillReason, PodActions, RefusedEphemeral, compute_pod_actions};
pub use backoff::{
    Backoff, CRASH_LOOP_INITIAL, CRASH_LOOP_MAX, ContainerBackoffKey, CrashLoopBackoff,
    IMAGE_PULL_INITIAL, IMAGE_PULL_MAX, ImageBackoffKey, ImagePullBackoff, InBackoff,
    last_finished_at,
};
pub use lifecycle::{ContainerLifecycle, NoLifecycle};
pub use mounts::{ContainerMounts, MountsError, NoMounts};
// The pod facts the decisions are made of live in `pod`, below every loop; these keep the
// paths the runtime's callers have always used.
pub use crate::pod::{
    restart::should_container_be_restarted,
    sandbox::{SandboxChange, SandboxCheck, pod_sandbox_changed},
    spec,
};

// The probe results' types are the prober's (as upstream's `proberesults`), re-exported for the
// decisions' callers.
use crate::container::ContainerId;
pub use crate::prober::{ContainerProbeResults, ProbeOutcome};

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
