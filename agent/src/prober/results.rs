//! The settled probe results by container instance (upstream `prober/results.Manager`): one map
//! per probe kind, and a channel that carries every change to the sync loop.

use crate::lock::MutexExt as _;
use std::{collections::HashMap, sync::Mutex};

use tokio::sync::mpsc;

use super::ProbeKind;
use crate::container::{ContainerId, PodUid};

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

/// A result changed: the sync loop syncs the pod (upstream `results.Update`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub kind: ProbeKind,
    pub pod: PodUid,
    /// The container instance, as the status names it (`containerd://<id>`).
    pub container_id: String,
    pub outcome: ProbeOutcome,
}

pub struct ResultsManager {
    results: Mutex<HashMap<(ProbeKind, String), ProbeOutcome>>,
    updates: mpsc::UnboundedSender<ProbeUpdate>,
}

impl ResultsManager {
    /// The manager and the receiving end of its updates.
    pub fn new() -> (ResultsManager, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            ResultsManager {
                results: Mutex::new(HashMap::new()),
                updates: tx,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(ProbeKind, String), ProbeOutcome>> {
        self.results.lock_unpoisoned()
    }

    pub fn get(&self, kind: ProbeKind, container_id: &str) -> Option<ProbeOutcome> {
        self.lock().get(&(kind, container_id.to_owned())).copied()
    }

    /// Records `outcome`; only a change is sent on (upstream sends on change too, so a steady
    /// state costs the sync loop nothing).
    pub fn set(&self, kind: ProbeKind, pod: &PodUid, container_id: &str, outcome: ProbeOutcome) {
        let previous = self.lock().insert((kind, container_id.to_owned()), outcome);
        if previous != Some(outcome) {
            // The receiver goes only at shutdown; nothing is left to sync then.
            let _ = self.updates.send(ProbeUpdate {
                kind,
                pod: pod.clone(),
                container_id: container_id.to_owned(),
                outcome,
            });
        }
    }

    pub fn remove(&self, kind: ProbeKind, container_id: &str) {
        self.lock().remove(&(kind, container_id.to_owned()));
    }
}
