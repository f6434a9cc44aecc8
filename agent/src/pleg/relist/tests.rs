use std::sync::Mutex as StdMutex;

use tokio::sync::mpsc;

use super::*;
use crate::{
    container::{ContainerStatus, SandboxStatus},
    pleg::{
        RuntimeViewError,
        facts::KernelFacts,
        records::{Outputs, PodRecords},
    },
};

fn cid(id: &str) -> ContainerId {
    ContainerId::new("containerd", id)
}

fn pod(uid: &str, containers: &[(&str, ContainerState)]) -> RunningPod {
    RunningPod {
        uid: PodUid::from(uid),
        name: format!("pod-{uid}"),
        namespace: "default".into(),
        sandboxes: vec![(format!("sb-{uid}"), SandboxState::Ready)],
        containers: containers
            .iter()
            .map(|(id, state)| (cid(id), format!("c-{id}"), *state))
            .collect(),
    }
}

#[derive(Default)]
struct FakeRuntime {
    pods: StdMutex<Vec<RunningPod>>,
    fail_status: StdMutex<HashSet<PodUid>>,
    status_calls: StdMutex<Vec<PodUid>>,
}

#[tonic::async_trait]
impl RuntimeView for FakeRuntime {
    async fn list_pods(&self) -> Result<Vec<RunningPod>, RuntimeViewError> {
        Ok(self.pods.lock().expect("lock").clone())
    }

    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeViewError> {
        self.status_calls.lock().expect("lock").push(uid.clone());
        if self.fail_status.lock().expect("lock").contains(uid) {
            return Err(RuntimeViewError {
                operation: "pod_status",
                message: "runtime hiccup".into(),
            });
        }
        let pods = self.pods.lock().expect("lock");
        let mut status = PodStatus::empty(uid.clone(), name, namespace);
        if let Some(p) = pods.iter().find(|p| &p.uid == uid) {
            status.sandboxes = p
                .sandboxes
                .iter()
                .map(|(id, state)| SandboxStatus {
                    id: id.clone(),
                    state: *state,
                    created_at: SystemTime::UNIX_EPOCH,
                    attempt: 0,
                    ips: vec![],
                    host_network: true,
                    labels: Default::default(),
                    annotations: Default::default(),
                })
                .collect();
            status.containers = p
                .containers
                .iter()
                .map(|(id, name, state)| ContainerStatus {
                    id: id.clone(),
                    name: name.clone(),
                    state: *state,
                    created_at: None,
                    started_at: None,
                    finished_at: None,
                    exit_code: None,
                    reason: String::new(),
                    message: String::new(),
                    image: String::new(),
                    image_ref: String::new(),
                    restart_count: 0,
                    hash: 0,
                    sandbox_id: String::new(),
                    labels: Default::default(),
                    annotations: Default::default(),
                })
                .collect();
        }
        Ok(status)
    }
}

fn pleg(
    runtime: Arc<FakeRuntime>,
    config: PlegConfig,
) -> (
    Arc<RelistPleg>,
    mpsc::Receiver<PodLifecycleEvent>,
    PlegMetrics,
) {
    let metrics = PlegMetrics::register(&Registry::new()).expect("metrics");
    let (records, rx) = PodRecords::new(
        "containerd",
        KernelFacts::default(),
        Outputs {
            observer: None,
            event_latency: None,
            discarded: metrics.discard_events.clone(),
        },
    );
    let pleg = RelistPleg::new(runtime, records, config, metrics.clone());
    (pleg, rx, metrics)
}

fn drain(rx: &mut mpsc::Receiver<PodLifecycleEvent>) -> Vec<(String, EventType, String)> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        let id = e.container.map(|c| c.id).unwrap_or_default();
        out.push((e.pod.0, e.kind, id));
    }
    out
}

#[test]
fn events_for_each_state_transition() {
    use ContainerState::*;
    use EventType::*;
    let uid = PodUid::from("p");
    type Case = (
        Option<RunningPod>,
        Option<RunningPod>,
        Vec<(EventType, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        // A new pod: its sandbox and running container started.
        (
            None,
            Some(pod("p", &[("a", Running)])),
            vec![(ContainerStarted, "a"), (ContainerStarted, "sb-p")],
        ),
        (
            Some(pod("p", &[("a", Running)])),
            Some(pod("p", &[("a", Exited)])),
            vec![(ContainerDied, "a")],
        ),
        (
            Some(pod("p", &[("a", Exited)])),
            Some(pod("p", &[])),
            vec![(ContainerRemoved, "a")],
        ),
        (
            Some(pod("p", &[("a", Running)])),
            Some(pod("p", &[])),
            vec![(ContainerDied, "a"), (ContainerRemoved, "a")],
        ),
        // Created and unknown states are not acted on.
        (
            Some(pod("p", &[])),
            Some(pod("p", &[("a", Created)])),
            vec![],
        ),
        (
            Some(pod("p", &[("a", Running)])),
            Some(pod("p", &[("a", Running)])),
            vec![],
        ),
    ];
    for (old, new, want) in cases {
        let got: Vec<(EventType, String)> =
            compute_events(&uid, old.as_ref(), new.as_ref(), "containerd")
                .into_iter()
                .map(|e| (e.kind, e.container.map(|c| c.id).unwrap_or_default()))
                .collect();
        let want: Vec<(EventType, String)> =
            want.into_iter().map(|(k, id)| (k, id.to_owned())).collect();
        assert_eq!(got, want, "{old:?} -> {new:?}");
    }
}

#[test]
fn a_sandbox_that_stops_is_a_death() {
    let mut before = pod("p", &[]);
    let mut after = before.clone();
    after.sandboxes[0].1 = SandboxState::NotReady;
    let events = compute_events(
        &PodUid::from("p"),
        Some(&before),
        Some(&after),
        "containerd",
    );
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventType::ContainerDied);
    before.sandboxes.clear();
    assert!(
        !compute_events(
            &PodUid::from("p"),
            Some(&before),
            Some(&before),
            "containerd"
        )
        .iter()
        .any(|e| e.kind == EventType::ContainerChanged)
    );
}

#[tokio::test]
async fn a_relist_caches_statuses_before_sending_events() {
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Running)])];
    let (pleg, mut rx, _) = pleg(runtime.clone(), PlegConfig::default());
    pleg.relist().await;
    let event = rx.try_recv().expect("an event");
    // By the time the event is seen, the cache has the pod.
    let cached = pleg.cache().get(&event.pod);
    assert!(cached.status.is_some_and(|s| s.containers.len() == 1));

    // Nothing changed: no event, no status call.
    drain(&mut rx);
    let calls_before = runtime.status_calls.lock().expect("lock").len();
    pleg.relist().await;
    assert!(drain(&mut rx).is_empty());
    assert_eq!(
        runtime.status_calls.lock().expect("lock").len(),
        calls_before
    );

    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Exited)])];
    pleg.relist().await;
    let died = rx.try_recv().expect("ContainerDied");
    assert_eq!(died.kind, EventType::ContainerDied);
    // The event carries the status the relist inspected.
    assert_eq!(
        died.status.map(|s| (s.id.id, s.state)),
        Some(("a".to_owned(), ContainerState::Exited))
    );
    assert!(drain(&mut rx).is_empty());
}

#[tokio::test]
async fn a_failed_status_is_retried_on_the_next_relist() {
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Running)])];
    runtime
        .fail_status
        .lock()
        .expect("lock")
        .insert(PodUid::from("p"));
    let (pleg, _rx, _) = pleg(runtime.clone(), PlegConfig::default());
    pleg.relist().await;
    assert!(pleg.cache().get(&PodUid::from("p")).error.is_some());
    runtime.fail_status.lock().expect("lock").clear();
    pleg.relist().await;
    let cached = pleg.cache().get(&PodUid::from("p"));
    assert!(cached.error.is_none() && cached.status.is_some());
}

#[tokio::test]
async fn events_beyond_the_channel_capacity_are_counted_as_discarded() {
    let runtime = Arc::new(FakeRuntime::default());
    let pods: Vec<RunningPod> = (0..super::super::CHANNEL_CAPACITY + 5)
        .map(|i| pod(&i.to_string(), &[]))
        .collect();
    *runtime.pods.lock().expect("lock") = pods;
    let (pleg, _rx, metrics) = pleg(runtime, PlegConfig::default());
    pleg.relist().await;
    // Each pod's sandbox started: capacity events delivered, the rest discarded.
    assert_eq!(metrics.discard_events.get(), 5);
}

#[tokio::test]
async fn an_on_demand_relist_refreshes_one_pod_and_reports_its_changes() {
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Running)])];
    let (pleg, mut rx, _) = pleg(runtime.clone(), PlegConfig::default());
    pleg.relist().await;
    drain(&mut rx);
    *runtime.pods.lock().expect("lock") = vec![pod(
        "p",
        &[
            ("a", ContainerState::Running),
            ("b", ContainerState::Running),
        ],
    )];
    pleg.relist_pod(&PodUid::from("p")).await;
    assert_eq!(
        drain(&mut rx),
        vec![("p".into(), EventType::ContainerStarted, "b".into())]
    );
    // The next periodic relist does not report it again.
    pleg.relist().await;
    assert!(drain(&mut rx).is_empty());
}

/// The kernel can see a container's program exit while `StartContainer` is still in flight: CRI
/// then says "created". That is not the exit; the refresh keeps asking until CRI says "exited",
/// and the death is reported.
#[tokio::test]
async fn a_refresh_expecting_an_exit_waits_past_created_until_exited() {
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Created)])];
    let (pleg, mut rx, _) = pleg(runtime.clone(), PlegConfig::default());
    pleg.relist().await;
    drain(&mut rx);
    let refresh = {
        let pleg = pleg.clone();
        tokio::spawn(async move {
            pleg.refresh_pod_expecting(
                &PodUid::from("p"),
                "a",
                Expect::Stopped,
                0,
                Duration::from_secs(30),
            )
            .await;
        })
    };
    // Several refreshes see "created" and report nothing.
    let calls = || runtime.status_calls.lock().expect("lock").len();
    let before = calls();
    for _ in 0..1000 {
        if calls() >= before + 3 || refresh.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(drain(&mut rx).is_empty());
    assert!(!refresh.is_finished());
    *runtime.pods.lock().expect("lock") = vec![pod("p", &[("a", ContainerState::Exited)])];
    refresh.await.expect("refresh");
    assert_eq!(
        drain(&mut rx),
        vec![("p".into(), EventType::ContainerDied, "a".into())]
    );
}

/// A start is caught up with once the runtime shows the container running, or already exited.
#[test]
fn what_each_expectation_waits_for() {
    use ContainerState::*;
    let meets = |state, expect| Seen::of_container(state).meets(expect);
    assert!(!meets(Created, Expect::Running));
    assert!(meets(Running, Expect::Running));
    assert!(meets(Exited, Expect::Running));
    assert!(!meets(Created, Expect::Stopped));
    assert!(!meets(Running, Expect::Stopped));
    assert!(meets(Exited, Expect::Stopped));
    assert!(meets(Unknown, Expect::Stopped));
    assert!(meets(Created, Expect::Any));
    assert!(Seen::of_sandbox(SandboxState::NotReady).meets(Expect::Stopped));
    assert!(!Seen::of_sandbox(SandboxState::Ready).meets(Expect::Stopped));
}

#[test]
fn unhealthy_once_the_last_relist_is_older_than_the_threshold() {
    let runtime = Arc::new(FakeRuntime::default());
    let (pleg, _rx, _) = pleg(
        runtime,
        PlegConfig {
            relist_period: Duration::from_secs(1),
            relist_threshold: Duration::ZERO,
        },
    );
    std::thread::sleep(Duration::from_millis(2));
    assert!(
        matches!(pleg.health(), Health::Unhealthy(m) if m.contains("pleg was last seen active"))
    );
}
