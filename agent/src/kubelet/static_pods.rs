//! What the kubelet runs of its static pods, for their mirror pods on the API server (the
//! sources' `StaticPods`): upstream reads the same from its pod manager and pod workers — the
//! mirror pod of a static pod is made in its `SyncPod` (so only for the started, syncing one of
//! its full name), an orphan mirror pod is one whose full name no static pod in the pod
//! manager has, and one whose static pod is still terminating is left alone
//! (`IsPodForMirrorPodTerminatingByFullName`).
//!
//! Not here: the mirror pods themselves (`sources/apiserver/mirror_pods.rs`).

use std::sync::atomic::Ordering;

use super::Kubelet;
use crate::{
    pod::{full_name, spec::is_static_pod},
    pod_workers::{WorkerPhase, is_terminal_phase},
    sources::StaticPods,
};

impl Kubelet {
    /// The static pods as their mirror pods need them; `None` until the pod manager holds every
    /// source's first complete set (before, every mirror pod would look like an orphan).
    pub fn static_pods(&self) -> Option<StaticPods> {
        if !self.sources_complete.load(Ordering::Acquire) {
            return None;
        }
        let rejected = self.rejected().clone();
        let mut out = StaticPods::default();
        for pod in self.pods.pods() {
            if is_static_pod(&pod) {
                out.wanted.insert(full_name(&pod));
            }
        }
        for (name, (uid, phase)) in self.workers.started_static_pods() {
            match phase {
                WorkerPhase::Syncing => {
                    if let Some(pod) = self.pods.get(&uid)
                        && is_static_pod(&pod)
                        && !rejected.contains(&uid)
                        && !is_terminal_phase(&pod)
                    {
                        out.running.push(pod);
                    }
                }
                WorkerPhase::Terminating => {
                    out.terminating.insert(name);
                }
                WorkerPhase::Terminated | WorkerPhase::Finished => {}
            }
        }
        out.running.sort_by_key(|p| full_name(p));
        Some(out)
    }
}
