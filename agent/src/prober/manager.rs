//! The probe manager (upstream `prober/prober_manager.go`): starts a worker for every probe of
//! a pod's containers and sidecars, stops them as the pod terminates or goes, and answers the
//! runtime manager and status generation from the recorded results.

use crate::lock::MutexExt as _;
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{
    ContainerProbeResults, ProbeKind, ProbeOutcome, ProbeUpdate, ResultsManager,
    metrics::ProberMetrics, worker::Worker,
};
use crate::{
    container::{ContainerId, PodUid},
    cri::RuntimeService,
    events::Events,
    pod::spec,
    status::{ContainerReadiness, StatusManager},
};

/// What a worker needs to know about its container (upstream reads the status manager's cache).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetStatus {
    /// The pod has succeeded or failed: its workers end.
    pub terminal: bool,
    pub pod_ip: Option<String>,
    /// The container's latest instance, once it exists.
    pub container: Option<TargetContainer>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetContainer {
    /// `containerd://<id>`.
    pub id: String,
    /// When it started, while it runs.
    pub running_since: Option<SystemTime>,
    pub terminated: bool,
    /// It passed its startup probe (or has none).
    pub started: bool,
}

/// Where workers read their pods' state.
pub trait ProbeTarget: Send + Sync {
    fn status(&self, pod: &PodUid, container: &str) -> Option<TargetStatus>;
}

/// The statuses the kubelet last generated, as upstream's workers read them.
impl ProbeTarget for StatusManager {
    fn status(&self, pod: &PodUid, container: &str) -> Option<TargetStatus> {
        let status = self.get(pod)?;
        let terminal = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let container = status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten())
            .find(|c| {
                c.name == container && c.container_id.as_deref().is_some_and(|id| !id.is_empty())
            })
            .map(|c| {
                let state = c.state.clone().unwrap_or_default();
                TargetContainer {
                    id: c.container_id.clone().unwrap_or_default(),
                    running_since: state.running.as_ref().map(|r| {
                        r.started_at
                            .as_ref()
                            .map_or(SystemTime::UNIX_EPOCH, |t| SystemTime::from(t.0))
                    }),
                    terminated: state.terminated.is_some(),
                    started: c.started == Some(true),
                }
            });
        Some(TargetStatus {
            terminal,
            pod_ip: status.pod_ip.clone(),
            container,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub pod: PodUid,
    pub container: String,
    pub kind: ProbeKind,
}

struct Handle {
    stop: CancellationToken,
    trigger: Arc<Notify>,
    /// Tells a worker from the one that replaced it under the same key.
    generation: u64,
}

pub(super) struct Shared {
    workers: Mutex<HashMap<Key, Handle>>,
    pub results: ResultsManager,
    pub runtime: Arc<dyn RuntimeService>,
    pub target: Arc<dyn ProbeTarget>,
    pub metrics: ProberMetrics,
    /// Failed probes are reported here (`Unhealthy`, `ProbeWarning`).
    pub events: Events,
    pub started_at: Instant,
    next_generation: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Handle>> {
        self.workers.lock_unpoisoned()
    }

    /// A worker that ended takes itself out, unless a newer one has taken its key.
    pub fn forget_worker(&self, key: &Key, generation: u64) {
        let mut workers = self.workers();
        if workers.get(key).is_some_and(|h| h.generation == generation) {
            workers.remove(key);
        }
    }
}

#[derive(Clone)]
pub struct ProbeManager {
    shared: Arc<Shared>,
}

impl ProbeManager {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        target: Arc<dyn ProbeTarget>,
        metrics: ProberMetrics,
        events: Events,
    ) -> (ProbeManager, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (results, updates) = ResultsManager::new();
        (
            ProbeManager {
                shared: Arc::new(Shared {
                    workers: Mutex::new(HashMap::new()),
                    results,
                    runtime,
                    target,
                    metrics,
                    events,
                    started_at: Instant::now(),
                    next_generation: std::sync::atomic::AtomicU64::new(0),
                }),
            },
            updates,
        )
    }

    /// Starts the missing workers of `pod`'s probes (upstream `AddPod`): regular containers and
    /// sidecars. Idempotent; a probe's spec is taken as it is at its worker's start.
    pub fn add_pod(&self, pod: &Arc<Pod>) {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let probed: Vec<&Container> = pod
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .chain(
                        s.init_containers
                            .iter()
                            .flatten()
                            .filter(|c| spec::is_sidecar(c)),
                    )
                    .collect()
            })
            .unwrap_or_default();
        let mut workers = self.shared.workers();
        for container in probed {
            for kind in ProbeKind::ALL {
                let Some(probe) = kind.of(container) else {
                    continue;
                };
                let key = Key {
                    pod: uid.clone(),
                    container: container.name.clone(),
                    kind,
                };
                if workers.contains_key(&key) {
                    continue;
                }
                let stop = CancellationToken::new();
                let trigger = Arc::new(Notify::new());
                let generation = self
                    .shared
                    .next_generation
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let worker = Worker::new(
                    key.clone(),
                    pod.clone(),
                    container.clone(),
                    probe.clone(),
                    self.shared.clone(),
                    stop.clone(),
                    trigger.clone(),
                    generation,
                );
                workers.insert(
                    key,
                    Handle {
                        stop,
                        trigger,
                        generation,
                    },
                );
                tokio::spawn(worker.run());
            }
        }
    }

    fn stop_where(&self, keep: impl Fn(&Key) -> bool) {
        for (key, handle) in self.shared.workers().iter() {
            if !keep(key) {
                handle.stop.cancel();
            }
        }
    }

    /// A terminating pod's containers are not restarted over a probe any more (upstream
    /// `StopLivenessAndStartup`); readiness goes on until the containers stop.
    pub fn stop_liveness_and_startup(&self, uid: &PodUid) {
        self.stop_where(|k| &k.pod != uid || k.kind == ProbeKind::Readiness);
    }

    /// Stops every worker of the pod; their results go with them (upstream `RemovePod`).
    pub fn remove_pod(&self, uid: &PodUid) {
        self.stop_where(|k| &k.pod != uid);
    }

    /// Stops the workers of pods not in `desired` (upstream `CleanupPods`).
    pub fn cleanup_pods(&self, desired: &HashSet<PodUid>) {
        self.stop_where(|k| desired.contains(&k.pod));
    }

    /// How many workers run (tests and debugging).
    pub fn worker_count(&self) -> usize {
        self.shared.workers().len()
    }

    fn trigger(&self, uid: &PodUid, container: &str, kind: ProbeKind) {
        let key = Key {
            pod: uid.clone(),
            container: container.to_owned(),
            kind,
        };
        if let Some(handle) = self.shared.workers().get(&key) {
            handle.trigger.notify_one();
        }
    }
}

impl ContainerProbeResults for ProbeManager {
    fn liveness(&self, id: &ContainerId) -> Option<ProbeOutcome> {
        self.shared
            .results
            .get(ProbeKind::Liveness, &id.to_string())
    }

    fn startup(&self, id: &ContainerId) -> Option<ProbeOutcome> {
        self.shared.results.get(ProbeKind::Startup, &id.to_string())
    }
}

/// Judged by the spec, not by whether a worker exists yet: a container with a probe is not
/// started (or ready) until its probe says so, even in the first status after an agent restart.
impl ContainerReadiness for ProbeManager {
    fn started(&self, _: &Pod, container: &Container, id: &ContainerId) -> bool {
        container.startup_probe.is_none()
            || self.shared.results.get(ProbeKind::Startup, &id.to_string())
                == Some(ProbeOutcome::Success)
    }

    fn ready(&self, pod: &Pod, container: &Container, id: &ContainerId) -> bool {
        if container.readiness_probe.is_none() {
            return true;
        }
        let ready = self
            .shared
            .results
            .get(ProbeKind::Readiness, &id.to_string())
            == Some(ProbeOutcome::Success);
        if !ready {
            // Probe now rather than at the next period (upstream's manual trigger): this is
            // where a container that has just started is first seen not ready.
            let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
            self.trigger(&uid, &container.name, ProbeKind::Readiness);
        }
        ready
    }
}
