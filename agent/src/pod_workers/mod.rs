//! Pod workers: one serial worker per pod UID, driving the pod through its life (upstream
//! `pkg/kubelet/pod_workers.go`). The sync loop hands every change of a pod to
//! [`PodWorkers::update_pod`]; at most one sync per pod is in flight and later updates coalesce
//! (the latest pending update wins, a termination request sticks).
//!
//! The sync logic is injected as a [`PodSyncer`] (upstream injects `syncPodFn`): this module
//! never talks to the runtime. Before each sync a worker waits until the PLEG's cache holds a
//! status newer than its own last action, so it never decides on a stale view.

mod queue;
pub mod state;
mod worker;

#[cfg(test)]
mod tests;

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
pub use queue::WorkQueue;
pub use state::WorkerPhase;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::{
    container::{PodStatus, PodUid, RunningPod},
    pleg::PodCache,
};

/// Why the worker is asked to look at the pod (upstream `SyncPodType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateType {
    Create,
    Update,
    /// A periodic or event-driven resync.
    Sync,
    Kill,
}

/// Options of a kill request.
#[derive(Debug, Default)]
pub struct KillOptions {
    /// Overrides the pod's grace period (seconds), e.g. for eviction.
    pub grace_period_override: Option<i64>,
    pub evict: bool,
    /// Told when every container has stopped.
    pub completed: Option<oneshot::Sender<()>>,
}

/// One unit of work for a pod's worker.
#[derive(Debug)]
pub struct UpdatePodOptions {
    pub update_type: UpdateType,
    /// The desired pod; `None` for a pod the runtime runs that no source knows (an orphan).
    pub pod: Option<Arc<Pod>>,
    /// For orphans: what the runtime runs.
    pub running_pod: Option<RunningPod>,
    pub kill: Option<KillOptions>,
}

/// The sync functions the workers call (upstream `syncPodFn`, `syncTerminatingPodFn`,
/// `syncTerminatedPodFn`). Implemented by the kubelet core over the runtime.
#[tonic::async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    /// Why a sync failed: the worker logs it and retries after its back-off (upstream's
    /// workers see only an `error`; the syncer's own type stays typed for it and its tests).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Drives the pod towards its spec. Should return early once `cancel` fires (a termination
    /// was requested meanwhile).
    async fn sync_pod(
        &self,
        update: UpdateType,
        pod: &Pod,
        status: &PodStatus,
        cancel: &CancellationToken,
    ) -> Result<SyncPodOutcome, Self::Error>;

    /// Stops every container of the pod within `grace`.
    async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace: Duration,
    ) -> Result<(), Self::Error>;

    /// Stops what the runtime runs for a pod no source knows.
    async fn sync_terminating_runtime_pod(&self, running: &RunningPod) -> Result<(), Self::Error>;

    /// Cleans up after a pod whose containers have all stopped.
    async fn sync_terminated_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), Self::Error>;
}

/// What a successful SyncPod reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncPodOutcome {
    /// The pod reached a terminal phase: the worker moves on to terminating it.
    pub terminal: bool,
    /// Look again sooner than the resync interval (a back-off ends then).
    pub retry_after: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Resync a healthy pod this often (upstream `syncFrequency`, 1 min).
    pub resync_interval: Duration,
    /// Retry a failed sync after this long (upstream `backOffPeriod`, 10 s).
    pub backoff_period: Duration,
    /// Longest a worker waits for a fresher status before using what the cache has.
    pub status_wait_limit: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            resync_interval: Duration::from_secs(60),
            backoff_period: Duration::from_secs(10),
            status_wait_limit: Duration::from_secs(30),
        }
    }
}

/// Called after every sync of a pod (the PLEG relists that pod at once).
pub type OnSynced = Arc<dyn Fn(&PodUid) + Send + Sync>;

/// The per-pod bookkeeping (upstream `podSyncStatus`).
struct PodSyncStatus {
    full_name: String,
    is_static: bool,
    phase: WorkerPhase,
    pending: Option<UpdatePodOptions>,
    /// The pod of the latest work (kept for terminating and cleanup).
    pod: Option<Arc<Pod>>,
    running_pod: Option<RunningPod>,
    /// When the last sync finished: the next one waits for a newer status.
    synced_at: Option<SystemTime>,
    terminating_at: Option<Instant>,
    grace_period_secs: Option<i64>,
    deleted: bool,
    evicted: bool,
    /// A pod with this UID was created again after its worker finished.
    restart_requested: bool,
    kill_waiters: Vec<oneshot::Sender<()>>,
    /// Cancels the SyncPod in flight when a termination is requested.
    cancel: CancellationToken,
    wake: Arc<Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<PodUid, PodSyncStatus>,
    /// Static pods share full names across UIDs (a changed manifest is a new UID): only one may
    /// run at a time, the next starts once its predecessor has finished.
    started_static: HashMap<String, PodUid>,
}

/// The workers over the syncer `S` (the kubelet core's, or a test's).
pub struct PodWorkers<S: PodSyncer> {
    inner: Mutex<Inner>,
    syncer: Arc<S>,
    cache: Arc<PodCache>,
    queue: Arc<WorkQueue>,
    config: WorkerConfig,
    on_synced: Option<OnSynced>,
    /// `kubelet_pod_worker_duration_seconds`, when the agent registers it.
    duration: Option<prometheus::HistogramVec>,
}

/// The upstream default when a pod gives none.
pub const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;

pub use crate::pod::pod_uid;
use crate::pod::{full_name, spec::is_static_pod};

/// Whether a pod's (API) status says it is done.
pub fn is_terminal_phase(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// The grace period a termination uses (upstream `calculateEffectiveGracePeriod`): the override,
/// else the deletion's, else the spec's, else 30 s; never longer than one already in force.
pub fn effective_grace_period(
    pod: Option<&Pod>,
    override_secs: Option<i64>,
    current: Option<i64>,
) -> i64 {
    let from_pod = pod.and_then(|pod| {
        let deletion = pod
            .metadata
            .deletion_timestamp
            .as_ref()
            .and(pod.metadata.deletion_grace_period_seconds);
        deletion.or(pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds))
    });
    let wanted = override_secs
        .or(from_pod)
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
        .max(0);
    current.map_or(wanted, |c| c.min(wanted))
}

impl<S: PodSyncer> PodWorkers<S> {
    pub fn new(
        syncer: Arc<S>,
        cache: Arc<PodCache>,
        config: WorkerConfig,
        on_synced: Option<OnSynced>,
    ) -> Arc<Self> {
        Self::build(syncer, cache, config, on_synced, None)
    }

    /// The same, observing every sync's duration in `duration` (label `operation_type`).
    pub fn with_metrics(
        syncer: Arc<S>,
        cache: Arc<PodCache>,
        config: WorkerConfig,
        on_synced: Option<OnSynced>,
        duration: prometheus::HistogramVec,
    ) -> Arc<Self> {
        Self::build(syncer, cache, config, on_synced, Some(duration))
    }

    fn build(
        syncer: Arc<S>,
        cache: Arc<PodCache>,
        config: WorkerConfig,
        on_synced: Option<OnSynced>,
        duration: Option<prometheus::HistogramVec>,
    ) -> Arc<Self> {
        Arc::new(PodWorkers::<S> {
            inner: Mutex::new(Inner::default()),
            syncer,
            cache,
            queue: Arc::new(WorkQueue::default()),
            config,
            on_synced,
            duration,
        })
    }

    /// Pods due for a resync or a retry (the sync loop's tick drains this).
    pub fn take_due(&self, now: Instant) -> Vec<PodUid> {
        self.queue.take_due(now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }

    /// Hands work to the pod's worker, starting the worker if it is new.
    pub fn update_pod(self: &Arc<Self>, mut options: UpdatePodOptions) {
        let uid = match (&options.pod, &options.running_pod) {
            (Some(pod), _) => pod_uid(pod),
            (None, Some(running)) => running.uid.clone(),
            (None, None) => {
                tracing::warn!("pod worker update without a pod; ignored");
                return;
            }
        };
        let mut inner = self.lock();
        if !inner.pods.contains_key(&uid) {
            let status = self.new_status(&uid, &options);
            inner.pods.insert(uid.clone(), status);
        }
        let Some(status) = inner.pods.get_mut(&uid) else {
            return;
        };
        if status.phase == WorkerPhase::Finished {
            if options.update_type == UpdateType::Create {
                // Same UID created again: it restarts once housekeeping forgets this worker.
                status.restart_requested = true;
            }
            if let Some(done) = options.kill.as_mut().and_then(|k| k.completed.take()) {
                let _ = done.send(());
            }
            return;
        }
        let terminate = options.update_type == UpdateType::Kill
            || options.pod.is_none()
            || options
                .pod
                .as_deref()
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some() || is_terminal_phase(p));
        if terminate {
            let override_secs = options.kill.as_ref().and_then(|k| k.grace_period_override);
            let pod = options.pod.as_deref().or(status.pod.as_deref());
            status.grace_period_secs = Some(effective_grace_period(
                pod,
                override_secs,
                status.grace_period_secs,
            ));
            status.deleted |= pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
            status.evicted |= options.kill.as_ref().is_some_and(|k| k.evict);
            if status.phase == WorkerPhase::Syncing {
                status.phase = state::next(status.phase, state::Transition::TerminationRequested);
                status.terminating_at = Some(Instant::now());
                status.cancel.cancel();
            }
        }
        if let Some(done) = options.kill.as_mut().and_then(|k| k.completed.take()) {
            if matches!(
                status.phase,
                WorkerPhase::Terminated | WorkerPhase::Finished
            ) {
                let _ = done.send(());
            } else {
                status.kill_waiters.push(done);
            }
        }
        if let Some(pod) = &options.pod {
            status.pod = Some(pod.clone());
            status.full_name = full_name(pod);
        }
        if options.running_pod.is_some() {
            status.running_pod = options.running_pod.clone();
        }
        status.pending = Some(options);
        if status.task.is_none() {
            let wake = status.wake.clone();
            let workers = Arc::clone(self);
            let worker_uid = uid.clone();
            status.task = Some(tokio::spawn(async move {
                workers.worker_loop(worker_uid, wake).await;
            }));
        }
        status.wake.notify_one();
    }

    fn new_status(&self, uid: &PodUid, options: &UpdatePodOptions) -> PodSyncStatus {
        let (full_name, is_static) = match (&options.pod, &options.running_pod) {
            (Some(pod), _) => (full_name(pod), is_static_pod(pod)),
            (None, Some(r)) => (format!("{}_{}", r.name, r.namespace), false),
            (None, None) => (uid.0.clone(), false),
        };
        PodSyncStatus {
            full_name,
            is_static,
            phase: WorkerPhase::Syncing,
            pending: None,
            pod: options.pod.clone(),
            running_pod: options.running_pod.clone(),
            synced_at: None,
            terminating_at: None,
            grace_period_secs: None,
            deleted: false,
            evicted: false,
            restart_requested: false,
            kill_waiters: Vec::new(),
            cancel: CancellationToken::new(),
            wake: Arc::new(Notify::new()),
            task: None,
        }
    }

    /// The phase of a pod's worker, if it has one.
    pub fn phase(&self, uid: &PodUid) -> Option<WorkerPhase> {
        self.lock().pods.get(uid).map(|s| s.phase)
    }

    /// Whether a termination was requested (or the pod is past it).
    pub fn is_termination_requested(&self, uid: &PodUid) -> bool {
        self.phase(uid).is_some_and(|p| p != WorkerPhase::Syncing)
    }

    /// Whether containers of this pod may still run (unknown pods may: the runtime decides).
    pub fn could_have_running_containers(&self, uid: &PodUid) -> bool {
        self.phase(uid)
            .is_none_or(|p| matches!(p, WorkerPhase::Syncing | WorkerPhase::Terminating))
    }

    /// Whether the pod's containers have all stopped.
    pub fn is_known_terminated(&self, uid: &PodUid) -> bool {
        self.phase(uid)
            .is_some_and(|p| matches!(p, WorkerPhase::Terminated | WorkerPhase::Finished))
    }

    /// The static pods that have started, one per full name (the others of the name wait for
    /// it to finish), with their workers' phases: what their mirror pods follow (upstream
    /// `startedStaticPodsByFullname`).
    pub fn started_static_pods(&self) -> HashMap<String, (PodUid, WorkerPhase)> {
        let inner = self.lock();
        inner
            .started_static
            .iter()
            .filter_map(|(name, uid)| {
                let phase = inner.pods.get(uid)?.phase;
                Some((name.clone(), (uid.clone(), phase)))
            })
            .collect()
    }

    /// Whether the pod was evicted.
    pub fn is_evicted(&self, uid: &PodUid) -> bool {
        self.lock().pods.get(uid).is_some_and(|s| s.evicted)
    }

    /// Aligns the workers with the desired pods (upstream `SyncKnownPods`): workers of pods no
    /// longer desired are asked to terminate, and forgotten once finished. Returns the phase of
    /// every worker left, and the UIDs whose pods must be re-created (same UID created again).
    pub fn sync_known_pods(
        self: &Arc<Self>,
        desired: &[Arc<Pod>],
    ) -> (HashMap<PodUid, WorkerPhase>, Vec<PodUid>) {
        let desired: HashMap<PodUid, &Arc<Pod>> = desired.iter().map(|p| (pod_uid(p), p)).collect();
        let mut orphans = Vec::new();
        let mut restart = Vec::new();
        {
            let mut inner = self.lock();
            let finished: Vec<PodUid> = inner
                .pods
                .iter()
                .filter(|(uid, s)| {
                    s.phase == WorkerPhase::Finished
                        && (!desired.contains_key(*uid) || s.restart_requested)
                })
                .map(|(uid, _)| uid.clone())
                .collect();
            for uid in finished {
                if let Some(status) = inner.pods.remove(&uid) {
                    if status.restart_requested && desired.contains_key(&uid) {
                        restart.push(uid.clone());
                    }
                    if let Some(task) = status.task {
                        task.abort();
                    }
                }
                self.queue.forget(&uid);
            }
            for (uid, status) in &inner.pods {
                if !desired.contains_key(uid) && status.phase == WorkerPhase::Syncing {
                    orphans.push((status.pod.clone(), status.running_pod.clone()));
                }
            }
        }
        for (pod, running_pod) in orphans {
            self.update_pod(UpdatePodOptions {
                update_type: UpdateType::Kill,
                pod,
                running_pod,
                kill: None,
            });
        }
        let phases = self
            .lock()
            .pods
            .iter()
            .map(|(uid, s)| (uid.clone(), s.phase))
            .collect();
        (phases, restart)
    }
}
