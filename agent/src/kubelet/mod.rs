//! The kubelet core (upstream `pkg/kubelet/kubelet.go`): the sync loop that dispatches source
//! updates, PLEG events and periodic work to the pod workers, admission, housekeeping, and the
//! sync functions the workers call. Everything it acts through is handed in by `app`, at
//! construction ([`KubeletParts`]). Also what the kubelet computes about the node for the rest:
//! allocatable (`allocatable.rs`), the runtime's health (`runtime_health.rs`) and system OOMs
//! (`oom_watcher.rs`).

pub mod active_deadline;
pub mod admission;
pub mod allocatable;
pub mod housekeeping;
pub mod metrics;
pub mod oom_watcher;
pub mod pod_manager;
pub mod runtime_health;
pub mod security_admission;
mod static_pods;
pub mod sync_loop;
pub mod syncer;
pub use crate::pod::sysctl;

use std::{
    collections::{BTreeSet, HashSet},
    sync::{Arc, Mutex, OnceLock},
    time::{Instant, SystemTime},
};

use tokio::sync::{oneshot, watch};

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};

use self::{
    admission::{AdmissionNode, NodeCapacity, admit},
    pod_manager::PodManager,
    security_admission::SecurityAdmission,
};
use crate::{
    cm::{cpumanager::CpuManager, pod_cgroups::PodCgroups},
    container::PodUid,
    events::{Action, Event, Events, pod_ref, reasons},
    eviction::{Evictor, NodeCondition},
    kuberuntime::{manager::KubeRuntimeManager, should_container_be_restarted},
    lock::MutexExt as _,
    node::Registration,
    nodeshutdown::{PodTerminator, ShutdownState},
    pleg::{EventType, PodCache, PodLifecycleEvent, relist::running_pod_of},
    pod_workers::{
        KillOptions, PodWorkers, UpdatePodOptions, UpdateType, WorkerPhase, is_terminal_phase,
        pod_uid,
    },
    prober::ProbeManager,
    prober::{ProbeKind, ProbeUpdate},
    sources::{Op, PodUpdate},
    status::StatusManager,
    volume::VolumeManager,
};

pub struct Kubelet {
    pub node_name: String,
    pub pods: Arc<PodManager>,
    pub workers: Arc<PodWorkers<syncer::KubeletSyncer>>,
    pub cache: Arc<PodCache>,
    pub status: Arc<StatusManager>,
    pub runtime: Arc<KubeRuntimeManager>,
    pub cgroups: Arc<PodCgroups>,
    pub capacity: NodeCapacity,
    /// The labels and taints the node registers with: admission's node affinity and taints.
    registration: Registration,
    /// Sysctls, AppArmor, supplemental groups and user namespaces the node can (not) enforce.
    security: SecurityAdmission,
    /// Pods admission turned away: they keep their Failed status and never get a worker.
    rejected: Mutex<HashSet<PodUid>>,
    /// The eviction manager's node conditions: admission turns pods away under pressure.
    ///
    /// The one part bound after construction, because of a real cycle: the eviction manager
    /// chooses among the kubelet's active pods and evicts through its pod workers
    /// ([`KubeletEvictor`]), so it is built after the kubelet, and hands its conditions back
    /// with [`Kubelet::set_pressure`] before the sync loop runs (upstream's kubelet likewise
    /// gets the eviction admit handler from a manager that is started with `GetActivePods`).
    pressure: OnceLock<watch::Receiver<BTreeSet<NodeCondition>>>,
    /// The CPU manager, under the static policy.
    cpu_manager: Option<Arc<CpuManager>>,
    /// Whether the node is shutting down: admission turns pods away meanwhile.
    node_shutdown: ShutdownState,
    /// Housekeeping stops the probes of pods that are gone.
    probes: ProbeManager,
    /// Housekeeping removes the directories of pods nobody wants.
    volumes: Arc<VolumeManager>,
    /// Every source's first complete set is in the pod manager (see `static_pods.rs`).
    sources_complete: std::sync::atomic::AtomicBool,
    /// Rejected and evicted pods are reported here.
    events: Events,
}

/// What the kubelet core is built from, each part already built by its own constructor
/// (upstream `NewMainKubelet` hands the Kubelet its managers the same way).
pub struct KubeletParts {
    pub node_name: String,
    pub pods: Arc<PodManager>,
    pub workers: Arc<PodWorkers<syncer::KubeletSyncer>>,
    pub cache: Arc<PodCache>,
    pub status: Arc<StatusManager>,
    pub runtime: Arc<KubeRuntimeManager>,
    pub cgroups: Arc<PodCgroups>,
    pub capacity: NodeCapacity,
    pub registration: Registration,
    pub security: SecurityAdmission,
    pub cpu_manager: Option<Arc<CpuManager>>,
    pub node_shutdown: ShutdownState,
    pub probes: ProbeManager,
    pub volumes: Arc<VolumeManager>,
    pub events: Events,
}

impl Kubelet {
    pub fn new(parts: KubeletParts) -> Kubelet {
        let KubeletParts {
            node_name,
            pods,
            workers,
            cache,
            status,
            runtime,
            cgroups,
            capacity,
            registration,
            security,
            cpu_manager,
            node_shutdown,
            probes,
            volumes,
            events,
        } = parts;
        Kubelet {
            node_name,
            pods,
            workers,
            cache,
            status,
            runtime,
            cgroups,
            capacity,
            registration,
            security,
            rejected: Mutex::new(HashSet::new()),
            pressure: OnceLock::new(),
            cpu_manager,
            node_shutdown,
            probes,
            volumes,
            sources_complete: std::sync::atomic::AtomicBool::new(false),
            events,
        }
    }

    /// Where the kubelet's components report events.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Admission from now on also checks the node's pressure conditions (see `pressure`).
    pub fn set_pressure(&self, conditions: watch::Receiver<BTreeSet<NodeCondition>>) {
        let _ = self.pressure.set(conditions);
    }

    pub fn volume_manager(&self) -> Arc<VolumeManager> {
        self.volumes.clone()
    }

    /// `wanted`: every pod a source wants, once all sources have sent their first complete set.
    fn admit(
        &self,
        pod: &Pod,
        active: &[&Pod],
        wanted: Option<&HashSet<PodUid>>,
    ) -> Result<(), admission::Rejection> {
        let node = AdmissionNode {
            name: &self.node_name,
            capacity: &self.capacity,
            registration: &self.registration,
        };
        admit(pod, active, &node)?;
        if let Some(pressure) = self.pressure.get() {
            let conditions = pressure.borrow().clone();
            crate::eviction::admission::admit(pod, &conditions)?;
        }
        // Upstream's node shutdown admit handler.
        self.node_shutdown
            .admission()
            .map_err(|(reason, message)| admission::Rejection {
                reason: reason.into(),
                message: message.into(),
            })?;
        self.security.admit(pod)?;
        // Last: allocating is the only check with a side effect.
        if let Some(cpus) = &self.cpu_manager {
            cpus.allocate(pod, wanted)
                .map_err(|e| admission::Rejection {
                    reason: "UnexpectedAdmissionError".into(),
                    message: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// The pods eviction may choose from (upstream `GetActivePods`): admitted, not done, and
    /// not already being terminated.
    pub fn pods_for_eviction(&self) -> Vec<Arc<Pod>> {
        self.admitted_pods(|uid| self.workers.phase(uid) == Some(WorkerPhase::Syncing))
    }

    /// Admitted pods not in a terminal phase that also pass `keep`.
    fn admitted_pods(&self, keep: impl Fn(&PodUid) -> bool) -> Vec<Arc<Pod>> {
        let rejected = self.rejected().clone();
        self.pods
            .pods()
            .into_iter()
            .filter(|p| {
                let uid = pod_uid(p);
                !rejected.contains(&uid) && !is_terminal_phase(p) && keep(&uid)
            })
            .collect()
    }

    fn rejected(&self) -> std::sync::MutexGuard<'_, HashSet<PodUid>> {
        self.rejected.lock_unpoisoned()
    }

    /// One update from the sources (upstream `syncLoopIteration`'s `configCh` case).
    /// `sources_complete`: the updates up to this one hold every source's first complete set.
    pub fn handle_update(&self, update: PodUpdate, sources_complete: bool) {
        self.handle_source_update(update, sources_complete);
        if sources_complete {
            self.sources_complete
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    fn handle_source_update(&self, update: PodUpdate, sources_complete: bool) {
        match update.op {
            Op::Add => self.handle_additions(update.pods, sources_complete),
            Op::Update | Op::Delete => self.handle_updates(update.pods),
            Op::Remove => self.handle_removes(update.pods),
            Op::Reconcile => {
                for pod in update.pods {
                    if self.pods.get(&pod_uid(&pod)).is_some() {
                        self.pods.upsert(pod);
                    }
                }
            }
            Op::Set => tracing::warn!("unexpected SET update from the merge; ignored"),
        }
    }

    /// Admits new pods oldest first (upstream `HandlePodAdditions`). Once the sources are
    /// complete, the CPUs of pods none of them wants are released before each admission.
    pub fn handle_additions(&self, mut pods: Vec<Pod>, sources_complete: bool) {
        pods.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
        });
        // The later pods of this batch are wanted too, though not in the pod manager yet.
        let batch: Vec<PodUid> = pods.iter().map(pod_uid).collect();
        for pod in pods {
            let uid = pod_uid(&pod);
            let pod = self.pods.upsert(pod);
            if self.workers.phase(&uid).is_none() && !is_terminal_phase(&pod) {
                let active = self.active_pods(&uid);
                let wanted: Option<HashSet<PodUid>> = sources_complete.then(|| {
                    active
                        .iter()
                        .map(|p| pod_uid(p))
                        .chain(batch.iter().cloned())
                        .collect()
                });
                let active: Vec<&Pod> = active.iter().map(|p| p.as_ref()).collect();
                if let Err(rejection) = self.admit(&pod, &active, wanted.as_ref()) {
                    tracing::warn!(pod = %uid, reason = rejection.reason, message = rejection.message, "pod rejected");
                    // Upstream `rejectPod`: the admit handler's reason and message.
                    self.events.record(Event::warning(
                        pod_ref(&pod),
                        rejection.reason.clone(),
                        Action::AdmitPod,
                        rejection.message.clone(),
                    ));
                    self.rejected().insert(uid.clone());
                    self.status.set_pod_status(
                        &pod,
                        ApiPodStatus {
                            phase: Some("Failed".into()),
                            reason: Some(rejection.reason),
                            message: Some(rejection.message),
                            ..Default::default()
                        },
                    );
                    continue;
                }
            }
            self.workers.update_pod(UpdatePodOptions {
                update_type: UpdateType::Create,
                pod: Some(pod),
                running_pod: None,
                kill: None,
            });
        }
    }

    /// Admitted pods that are not done, other than `except`.
    fn active_pods(&self, except: &PodUid) -> Vec<Arc<Pod>> {
        self.admitted_pods(|uid| uid != except && !self.workers.is_known_terminated(uid))
    }

    pub fn handle_updates(&self, pods: Vec<Pod>) {
        for pod in pods {
            let uid = pod_uid(&pod);
            let pod = self.pods.upsert(pod);
            if self.rejected().contains(&uid) {
                continue;
            }
            self.workers.update_pod(UpdatePodOptions {
                update_type: UpdateType::Update,
                pod: Some(pod),
                running_pod: None,
                kill: None,
            });
        }
    }

    pub fn handle_removes(&self, pods: Vec<Pod>) {
        for pod in pods {
            let uid = pod_uid(&pod);
            let known = self.pods.remove(&uid);
            if self.rejected().remove(&uid) {
                self.status.remove(&uid);
                continue;
            }
            self.workers.update_pod(UpdatePodOptions {
                update_type: UpdateType::Kill,
                pod: Some(known.unwrap_or_else(|| Arc::new(pod))),
                running_pod: None,
                kill: None,
            });
        }
    }

    /// Evicts a pod: its status says why from now on, and its worker kills it.
    fn evict_pod(&self, pod: &Arc<Pod>, grace_secs: i64, message: &str) -> oneshot::Receiver<()> {
        self.status.set_terminal(pod, "Evicted", message);
        // Upstream's eviction manager reports it (`evictPod`) before the kill.
        self.events.record(Event::warning(
            pod_ref(pod),
            reasons::EVICTED,
            Action::EvictPod,
            message,
        ));
        self.kill_within(pod, grace_secs, true)
    }

    /// Kills a pod for the node's shutdown (upstream's shutdown manager's `killPodFunc`): its
    /// status says so from now on (Failed unless it already Succeeded), its worker kills it
    /// within `grace_secs`, preStop hooks included.
    fn terminate_for_shutdown(&self, pod: &Arc<Pod>, grace_secs: i64) -> oneshot::Receiver<()> {
        self.status.set_terminal_unless_succeeded(
            pod,
            crate::nodeshutdown::SHUTDOWN_REASON,
            crate::nodeshutdown::SHUTDOWN_MESSAGE,
        );
        self.kill_within(pod, grace_secs, false)
    }

    /// Has the pod's worker kill it within `grace_secs`; the receiver completes once it is dead.
    fn kill_within(&self, pod: &Arc<Pod>, grace_secs: i64, evict: bool) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.workers.update_pod(UpdatePodOptions {
            update_type: UpdateType::Kill,
            pod: Some(pod.clone()),
            running_pod: None,
            kill: Some(KillOptions {
                grace_period_override: Some(grace_secs),
                evict,
                completed: Some(tx),
            }),
        });
        rx
    }

    /// A PLEG event wakes the pod's worker (upstream `syncLoopIteration`'s `plegCh` case).
    pub fn handle_pleg_event(&self, event: &PodLifecycleEvent) {
        if let Some(cpus) = &self.cpu_manager {
            self.cpu_event(cpus, event);
        }
        if event.kind == EventType::ContainerChanged {
            return;
        }
        let Some(pod) = self.pods.get(&event.pod) else {
            return;
        };
        if self.rejected().contains(&event.pod) {
            return;
        }
        self.workers.update_pod(UpdatePodOptions {
            update_type: UpdateType::Sync,
            pod: Some(pod),
            running_pod: None,
            kill: None,
        });
    }

    /// A probe result changed (upstream `handleProbeSync`): the pod syncs, which kills a container
    /// that failed liveness or startup and puts readiness into the status. A liveness success is
    /// no news.
    pub fn handle_probe_update(&self, update: &ProbeUpdate) {
        use crate::kuberuntime::ProbeOutcome;
        if update.kind == ProbeKind::Liveness && update.outcome == ProbeOutcome::Success {
            return;
        }
        tracing::debug!(pod = %update.pod, container = update.container_id, probe = update.kind.as_str(), outcome = ?update.outcome, "probe result changed");
        let Some(pod) = self.pods.get(&update.pod) else {
            return;
        };
        if self.rejected().contains(&update.pod) {
            return;
        }
        self.workers.update_pod(UpdatePodOptions {
            update_type: UpdateType::Sync,
            pod: Some(pod),
            running_pod: None,
            kill: None,
        });
    }

    /// A container started (its cpuset may be stale) or died (its exclusive CPUs may be free).
    fn cpu_event(&self, cpus: &CpuManager, event: &PodLifecycleEvent) {
        let Some(id) = &event.container else {
            return;
        };
        match event.kind {
            EventType::ContainerStarted => cpus.container_started(&id.id),
            EventType::ContainerDied => {
                if let Some(name) = event.status.as_ref().map(|s| s.name.as_str())
                    && self.done_for_good(&event.pod, name)
                {
                    cpus.container_exited(&event.pod, name, &id.id);
                }
            }
            _ => {}
        }
    }

    /// Whether the container `name` of pod `uid` exited and will not run again: its pod is no
    /// longer active, or its restart policy does not restart it.
    fn done_for_good(&self, uid: &PodUid, name: &str) -> bool {
        let Some(pod) = self.pods.get(uid) else {
            return true;
        };
        if self.rejected().contains(uid)
            || is_terminal_phase(&pod)
            || self.workers.phase(uid) != Some(WorkerPhase::Syncing)
        {
            return true;
        }
        let Some(status) = self.cache.get(uid).status else {
            return false;
        };
        let exited = status
            .latest(name)
            .is_some_and(|c| c.state == crate::container::ContainerState::Exited);
        let spec = pod.spec.as_ref();
        let container = spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
        });
        exited && container.is_some_and(|c| !should_container_be_restarted(c, &pod, &status))
    }

    /// The CPU manager's safety net: CPUs of pods no longer active and of containers done for
    /// good go back to the shared pool even if their event was missed.
    fn cpu_housekeeping(&self, cpus: &CpuManager) {
        let active: HashSet<PodUid> = self
            .active_pods(&PodUid(String::new()))
            .iter()
            .map(|p| pod_uid(p))
            .collect();
        cpus.remove_stale(&active);
        for (uid, containers) in cpus.assignments().entries {
            let uid = PodUid(uid);
            let Some(status) = self.cache.get(&uid).status else {
                continue;
            };
            for name in containers.keys() {
                if let Some(latest) = status.latest(name)
                    && latest.state == crate::container::ContainerState::Exited
                    && self.done_for_good(&uid, name)
                {
                    cpus.container_exited(&uid, name, &latest.id.id);
                }
            }
        }
    }

    /// A pod's active deadline came (upstream finds it in `getPodsToSync` with the deadline
    /// handler's `ShouldSync`): it syncs, and its status generation fails it.
    pub fn handle_active_deadline(&self, uid: &PodUid) {
        let Some(pod) = self.pods.get(uid) else {
            return;
        };
        if self.rejected().contains(uid) {
            return;
        }
        self.workers.update_pod(UpdatePodOptions {
            update_type: UpdateType::Sync,
            pod: Some(pod),
            running_pod: None,
            kill: None,
        });
    }

    /// Pods whose resync or retry is due (upstream `syncCh`).
    pub fn handle_due(&self, now: Instant) {
        for uid in self.workers.take_due(now) {
            if let Some(pod) = self.pods.get(&uid) {
                self.workers.update_pod(UpdatePodOptions {
                    update_type: UpdateType::Sync,
                    pod: Some(pod),
                    running_pod: None,
                    kill: None,
                });
            }
        }
    }

    /// Upstream `HandlePodCleanups`: align workers with the desired pods, stop what the runtime
    /// runs for pods nobody wants, forget statuses and cgroups of pods that are gone.
    pub async fn housekeeping(&self) {
        let rejected = self.rejected().clone();
        let desired: Vec<Arc<Pod>> = self
            .pods
            .pods()
            .into_iter()
            .filter(|p| !rejected.contains(&pod_uid(p)))
            .collect();
        let (phases, restart) = self.workers.sync_known_pods(&desired);
        for uid in restart {
            if let Some(pod) = self.pods.get(&uid) {
                self.workers.update_pod(UpdatePodOptions {
                    update_type: UpdateType::Create,
                    pod: Some(pod),
                    running_pod: None,
                    kill: None,
                });
            }
        }
        let desired_uids: HashSet<PodUid> = desired.iter().map(|p| pod_uid(p)).collect();
        // Pods the runtime has that no source wants and no worker handles: orphans.
        for uid in self.cache.pods() {
            if desired_uids.contains(&uid) || rejected.contains(&uid) || phases.contains_key(&uid) {
                continue;
            }
            let cached = self.cache.get(&uid);
            let Some(status) = cached.status else {
                continue;
            };
            if status.sandboxes.is_empty() && status.containers.is_empty() {
                self.cache.delete(&uid);
                continue;
            }
            tracing::info!(pod = %uid, name = status.name, "stopping and removing an orphaned pod");
            self.workers.update_pod(UpdatePodOptions {
                update_type: UpdateType::Kill,
                pod: None,
                running_pod: Some(running_pod_of(&status)),
                kill: None,
            });
        }
        self.status.retain(|uid| {
            desired_uids.contains(uid) || rejected.contains(uid) || phases.contains_key(uid)
        });
        for uid in self.cgroups.existing_pods() {
            let busy = phases
                .get(&uid)
                .is_some_and(|p| matches!(p, WorkerPhase::Syncing | WorkerPhase::Terminating));
            if !busy
                && !desired_uids.contains(&uid)
                && let Err(e) = self.cgroups.remove_pod(&uid).await
            {
                tracing::debug!(pod = %uid, error = %e, "orphaned pod cgroup not removed yet");
            }
        }
        {
            // Upstream's periodic `UpdateCgroups`: the Burstable level's weight from the pods
            // that still run or may (pod syncs and removals update it as they happen).
            let active = self.admitted_pods(|uid| {
                !matches!(
                    self.workers.phase(uid),
                    Some(WorkerPhase::Terminated | WorkerPhase::Finished)
                )
            });
            let active: Vec<&Pod> = active.iter().map(AsRef::as_ref).collect();
            if let Err(e) = self
                .cgroups
                .update_qos_cgroups(&active, Instant::now())
                .await
            {
                tracing::warn!(error = %e, "updating the QoS cgroups");
            }
        }
        if let Some(cpus) = &self.cpu_manager {
            self.cpu_housekeeping(cpus);
        }
        {
            let live: HashSet<PodUid> = desired_uids
                .iter()
                .filter(|uid| {
                    phases.get(*uid).is_none_or(|p| {
                        matches!(p, WorkerPhase::Syncing | WorkerPhase::Terminating)
                    })
                })
                .cloned()
                .collect();
            self.probes.cleanup_pods(&live);
        }
        {
            // Upstream `cleanupOrphanedPodDirs`: pods no source wants, no worker handles and
            // the runtime no longer runs.
            let in_runtime: HashSet<PodUid> = self.cache.pods().into_iter().collect();
            self.volumes.cleanup_orphaned_pod_dirs(|uid| {
                desired_uids.contains(uid)
                    || in_runtime.contains(uid)
                    || phases.get(uid).is_some_and(|p| *p != WorkerPhase::Finished)
            });
        }
        // Upstream `CleanupOrphanedPodUsernsAllocations`: ranges of pods nobody wants and the
        // runtime no longer has.
        let in_runtime: HashSet<PodUid> = self.cache.pods().into_iter().collect();
        self.runtime.release_user_namespaces(|uid| {
            desired_uids.contains(uid) || in_runtime.contains(uid) || phases.contains_key(uid)
        });
        self.runtime.gc(SystemTime::now());
    }
}

/// The node shutdown manager's way to the pods: the active ones (as eviction's), killed through
/// the kubelet's pod workers.
pub struct KubeletShutdownTerminator(pub Arc<Kubelet>);

impl PodTerminator for KubeletShutdownTerminator {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.0.pods_for_eviction()
    }

    fn terminate(&self, pod: &Arc<Pod>, grace_secs: i64) -> oneshot::Receiver<()> {
        self.0.terminate_for_shutdown(pod, grace_secs)
    }
}

/// The eviction manager's way to evict: through the kubelet's pod workers.
pub struct KubeletEvictor(pub Arc<Kubelet>);

impl Evictor for KubeletEvictor {
    fn evict(&self, pod: &Arc<Pod>, grace_secs: i64, message: String) -> oneshot::Receiver<()> {
        self.0.evict_pod(pod, grace_secs, &message)
    }
}
