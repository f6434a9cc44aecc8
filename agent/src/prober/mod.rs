//! Liveness, readiness and startup probes (upstream `pkg/kubelet/prober`): one worker task per
//! (pod, container, probe kind) runs its probe every period, applies the success and failure
//! thresholds and records the settled result per container instance ([`ResultsManager`]). A
//! change of a result goes to the sync loop, which syncs the pod: a failed liveness or startup
//! probe gets the container killed (`kuberuntime::compute_pod_actions` asks
//! [`ContainerProbeResults`], the trait the runtime decisions read), and readiness
//! becomes the containers' `ready` and the pod's Ready conditions when the status is generated
//! (through [`ContainerReadiness`](crate::status::ContainerReadiness)).
//!
//! The probe mechanisms (`exec` through CRI ExecSync, `httpGet`, `tcpSocket`, `grpc`) are in
//! [`probe`]; the HTTP GET is shared with the lifecycle hooks.

pub mod http;
mod manager;
pub mod metrics;
pub mod probe;
mod results;
mod worker;

#[cfg(test)]
mod tests;

pub use manager::{ProbeManager, ProbeTarget, TargetStatus};
pub use results::{ContainerProbeResults, ProbeOutcome, ProbeUpdate, ResultsManager};

/// Which probe (upstream `probeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// The `probe_type` label and the word in messages, as upstream.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The container's probe of this kind.
    pub fn of(
        self,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> Option<&k8s_openapi::api::core::v1::Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// What a new container instance starts with before its first settled probe: not ready,
    /// alive, and startup unknown (upstream `initialValue`).
    fn initial(self) -> Option<ProbeOutcome> {
        match self {
            ProbeKind::Readiness => Some(ProbeOutcome::Failure),
            ProbeKind::Liveness => Some(ProbeOutcome::Success),
            ProbeKind::Startup => None,
        }
    }
}
