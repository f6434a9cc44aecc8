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
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{EventType, Health, Pleg, PlegConfig, PodCache, PodLifecycleEvent, RuntimeView};
use crate::container::{ContainerId, ContainerState, PodStatus, PodUid, RunningPod, SandboxState};

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
struct Records {
    /// The last list, by pod.
    pods: HashMap<PodUid, RunningPod>,
    /// Pods whose status fetch failed: fetched again on the next relist even without events.
    reinspect: HashSet<PodUid>,
    last_relist: Option<Instant>,
    last_relist_end: Option<Instant>,
}

pub struct RelistPleg {
    runtime: Arc<dyn RuntimeView>,
    /// The runtime's name, for container ids of sandboxes ("containerd").
    runtime_name: String,
    cache: Arc<PodCache>,
    events: mpsc::Sender<PodLifecycleEvent>,
    config: PlegConfig,
    metrics: PlegMetrics,
    records: Mutex<Records>,
    on_demand: Mutex<HashSet<PodUid>>,
    /// A full relist was asked for (lost kernel events).
    full_requested: std::sync::atomic::AtomicBool,
    wake: Notify,
    started: Instant,
    /// Every event sent is also told here (the gRPC watchers), when set.
    observer: Mutex<Option<tokio::sync::broadcast::Sender<Arc<super::PublishedEvent>>>>,
    /// Kernel timestamp → event sent, for kernel-triggered refreshes.
    event_latency: Mutex<Option<Histogram>>,
    /// Corrects a status with what the runtime cannot know (an OOM kill the kernel reported).
    amend: Mutex<Option<StatusAmender>>,
    /// Told of pods the runtime no longer has (no sandbox, no container left).
    on_gone: Mutex<Option<GoneHook>>,
}

/// See [`RelistPleg::set_on_gone`].
pub type GoneHook = Arc<dyn Fn(&PodUid) + Send + Sync>;

/// See [`RelistPleg::set_amender`].
pub type StatusAmender = Arc<dyn Fn(&mut PodStatus, Source) + Send + Sync>;

/// Whose account a status being applied is, for the amender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The runtime's, just fetched: an exit it shows is the runtime's own.
    Runtime,
    /// The cache's, amended before: an exit it shows may be the kernel's account, which the
    /// runtime has not confirmed.
    Cache,
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
    pub fn new(
        runtime: Arc<dyn RuntimeView>,
        runtime_name: &str,
        config: PlegConfig,
        metrics: PlegMetrics,
    ) -> (Arc<RelistPleg>, mpsc::Receiver<PodLifecycleEvent>) {
        let (tx, rx) = mpsc::channel(super::CHANNEL_CAPACITY);
        let pleg = Arc::new(RelistPleg {
            runtime,
            runtime_name: runtime_name.to_owned(),
            cache: Arc::new(PodCache::default()),
            events: tx,
            config,
            metrics,
            records: Mutex::new(Records::default()),
            on_demand: Mutex::new(HashSet::new()),
            full_requested: std::sync::atomic::AtomicBool::new(false),
            wake: Notify::new(),
            started: Instant::now(),
            observer: Mutex::new(None),
            event_latency: Mutex::new(None),
            amend: Mutex::new(None),
            on_gone: Mutex::new(None),
        });
        (pleg, rx)
    }

    /// Relists every period, and single pods on demand in between, until shut down.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    self.relist().await;
                    next = tokio::time::Instant::now() + self.config.relist_period;
                }
                () = self.wake.notified() => {
                    if self.full_requested.swap(false, std::sync::atomic::Ordering::AcqRel) {
                        self.relist().await;
                        next = tokio::time::Instant::now() + self.config.relist_period;
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
        if let Some(last) = lock(&self.records).last_relist {
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
        let (mut events, mut to_inspect, gone) = {
            let mut records = lock(&self.records);
            records.last_relist = Some(start);
            let uids: BTreeSet<&PodUid> = records.pods.keys().chain(current.keys()).collect();
            let mut events = Vec::new();
            let mut to_inspect = Vec::new();
            for uid in uids {
                let pod_events = compute_events(
                    uid,
                    records.pods.get(uid),
                    current.get(uid),
                    &self.runtime_name,
                );
                if (!pod_events.is_empty() || records.reinspect.contains(uid))
                    && let Some(pod) = current.get(uid).or_else(|| records.pods.get(uid))
                {
                    to_inspect.push((uid.clone(), pod.name.clone(), pod.namespace.clone()));
                }
                events.extend(pod_events);
            }
            let gone: Vec<PodUid> = records
                .pods
                .keys()
                .filter(|uid| !current.contains_key(*uid))
                .cloned()
                .collect();
            records.pods = current;
            records.reinspect.clear();
            (events, to_inspect, gone)
        };
        self.tell_gone(&gone);
        // Statuses before events: a worker woken by an event must find the status in the cache.
        let mut statuses = HashMap::with_capacity(to_inspect.len());
        for (uid, name, namespace) in to_inspect.drain(..) {
            if let Some(status) = self.update_cache(&uid, &name, &namespace, None).await {
                statuses.insert(uid, status);
            }
        }
        self.cache.update_time(observed);
        // Each event carries its container's status as just inspected, as targeted refreshes do.
        for event in &mut events {
            event.status = event.container.as_ref().and_then(|id| {
                statuses
                    .get(&event.pod)?
                    .containers
                    .iter()
                    .find(|c| &c.id == id)
                    .cloned()
            });
        }
        let discarded = events
            .drain(..)
            .map(|e| self.send(e))
            .filter(|sent| !sent)
            .count();
        if discarded > 0 {
            tracing::warn!(
                discarded,
                "PLEG: event channel is full, discarding events of this relist"
            );
        }
        let end = Instant::now();
        lock(&self.records).last_relist_end = Some(end);
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
        let (name, namespace) = self.identity(uid).unwrap_or_default();
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
        let (name, namespace) = self.identity(uid).unwrap_or_default();
        let give_up = Instant::now() + patience;
        let mut pause = Duration::from_micros(500);
        loop {
            let status = self
                .update_cache(uid, &name, &namespace, Some(kernel_ts_ns))
                .await;
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

    /// Asks for a full relist at once (kernel events were lost).
    pub fn request_full_relist(&self) {
        self.full_requested
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
    }

    /// Also tells `observer` of every event sent.
    pub fn set_observer(
        &self,
        observer: tokio::sync::broadcast::Sender<Arc<super::PublishedEvent>>,
    ) {
        *lock(&self.observer) = Some(observer);
    }

    /// Applies `amend` to every status before it is cached, telling it where the status came
    /// from.
    pub fn set_amender(&self, amend: StatusAmender) {
        *lock(&self.amend) = Some(amend);
    }

    /// Calls `hook` for every pod that disappears from the runtime (per-pod state elsewhere,
    /// such as metric series, goes with it).
    pub fn set_on_gone(&self, hook: GoneHook) {
        *lock(&self.on_gone) = Some(hook);
    }

    fn tell_gone(&self, uids: &[PodUid]) {
        if uids.is_empty() {
            return;
        }
        let hook = lock(&self.on_gone).clone();
        if let Some(hook) = hook {
            uids.iter().for_each(|uid| hook(uid));
        }
    }

    /// Observes kernel-to-event latency of kernel-triggered refreshes in `histogram`.
    pub fn set_event_latency(&self, histogram: Histogram) {
        *lock(&self.event_latency) = Some(histogram);
    }

    /// The name and namespace of a pod the PLEG has seen in the runtime.
    pub fn identity(&self, uid: &PodUid) -> Option<(String, String)> {
        lock(&self.records)
            .pods
            .get(uid)
            .map(|p| (p.name.clone(), p.namespace.clone()))
    }

    /// Fetches one pod's status into the cache, diffs it against the last record and sends its
    /// events (each with the container's status, and the kernel's timestamp when a kernel event
    /// caused the fetch). Returns the status, if the runtime gave one.
    async fn update_cache(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
        kernel_ts_ns: Option<u64>,
    ) -> Option<PodStatus> {
        let observed = SystemTime::now();
        match self.runtime.pod_status(uid, name, namespace).await {
            Ok(status) => Some(self.apply(uid, status, Source::Runtime, observed, kernel_ts_ns)),
            Err(error) => {
                tracing::warn!(pod = %uid, %error, "PLEG: cannot get pod status; will retry");
                self.cache.set_error(uid, error.to_string(), observed);
                lock(&self.records).reinspect.insert(uid.clone());
                None
            }
        }
    }

    /// Reports what the kernel saw of container `container_id` of a pod the cache already has a
    /// runtime status of, at once: that status with the amender's kernel facts (an exit) becomes
    /// the pod's, and what changed is sent. The runtime is not asked: the refresh that follows
    /// does. `false` when there is no cached status showing the container to start from.
    ///
    /// The status keeps the time the cached one was observed: only the exit is newer than that.
    /// Stamped now, it would pass for newer than a pod worker's last sync, and a worker that has
    /// since created a container the cache has not seen yet would decide on a pod without it
    /// (a restarted container that died at once read as the previous one, still in back-off).
    pub fn report_from_cache(&self, uid: &PodUid, container_id: &str, kernel_ts_ns: u64) -> bool {
        let cached = self.cache.get(uid);
        let Some(status) = cached.status else {
            return false;
        };
        if !status.containers.iter().any(|c| c.id.id == container_id) {
            return false;
        }
        self.apply(
            uid,
            status,
            Source::Cache,
            cached.timestamp,
            Some(kernel_ts_ns),
        );
        true
    }

    /// Makes `status` (from `source`, observed at `observed`) the pod's: amended, compared with
    /// the last record of the pod, cached, and its changes sent as events carrying their
    /// container's status.
    fn apply(
        &self,
        uid: &PodUid,
        mut status: PodStatus,
        source: Source,
        observed: SystemTime,
        kernel_ts_ns: Option<u64>,
    ) -> PodStatus {
        let amend = lock(&self.amend).clone();
        if let Some(amend) = amend {
            amend(&mut status, source);
        }
        let running = running_pod_of(&status);
        let (mut events, gone) = {
            let mut records = lock(&self.records);
            let events = compute_events(
                uid,
                records.pods.get(uid),
                Some(&running),
                &self.runtime_name,
            );
            let gone = if running.sandboxes.is_empty() && running.containers.is_empty() {
                records.pods.remove(uid).is_some()
            } else {
                records.pods.insert(uid.clone(), running);
                false
            };
            (events, gone)
        };
        if gone {
            self.tell_gone(std::slice::from_ref(uid));
        }
        for event in &mut events {
            event.kernel_ts_ns = kernel_ts_ns;
            event.status = event
                .container
                .as_ref()
                .and_then(|id| status.containers.iter().find(|c| &c.id == id).cloned());
        }
        self.cache.set(uid, status.clone(), observed);
        let discarded = events
            .into_iter()
            .map(|e| self.send(e))
            .filter(|sent| !sent)
            .count();
        if discarded > 0 {
            tracing::warn!(pod = %uid, discarded, "PLEG: event channel is full, discarding events");
        }
        status
    }

    /// Sends one event without waiting; `false` (and counted) when the channel is full.
    fn send(&self, event: PodLifecycleEvent) -> bool {
        if event.kind == EventType::ContainerChanged {
            return true;
        }
        if let Some(ts) = event.kernel_ts_ns
            && let Some(histogram) = lock(&self.event_latency).as_ref()
        {
            let seconds = crate::kernel::monotonic_ns().saturating_sub(ts) as f64 / 1e9;
            histogram.observe(seconds);
        }
        if let Some(observer) = lock(&self.observer).as_ref() {
            let (pod_name, namespace) = self.identity(&event.pod).unwrap_or_default();
            let _ = observer.send(Arc::new(super::PublishedEvent {
                event: event.clone(),
                pod_name,
                namespace,
                sent_ns: crate::kernel::monotonic_ns(),
            }));
        }
        if self.events.try_send(event).is_err() {
            self.metrics.discard_events.inc();
            return false;
        }
        true
    }
}

impl Pleg for RelistPleg {
    fn health(&self) -> Health {
        let records = lock(&self.records);
        let last = records.last_relist_end.unwrap_or(self.started);
        let age = last.elapsed();
        if age > self.config.relist_threshold {
            return Health::Unhealthy(format!(
                "pleg was last seen active {age:?} ago; threshold is {:?}",
                self.config.relist_threshold
            ));
        }
        Health::Healthy
    }

    fn cache(&self) -> Arc<PodCache> {
        self.cache.clone()
    }

    fn request_relist(&self, pod: &PodUid) {
        lock(&self.on_demand).insert(pod.clone());
        self.wake.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long ago the last relist finished (for tests and health reporting).
impl RelistPleg {
    pub fn since_last_relist(&self) -> Option<Duration> {
        lock(&self.records).last_relist_end.map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests;
