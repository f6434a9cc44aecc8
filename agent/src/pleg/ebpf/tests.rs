//! The kernel-event PLEG against synthetic kernel events and a scripted runtime view.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex as StdMutex},
    time::{Duration, SystemTime},
};

use prometheus::Registry;
use tokio::sync::mpsc;

use super::*;
use crate::{
    container::{
        ContainerId, ContainerState, ContainerStatus, PodStatus, RunningPod, SandboxState,
        SandboxStatus,
    },
    kernel::{CgroupChange, ProcessExec, ProcessExit},
    pleg::{
        EventType, PlegConfig, PodLifecycleEvent, RuntimeView, RuntimeViewError,
        facts::{EXIT_MEMORY, KernelExits, KernelFacts},
        records::Outputs,
        relist::PlegMetrics,
    },
};

/// A runtime whose container state follows a script: each status call takes the next state.
#[derive(Default)]
struct ScriptedRuntime {
    states: StdMutex<Vec<ContainerState>>,
    calls: StdMutex<usize>,
}

#[tonic::async_trait]
impl RuntimeView for ScriptedRuntime {
    async fn list_pods(&self) -> Result<Vec<RunningPod>, RuntimeViewError> {
        Ok(Vec::new())
    }

    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeViewError> {
        *self.calls.lock().expect("lock") += 1;
        let state = {
            let mut states = self.states.lock().expect("lock");
            if states.len() > 1 {
                states.remove(0)
            } else {
                states[0]
            }
        };
        Ok(pod_status(
            uid,
            name,
            namespace,
            vec![container("c1", state)],
        ))
    }
}

/// A runtime whose pod shows the containers the test puts in it.
#[derive(Default)]
struct SettableRuntime {
    containers: StdMutex<Vec<ContainerStatus>>,
}

#[tonic::async_trait]
impl RuntimeView for SettableRuntime {
    async fn list_pods(&self) -> Result<Vec<RunningPod>, RuntimeViewError> {
        Ok(Vec::new())
    }

    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeViewError> {
        let containers = self.containers.lock().expect("lock").clone();
        Ok(pod_status(uid, name, namespace, containers))
    }
}

/// A status of pod `uid` with one ready sandbox and `containers`; pods asked about by uid alone
/// are the "web" pod of "default".
fn pod_status(
    uid: &PodUid,
    name: &str,
    namespace: &str,
    containers: Vec<ContainerStatus>,
) -> PodStatus {
    let (name, namespace) = if name.is_empty() {
        ("web", "default")
    } else {
        (name, namespace)
    };
    let mut status = PodStatus::empty(uid.clone(), name, namespace);
    status.sandboxes.push(SandboxStatus {
        id: "sb".into(),
        state: SandboxState::Ready,
        created_at: SystemTime::UNIX_EPOCH,
        attempt: 0,
        ips: vec![],
        host_network: true,
        labels: Default::default(),
        annotations: Default::default(),
    });
    status.containers = containers;
    status
}

/// Container `id` of the "main" container in `state` (exit code 3, `Error`, once exited).
fn container(id: &str, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        id: ContainerId::new("containerd", id),
        name: "main".into(),
        state,
        created_at: None,
        started_at: None,
        finished_at: None,
        exit_code: (state == ContainerState::Exited).then_some(3),
        // containerd's reason for a non-zero exit.
        reason: if state == ContainerState::Exited {
            "Error"
        } else {
            ""
        }
        .into(),
        message: String::new(),
        image: String::new(),
        image_ref: String::new(),
        restart_count: 0,
        hash: 0,
        sandbox_id: "sb".into(),
        labels: Default::default(),
        annotations: Default::default(),
    }
}

struct Fixture<R = ScriptedRuntime> {
    pleg: Arc<EbpfPleg>,
    runtime: Arc<R>,
    events: mpsc::Receiver<PodLifecycleEvent>,
    metrics: EbpfPlegMetrics,
}

fn fixture(states: Vec<ContainerState>) -> Fixture {
    fixture_over(Arc::new(ScriptedRuntime {
        states: StdMutex::new(states),
        calls: StdMutex::new(0),
    }))
}

fn fixture_over<R: RuntimeView>(runtime: Arc<R>) -> Fixture<R> {
    // Pid 100 plays the container's init (pid 1 in its namespace); no exit empties a cgroup
    // but the init's.
    fixture_with(
        runtime,
        Processes {
            is_init: |pid| pid == 100,
            is_last_process: |_, _| false,
        },
    )
}

fn fixture_with<R: RuntimeView>(runtime: Arc<R>, processes: Processes) -> Fixture<R> {
    let registry = Registry::new();
    let pleg_metrics = PlegMetrics::register(&registry).expect("metrics");
    let metrics = EbpfPlegMetrics::register(&registry).expect("metrics");
    let (records, events) = PodRecords::new(
        "containerd",
        KernelFacts::new(Some(metrics.facts())),
        Outputs {
            observer: None,
            event_latency: Some(metrics.event_latency.clone()),
            discarded: pleg_metrics.discard_events.clone(),
        },
    );
    let relist = RelistPleg::new(
        runtime.clone(),
        records.clone(),
        PlegConfig {
            relist_period: RELIST_PERIOD,
            relist_threshold: RELIST_THRESHOLD,
        },
        pleg_metrics,
    );
    // An empty root: nothing to index at start.
    let pleg = EbpfPleg::new(
        relist,
        records,
        PathBuf::from("/nonexistent"),
        crate::cgroup::PodCgroupLayout::new(std::path::Path::new("/"), true),
        metrics.clone(),
        processes,
    );
    Fixture {
        pleg,
        runtime,
        events,
        metrics,
    }
}

fn event(ts_ns: u64, body: EventBody) -> StreamItem {
    StreamItem::Event(KernelEvent {
        ts_ns,
        received_ns: ts_ns,
        cpu: 0,
        body,
    })
}

fn mkdir(id: u64, path: &str) -> StreamItem {
    event(
        1,
        EventBody::CgroupMkdir(CgroupChange {
            cgroup_id: id,
            level: 4,
            path: path.into(),
        }),
    )
}

fn rmdir(id: u64, path: &str) -> StreamItem {
    event(
        9,
        EventBody::CgroupRmdir(CgroupChange {
            cgroup_id: id,
            level: 4,
            path: path.into(),
        }),
    )
}

fn exec(cgroup: u64, pid: u32) -> StreamItem {
    event(
        2,
        EventBody::Exec(ProcessExec {
            cgroup_id: cgroup,
            pid,
            tid: pid,
            old_pid: pid,
            comm: "sh".into(),
            filename: "/bin/sh".into(),
        }),
    )
}

fn exit(cgroup: u64, pid: u32) -> StreamItem {
    event(
        3,
        EventBody::Exit(ProcessExit {
            cgroup_id: cgroup,
            pid,
            tid: pid,
            comm: "sh".into(),
            exit_code: Some(3),
            signal: None,
            core_dumped: false,
            wait_status: 3 << 8,
        }),
    )
}

fn oom(cgroup: u64, pid: u32) -> StreamItem {
    event(
        4,
        EventBody::Oom(crate::kernel::OomKill {
            cgroup_id: cgroup,
            pid,
            comm: "hog".into(),
            exit_ts_ns: 5,
            total_vm_kb: None,
            anon_rss_kb: None,
            file_rss_kb: None,
            shmem_rss_kb: None,
            pgtables_kb: None,
            uid: None,
            oom_score_adj: None,
        }),
    )
}

async fn next_event(rx: &mut mpsc::Receiver<PodLifecycleEvent>) -> PodLifecycleEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event in time")
        .expect("channel open")
}

#[tokio::test]
async fn the_first_exec_starts_a_container_and_only_its_init_exit_kills_it() {
    let mut f = fixture(vec![
        ContainerState::Running,
        // The runtime lags the kernel: the exit shows on the third look.
        ContainerState::Running,
        ContainerState::Running,
        ContainerState::Exited,
    ]);
    f.pleg.handle(&mkdir(10, "/kubepods/besteffort/podu1/c1"));
    // runc's bootstrap runs and exits in the container's cgroup first: no event.
    f.pleg.handle(&event(
        2,
        EventBody::Exec(ProcessExec {
            cgroup_id: 10,
            pid: 99,
            tid: 99,
            old_pid: 99,
            comm: "runc".into(),
            filename: "/dev/fd/6".into(),
        }),
    ));
    f.pleg.handle(&exit(10, 99));
    assert_eq!(
        *f.runtime.calls.lock().expect("lock"),
        0,
        "no refresh for the bootstrap"
    );
    f.pleg.handle(&exec(10, 100));
    let started = next_event(&mut f.events).await;
    assert_eq!(started.kind, EventType::ContainerStarted);
    assert_eq!(started.pod, PodUid::from("u1"));
    assert_eq!(started.kernel_ts_ns, Some(2));

    // A second exec (a child) and a child's exit are not pod events; nor is a buffered mkdir
    // of the same cgroup (it must not forget the init).
    let calls = *f.runtime.calls.lock().expect("lock");
    f.pleg.handle(&exec(10, 101));
    f.pleg.handle(&exit(10, 101));
    f.pleg.handle(&mkdir(10, "/kubepods/besteffort/podu1/c1"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        *f.runtime.calls.lock().expect("lock"),
        calls,
        "no refresh for a child"
    );

    f.pleg.handle(&exit(10, 100));
    let died = loop {
        let e = next_event(&mut f.events).await;
        if e.kind == EventType::ContainerDied {
            break e;
        }
    };
    assert_eq!(died.kernel_ts_ns, Some(3));
    let status = died.status.expect("the refreshed status");
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, Some(3))
    );
    assert_eq!(
        f.metrics.triggers.with_label_values(&["exit"]).get(),
        1,
        "only the init's exit triggered"
    );
}

#[tokio::test]
async fn events_outside_container_cgroups_are_ignored() {
    let mut f = fixture(vec![ContainerState::Running]);
    f.pleg.handle(&mkdir(20, "/kubepods/besteffort/podu1"));
    f.pleg.handle(&exec(20, 100));
    f.pleg.handle(&exec(999, 6));
    f.pleg.handle(&exit(999, 6));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*f.runtime.calls.lock().expect("lock"), 0);
    assert!(f.events.try_recv().is_err());
}

#[tokio::test]
async fn lost_events_force_a_full_relist() {
    let f = fixture(vec![ContainerState::Running]);
    f.pleg.handle(&StreamItem::Lost { count: 3 });
    assert_eq!(f.metrics.relists.with_label_values(&["lost"]).get(), 1);
}

#[tokio::test]
async fn an_ended_stream_is_a_failure_except_at_shutdown() {
    for at_shutdown in [true, false] {
        let f = fixture(vec![ContainerState::Running]);
        let (tx, rx) = broadcast::channel(4);
        drop(tx);
        let shutdown = CancellationToken::new();
        if at_shutdown {
            shutdown.cancel();
        }
        f.pleg.clone().run(rx, shutdown).await;
        let relists = f.metrics.relists.with_label_values(&["stream"]).get();
        let alive = f.pleg.stream_alive.load(Ordering::Acquire);
        assert_eq!((alive, relists), (at_shutdown, u64::from(!at_shutdown)));
    }
}

#[tokio::test]
async fn an_oom_kill_marks_the_container() {
    let f = fixture(vec![ContainerState::Running]);
    f.pleg.handle(&mkdir(30, "/kubepods/podu2/c9"));
    f.pleg.handle(&oom(30, 77));
    assert!(f.pleg.oom_killed("c9"));
}

fn oom_series(metrics: &EbpfPlegMetrics) -> Vec<(Vec<String>, f64)> {
    use prometheus::core::Collector;
    metrics
        .oom_kills
        .collect()
        .iter()
        .flat_map(|family| family.get_metric().to_vec())
        .map(|m| {
            let labels = m.get_label().iter().map(|l| l.value().to_owned()).collect();
            (labels, m.get_counter().get_value())
        })
        .collect()
}

#[tokio::test]
async fn an_oom_series_lives_as_long_as_the_pod_in_the_runtime() {
    let f = fixture(vec![ContainerState::Running]);
    let pod = PodUid::from("u2");
    // The runtime has the pod (its name is what the series is labelled with).
    f.pleg.relist.relist_pod(&pod).await;
    f.pleg.handle(&mkdir(30, "/kubepods/podu2/c9"));
    f.pleg.handle(&oom(30, 77));
    assert_eq!(
        oom_series(&f.metrics),
        vec![(vec!["default".to_owned(), "web".to_owned()], 1.0)]
    );
    // The pod's cgroups go (it terminated) but the runtime still has its sandbox: kept.
    f.pleg.handle(&rmdir(30, "/kubepods/podu2/c9"));
    f.pleg.handle(&rmdir(29, "/kubepods/podu2"));
    assert_eq!(oom_series(&f.metrics).len(), 1);
    // The runtime no longer has it (this runtime lists no pods): the series goes.
    f.pleg.relist.relist().await;
    assert!(oom_series(&f.metrics).is_empty());
}

/// Starts container c1 of pod u1 (cgroup 10, init pid 100) and returns once its start is
/// reported.
async fn started<R>(f: &mut Fixture<R>) {
    f.pleg.handle(&mkdir(10, "/kubepods/besteffort/podu1/c1"));
    f.pleg.handle(&exec(10, 100));
    let e = next_event(&mut f.events).await;
    assert_eq!(e.kind, EventType::ContainerStarted);
    // The sandbox's start came with it.
    while f.events.try_recv().is_ok() {}
}

async fn next_death(rx: &mut mpsc::Receiver<PodLifecycleEvent>) -> PodLifecycleEvent {
    loop {
        let e = next_event(rx).await;
        if e.kind == EventType::ContainerDied {
            return e;
        }
    }
}

/// Waits (bounded) until the runtime has confirmed every exit the kernel reported.
async fn confirmed<R>(f: &Fixture<R>) {
    for _ in 0..1000 {
        if f.pleg.records.facts().exits.by_container.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the exit was never confirmed");
}

#[tokio::test]
async fn an_exit_is_reported_with_the_kernels_account_before_the_runtime_shows_it() {
    // The runtime shows the exit only on its fourth look after the start.
    let mut f = fixture(vec![
        ContainerState::Running,
        ContainerState::Running,
        ContainerState::Running,
        ContainerState::Running,
        ContainerState::Exited,
    ]);
    started(&mut f).await;
    let calls = *f.runtime.calls.lock().expect("lock");
    f.pleg.handle(&exit(10, 100));
    // Reported before the runtime is asked anything (this test's runtime runs the spawned
    // refresh only once the test awaits).
    let died = f.events.try_recv().expect("ContainerDied at once");
    assert_eq!(died.kind, EventType::ContainerDied);
    assert_eq!(died.kernel_ts_ns, Some(3));
    assert_eq!(*f.runtime.calls.lock().expect("lock"), calls);
    let status = died.status.expect("a status");
    assert_eq!(status.state, ContainerState::Exited);
    assert_eq!(status.exit_code, Some(3));
    assert_eq!(status.reason, "Error");
    assert!(status.finished_at.is_some());
    // The cache the pod worker reads has it too.
    let cached = f
        .pleg
        .cache()
        .get(&PodUid::from("u1"))
        .status
        .expect("cached");
    assert_eq!(cached.containers[0].state, ContainerState::Exited);
    // Follow-up refreshes run until the runtime agrees; it agreed on the exit code.
    confirmed(&f).await;
    assert!(*f.runtime.calls.lock().expect("lock") >= calls + 4);
    assert_eq!(f.metrics.exit_disagreements.get(), 0);
    // No second death for the confirmation.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(f.events.try_recv().is_err());
}

#[tokio::test]
async fn the_runtime_wins_when_it_reports_another_exit_code() {
    let mut f = fixture(vec![
        ContainerState::Running,
        ContainerState::Running,
        ContainerState::Exited,
    ]);
    started(&mut f).await;
    // The kernel says SIGKILL (137); this runtime says 3.
    f.pleg.handle(&event(
        3,
        EventBody::Exit(ProcessExit {
            cgroup_id: 10,
            pid: 100,
            tid: 100,
            comm: "sh".into(),
            exit_code: None,
            signal: Some(9),
            core_dumped: false,
            wait_status: 9,
        }),
    ));
    let died = next_death(&mut f.events).await;
    assert_eq!(died.status.and_then(|s| s.exit_code), Some(137));
    confirmed(&f).await;
    assert_eq!(f.metrics.exit_disagreements.get(), 1);
    let cached = f
        .pleg
        .cache()
        .get(&PodUid::from("u1"))
        .status
        .expect("cached");
    assert_eq!(cached.containers[0].exit_code, Some(3));
}

#[test]
fn unconfirmed_exits_are_bounded_and_go_with_their_pod() {
    let mut exits = KernelExits::default();
    let exit = |pod: &str| KernelExit {
        pod: PodUid::from(pod),
        exit_code: 0,
        finished_at: SystemTime::UNIX_EPOCH,
    };
    for i in 0..EXIT_MEMORY + 2 {
        exits.insert(format!("c{i}"), exit("a"));
    }
    assert_eq!(exits.by_container.len(), EXIT_MEMORY);
    assert!(!exits.contains("c0") && !exits.contains("c1") && exits.contains("c2"));
    exits.insert("b1".into(), exit("b"));
    exits.remove_pod(&PodUid::from("a"));
    assert_eq!(exits.by_container.len(), 1);
    assert_eq!(exits.order.len(), 1);
    assert!(exits.contains("b1"));
}

#[tokio::test]
async fn an_exit_reported_from_the_cache_is_no_newer_than_the_status_it_amends() {
    let uid = PodUid::from("u1");
    let runtime = Arc::new(SettableRuntime::default());
    *runtime.containers.lock().expect("lock") = vec![container("c1", ContainerState::Running)];
    let mut f = fixture_over(runtime);
    started(&mut f).await;
    *f.runtime.containers.lock().expect("lock") = vec![container("c1", ContainerState::Exited)];
    f.pleg.handle(&exit(10, 100));
    next_death(&mut f.events).await;
    confirmed(&f).await;
    // A pod worker restarts the container: c2 is created and started, and its sync ends.
    *f.runtime.containers.lock().expect("lock") = vec![
        container("c1", ContainerState::Exited),
        container("c2", ContainerState::Exited),
    ];
    tokio::time::sleep(Duration::from_millis(2)).await;
    let synced_at = SystemTime::now();
    // c2 dies at once, before any refresh has shown it: the kernel's account of its exit has
    // no cached status showing c2 to go into (the refreshes its exec and exit cause run only
    // once this test awaits).
    f.pleg.handle(&mkdir(11, "/kubepods/besteffort/podu1/c2"));
    f.pleg.handle(&exec(11, 100));
    f.pleg.handle(&exit(11, 100));
    // What the worker's next sync reads: a status newer than its sync shows what it created.
    let cached = f
        .pleg
        .cache()
        .get_newer_than(&uid, synced_at, Duration::from_secs(10))
        .await;
    assert!(cached.timestamp > synced_at);
    let ids: Vec<String> = cached
        .status
        .expect("a status")
        .containers
        .iter()
        .map(|c| c.id.id.clone())
        .collect();
    assert_eq!(ids, ["c1", "c2"]);
}

#[tokio::test]
async fn an_exit_reported_from_the_cache_keeps_the_cached_status_time() {
    let uid = PodUid::from("u1");
    let mut f = fixture(vec![ContainerState::Running]);
    started(&mut f).await;
    let before = f.pleg.cache().get(&uid).timestamp;
    f.pleg.handle(&exit(10, 100));
    let died = f.events.try_recv().expect("ContainerDied at once");
    assert_eq!(died.kind, EventType::ContainerDied);
    let cached = f.pleg.cache().get(&uid);
    assert_eq!(cached.timestamp, before);
    assert_eq!(
        cached.status.expect("cached").containers[0].state,
        ContainerState::Exited
    );
}

#[tokio::test]
async fn an_exit_reported_again_from_the_cache_stays_until_the_runtime_shows_it() {
    let uid = PodUid::from("u1");
    // The runtime is slow to show the exit: it reports the container running throughout.
    let mut f = fixture(vec![ContainerState::Running]);
    started(&mut f).await;
    f.pleg.handle(&exit(10, 100));
    assert_eq!(
        next_death(&mut f.events).await.kind,
        EventType::ContainerDied
    );
    // Reported from the cache again (a refresh amended the cached status with the kernel's
    // account before the exit event was handled): the cache's exit is the kernel's, no
    // confirmation.
    assert!(
        f.pleg
            .records
            .record(
                &uid,
                Some("c1"),
                Observation::KernelExit { kernel_ts_ns: 3 }
            )
            .is_some()
    );
    assert!(f.pleg.records.facts().exit_pending("c1"));
    // So the runtime's next status, still behind, does not bring the dead container back.
    f.pleg.relist.relist_pod(&uid).await;
    let cached = f.pleg.cache().get(&uid).status.expect("cached");
    assert_eq!(cached.containers[0].state, ContainerState::Exited);
}

#[tokio::test]
async fn a_sandbox_exit_is_left_to_the_runtime() {
    let mut f = fixture(vec![ContainerState::Running]);
    started(&mut f).await;
    // The pod's sandbox (its pause process, pid 100 of its own namespace) starts and the
    // refresh that follows shows it as the sandbox.
    f.pleg.handle(&mkdir(12, "/kubepods/besteffort/podu1/sb"));
    f.pleg.handle(&exec(12, 100));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(f.pleg.records.is_sandbox(&PodUid::from("u1"), "sb"));
    // The pod ends: the pause process exits. No container died, and no kernel account of the
    // exit waits for a container status the runtime will never show.
    f.pleg.handle(&exit(12, 100));
    assert!(!f.pleg.records.facts().exit_pending("sb"));
    assert!(f.pleg.records.facts().exits.by_container.is_empty());
    assert!(
        std::iter::from_fn(|| f.events.try_recv().ok()).all(
            |e| e.kind != EventType::ContainerDied || e.container.is_some_and(|c| c.id == "sb")
        ),
        "only the sandbox's own change"
    );
}

#[tokio::test]
async fn a_death_is_seen_when_the_containers_start_was_lost() {
    // The exec of the container's program was lost (a full ring buffer): the index never saw it
    // start. The exit that empties its cgroup still makes the runtime be asked.
    let runtime = Arc::new(ScriptedRuntime {
        states: StdMutex::new(vec![ContainerState::Exited]),
        calls: StdMutex::new(0),
    });
    let mut f = fixture_with(
        runtime,
        Processes {
            is_init: |_| false,
            is_last_process: |_, pid| pid == 100,
        },
    );
    f.pleg.handle(&mkdir(10, "/kubepods/besteffort/podu1/c1"));
    // A bootstrap process exits, leaving the container's init behind: nothing.
    f.pleg.handle(&exit(10, 99));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(*f.runtime.calls.lock().expect("lock"), 0);
    f.pleg.handle(&exit(10, 100));
    let died = next_death(&mut f.events).await;
    assert_eq!(died.pod, PodUid::from("u1"));
    assert_eq!(died.status.and_then(|s| s.exit_code), Some(3));
    assert_eq!(f.metrics.triggers.with_label_values(&["exit"]).get(), 1);
}

#[tokio::test]
async fn a_container_without_an_init_of_its_own_dies_when_its_cgroup_goes() {
    // An ephemeral container in its target's pid namespace (or any container of a pod sharing
    // one): none of its processes is pid 1 of a namespace, and the exit of its last one can read
    // the cgroup still populated. The runtime removing the cgroup says it is dead.
    let runtime = Arc::new(SettableRuntime::default());
    *runtime.containers.lock().expect("lock") =
        vec![container("debugger", ContainerState::Running)];
    let mut f = fixture_over(runtime.clone());
    f.pleg
        .handle(&mkdir(10, "/kubepods/besteffort/podu1/debugger"));
    f.pleg.handle(&exec(10, 200));
    let started = next_event(&mut f.events).await;
    assert_eq!(started.kind, EventType::ContainerStarted);
    *runtime.containers.lock().expect("lock") = vec![container("debugger", ContainerState::Exited)];
    f.pleg.handle(&exit(10, 200));
    assert_eq!(f.metrics.triggers.with_label_values(&["exit"]).get(), 0);
    f.pleg
        .handle(&rmdir(10, "/kubepods/besteffort/podu1/debugger"));
    let died = next_death(&mut f.events).await;
    assert_eq!(died.pod, PodUid::from("u1"));
    assert_eq!(
        f.metrics
            .triggers
            .with_label_values(&["cgroup_rmdir"])
            .get(),
        1
    );
}
