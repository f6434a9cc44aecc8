//! The eviction manager's loop (upstream `managerImpl.synchronize` and `Start`), woken by kernel
//! signals — PSI triggers, memory cgroup notifications, OOM kills and reclaim from the eBPF
//! programs, the pods' memory cgroup reaching the level armed after each decision — and by a
//! periodic check as the safety net. Each wake-up reads fresh figures, decides
//! with upstream's rules, updates the node conditions and evicts at most one pod; after an
//! eviction it waits for the pod's containers to stop and looks again at once.
//!
//! Not here: the rules (`logic.rs`), the ranking (`rank.rs`), where figures come from
//! (`observe.rs`), how a pod is killed (the [`Evictor`] the app hands in). Upstream:
//! `pkg/kubelet/eviction/eviction_manager.go`.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{
    logic::{
        NodeCondition, Observations, Resource, ThresholdKey, is_met, merge_thresholds,
        node_conditions, node_conditions_last_observed_at, node_conditions_observed_since,
        reclaimable_threshold, resource_of, thresholds_first_observed_at, thresholds_met,
        thresholds_met_grace_period,
    },
    rank::{UsageByPod, eviction_message, rank},
    thresholds::{EvictionConfig, Signal, Threshold},
};
use crate::{container::PodUid, pod::pod_uid};

/// What woke the manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WakeSource {
    /// The periodic safety-net check.
    Periodic,
    /// A PSI trigger of the pods' cgroup or the node.
    Psi,
    /// A memory cgroup notification (v1 usage threshold, v2 `memory.events`).
    Memcg,
    /// An OOM kill reported by the kernel programs.
    Oom,
    /// Memory reclaim reported by the kernel programs.
    Reclaim,
    /// The check right after an eviction completed.
    Retry,
    /// The pods' memory cgroup reached the level the last decision armed (cgroup v2): the kernel
    /// programs saw the charge that took it there.
    MemcgLevel,
    /// The same level, seen by polling `memory.current` (where the kernel programs cannot run).
    MemcgPoll,
}

impl WakeSource {
    pub const ALL: [WakeSource; 8] = [
        WakeSource::Periodic,
        WakeSource::Psi,
        WakeSource::Memcg,
        WakeSource::Oom,
        WakeSource::Reclaim,
        WakeSource::Retry,
        WakeSource::MemcgLevel,
        WakeSource::MemcgPoll,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WakeSource::Periodic => "periodic",
            WakeSource::Psi => "psi",
            WakeSource::Memcg => "memcg",
            WakeSource::Oom => "oom",
            WakeSource::Reclaim => "reclaim",
            WakeSource::Retry => "retry",
            WakeSource::MemcgLevel => "memcg_level",
            WakeSource::MemcgPoll => "memcg_poll",
        }
    }
}

/// A wake-up: its source and when the agent learnt of it.
#[derive(Clone, Copy, Debug)]
pub struct Wake {
    pub source: WakeSource,
    pub at: Instant,
}

/// How the manager asks for a pod to go.
pub trait Evictor: Send + Sync {
    /// Kills `pod` within `grace_secs`, its status saying `Evicted` with `message`; the receiver
    /// resolves once its containers have stopped.
    fn evict(&self, pod: &Arc<Pod>, grace_secs: i64, message: String) -> oneshot::Receiver<()>;
}

/// Reads what the given pods use now.
pub type PodUsageFn = Box<dyn Fn(&[Arc<Pod>]) -> UsageByPod + Send + Sync>;

/// What the manager reads the world through.
pub struct Sources {
    /// Fresh node figures.
    pub observe: Box<dyn Fn() -> Observations + Send + Sync>,
    /// The admitted pods that are not done.
    pub active_pods: Box<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>,
    /// Fresh per-pod usage of the given pods.
    pub pod_usage: PodUsageFn,
    /// Frees node-level disk (dead containers) before any pod is evicted for disk.
    pub reclaim_disk: Box<dyn Fn() + Send + Sync>,
    /// What each emptyDir of a pod holds, for `sizeLimit` (upstream `localStorageEviction`).
    pub empty_dir_usage: super::local_storage::EmptyDirUsageFn,
    /// What the containers of pods with `ephemeral-storage` limits write (writable layer and
    /// logs), measured before each decision.
    pub container_storage: super::local_storage::ContainerStorageFn,
    pub evictor: Arc<dyn Evictor>,
}

/// One decision, published to watchers (the benchmark reads these).
#[derive(Clone, Debug)]
pub struct Decision {
    pub source: WakeSource,
    /// When the wake-up reached the agent.
    pub woke: Instant,
    /// When the decision was made.
    pub decided: Instant,
    /// The signal acted on and the evicted pod (namespace, name, uid), if any.
    pub signal: Option<Signal>,
    pub pod: Option<(String, String, String)>,
    pub message: String,
}

#[derive(Default)]
struct State {
    thresholds_met: Vec<Threshold>,
    first_observed: HashMap<ThresholdKey, Instant>,
    conditions_last_observed: HashMap<NodeCondition, Instant>,
}

#[derive(Clone)]
pub struct EvictionMetrics {
    /// Upstream's `kubelet_evictions` (a counter without `_total`, as upstream names it).
    pub evictions: CounterVec,
    pub wakeups: IntCounterVec,
    pub decision: HistogramVec,
    pub conditions: GaugeVec,
    pub observed: GaugeVec,
}

impl EvictionMetrics {
    pub fn register(registry: &Registry) -> Result<EvictionMetrics, prometheus::Error> {
        let evictions = CounterVec::new(
            Opts::new(
                "kubelet_evictions",
                "Cumulative number of pod evictions by eviction signal",
            ),
            &["eviction_signal"],
        )?;
        let wakeups = IntCounterVec::new(
            Opts::new(
                "swiftlet_eviction_wakeups_total",
                "Eviction manager wake-ups, by what woke it (periodic, psi, memcg, oom, reclaim, \
                 retry, memcg_level, memcg_poll)",
            ),
            &["source"],
        )?;
        let decision = HistogramVec::new(
            HistogramOpts::new(
                "swiftlet_eviction_decision_seconds",
                "From a wake-up reaching the eviction manager to its decision (fresh figures \
                 read, thresholds evaluated, a pod chosen or none), by wake-up source",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ]),
            &["source"],
        )?;
        let conditions = GaugeVec::new(
            Opts::new(
                "swiftlet_node_pressure_condition",
                "1 while the node reports this pressure condition (MemoryPressure, DiskPressure, \
                 PIDPressure)",
            ),
            &["condition"],
        )?;
        let observed = GaugeVec::new(
            Opts::new(
                "swiftlet_eviction_signal_available",
                "The last observed value of each eviction signal: what is left (`available`) \
                 and of how much (`capacity`); bytes, inodes, pids, or PSI percent × 100",
            ),
            &["signal", "figure"],
        )?;
        registry.register(Box::new(evictions.clone()))?;
        registry.register(Box::new(wakeups.clone()))?;
        registry.register(Box::new(decision.clone()))?;
        registry.register(Box::new(conditions.clone()))?;
        registry.register(Box::new(observed.clone()))?;
        for c in NodeCondition::ALL {
            conditions.with_label_values(&[c.as_str()]).set(0.0);
        }
        for s in WakeSource::ALL {
            wakeups.with_label_values(&[s.as_str()]);
        }
        Ok(EvictionMetrics {
            evictions,
            wakeups,
            decision,
            conditions,
            observed,
        })
    }
}

/// A handle to wake the manager; cheap to clone. Wake-ups coalesce: a full queue means a check
/// is already due, and every wake-up is counted.
#[derive(Clone)]
pub struct Waker {
    tx: mpsc::Sender<Wake>,
    wakeups: IntCounterVec,
}

impl Waker {
    /// A waker whose wake-ups arrive on the returned receiver, for tests of the wake-up tasks.
    #[cfg(test)]
    pub(crate) fn for_test() -> (Waker, mpsc::Receiver<Wake>) {
        let (tx, rx) = mpsc::channel(64);
        let wakeups =
            IntCounterVec::new(Opts::new("test_wakeups", "test"), &["source"]).expect("a counter");
        (Waker { tx, wakeups }, rx)
    }

    pub fn wake(&self, source: WakeSource) {
        self.wakeups.with_label_values(&[source.as_str()]).inc();
        let _ = self.tx.try_send(Wake {
            source,
            at: Instant::now(),
        });
    }
}

pub struct EvictionManager {
    config: EvictionConfig,
    sources: Sources,
    state: Mutex<State>,
    conditions: watch::Sender<BTreeSet<NodeCondition>>,
    decisions: broadcast::Sender<Decision>,
    /// The last observations, for re-arming the memory cgroup notifiers.
    observed: watch::Sender<Observations>,
    /// What the containers of pods with `ephemeral-storage` limits wrote, as measured before
    /// the last periodic check.
    container_storage: Mutex<HashMap<PodUid, Vec<super::local_storage::ContainerStorage>>>,
    metrics: EvictionMetrics,
}

/// Pods the kubelet never evicts: critical by priority (upstream also exempts every static
/// pod; here static manifests are how most pods run, so only a critical priority protects one).
pub fn is_critical(pod: &Pod) -> bool {
    const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
        || spec
            .and_then(|s| s.priority_class_name.as_deref())
            .is_some_and(|c| c == "system-node-critical" || c == "system-cluster-critical")
}

impl EvictionManager {
    pub fn new(
        config: EvictionConfig,
        sources: Sources,
        metrics: EvictionMetrics,
    ) -> (Arc<EvictionManager>, Waker, mpsc::Receiver<Wake>) {
        let (tx, rx) = mpsc::channel(64);
        let waker = Waker {
            tx,
            wakeups: metrics.wakeups.clone(),
        };
        let manager = Arc::new(EvictionManager {
            config,
            sources,
            state: Mutex::new(State::default()),
            conditions: watch::Sender::new(BTreeSet::new()),
            decisions: broadcast::Sender::new(256),
            observed: watch::Sender::new(Observations::new()),
            container_storage: Mutex::new(HashMap::new()),
            metrics,
        });
        (manager, waker, rx)
    }

    pub fn config(&self) -> &EvictionConfig {
        &self.config
    }

    /// The node's pressure conditions, as they change.
    pub fn conditions(&self) -> watch::Receiver<BTreeSet<NodeCondition>> {
        self.conditions.subscribe()
    }

    pub fn decisions(&self) -> broadcast::Receiver<Decision> {
        self.decisions.subscribe()
    }

    /// The sender of decisions, for the gRPC API to subscribe watchers to.
    pub fn decision_sender(&self) -> broadcast::Sender<Decision> {
        self.decisions.clone()
    }

    pub fn observations(&self) -> watch::Receiver<Observations> {
        self.observed.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Runs until `shutdown`: waits for a wake-up or the periodic check, then decides.
    pub async fn run(
        self: Arc<Self>,
        mut wakes: mpsc::Receiver<Wake>,
        shutdown: CancellationToken,
    ) {
        let mut periodic = tokio::time::interval(self.config.monitoring_period);
        periodic.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_reclaim_check: Option<Instant> = None;
        loop {
            let mut wake = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = periodic.tick() => {
                    self.metrics.wakeups.with_label_values(&[WakeSource::Periodic.as_str()]).inc();
                    Wake { source: WakeSource::Periodic, at: Instant::now() }
                }
                Some(wake) = wakes.recv() => wake,
            };
            // Reclaim records come in storms on a node that is merely busy with page cache: the
            // first one is answered at once, later ones at most once per cool-down. Any other
            // wake-up arriving meanwhile ends the wait.
            if wake.source == WakeSource::Reclaim {
                if let Some(last) = last_reclaim_check {
                    let resume = last + RECLAIM_COOLDOWN;
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep_until(resume.into()) => {}
                        Some(other) = async {
                            loop {
                                match wakes.recv().await {
                                    Some(w) if w.source == WakeSource::Reclaim => continue,
                                    other => return other,
                                }
                            }
                        } => wake = other,
                    }
                }
                last_reclaim_check = Some(Instant::now());
            }
            // Wake-ups that queued meanwhile are answered by this one check.
            while wakes.try_recv().is_ok() {}
            let mut next = Some(wake);
            while let Some(wake) = next.take() {
                // On the periodic check only (upstream's cadence): a kernel wake-up is about
                // memory and must not wait on a runtime round-trip.
                if wake.source == WakeSource::Periodic {
                    self.measure_container_storage().await;
                }
                let Some(done) = self.synchronize(wake) else {
                    break;
                };
                // Upstream waits for the evicted pod to be cleaned up, then looks again at once:
                // one pod per round, as many rounds as the pressure needs.
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tokio::time::timeout(POD_CLEANUP_TIMEOUT, done) => {}
                }
                while wakes.try_recv().is_ok() {}
                self.metrics
                    .wakeups
                    .with_label_values(&[WakeSource::Retry.as_str()])
                    .inc();
                next = Some(Wake {
                    source: WakeSource::Retry,
                    at: Instant::now(),
                });
            }
        }
    }

    /// Measures what the containers of the active pods with `ephemeral-storage` limits write
    /// (a CRI call, so before the decision rather than in it); nothing is asked of the runtime
    /// while no pod has such a limit.
    pub async fn measure_container_storage(&self) {
        let pods: Vec<Arc<Pod>> = (self.sources.active_pods)()
            .into_iter()
            .filter(|p| super::local_storage::has_ephemeral_limits(p) && !is_critical(p))
            .collect();
        let measured = if pods.is_empty() {
            HashMap::new()
        } else {
            (self.sources.container_storage)(pods).await
        };
        *self.container_storage.lock_unpoisoned() = measured;
    }

    /// One decision (upstream `synchronize`). Returns the evicted pod's completion, if any.
    pub fn synchronize(&self, wake: Wake) -> Option<oneshot::Receiver<()>> {
        let observations = (self.sources.observe)();
        let now = Instant::now();
        for (signal, o) in &observations {
            let name = signal.to_string();
            self.metrics
                .observed
                .with_label_values(&[name.as_str(), "available"])
                .set(o.available as f64);
            self.metrics
                .observed
                .with_label_values(&[name.as_str(), "capacity"])
                .set(o.capacity as f64);
        }
        let (met, conditions) = {
            let mut state = self.lock();
            let mut met = thresholds_met(&self.config.thresholds, &observations, false);
            // Thresholds acted on stay met until their minimum reclaim is back.
            if !state.thresholds_met.is_empty() {
                let unresolved = thresholds_met(&state.thresholds_met, &observations, true);
                met = merge_thresholds(met, unresolved);
            }
            let first_observed = thresholds_first_observed_at(&met, &state.first_observed, now);
            let conditions_last = node_conditions_last_observed_at(
                &node_conditions(&met),
                &state.conditions_last_observed,
                now,
            );
            let conditions = node_conditions_observed_since(
                &conditions_last,
                self.config.pressure_transition_period,
                now,
            );
            let met = thresholds_met_grace_period(&met, &first_observed, now);
            state.first_observed = first_observed;
            state.conditions_last_observed = conditions_last;
            state.thresholds_met = met.clone();
            (met, conditions)
        };
        for c in NodeCondition::ALL {
            self.metrics
                .conditions
                .with_label_values(&[c.as_str()])
                .set(if conditions.contains(&c) { 1.0 } else { 0.0 });
        }
        self.conditions.send_if_modified(|old| {
            if *old == conditions {
                return false;
            }
            tracing::info!(conditions = ?conditions, "node pressure conditions changed");
            *old = conditions;
            true
        });
        // Upstream: a pod over its local storage limits goes first, and nothing else this round.
        let outcome = self
            .local_storage_eviction()
            .or_else(|| self.act(&met, &observations, wake));
        self.observed.send_replace(observations);
        let decided = Instant::now();
        self.metrics
            .decision
            .with_label_values(&[wake.source.as_str()])
            .observe(decided.saturating_duration_since(wake.at).as_secs_f64());
        let (signal, pod, message, done) = match outcome {
            Some((signal, pod, message, done)) => (signal, Some(pod), message, Some(done)),
            None => (None, None, String::new(), None),
        };
        let _ = self.decisions.send(Decision {
            source: wake.source,
            woke: wake.at,
            decided,
            signal,
            pod,
            message,
        });
        done
    }

    /// Evicts the first pod (not critical) over a local storage limit, at once (upstream
    /// `localStorageEviction`): an emptyDir over its `sizeLimit`, the pod over its containers'
    /// summed `ephemeral-storage` limits, or a container over its own.
    fn local_storage_eviction(&self) -> Option<Outcome> {
        use super::local_storage::{
            container_ephemeral_violation, empty_dir_violation, has_ephemeral_limits,
            has_size_limits, pod_ephemeral_violation,
        };
        let measured = self.container_storage.lock_unpoisoned().clone();
        for pod in (self.sources.active_pods)() {
            let ephemeral = has_ephemeral_limits(&pod);
            if !(has_size_limits(&pod) || ephemeral) || is_critical(&pod) {
                continue;
            }
            let usage = (self.sources.empty_dir_usage)(&pod);
            let containers = measured
                .get(&pod_uid(&pod))
                .map(Vec::as_slice)
                .unwrap_or_default();
            // The metric's signal as upstream labels these evictions.
            const POD_FS: &str = "ephemeralpodfs.limit";
            const CONTAINER_FS: &str = "ephemeralcontainerfs.limit";
            let found = empty_dir_violation(&pod, &usage)
                .map(|m| (m, POD_FS))
                .or_else(|| {
                    if !ephemeral {
                        return None;
                    }
                    pod_ephemeral_violation(&pod, containers, &usage)
                        .map(|m| (m, POD_FS))
                        .or_else(|| {
                            container_ephemeral_violation(&pod, containers)
                                .map(|m| (m, CONTAINER_FS))
                        })
                });
            let Some((message, signal)) = found else {
                continue;
            };
            let names = pod_names(&pod);
            tracing::warn!(pod = %format!("{}/{}", names.0, names.1), message, "evicting a pod");
            // Its measurement answered; the next round must not act on it again.
            self.container_storage
                .lock_unpoisoned()
                .remove(&pod_uid(&pod));
            let done = self.sources.evictor.evict(&pod, 0, message.clone());
            self.metrics.evictions.with_label_values(&[signal]).inc();
            return Some((None, names, message, done));
        }
        None
    }

    fn act(&self, met: &[Threshold], observations: &Observations, wake: Wake) -> Option<Outcome> {
        let threshold = reclaimable_threshold(met)?;
        let resource = resource_of(threshold.signal);
        if matches!(resource, Resource::Disk | Resource::Inodes) {
            // Node-level reclaim first (upstream `reclaimNodeLevelResources`): dead containers.
            (self.sources.reclaim_disk)();
            let fresh = (self.sources.observe)();
            if fresh
                .get(&threshold.signal)
                .is_none_or(|o| !is_met(threshold, o, true))
            {
                tracing::info!(signal = %threshold.signal, "node-level reclaim relieved the pressure");
                return None;
            }
        }
        let mut pods: Vec<Arc<Pod>> = (self.sources.active_pods)();
        if pods.is_empty() {
            tracing::debug!(signal = %threshold.signal, "threshold met but no pod to evict");
            return None;
        }
        let usage = (self.sources.pod_usage)(&pods);
        rank(resource, &mut pods, &usage);
        for pod in pods {
            if is_critical(&pod) {
                tracing::warn!(
                    pod = pod.metadata.name.as_deref().unwrap_or_default(),
                    "cannot evict a critical pod"
                );
                continue;
            }
            let grace = if threshold.is_hard() {
                0
            } else {
                let spec = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                spec.map_or(self.config.max_pod_grace_period_secs, |g| {
                    g.min(self.config.max_pod_grace_period_secs)
                })
            };
            let uid = pod_uid(&pod);
            let message = eviction_message(
                resource,
                threshold,
                observations.get(&threshold.signal),
                &pod,
                usage.get(&uid),
            );
            let names = pod_names(&pod);
            tracing::warn!(
                pod = %format!("{}/{}", names.0, names.1),
                signal = %threshold.signal,
                threshold = threshold.text,
                woken_by = wake.source.as_str(),
                grace_secs = grace,
                message,
                "evicting a pod"
            );
            let done = self.sources.evictor.evict(&pod, grace, message.clone());
            self.metrics
                .evictions
                .with_label_values(&[threshold.signal.to_string().as_str()])
                .inc();
            return Some((Some(threshold.signal), names, message, done));
        }
        None
    }
}

/// What one round did: the signal acted on (none for a local storage limit), the evicted pod's
/// names, the message and the eviction's completion.
type Outcome = (
    Option<Signal>,
    (String, String, String),
    String,
    oneshot::Receiver<()>,
);

/// (namespace, name, uid) of a pod.
fn pod_names(pod: &Pod) -> (String, String, String) {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
        pod_uid(pod).0,
    )
}

/// The shortest time between two checks woken by reclaim records alone.
pub const RECLAIM_COOLDOWN: Duration = Duration::from_millis(50);

/// How long the manager waits for an evicted pod's containers to stop before looking again
/// (upstream `podCleanupTimeout`).
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;
