//! The pod workers against a scripted syncer: coalescing, the termination sequence, cancellation,
//! static-pod succession, housekeeping, back-off.

use crate::testing;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::container::{PodStatus, PodUid, RunningPod};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Sync(String, UpdateType, String),
    Terminating(String, u64),
    TerminatingRuntime(String),
    Terminated(String),
}

#[derive(Default)]
struct Script {
    calls: Vec<Call>,
    /// sync_pod of these UIDs blocks until released or cancelled.
    block: HashMap<String, Arc<Notify>>,
    /// sync_pod of these UIDs reports the pod terminal.
    terminal: Vec<String>,
    /// sync_pod of these UIDs fails.
    fail: Vec<String>,
}

#[derive(Default)]
struct FakeSyncer {
    script: Mutex<Script>,
    progress: Notify,
}

impl FakeSyncer {
    fn calls(&self) -> Vec<Call> {
        self.script.lock().expect("lock").calls.clone()
    }

    fn record(&self, call: Call) {
        self.script.lock().expect("lock").calls.push(call);
        self.progress.notify_waiters();
    }

    /// Waits until the recorded calls satisfy `done` (bounded, so a bug fails instead of hangs).
    async fn wait_for(&self, done: impl Fn(&[Call]) -> bool) -> Vec<Call> {
        let result = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = self.progress.notified();
                let calls = self.calls();
                if done(&calls) {
                    return calls;
                }
                notified.await;
            }
        })
        .await;
        result.unwrap_or_else(|_| panic!("calls never got there: {:#?}", self.calls()))
    }
}

/// The fake's failures: the two a test scripts.
#[derive(Debug, thiserror::Error)]
enum FakeError {
    #[error("cancelled")]
    Cancelled,
    #[error("scripted failure")]
    Scripted,
}

#[tonic::async_trait]
impl PodSyncer for FakeSyncer {
    type Error = FakeError;

    async fn sync_pod(
        &self,
        update: UpdateType,
        pod: &Pod,
        _status: &PodStatus,
        cancel: &CancellationToken,
    ) -> Result<SyncPodOutcome, FakeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        let (block, terminal, fail) = {
            let script = self.script.lock().expect("lock");
            (
                script.block.get(&uid).cloned(),
                script.terminal.contains(&uid),
                script.fail.contains(&uid),
            )
        };
        self.record(Call::Sync(uid.clone(), update, version));
        if let Some(release) = block {
            tokio::select! {
                () = release.notified() => {}
                () = cancel.cancelled() => return Err(FakeError::Cancelled),
            }
        }
        if fail {
            return Err(FakeError::Scripted);
        }
        Ok(SyncPodOutcome {
            terminal,
            retry_after: None,
        })
    }

    async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        _status: &PodStatus,
        grace: Duration,
    ) -> Result<(), FakeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.record(Call::Terminating(uid, grace.as_secs()));
        Ok(())
    }

    async fn sync_terminating_runtime_pod(&self, running: &RunningPod) -> Result<(), FakeError> {
        self.record(Call::TerminatingRuntime(running.uid.0.clone()));
        Ok(())
    }

    async fn sync_terminated_pod(&self, pod: &Pod, _status: &PodStatus) -> Result<(), FakeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.record(Call::Terminated(uid));
        Ok(())
    }
}

fn pod(uid: &str, name: &str, version: &str) -> Arc<Pod> {
    testing::pod()
        .named("default", name, uid)
        .resource_version(version)
        .grace_period(7)
        .arc()
}

fn static_pod(uid: &str, name: &str) -> Arc<Pod> {
    let mut p = (*pod(uid, name, "1")).clone();
    p.metadata.annotations = Some(
        [("kubernetes.io/config.source".to_owned(), "file".to_owned())]
            .into_iter()
            .collect(),
    );
    Arc::new(p)
}

fn workers(syncer: Arc<FakeSyncer>) -> Arc<PodWorkers<FakeSyncer>> {
    PodWorkers::new(
        syncer,
        Arc::new(PodCache::default()),
        WorkerConfig {
            resync_interval: Duration::from_secs(60),
            backoff_period: Duration::from_secs(10),
            status_wait_limit: Duration::from_millis(50),
        },
        None,
    )
}

fn update(kind: UpdateType, pod: &Arc<Pod>) -> UpdatePodOptions {
    UpdatePodOptions {
        update_type: kind,
        pod: Some(pod.clone()),
        running_pod: None,
        kill: None,
    }
}

#[tokio::test]
async fn a_new_pod_is_synced_and_scheduled_for_resync() {
    let syncer = Arc::new(FakeSyncer::default());
    let w = workers(syncer.clone());
    w.update_pod(update(UpdateType::Create, &pod("a", "a", "1")));
    syncer.wait_for(|c| c.len() == 1).await;
    assert_eq!(
        syncer.calls(),
        vec![Call::Sync("a".into(), UpdateType::Create, "1".into())]
    );
    tokio::task::yield_now().await;
    let later = Instant::now() + Duration::from_secs(61);
    assert!(w.take_due(Instant::now()).is_empty());
    assert_eq!(w.take_due(later), vec![PodUid::from("a")]);
}

#[tokio::test]
async fn updates_arriving_during_a_sync_coalesce_to_the_latest() {
    let syncer = Arc::new(FakeSyncer::default());
    let release = Arc::new(Notify::new());
    syncer
        .script
        .lock()
        .expect("lock")
        .block
        .insert("a".into(), release.clone());
    let w = workers(syncer.clone());
    w.update_pod(update(UpdateType::Create, &pod("a", "a", "1")));
    syncer.wait_for(|c| c.len() == 1).await;
    for version in ["2", "3", "4"] {
        w.update_pod(update(UpdateType::Update, &pod("a", "a", version)));
    }
    syncer.script.lock().expect("lock").block.clear();
    release.notify_one();
    let calls = syncer.wait_for(|c| c.len() == 2).await;
    assert_eq!(
        calls[1],
        Call::Sync("a".into(), UpdateType::Update, "4".into()),
        "only the latest pending update runs"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(syncer.calls().len(), 2, "and nothing else");
}

#[tokio::test]
async fn a_kill_runs_the_termination_sequence_and_reports_completion() {
    let syncer = Arc::new(FakeSyncer::default());
    let w = workers(syncer.clone());
    let p = pod("a", "a", "1");
    w.update_pod(update(UpdateType::Create, &p));
    syncer.wait_for(|c| c.len() == 1).await;
    let (done_tx, done_rx) = oneshot::channel();
    w.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod: Some(p.clone()),
        running_pod: None,
        kill: Some(KillOptions {
            grace_period_override: Some(3),
            evict: true,
            completed: Some(done_tx),
        }),
    });
    tokio::time::timeout(Duration::from_secs(10), done_rx)
        .await
        .expect("in time")
        .expect("completed");
    let calls = syncer
        .wait_for(|c| c.contains(&Call::Terminated("a".into())))
        .await;
    assert_eq!(
        &calls[1..],
        &[
            Call::Terminating("a".into(), 3),
            Call::Terminated("a".into())
        ]
    );
    assert!(w.is_known_terminated(&PodUid::from("a")));
    assert!(w.is_evicted(&PodUid::from("a")));
    // Once finished, updates other than a re-creation are ignored.
    w.update_pod(update(UpdateType::Update, &p));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(syncer.calls().len(), 3);
}

#[tokio::test]
async fn a_termination_cancels_the_sync_in_flight() {
    let syncer = Arc::new(FakeSyncer::default());
    let never = Arc::new(Notify::new());
    syncer
        .script
        .lock()
        .expect("lock")
        .block
        .insert("a".into(), never);
    let w = workers(syncer.clone());
    let p = pod("a", "a", "1");
    w.update_pod(update(UpdateType::Create, &p));
    syncer.wait_for(|c| c.len() == 1).await;
    let mut deleted = (*p).clone();
    deleted.metadata.deletion_timestamp = Some(Time(chrono_now()));
    deleted.metadata.deletion_grace_period_seconds = Some(2);
    w.update_pod(update(UpdateType::Update, &Arc::new(deleted)));
    let calls = syncer
        .wait_for(|c| c.contains(&Call::Terminated("a".into())))
        .await;
    assert_eq!(
        calls[1],
        Call::Terminating("a".into(), 2),
        "deletion's grace period"
    );
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::try_from(SystemTime::now()).unwrap_or_default()
}

#[tokio::test]
async fn a_pod_that_synced_to_terminal_is_terminated_with_its_spec_grace() {
    let syncer = Arc::new(FakeSyncer::default());
    syncer
        .script
        .lock()
        .expect("lock")
        .terminal
        .push("a".into());
    let w = workers(syncer.clone());
    w.update_pod(update(UpdateType::Create, &pod("a", "a", "1")));
    let calls = syncer
        .wait_for(|c| c.contains(&Call::Terminated("a".into())))
        .await;
    assert_eq!(calls[1], Call::Terminating("a".into(), 7));
}

#[tokio::test]
async fn a_static_pod_waits_for_its_predecessor_of_the_same_name() {
    let syncer = Arc::new(FakeSyncer::default());
    let w = workers(syncer.clone());
    let old = static_pod("old", "web");
    let new = static_pod("new", "web");
    w.update_pod(update(UpdateType::Create, &old));
    syncer.wait_for(|c| c.len() == 1).await;
    w.update_pod(update(UpdateType::Create, &new));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(syncer.calls().len(), 1, "the new UID waits");
    // The one started under the name is the old one (its mirror pod follows it).
    let started: Vec<(PodUid, WorkerPhase)> = w.started_static_pods().into_values().collect();
    assert_eq!(started, vec![(PodUid::from("old"), WorkerPhase::Syncing)]);
    w.update_pod(update(UpdateType::Kill, &old));
    let calls = syncer
        .wait_for(|c| {
            c.iter()
                .any(|x| matches!(x, Call::Sync(uid, _, _) if uid == "new"))
        })
        .await;
    let terminated = calls
        .iter()
        .position(|c| *c == Call::Terminated("old".into()));
    let started = calls
        .iter()
        .position(|c| matches!(c, Call::Sync(uid, _, _) if uid == "new"));
    assert!(terminated < started, "{calls:#?}");
    let started: Vec<PodUid> = w
        .started_static_pods()
        .into_values()
        .map(|(uid, _)| uid)
        .collect();
    assert_eq!(started, vec![PodUid::from("new")]);
}

#[tokio::test]
async fn housekeeping_terminates_undesired_pods_and_forgets_finished_ones() {
    let syncer = Arc::new(FakeSyncer::default());
    let w = workers(syncer.clone());
    let a = pod("a", "a", "1");
    let b = pod("b", "b", "1");
    w.update_pod(update(UpdateType::Create, &a));
    w.update_pod(update(UpdateType::Create, &b));
    syncer.wait_for(|c| c.len() == 2).await;
    let (phases, _) = w.sync_known_pods(std::slice::from_ref(&a));
    assert_eq!(phases.len(), 2);
    syncer
        .wait_for(|c| c.contains(&Call::Terminated("b".into())))
        .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (phases, _) = w.sync_known_pods(std::slice::from_ref(&a));
    assert_eq!(phases.keys().collect::<Vec<_>>(), vec![&PodUid::from("a")]);
}

#[tokio::test]
async fn an_orphan_is_stopped_through_the_runtime_pod() {
    let syncer = Arc::new(FakeSyncer::default());
    let w = workers(syncer.clone());
    w.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod: None,
        running_pod: Some(RunningPod {
            uid: PodUid::from("orphan"),
            name: "o".into(),
            namespace: "default".into(),
            sandboxes: vec![],
            containers: vec![],
        }),
        kill: None,
    });
    syncer.wait_for(|c| !c.is_empty()).await;
    assert_eq!(syncer.calls()[0], Call::TerminatingRuntime("orphan".into()));
}

#[tokio::test]
async fn a_failed_sync_is_retried_after_the_backoff_period() {
    let syncer = Arc::new(FakeSyncer::default());
    syncer.script.lock().expect("lock").fail.push("a".into());
    let w = workers(syncer.clone());
    w.update_pod(update(UpdateType::Create, &pod("a", "a", "1")));
    syncer.wait_for(|c| c.len() == 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let now = Instant::now();
    assert!(w.take_due(now + Duration::from_secs(5)).is_empty());
    assert_eq!(
        w.take_due(now + Duration::from_secs(11)),
        vec![PodUid::from("a")]
    );
}

#[test]
fn grace_periods_follow_override_then_deletion_then_spec_and_only_shrink() {
    let mut p = (*pod("a", "a", "1")).clone();
    assert_eq!(effective_grace_period(Some(&p), None, None), 7);
    p.metadata.deletion_timestamp = Some(Time(chrono_now()));
    p.metadata.deletion_grace_period_seconds = Some(4);
    assert_eq!(effective_grace_period(Some(&p), None, None), 4);
    assert_eq!(effective_grace_period(Some(&p), Some(1), None), 1);
    assert_eq!(effective_grace_period(Some(&p), Some(20), Some(4)), 4);
    assert_eq!(
        effective_grace_period(None, None, None),
        DEFAULT_GRACE_PERIOD_SECS
    );
}

#[tokio::test]
async fn a_pod_whose_last_look_failed_is_not_synced_on_no_status() {
    let syncer = Arc::new(FakeSyncer::default());
    let cache = Arc::new(PodCache::default());
    let w = PodWorkers::new(
        syncer.clone(),
        cache.clone(),
        WorkerConfig {
            resync_interval: Duration::from_secs(60),
            backoff_period: Duration::from_secs(10),
            status_wait_limit: Duration::from_millis(50),
        },
        None,
    );
    // The runtime went away: the PLEG could not look at the pod. Syncing on an empty status now
    // would start a second sandbox once the runtime answers again.
    let uid = PodUid::from("a");
    cache.set_error(
        &uid,
        "rpc error: connection refused".into(),
        SystemTime::now(),
    );
    w.update_pod(update(UpdateType::Create, &pod("a", "a", "1")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(syncer.calls(), vec![], "no sync on a failed look");
    let now = Instant::now();
    assert!(w.take_due(now + Duration::from_secs(5)).is_empty());
    assert_eq!(
        w.take_due(now + Duration::from_secs(11)),
        vec![uid.clone()],
        "retried after the back-off"
    );
    // The runtime answers again: the next sync goes ahead on the status.
    cache.set(
        &uid,
        PodStatus::empty(uid.clone(), "a", "default"),
        SystemTime::now(),
    );
    w.update_pod(update(UpdateType::Sync, &pod("a", "a", "1")));
    let calls = syncer.wait_for(|c| c.len() == 1).await;
    assert_eq!(
        calls,
        vec![Call::Sync("a".into(), UpdateType::Sync, "1".into())]
    );
}
