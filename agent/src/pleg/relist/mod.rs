//! The relist PLEG (upstream `GenericPLEG`): every period, list every pod and container from the
//! runtime, diff container states against the previous list, fetch a full status for each pod that
//! changed, put it in the cache, and send one event per change. Plus upstream's on-demand per-pod
//! relist: after a pod worker acted, that pod is relisted at once instead of at the next period.
//!
//! This is the polling baseline the kernel-event PLEG is measured against.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, Registry};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    EventType, Health, Pleg, PlegConfig, PodCache, PodLifecycleEvent, RuntimeView,
    records::{ListChanges, Observation, PodRecords},
};
use crate::container::{ContainerId, ContainerState, PodStatus, PodUid, RunningPod, SandboxState};
use crate::lock::MutexExt as _;

/// A container's state as the PLEG compares it (upstream `plegContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(state: ContainerState) -> Self {
        match state {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            // The kubelet does not act on "created"; upstream maps it to unknown as well.
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        }
    }
}

/// Every container and sandbox of a pod with its state.
fn states(pod: &RunningPod, runtime: &str) -> HashMap<ContainerId, PlegState> {
    let mut map: HashMap<ContainerId, PlegState> = pod
        .containers
        .iter()
        .map(|(id, _, state)| (id.clone(), PlegState::from(*state)))
        .collect();
    for (id, state) in &pod.sandboxes {
        let state = match state {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
        };
        map.insert(ContainerId::new(runtime, id), state);
    }
    map
}

/// The events between two observations of one pod (upstream `computeEvents` +
/// `generateEvents`), unknown-state changes left out as upstream does.
pub fn compute_events(
    uid: &PodUid,
    old: Option<&RunningPod>,
    new: Option<&RunningPod>,
    runtime: &str,
) -> Vec<PodLifecycleEvent> {
    let old = old.map(|p| states(p, runtime)).unwrap_or_default();
    let new = new.map(|p| states(p, runtime)).unwrap_or_default();
    let ids: BTreeSet<&ContainerId> = old.keys().chain(new.keys()).collect();
    let mut events = Vec::new();
    for id in ids {
        let before = old.get(id).copied().unwrap_or(PlegState::NonExistent);
        let after = new.get(id).copied().unwrap_or(PlegState::NonExistent);
        if before == after {
            continue;
        }
        let event = |kind| PodLifecycleEvent {
            pod: uid.clone(),
            kind,
            container: Some(id.clone()),
            kernel_ts_ns: None,
            observed_at: None,
            status: None,
        };
        match after {
            PlegState::Running => events.push(event(EventType::ContainerStarted)),
            PlegState::Exited => events.push(event(EventType::ContainerDied)),
            PlegState::Unknown => {}
            PlegState::NonExistent => {
                if before != PlegState::Exited {
                    events.push(event(EventType::ContainerDied));
                }
                events.push(event(EventType::ContainerRemoved));
            }
        }
    }
    events
}

/// A `RunningPod` view of a full status, for on-demand relists (which fetch one pod's status).
pub fn running_pod_of(status: &PodStatus) -> RunningPod {
    RunningPod {
        uid: status.uid.clone(),
        name: status.name.clone(),
        namespace: status.namespace.clone(),
        sandboxes: status
            .sandboxes
            .iter()
            .map(|s| (s.id.clone(), s.state))
            .collect(),
        containers: status
            .containers
            .iter()
            .map(|c| (c.id.clone(), c.name.clone(), c.state))
            .collect(),
    }
}

#[derive(Clone)]
pub struct PlegMetrics {
    pub relist_duration: Histogram,
    pub relist_interval: Histogram,
    pub discard_events: IntCounter,
    pub last_seen: Gauge,
}

impl PlegMetrics {
    /// The kubelet's PLEG metrics, registered in `registry`.
    pub fn register(registry: &Registry) -> Result<PlegMetrics, prometheus::Error> {
        let relist_duration = Histogram::with_opts(HistogramOpts::new(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
        ))?;
        let relist_interval = Histogram::with_opts(HistogramOpts::new(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG.",
        ))?;
        let discard_events = IntCounter::new(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG.",
        )?;
        let last_seen = Gauge::new(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
        )?;
        registry.register(Box::new(relist_duration.clone()))?;
        registry.register(Box::new(relist_interval.clone()))?;
        registry.register(Box::new(discard_events.clone()))?;
        registry.register(Box::new(last_seen.clone()))?;
        Ok(PlegMetrics {
            relist_duration,
            relist_interval,
            discard_events,
            last_seen,
        })
    }
}

#[derive(Default)]
struct Timing {
    /// Pods whose status fetch failed: fetched again on the next relist even without events.
    reinspect: HashSet<PodUid>,
    last_relist: Option<Instant>,
    last_relist_end: Option<Instant>,
}

/// The relist PLEG. Under kernel events it is the safety net, and the kernel-event PLEG uses it
/// through its plain methods: [`relist`](Self::relist), [`relist_pod`](Self::relist_pod),
/// [`refresh_pod_expecting`](Self::refresh_pod_expecting) and
/// [`request_full_relist`](Self::request_full_relist).
pub struct RelistPleg {
    runtime: Arc<dyn RuntimeView>,
    records: Arc<PodRecords>,
    /// Period and threshold; the Evented PLEG changes them when it falls back (upstream
    /// `GenericPLEG.Update`).
    config: Mutex<PlegConfig>,
    metrics: PlegMetrics,
    timing: Mutex<Timing>,
    on_demand: Mutex<HashSet<PodUid>>,
    /// A full relist was asked for (lost kernel events).
    full_requested: std::sync::atomic::AtomicBool,
    wake: Notify,
    started: Instant,
}

/// What one fetch of a pod's status came to.
enum Fetched {
    /// The status, now the pod's record.
    Recorded(PodStatus),
    /// The runtime answered, but a status asked for later was recorded first.
    Stale,
    /// The runtime gave no status (retried by the next relist).
    Failed,
}

/// What a targeted refresh waits to see (the runtime learns of an exit a little after the
/// kernel does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The container no longer runs (exited or gone).
    Stopped,
    /// The container runs.
    Running,
    /// Anything: one refresh.
    Any,
}

/// Where the runtime says a container is in its life, for [`Expect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Created, its start not yet done: what CRI reports while `StartContainer` is in flight,
    /// even when the kernel has already seen the program start, or exit.
    NotStarted,
    Running,
    /// Exited, or in a state the runtime cannot tell (which it reports only for dead tasks).
    Stopped,
}

impl Seen {
    fn of_container(state: ContainerState) -> Seen {
        match state {
            ContainerState::Created => Seen::NotStarted,
            ContainerState::Running => Seen::Running,
            ContainerState::Exited | ContainerState::Unknown => Seen::Stopped,
        }
    }

    fn of_sandbox(state: SandboxState) -> Seen {
        match state {
            SandboxState::Ready => Seen::Running,
            SandboxState::NotReady => Seen::Stopped,
        }
    }

    /// Whether the runtime has caught up with what the kernel saw. A start is caught up with
    /// once the container runs or already ran; an exit only once the runtime says it exited:
    /// "created" is not "stopped", and caching it would leave the exit unreported.
    fn meets(self, expect: Expect) -> bool {
        match expect {
            Expect::Any => true,
            Expect::Running => self != Seen::NotStarted,
            Expect::Stopped => self == Seen::Stopped,
        }
    }
}

impl RelistPleg {
    /// A relist of `runtime` that records what it sees in `records`.
    pub fn new(
        runtime: Arc<dyn RuntimeView>,
        records: Arc<PodRecords>,
        config: PlegConfig,
        metrics: PlegMetrics,
    ) -> Arc<RelistPleg> {
        Arc::new(RelistPleg {
            runtime,
            records,
            config: Mutex::new(config),
            metrics,
            timing: Mutex::new(Timing::default()),
            on_demand: Mutex::new(HashSet::new()),
            full_requested: std::sync::atomic::AtomicBool::new(false),
            wake: Notify::new(),
            started: Instant::now(),
        })
    }

    /// Relists every period, and single pods on demand in between, until shut down.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    self.relist().await;
                    next = tokio::time::Instant::now() + self.config().relist_period;
                }
                () = self.wake.notified() => {
                    if self.full_requested.swap(false, std::sync::atomic::Ordering::AcqRel) {
                        self.relist().await;
                        next = tokio::time::Instant::now() + self.config().relist_period;
                    }
                    let pods: Vec<PodUid> = lock(&self.on_demand).drain().collect();
                    for uid in pods {
                        self.relist_pod(&uid).await;
                    }
                }
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// One full relist (upstream `Relist`).
    pub async fn relist(&self) {
        let start = Instant::now();
        let observed = SystemTime::now();
        if let Some(last) = lock(&self.timing).last_relist {
            self.metrics
                .relist_interval
                .observe(start.duration_since(last).as_secs_f64());
        }
        let pods = match self.runtime.list_pods().await {
            Ok(pods) => pods,
            Err(error) => {
                tracing::warn!(%error, "PLEG: relist failed; will retry");
                return;
            }
        };
        let current: HashMap<PodUid, RunningPod> =
            pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        let reinspect = {
            let mut timing = lock(&self.timing);
            timing.last_relist = Some(start);
            std::mem::take(&mut timing.reinspect)
        };
        let ListChanges {
            mut events,
            to_inspect,
        } = self.records.replace_all(current, &reinspect);
        // Statuses before events: a worker woken by an event must find the status in the cache.
        let mut statuses = HashMap::with_capacity(to_inspect.len());
        for (uid, name, namespace) in to_inspect {
            if let Fetched::Recorded(status) =
                self.update_cache(&uid, &name, &namespace, None).await
            {
                statuses.insert(uid, status);
            }
        }
        self.records.all_observed_at(observed);
        // Each event carries its container's status as just inspected, as targeted refreshes do,
        // and the moment the list that found the change was asked for.
        for event in &mut events {
            event.observed_at = Some(observed);
            event.status = event.container.as_ref().and_then(|id| {
                statuses
                    .get(&event.pod)?
                    .containers
                    .iter()
                    .find(|c| &c.id == id)
                    .cloned()
            });
        }
        if !events.is_empty() {
            tracing::debug!(events = events.len(), "PLEG: the relist found changes");
        }
        let discarded = events
            .drain(..)
            .map(|e| self.records.send(e))
            .filter(|sent| !sent)
            .count();
        if discarded > 0 {
            tracing::warn!(
                discarded,
                "PLEG: event channel is full, discarding events of this relist"
            );
        }
        let end = Instant::now();
        lock(&self.timing).last_relist_end = Some(end);
        self.metrics
            .relist_duration
            .observe(end.duration_since(start).as_secs_f64());
        self.metrics.last_seen.set(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
    }

    /// Relists one pod now: a fresh status in the cache and events for what changed.
    pub async fn relist_pod(&self, uid: &PodUid) {
        let (name, namespace) = self.records.identity(uid).unwrap_or_default();
        self.update_cache(uid, &name, &namespace, None).await;
    }

    /// A refresh of one pod triggered by the kernel: fetched until the runtime shows `expect`
    /// for `container_id` (it learns of an exit a moment after the kernel), at most `patience`,
    /// then events for what changed, carrying `kernel_ts_ns`.
    pub async fn refresh_pod_expecting(
        &self,
        uid: &PodUid,
        container_id: &str,
        expect: Expect,
        kernel_ts_ns: u64,
        patience: Duration,
    ) {
        let (name, namespace) = self.records.identity(uid).unwrap_or_default();
        let give_up = Instant::now() + patience;
        let mut pause = Duration::from_micros(500);
        loop {
            let status = self
                .update_cache(uid, &name, &namespace, Some(kernel_ts_ns))
                .await;
            let status = match status {
                Fetched::Recorded(status) => Some(status),
                Fetched::Failed => None,
                // A newer answer is recorded, which may not show what the kernel saw yet: ask
                // again rather than take it for this one.
                Fetched::Stale => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                    if Instant::now() >= give_up {
                        return;
                    }
                    continue;
                }
            };
            // The id may be a container's or the sandbox's (the pause container's cgroup).
            let seen = status.as_ref().map(|s| {
                s.containers
                    .iter()
                    .find(|c| c.id.id == container_id)
                    .map(|c| Seen::of_container(c.state))
                    .or_else(|| {
                        s.sandboxes
                            .iter()
                            .find(|sb| sb.id == container_id)
                            .map(|sb| Seen::of_sandbox(sb.state))
                    })
            });
            let met = match (expect, seen) {
                // No status (the refresh failed and is retried by the relist) or no such
                // container any more: nothing to wait for.
                (Expect::Any, _) | (_, None | Some(None)) => true,
                (_, Some(Some(seen))) => seen.meets(expect),
            };
            tracing::debug!(pod = %uid, container_id, ?expect, state = ?seen, met, "PLEG: refreshed after a kernel event");
            if met || Instant::now() >= give_up {
                if !met {
                    tracing::warn!(pod = %uid, container_id, ?expect, state = ?seen, "the runtime did not show what the kernel reported in time");
                }
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The period and threshold in force.
    pub fn config(&self) -> PlegConfig {
        lock(&self.config).clone()
    }

    /// Runs at `config`'s period and judges health by its threshold from now on, starting with
    /// a relist at once (upstream `GenericPLEG.Update` between `Stop` and `Start`, whose start
    /// relists at once).
    pub fn update(&self, config: PlegConfig) {
        *lock(&self.config) = config;
        self.request_full_relist();
    }

    /// Asks for a full relist at once (kernel events were lost).
    pub fn request_full_relist(&self) {
        self.full_requested
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
    }

    /// Fetches one pod's status and records it (each event with the container's status, and
    /// the kernel's timestamp when a kernel event caused the fetch).
    async fn update_cache(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
        kernel_ts_ns: Option<u64>,
    ) -> Fetched {
        let at = SystemTime::now();
        match self.runtime.pod_status(uid, name, namespace).await {
            Ok(status) => self
                .records
                .record(
                    uid,
                    None,
                    Observation::Runtime {
                        status,
                        at,
                        kernel_ts_ns,
                    },
                )
                .map_or(Fetched::Stale, Fetched::Recorded),
            Err(error) => {
                tracing::warn!(pod = %uid, %error, "PLEG: cannot get pod status; will retry");
                self.records.record_error(uid, error.to_string(), at);
                lock(&self.timing).reinspect.insert(uid.clone());
                Fetched::Failed
            }
        }
    }
}

impl Pleg for RelistPleg {
    fn health(&self) -> Health {
        let last = lock(&self.timing).last_relist_end.unwrap_or(self.started);
        let age = last.elapsed();
        let threshold = self.config().relist_threshold;
        if age > threshold {
            return Health::Unhealthy(format!(
                "pleg was last seen active {age:?} ago; threshold is {threshold:?}"
            ));
        }
        Health::Healthy
    }

    fn cache(&self) -> Arc<PodCache> {
        self.records.cache()
    }

    fn request_relist(&self, pod: &PodUid) {
        lock(&self.on_demand).insert(pod.clone());
        self.wake.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_unpoisoned()
}

/// How long ago the last relist finished (for tests and health reporting).
impl RelistPleg {
    pub fn since_last_relist(&self) -> Option<Duration> {
        lock(&self.timing).last_relist_end.map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests;
