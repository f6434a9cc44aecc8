//! `KubeRuntimeManager` against the in-memory CRI fake: the exact runtime calls of SyncPod for
//! init containers, images, back-off and kills.

mod ephemeral;
mod events;
mod resources;
mod runtime_class;
mod security;
mod termination;
mod termination_message;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio_util::sync::CancellationToken;

use crate::kuberuntime::{NoProbes, manager::KubeRuntimeManager};
use crate::{
    container::{PodStatus, PodUid},
    cri::{
        convert::get_pod_status,
        fake::{Call, FakeRuntime},
    },
    status::{ReasonCache, StartFailureReason},
};

const IMAGE: &str = "localhost/swiftlet/busybox:latest";

fn container(name: &str, policy: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(IMAGE.into()),
        image_pull_policy: Some(policy.into()),
        command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
        ..Default::default()
    }
}

fn pod(inits: Vec<Container>, containers: Vec<Container>, restart: &str) -> Pod {
    crate::testing::pod()
        .named("default", "web", "uid-1")
        .host_network(true)
        .restart_policy(restart)
        .init_containers(inits)
        .containers(containers)
        .build()
}

fn manager(fake: &Arc<FakeRuntime>) -> (KubeRuntimeManager, Arc<Mutex<ReasonCache>>) {
    crate::kuberuntime::fixtures::runtime_manager(fake, "swiftlet-manager-tests", false)
}

async fn status_of(fake: &FakeRuntime) -> PodStatus {
    get_pod_status(fake, &PodUid::from("uid-1"), "web", "default")
        .await
        .expect("status")
}

fn mutating(calls: Vec<Call>) -> Vec<String> {
    calls
        .into_iter()
        .filter_map(|c| match c {
            Call::RunPodSandbox { attempt, .. } => Some(format!("RunPodSandbox#{attempt}")),
            Call::CreateContainer { name, attempt, .. } => Some(format!("Create {name}#{attempt}")),
            Call::StartContainer { .. } => Some("Start".into()),
            Call::StopContainer { .. } => Some("StopContainer".into()),
            Call::StopPodSandbox { .. } => Some("StopPodSandbox".into()),
            Call::PullImage { .. } => Some("Pull".into()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn init_containers_run_one_at_a_time_before_the_app() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let p = pod(
        vec![container("init", "IfNotPresent")],
        vec![container("app", "IfNotPresent")],
        "Always",
    );
    let cancel = CancellationToken::new();
    let first = m
        .sync_pod(
            &p,
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["RunPodSandbox#0", "Create init#0", "Start"]
    );
    // Until the init container succeeds, nothing else starts.
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/kubepods/podx",
        &NoProbes,
        &cancel,
    )
    .await;
    assert!(mutating(fake.take_calls()).is_empty());
    let init_id = fake.container_ids()[0].clone();
    fake.exit_container(&init_id, 0);
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/kubepods/podx",
        &NoProbes,
        &cancel,
    )
    .await;
    assert_eq!(mutating(fake.take_calls()), vec!["Create app#0", "Start"]);
    let sandbox = fake
        .sandbox_config(&fake.sandbox_ids()[0])
        .expect("sandbox");
    assert_eq!(
        sandbox.linux.map(|l| l.cgroup_parent).as_deref(),
        Some("/kubepods/podx")
    );
}

#[tokio::test]
async fn a_missing_image_with_never_is_err_image_never_pull() {
    let fake = Arc::new(FakeRuntime::new());
    let (m, reasons) = manager(&fake);
    let p = pod(vec![], vec![container("app", "Never")], "Always");
    let outcome = m
        .sync_pod(
            &p,
            &status_of(&fake).await,
            "/p",
            &NoProbes,
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(outcome.errors.len(), 1);
    assert!(
        !mutating(fake.take_calls())
            .iter()
            .any(|c| c.starts_with("Create"))
    );
    let reasons = reasons.lock().expect("lock");
    let failure = reasons
        .get(&PodUid::from("uid-1"), "app")
        .expect("a reason");
    assert_eq!(failure.reason, StartFailureReason::ErrImageNeverPull);
    assert!(failure.message.contains(IMAGE));
}

#[tokio::test]
async fn a_failed_pull_backs_off_before_pulling_again() {
    let fake = Arc::new(FakeRuntime::new());
    fake.fail_always(crate::cri::Operation::PullImage, tonic::Code::NotFound);
    let (m, reasons) = manager(&fake);
    let p = pod(vec![], vec![container("app", "Always")], "Always");
    let cancel = CancellationToken::new();
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let reason = |r: &Arc<Mutex<ReasonCache>>| {
        r.lock()
            .expect("lock")
            .get(&PodUid::from("uid-1"), "app")
            .map(|f| f.reason)
    };
    assert_eq!(reason(&reasons), Some(StartFailureReason::ErrImagePull));
    let pulls = |calls: Vec<Call>| {
        calls
            .iter()
            .filter(|c| matches!(c, Call::PullImage { .. }))
            .count()
    };
    assert_eq!(pulls(fake.take_calls()), 1);
    let outcome = m
        .sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert_eq!(reason(&reasons), Some(StartFailureReason::ImagePullBackOff));
    assert_eq!(pulls(fake.take_calls()), 0, "no pull while backing off");
    assert!(outcome.errors.is_empty(), "a back-off is not a sync error");
    assert!(outcome.retry_in.is_some());
}

#[tokio::test]
async fn a_crashing_container_restarts_then_waits_out_its_back_off() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = manager(&fake);
    let p = pod(vec![], vec![container("app", "IfNotPresent")], "Always");
    let cancel = CancellationToken::new();
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let first = fake.container_ids()[0].clone();
    fake.exit_container(&first, 1);
    fake.take_calls();
    // The first restart goes ahead (and starts the back-off)...
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert_eq!(mutating(fake.take_calls()), vec!["Create app#1", "Start"]);
    let second = fake
        .container_ids()
        .into_iter()
        .find(|id| *id != first)
        .expect("a second instance");
    fake.exit_container(&second, 1);
    // ...the next one waits.
    let outcome = m
        .sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert!(mutating(fake.take_calls()).is_empty());
    assert!(
        outcome
            .retry_in
            .is_some_and(|r| r <= Duration::from_secs(10))
    );
    let reason = reasons
        .lock()
        .expect("lock")
        .get(&PodUid::from("uid-1"), "app")
        .map(|f| (f.reason, f.message.clone()));
    assert!(
        reason
            .as_ref()
            .is_some_and(|(r, m)| *r == StartFailureReason::CrashLoopBackOff
                && m.contains("back-off 10s restarting failed container=app")),
        "{reason:?}"
    );
}

#[tokio::test]
async fn killing_a_pod_stops_containers_then_the_sandbox() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let p = pod(
        vec![],
        vec![
            container("a", "IfNotPresent"),
            container("b", "IfNotPresent"),
        ],
        "Always",
    );
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/p",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await;
    fake.take_calls();
    m.kill_pod_status(None, &status_of(&fake).await, Duration::from_secs(5))
        .await
        .expect("killed");
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["StopContainer", "StopContainer", "StopPodSandbox"]
    );
    let status = status_of(&fake).await;
    m.remove_pod(&status).await.expect("removed");
    assert!(fake.container_ids().is_empty() && fake.sandbox_ids().is_empty());
    let _ = PathBuf::new();
}

/// `app` with a postStart or preStop exec of `sleep 1000000`.
fn with_hook(mut app: Container, post_start: bool) -> Container {
    use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler};
    let handler = LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(vec!["sleep".into(), "1000000".into()]),
        }),
        ..Default::default()
    };
    app.lifecycle = Some(if post_start {
        Lifecycle {
            post_start: Some(handler),
            ..Default::default()
        }
    } else {
        Lifecycle {
            pre_stop: Some(handler),
            ..Default::default()
        }
    });
    app
}

#[tokio::test(start_paused = true)]
async fn a_termination_cancels_a_running_post_start_hook_and_its_exec() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    fake.hang_execs();
    let (m, reasons) = manager(&fake);
    let p = pod(
        vec![],
        vec![with_hook(container("app", "IfNotPresent"), true)],
        "Always",
    );
    let cancel = CancellationToken::new();
    let status = status_of(&fake).await;
    let sync = m.sync_pod(&p, &status, "/kubepods/podx", &NoProbes, &cancel);
    tokio::pin!(sync);
    // The hook has no deadline of its own (as upstream): an hour of (paused) time goes by with
    // the sync still in it and its exec still waiting.
    let waited = tokio::time::timeout(Duration::from_secs(3600), &mut sync).await;
    assert!(waited.is_err(), "the sync ended while its hook hangs");
    assert_eq!(fake.execs_waiting(), 1);
    // The pod's termination cancels the sync: it ends, and the exec call with it.
    cancel.cancel();
    let outcome = sync.await;
    assert_eq!(fake.execs_waiting(), 0, "the hook's exec was not cancelled");
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["RunPodSandbox#0", "Create app#0", "Start"]
    );
    // Not a hook failure: the container is the termination's to stop.
    assert!(
        reasons
            .lock()
            .expect("reasons")
            .get(&PodUid::from("uid-1"), "app")
            .is_none()
    );
    m.kill_pod_status(Some(&p), &status_of(&fake).await, Duration::from_secs(30))
        .await
        .expect("killed");
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["StopContainer", "StopPodSandbox"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pre_stop_hook_that_hangs_is_cut_at_the_grace_period() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let p = pod(
        vec![],
        vec![with_hook(container("app", "IfNotPresent"), false)],
        "Always",
    );
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/p",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await;
    fake.take_calls();
    fake.hang_execs();
    let grace = Duration::from_secs(30);
    let status = status_of(&fake).await;
    let kill = m.kill_pod_status(Some(&p), &status, grace);
    tokio::pin!(kill);
    // Counted in ticks of a 1 s interval beside it (paused time): the hook holds the stop for
    // the grace period, not longer.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ticks = 0u32;
    let killed = loop {
        tokio::select! {
            killed = &mut kill => break killed,
            _ = tick.tick() => ticks += 1,
        }
        assert!(ticks <= 120, "the preStop hook outlived the grace period");
    };
    killed.expect("killed");
    assert!(
        ticks >= 30,
        "the stop came after {ticks} ticks, before the grace period"
    );
    assert_eq!(fake.execs_waiting(), 0);
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["StopContainer", "StopPodSandbox"]
    );
}
