//! The Evented PLEG against the fake CRI runtime: events fill the cache with no relist, a
//! broken stream is counted and re-subscribed until the fall back, and the relist that takes over
//! finds what no event told; on containerd 1.7 each subscription relists until its first event.

use std::{sync::Arc, time::Duration};

use k8s_cri::v1 as cri;
use prometheus::Registry;
use tokio::sync::mpsc;

use super::*;
use crate::{
    container::{ContainerState, RunningPod, SandboxState},
    cri::{Operation, fake::FakeRuntime},
    pleg::{
        EventType, PodLifecycleEvent, RuntimeView, RuntimeViewError, facts::KernelFacts,
        records::Outputs, relist::PlegMetrics,
    },
};

/// The relist's view of the fake, through the same conversions the agent's runtime manager uses.
struct CriView(Arc<FakeRuntime>);

#[tonic::async_trait]
impl RuntimeView for CriView {
    async fn list_pods(&self) -> Result<Vec<RunningPod>, RuntimeViewError> {
        convert::get_pods(self.0.as_ref(), true)
            .await
            .map_err(|e| RuntimeViewError {
                operation: "list_pods",
                message: e.to_string(),
            })
    }

    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeViewError> {
        convert::get_pod_status(self.0.as_ref(), uid, name, namespace)
            .await
            .map_err(|e| RuntimeViewError {
                operation: "pod_status",
                message: e.to_string(),
            })
    }
}

struct Harness {
    fake: Arc<FakeRuntime>,
    pleg: Arc<EventedPleg>,
    relist: Arc<RelistPleg>,
    relist_metrics: PlegMetrics,
    metrics: EventedPlegMetrics,
    events: mpsc::Receiver<PodLifecycleEvent>,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The relist (at the evented period) and the Evented PLEG over `fake`, both running, after the
/// relist's first pass.
async fn harness(fake: FakeRuntime) -> Harness {
    let fake = Arc::new(fake);
    let registry = Registry::new();
    let relist_metrics = PlegMetrics::register(&registry).expect("metrics");
    let (records, events) = PodRecords::new(
        "containerd",
        KernelFacts::default(),
        Outputs {
            observer: None,
            event_latency: None,
            discarded: relist_metrics.discard_events.clone(),
        },
    );
    let relist = RelistPleg::new(
        Arc::new(CriView(fake.clone())),
        records.clone(),
        PlegConfig {
            relist_period: RELIST_PERIOD,
            relist_threshold: RELIST_THRESHOLD,
        },
        relist_metrics.clone(),
    );
    let metrics = EventedPlegMetrics::register(&registry).expect("metrics");
    let pleg = EventedPleg::new(fake.clone(), relist.clone(), records, metrics.clone());
    let shutdown = CancellationToken::new();
    tokio::spawn(relist.clone().run(shutdown.clone()));
    tokio::spawn(pleg.clone().run(shutdown.clone()));
    let h = Harness {
        fake,
        pleg,
        relist,
        relist_metrics,
        metrics,
        events,
        shutdown,
    };
    until("the first relist", || relists(&h) >= 1).await;
    h
}

fn relists(h: &Harness) -> u64 {
    h.relist_metrics.relist_duration.get_sample_count()
}

/// Waits (at most 5 s) for `cond`.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The next event of `kind` about container (or sandbox) `id`, skipping others.
async fn next_event(h: &mut Harness, kind: EventType, id: &str) -> PodLifecycleEvent {
    let wait = async {
        loop {
            let event = h.events.recv().await.expect("the channel is open");
            if event.kind == kind && event.container.as_ref().is_some_and(|c| c.id == id) {
                return event;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .unwrap_or_else(|_| panic!("no {kind:?} for {id}"))
}

fn cached(h: &Harness, uid: &str) -> PodStatus {
    h.pleg
        .cache()
        .get(&PodUid::from(uid))
        .status
        .expect("a cached status")
}

fn evented_fake() -> FakeRuntime {
    let fake = FakeRuntime::new();
    fake.enable_container_events();
    fake
}

#[tokio::test]
async fn events_update_the_cache_directly_with_no_relist() {
    let mut h = harness(evented_fake()).await;
    until("the subscription", || {
        h.fake.container_event_subscribers() == 1
    })
    .await;
    let (sandbox, ids) = h
        .fake
        .start_pod("u1", "web", "default", &["main"])
        .await
        .expect("pod");
    let id = ids[0].clone();
    use cri::ContainerEventType as Kind;

    h.fake
        .send_container_event(&id, &sandbox, Kind::ContainerStartedEvent);
    let started = next_event(&mut h, EventType::ContainerStarted, &id).await;
    assert_eq!(
        started.status.map(|s| s.state),
        Some(ContainerState::Running)
    );
    let status = cached(&h, "u1");
    assert_eq!(
        (status.name.as_str(), status.namespace.as_str()),
        ("web", "default")
    );
    assert_eq!(status.sandboxes[0].state, SandboxState::Ready);

    // Stopped with an exit code: the event's status is the cached one, exit code and reason.
    assert!(h.fake.exit_container(&id, 3));
    h.fake
        .send_container_event(&id, &sandbox, Kind::ContainerStoppedEvent);
    let died = next_event(&mut h, EventType::ContainerDied, &id).await;
    let dead = died.status.expect("the container's status");
    assert_eq!(
        (dead.state, dead.exit_code, dead.reason.as_str()),
        (ContainerState::Exited, Some(3), "Error")
    );
    assert_eq!(cached(&h, "u1").containers[0].exit_code, Some(3));

    // Deleted: gone from the cached status, and said so.
    h.fake.remove_container(&id).await.expect("remove");
    h.fake
        .send_container_event(&id, &sandbox, Kind::ContainerDeletedEvent);
    next_event(&mut h, EventType::ContainerRemoved, &id).await;
    assert!(cached(&h, "u1").containers.is_empty());

    // The sandbox's own events: stopped, then removed (containerd sends that one without the
    // sandbox's status, which is gone: the pod is relisted).
    h.fake.stop_pod_sandbox(&sandbox).await.expect("stop");
    h.fake
        .send_container_event(&sandbox, &sandbox, Kind::ContainerStoppedEvent);
    next_event(&mut h, EventType::ContainerDied, &sandbox).await;
    assert_eq!(cached(&h, "u1").sandboxes[0].state, SandboxState::NotReady);
    h.fake.remove_pod_sandbox(&sandbox).await.expect("remove");
    h.fake
        .send_container_event(&sandbox, &sandbox, Kind::ContainerDeletedEvent);
    next_event(&mut h, EventType::ContainerRemoved, &sandbox).await;
    assert!(cached(&h, "u1").sandboxes.is_empty());

    assert_eq!(relists(&h), 1, "every change came from an event");
    assert_eq!(h.metrics.connections.get(), 1);
    assert_eq!(h.metrics.connection_errors.get(), 0);
    assert_eq!(h.metrics.events.with_label_values(&["stopped"]).get(), 2);
    assert_eq!(h.metrics.latency.get_sample_count(), 5);
    assert_eq!(h.pleg.health(), Health::Healthy);
}

#[tokio::test]
async fn an_older_event_does_not_overwrite_a_newer_status() {
    let mut h = harness(evented_fake()).await;
    until("the subscription", || {
        h.fake.container_event_subscribers() == 1
    })
    .await;
    let (sandbox, ids) = h
        .fake
        .start_pod("u1", "web", "default", &["main"])
        .await
        .expect("pod");
    use cri::ContainerEventType as Kind;
    h.fake
        .send_container_event(&ids[0], &sandbox, Kind::ContainerStartedEvent);
    next_event(&mut h, EventType::ContainerStarted, &ids[0]).await;
    // A relist observes the exit now, later than the next event's stamp (the fake's clock is
    // in 2023): that event is older news and changes nothing.
    assert!(h.fake.exit_container(&ids[0], 1));
    h.relist.relist().await;
    next_event(&mut h, EventType::ContainerDied, &ids[0]).await;
    let observed = h.pleg.cache().observed_at(&PodUid::from("u1"));
    h.fake
        .send_container_event(&ids[0], &sandbox, Kind::ContainerStoppedEvent);
    until("the event", || {
        h.metrics.events.with_label_values(&["stopped"]).get() == 1
    })
    .await;
    assert_eq!(h.pleg.cache().observed_at(&PodUid::from("u1")), observed);
}

#[tokio::test]
async fn a_broken_stream_is_retried_then_the_relist_takes_over_and_misses_no_exit() {
    let mut h = harness(evented_fake()).await;
    until("the subscription", || {
        h.fake.container_event_subscribers() == 1
    })
    .await;
    let (sandbox, ids) = h
        .fake
        .start_pod("u1", "web", "default", &["main"])
        .await
        .expect("pod");
    h.fake.send_container_event(
        &ids[0],
        &sandbox,
        cri::ContainerEventType::ContainerStartedEvent,
    );
    next_event(&mut h, EventType::ContainerStarted, &ids[0]).await;

    // Four breaks: each counted, followed by a relist, and a new subscription.
    for broken in 1..stream::MAX_STREAM_RETRIES {
        h.fake.break_container_events(tonic::Code::Unavailable);
        until("a new subscription", || {
            h.metrics.connections.get() == u64::from(broken) + 1
                && h.fake.container_event_subscribers() == 1
        })
        .await;
        assert_eq!(h.metrics.connection_errors.get(), u64::from(broken));
        assert_eq!(
            h.pleg.stream_state(),
            StreamState::Streaming { failures: broken }
        );
    }
    assert_eq!(h.metrics.fell_back.get(), 0);

    // The container exits while no event tells it, and the stream breaks a fifth time: the
    // relist takes over at once, at its own period, and finds the exit.
    assert!(h.fake.exit_container(&ids[0], 7));
    h.fake.break_container_events(tonic::Code::Unavailable);
    let died = next_event(&mut h, EventType::ContainerDied, &ids[0]).await;
    assert_eq!(died.status.and_then(|s| s.exit_code), Some(7));
    until("the fall back", || h.metrics.fell_back.get() == 1).await;
    assert_eq!(h.pleg.stream_state(), StreamState::FellBack);
    assert_eq!(h.metrics.fell_back.get(), 1);
    assert_eq!(
        h.metrics.connection_errors.get(),
        u64::from(stream::MAX_STREAM_RETRIES)
    );
    assert_eq!(h.relist.config().relist_period, Duration::from_secs(1));
    assert_eq!(h.relist.config().relist_threshold, Duration::from_secs(180));
    let subscriptions = |h: &Harness| {
        h.fake
            .calls()
            .iter()
            .filter(|c| c.operation() == Operation::GetContainerEvents)
            .count()
    };
    assert_eq!(subscriptions(&h), 5);
    // No re-subscription after the fall back (upstream keeps to the relist until restarted),
    // while the relist keeps running every second.
    let before = relists(&h);
    until("a periodic relist", || relists(&h) > before).await;
    assert_eq!(subscriptions(&h), 5);
    assert_eq!(h.pleg.health(), Health::Healthy);
}

#[tokio::test]
async fn refused_subscriptions_count_the_same_way() {
    let fake = evented_fake();
    fake.fail_always(Operation::GetContainerEvents, tonic::Code::Unavailable);
    let h = harness(fake).await;
    until("the fall back", || h.metrics.fell_back.get() == 1).await;
    assert_eq!(h.metrics.connections.get(), 0);
    assert_eq!(
        h.metrics.connection_errors.get(),
        u64::from(stream::MAX_STREAM_RETRIES)
    );
    assert_eq!(h.relist.config().relist_period, Duration::from_secs(1));
}

#[tokio::test]
async fn a_runtime_without_container_events_is_refused_naming_what_is_needed() {
    // The fake answers as containerd 1.6 until told otherwise.
    let fake = FakeRuntime::new();
    let error = check_runtime(&fake).await.expect_err("refused");
    let text = error.to_string();
    for needed in [
        "--pleg evented",
        "containerd 1.6.20-fake",
        "containerd >= 1.7",
        "Unimplemented",
    ] {
        assert!(text.contains(needed), "{needed:?} in {text}");
    }
    fake.enable_container_events();
    assert!(check_runtime(&fake).await.is_ok());
    // Another failure is the stream's ordinary trouble, not a refusal.
    fake.fail_next(Operation::GetContainerEvents, tonic::Code::Unavailable);
    assert!(check_runtime(&fake).await.is_ok());
}

#[test]
fn only_containerd_1_7_serves_each_event_once() {
    for (runtime, version, once) in [
        ("containerd", "1.7.24~ds1", true),
        ("containerd", "v1.7.30", true),
        ("containerd", "1.7", true),
        ("containerd", "1.6.20", false),
        ("containerd", "2.1.9+unknown", false),
        ("containerd", "v2.0.0", false),
        ("containerd", "1.70.0", false),
        ("containerd", "11.7.0", false),
        ("cri-o", "1.7.0", false),
        ("containerd", "", false),
    ] {
        assert_eq!(
            serves_each_event_once(runtime, version),
            once,
            "{runtime} {version}"
        );
    }
}

#[tokio::test]
async fn on_containerd_1_7_a_subscription_relists_until_its_first_event() {
    let fake = evented_fake();
    fake.set_runtime_version("1.7.24~ds1");
    let mut h = harness(fake).await;
    until("the subscription", || {
        h.fake.container_event_subscribers() == 1
    })
    .await;
    let fast = fallback_config().relist_period;
    until("the relist at its own period", || {
        h.relist.config().relist_period == fast
    })
    .await;
    // An exit no event on this stream tells (containerd 1.7 handed it to a subscription that
    // went away): the relist finds it within its own period.
    let (sandbox, ids) = h
        .fake
        .start_pod("u1", "web", "default", &["main"])
        .await
        .expect("pod");
    assert!(h.fake.exit_container(&ids[0], 3));
    let died = next_event(&mut h, EventType::ContainerDied, &ids[0]).await;
    assert_eq!(died.status.and_then(|s| s.exit_code), Some(3));
    // The stream's first event: every stale subscription took its own before it, so the
    // relist is back at the evented period.
    h.fake.send_container_event(
        &ids[0],
        &sandbox,
        cri::ContainerEventType::ContainerStoppedEvent,
    );
    until("the evented period", || {
        h.relist.config().relist_period == RELIST_PERIOD
    })
    .await;
    assert_eq!(h.relist.config().relist_threshold, RELIST_THRESHOLD);
    // A new subscription after a broken stream catches up the same way.
    h.fake.break_container_events(tonic::Code::Unavailable);
    until("a new subscription", || {
        h.metrics.connections.get() == 2 && h.fake.container_event_subscribers() == 1
    })
    .await;
    until("the relist at its own period again", || {
        h.relist.config().relist_period == fast
    })
    .await;
    assert_eq!(
        h.pleg.stream_state(),
        StreamState::Streaming { failures: 1 }
    );
}

#[test]
fn an_event_replaces_only_its_own_sandbox() {
    use crate::container::{ContainerId, ContainerStatus, SandboxStatus};
    use std::time::SystemTime;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let sandbox = |id: &str, created: u64, state| SandboxStatus {
        id: id.to_owned(),
        state,
        created_at: at(created),
        attempt: 0,
        ips: Vec::new(),
        host_network: false,
        labels: Default::default(),
        annotations: Default::default(),
    };
    let container = |id: &str, sandbox: &str, created: u64, state| ContainerStatus {
        id: ContainerId::new("containerd", id),
        name: "main".into(),
        state,
        created_at: Some(at(created)),
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: String::new(),
        message: String::new(),
        image: String::new(),
        image_ref: String::new(),
        restart_count: 0,
        hash: 0,
        sandbox_id: sandbox.to_owned(),
        labels: Default::default(),
        annotations: Default::default(),
    };
    let mut cached = PodStatus::empty(PodUid::from("u1"), "web", "default");
    cached.sandboxes = vec![
        sandbox("new", 20, SandboxState::Ready),
        sandbox("old", 10, SandboxState::NotReady),
    ];
    cached.containers = vec![
        container("c2", "new", 21, ContainerState::Running),
        container("c1", "old", 11, ContainerState::Exited),
    ];
    let mut event = PodStatus::empty(PodUid::from("u1"), "web", "default");
    event.sandboxes = vec![sandbox("new", 20, SandboxState::Ready)];
    event.containers = vec![
        container("c3", "new", 22, ContainerState::Created),
        container("c2", "new", 21, ContainerState::Exited),
    ];
    event.observed_at = at(30);
    let merged = merge(Some(cached), event.clone());
    let ids: Vec<&str> = merged.containers.iter().map(|c| c.id.id.as_str()).collect();
    assert_eq!(
        ids,
        ["c3", "c2", "c1"],
        "newest first, the old sandbox's kept"
    );
    assert_eq!(merged.containers[1].state, ContainerState::Exited);
    let sandboxes: Vec<&str> = merged.sandboxes.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(sandboxes, ["new", "old"]);
    assert_eq!(merged.observed_at, at(30));
    assert_eq!(merge(None, event.clone()), event);

    // A message read by a refresh stays when an event brings the container again.
    let mut read = merged.clone();
    read.containers[1].message = "runtime: last words".into();
    event.containers[1].message = "runtime".into();
    let again = merge(Some(read), event.clone());
    assert_eq!(again.containers[1].message, "runtime: last words");
}
