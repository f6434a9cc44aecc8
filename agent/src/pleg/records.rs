//! What the PLEG knows of each pod, and the one place that records a new status of a pod.
//!
//! Both PLEGs observe pods — the relist by listing the runtime, the kernel-event PLEG by asking
//! it about one pod after a kernel event, or by reporting an exit from the kernel's account at
//! once — and every observation goes through [`PodRecords::record`]: amended with the kernel's
//! facts ([`KernelFacts`]), stamped with how fresh it is, compared with the pod's last record,
//! put in the [`PodCache`] and its changes sent as [`PodLifecycleEvent`]s. Nothing else writes a
//! status to the cache, so the freshness of what pod workers read is decided here and only here.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::SystemTime,
};

use prometheus::{Histogram, IntCounter};
use tokio::sync::{broadcast, mpsc};

use super::{
    EventType, PodCache, PodLifecycleEvent, PublishedEvent,
    facts::{KernelFacts, Source},
    relist::{compute_events, running_pod_of},
};
use crate::container::{ContainerId, PodStatus, PodUid, RunningPod};
use crate::lock::MutexExt as _;

/// An observation of a pod to record.
pub enum Observation {
    /// A status the runtime just gave, asked for at `at`; `kernel_ts_ns` when a kernel event
    /// caused the question.
    Runtime {
        status: PodStatus,
        at: SystemTime,
        kernel_ts_ns: Option<u64>,
    },
    /// The kernel saw a container's init exit (at `kernel_ts_ns`): the pod's cached status with
    /// the kernel's account of that exit. It keeps the time the cached status was observed: only
    /// the exit is newer than that. Stamped now, it would pass for newer than a pod worker's last
    /// sync, and a worker that has since created a container the cache has not seen yet would
    /// decide on a pod without it (a restarted container that died at once read as the previous
    /// one, still in back-off).
    KernelExit { kernel_ts_ns: u64 },
}

/// Where the events go besides the sync loop's channel.
#[derive(Clone)]
pub struct Outputs {
    /// Every event sent is also told here (the gRPC watchers).
    pub observer: Option<broadcast::Sender<Arc<PublishedEvent>>>,
    /// Kernel timestamp → event sent, for events a kernel event caused.
    pub event_latency: Option<Histogram>,
    /// Events the full channel refused (`kubelet_pleg_discard_events`).
    pub discarded: IntCounter,
}

pub struct PodRecords {
    /// The runtime's name, for container ids of sandboxes ("containerd").
    runtime_name: String,
    cache: Arc<PodCache>,
    /// The last observation of each pod the runtime has.
    pods: Mutex<HashMap<PodUid, RunningPod>>,
    facts: Mutex<KernelFacts>,
    events: mpsc::Sender<PodLifecycleEvent>,
    outputs: Outputs,
}

/// What a full list changed.
pub struct ListChanges {
    /// Events for every container whose state differs from the pod's last record.
    pub events: Vec<PodLifecycleEvent>,
    /// (uid, name, namespace) of the pods that changed or were asked to be looked at again.
    pub to_inspect: Vec<(PodUid, String, String)>,
}

impl PodRecords {
    pub fn new(
        runtime_name: &str,
        facts: KernelFacts,
        outputs: Outputs,
    ) -> (Arc<PodRecords>, mpsc::Receiver<PodLifecycleEvent>) {
        let (tx, rx) = mpsc::channel(super::CHANNEL_CAPACITY);
        let records = Arc::new(PodRecords {
            runtime_name: runtime_name.to_owned(),
            cache: Arc::new(PodCache::default()),
            pods: Mutex::new(HashMap::new()),
            facts: Mutex::new(facts),
            events: tx,
            outputs,
        });
        (records, rx)
    }

    pub fn cache(&self) -> Arc<PodCache> {
        self.cache.clone()
    }

    /// The kernel's facts (the kernel-event PLEG adds to them).
    pub fn facts(&self) -> MutexGuard<'_, KernelFacts> {
        lock(&self.facts)
    }

    /// The name and namespace of a pod seen in the runtime.
    pub fn identity(&self, uid: &PodUid) -> Option<(String, String)> {
        lock(&self.pods)
            .get(uid)
            .map(|p| (p.name.clone(), p.namespace.clone()))
    }

    /// Whether `id` is one of the pod's sandboxes as last seen.
    pub fn is_sandbox(&self, uid: &PodUid, id: &str) -> bool {
        lock(&self.pods)
            .get(uid)
            .is_some_and(|p| p.sandboxes.iter().any(|(s, _)| s == id))
    }

    /// The pod whose last record holds sandbox or container `id` (an event that names only an
    /// id, such as the runtime's for a removed sandbox, is traced back to its pod this way).
    pub fn pod_of(&self, id: &str) -> Option<PodUid> {
        lock(&self.pods)
            .values()
            .find(|p| {
                p.sandboxes.iter().any(|(s, _)| s == id)
                    || p.containers.iter().any(|(c, _, _)| c.id == id)
            })
            .map(|p| p.uid.clone())
    }

    /// Whether the event channel is full (upstream's Evented PLEG is unhealthy then).
    pub fn channel_full(&self) -> bool {
        self.events.capacity() == 0
    }

    /// Makes a full list of the runtime the record of every pod, and says what changed. Pods
    /// gone from the runtime are forgotten with their kernel facts.
    pub fn replace_all(
        &self,
        current: HashMap<PodUid, RunningPod>,
        reinspect: &HashSet<PodUid>,
    ) -> ListChanges {
        let mut pods = lock(&self.pods);
        let uids: BTreeSet<&PodUid> = pods.keys().chain(current.keys()).collect();
        let mut events = Vec::new();
        let mut to_inspect = Vec::new();
        for uid in uids {
            let pod_events =
                compute_events(uid, pods.get(uid), current.get(uid), &self.runtime_name);
            if (!pod_events.is_empty() || reinspect.contains(uid))
                && let Some(pod) = current.get(uid).or_else(|| pods.get(uid))
            {
                to_inspect.push((uid.clone(), pod.name.clone(), pod.namespace.clone()));
            }
            events.extend(pod_events);
        }
        let gone: Vec<PodUid> = pods
            .keys()
            .filter(|uid| !current.contains_key(*uid))
            .cloned()
            .collect();
        *pods = current;
        drop(pods);
        let mut facts = self.facts();
        gone.iter().for_each(|uid| facts.forget_pod(uid));
        ListChanges { events, to_inspect }
    }

    /// Records an observation of pod `uid` (see the module doc). Returns the status recorded,
    /// `None` for a runtime status older than the one recorded (answers of concurrent refreshes
    /// arrive out of order), or for a kernel exit with no cached status showing `container` to
    /// start from (it died before any refresh saw it: the refresh that follows reports it).
    pub fn record(
        &self,
        uid: &PodUid,
        container: Option<&str>,
        observation: Observation,
    ) -> Option<PodStatus> {
        let (mut status, source, observed, kernel_ts_ns) = match observation {
            Observation::Runtime {
                status,
                at,
                kernel_ts_ns,
            } => (status, Source::Runtime, at, kernel_ts_ns),
            Observation::KernelExit { kernel_ts_ns } => {
                let cached = self.cache.get(uid);
                let status = cached.status?;
                if !container.is_some_and(|id| status.containers.iter().any(|c| c.id.id == id)) {
                    return None;
                }
                (status, Source::Cache, cached.timestamp, Some(kernel_ts_ns))
            }
        };
        let confirmed = self.facts().amend(&mut status, source);
        let running = running_pod_of(&status);
        let (mut events, gone) = {
            let mut pods = lock(&self.pods);
            // Refreshes of one pod run concurrently and their answers can arrive out of order:
            // one asked earlier than what the cache holds is older news. It is dropped whole, so
            // the record events are computed from and the status pod workers read stay the same
            // observation (an event computed from a status the cache refused would wake a
            // worker to read the older one, and no later event would come).
            if source == Source::Runtime
                && self
                    .cache
                    .observed_at(uid)
                    .is_some_and(|cached| cached > observed)
            {
                return None;
            }
            let mut events = compute_events(uid, pods.get(uid), Some(&running), &self.runtime_name);
            // The runtime's confirmation of an exit already reported changes no state, so no
            // event says it; its message and reason still have to reach the API status.
            for id in confirmed {
                let id = ContainerId::new(&self.runtime_name, &id);
                if !events.iter().any(|e| e.container.as_ref() == Some(&id)) {
                    events.push(PodLifecycleEvent {
                        pod: uid.clone(),
                        kind: EventType::PodSync,
                        container: Some(id),
                        kernel_ts_ns: None,
                        observed_at: None,
                        status: None,
                    });
                }
            }
            let gone = if running.sandboxes.is_empty() && running.containers.is_empty() {
                pods.remove(uid).is_some()
            } else {
                pods.insert(uid.clone(), running);
                false
            };
            self.cache.set(uid, status.clone(), observed);
            (events, gone)
        };
        if gone {
            self.facts().forget_pod(uid);
        }
        for event in &mut events {
            // A confirmation is no state change the kernel saw: kept out of the latency figures.
            if event.kind != EventType::PodSync {
                event.kernel_ts_ns = kernel_ts_ns;
            }
            event.observed_at = Some(observed);
            event.status = event
                .container
                .as_ref()
                .and_then(|id| status.containers.iter().find(|c| &c.id == id).cloned());
        }
        if !events.is_empty() {
            tracing::debug!(pod = %uid, ?source, events = ?events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), "PLEG: recorded a change");
        }
        let discarded = events
            .into_iter()
            .map(|e| self.send(e))
            .filter(|sent| !sent)
            .count();
        if discarded > 0 {
            tracing::warn!(pod = %uid, discarded, "PLEG: event channel is full, discarding events");
        }
        Some(status)
    }

    /// Records that the runtime could not give pod `uid`'s status.
    pub fn record_error(&self, uid: &PodUid, error: String, at: SystemTime) {
        self.cache.set_error(uid, error, at);
    }

    /// Every status in the cache is at least as fresh as `at` (after a full relist).
    pub fn all_observed_at(&self, at: SystemTime) {
        self.cache.update_time(at);
    }

    /// Sends one event without waiting; `false` (and counted) when the channel is full.
    pub fn send(&self, event: PodLifecycleEvent) -> bool {
        if event.kind == EventType::ContainerChanged {
            return true;
        }
        if let Some(ts) = event.kernel_ts_ns
            && let Some(histogram) = &self.outputs.event_latency
        {
            let seconds = crate::kernel::monotonic_ns().saturating_sub(ts) as f64 / 1e9;
            histogram.observe(seconds);
        }
        if let Some(observer) = &self.outputs.observer {
            let (pod_name, namespace) = self.identity(&event.pod).unwrap_or_default();
            let _ = observer.send(Arc::new(PublishedEvent {
                event: event.clone(),
                pod_name,
                namespace,
                sent_ns: crate::kernel::monotonic_ns(),
            }));
        }
        if self.events.try_send(event).is_err() {
            self.outputs.discarded.inc();
            return false;
        }
        true
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_unpoisoned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::IntCounter;

    use super::*;
    use crate::container::{ContainerId, ContainerState, ContainerStatus};
    use crate::pleg::facts::KernelExit;

    fn status(state: ContainerState) -> PodStatus {
        let mut status = PodStatus::empty(PodUid::from("u1"), "web", "default");
        status.containers.push(ContainerStatus {
            id: ContainerId::new("containerd", "c1"),
            name: "main".into(),
            state,
            created_at: None,
            started_at: None,
            finished_at: None,
            exit_code: (state == ContainerState::Exited).then_some(4),
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            restart_count: 0,
            hash: 0,
            sandbox_id: "sb".into(),
            labels: Default::default(),
            annotations: Default::default(),
        });
        status
    }

    fn records() -> (Arc<PodRecords>, mpsc::Receiver<PodLifecycleEvent>) {
        PodRecords::new(
            "containerd",
            KernelFacts::default(),
            Outputs {
                observer: None,
                event_latency: None,
                discarded: IntCounter::new("d", "d").expect("counter"),
            },
        )
    }

    fn runtime(state: ContainerState, at: SystemTime) -> Observation {
        Observation::Runtime {
            status: status(state),
            at,
            kernel_ts_ns: None,
        }
    }

    #[test]
    fn an_answer_older_than_the_recorded_one_is_dropped_whole() {
        let (records, mut rx) = records();
        let uid = PodUid::from("u1");
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + s);
        assert!(
            records
                .record(&uid, None, runtime(ContainerState::Running, t(1)))
                .is_some()
        );
        assert_eq!(
            rx.try_recv().map(|e| e.kind),
            Ok(EventType::ContainerStarted)
        );
        // Asked at t(3), answered first: still running.
        assert!(
            records
                .record(&uid, None, runtime(ContainerState::Running, t(3)))
                .is_some()
        );
        // Asked at t(2), answered after: older news, even though it shows the exit. No event,
        // and the record and the cache both keep the t(3) answer.
        assert!(
            records
                .record(&uid, None, runtime(ContainerState::Exited, t(2)))
                .is_none()
        );
        assert!(rx.try_recv().is_err());
        assert_eq!(records.cache().observed_at(&uid), Some(t(3)));
        // The next answer shows the exit: the death is sent with the status workers will read.
        assert!(
            records
                .record(&uid, None, runtime(ContainerState::Exited, t(4)))
                .is_some()
        );
        assert_eq!(rx.try_recv().map(|e| e.kind), Ok(EventType::ContainerDied));
        let cached = records.cache().get(&uid);
        assert_eq!(
            cached.status.map(|s| s.containers[0].state),
            Some(ContainerState::Exited)
        );
    }

    /// An exit reported at the kernel's word is sent once; the runtime's confirmation wakes the
    /// pod's worker again only when it brings what the kernel could not know (the message).
    #[test]
    fn a_confirmation_with_a_message_wakes_the_worker_once_more() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + s);
        let run = |message: &str| {
            let (records, mut rx) = records();
            let uid = PodUid::from("u1");
            records.record(&uid, None, runtime(ContainerState::Running, t(1)));
            assert_eq!(
                rx.try_recv().map(|e| e.kind),
                Ok(EventType::ContainerStarted)
            );
            records.facts().record_exit(
                "c1".into(),
                KernelExit {
                    pod: uid.clone(),
                    exit_code: 4,
                    finished_at: t(2),
                },
            );
            let early = records.record(
                &uid,
                Some("c1"),
                Observation::KernelExit { kernel_ts_ns: 7 },
            );
            assert_eq!(
                early.map(|s| s.containers[0].message.clone()),
                Some(String::new())
            );
            let died = rx.try_recv().expect("the kernel's exit is sent");
            assert_eq!(
                (died.kind, died.kernel_ts_ns),
                (EventType::ContainerDied, Some(7))
            );

            let mut confirmed = status(ContainerState::Exited);
            confirmed.containers[0].reason = "Error".into();
            confirmed.containers[0].message = message.into();
            records.record(
                &uid,
                None,
                Observation::Runtime {
                    status: confirmed,
                    at: t(3),
                    kernel_ts_ns: Some(7),
                },
            );
            assert!(!records.facts().exit_pending("c1"));
            let cached = records
                .cache()
                .get(&uid)
                .status
                .map(|s| s.containers[0].message.clone());
            assert_eq!(cached.as_deref(), Some(message));
            let after: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
            after
        };
        let woken = run("crashed");
        assert_eq!(woken.len(), 1, "{woken:?}");
        assert_eq!(woken[0].kind, EventType::PodSync);
        assert_eq!(
            woken[0].container.as_ref().map(|c| c.id.as_str()),
            Some("c1")
        );
        // Not a state the kernel saw: no latency is measured from it.
        assert_eq!(woken[0].kernel_ts_ns, None);
        assert!(run("").is_empty(), "nothing new: no second wake-up");
    }
}
