//! Ephemeral containers (`kubectl debug`): started once in the pod's sandbox, in their target's
//! pid namespace, never restarted, not started on a pod being deleted, refused when their name
//! is another container's.

use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::{
    api::core::v1::{EphemeralContainer, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use tokio_util::sync::CancellationToken;

use super::{IMAGE, container, manager, mutating, pod, status_of};
use crate::{
    cri::fake::FakeRuntime,
    events::fake::FakeRecorder,
    kuberuntime::{NoProbes, compute_pod_actions},
    status::StartFailureReason,
};

fn debugger(name: &str, target: Option<&str>) -> EphemeralContainer {
    EphemeralContainer {
        name: name.into(),
        image: Some(IMAGE.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
        target_container_name: target.map(str::to_owned),
        // What the API server forbids; a hostile object may carry it all the same.
        liveness_probe: Some(Default::default()),
        ..Default::default()
    }
}

fn with_ephemeral(mut p: Pod, list: Vec<EphemeralContainer>) -> Pod {
    if let Some(spec) = p.spec.as_mut() {
        spec.ephemeral_containers = Some(list);
    }
    p
}

fn pid_namespace(config: Option<cri::ContainerConfig>) -> Option<(i32, String)> {
    config
        .and_then(|c| c.linux)
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .map(|n| (n.pid, n.target_id))
}

#[tokio::test]
async fn an_ephemeral_container_starts_once_in_its_targets_pid_namespace() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let cancel = CancellationToken::new();
    let p = pod(vec![], vec![container("main", "IfNotPresent")], "Always");
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let main_id = fake.container_ids()[0].clone();
    fake.take_calls();

    // Added to the running pod: started in the same sandbox, main untouched.
    let p = with_ephemeral(p, vec![debugger("debugger", Some("main"))]);
    let outcome = m
        .sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(
        mutating(fake.take_calls()),
        vec!["Create debugger#0", "Start"]
    );
    let ids = fake.container_ids();
    let debugger_id = ids
        .iter()
        .find(|id| **id != main_id)
        .cloned()
        .expect("the debugger exists");
    assert_eq!(
        pid_namespace(fake.container_config(&debugger_id)),
        Some((cri::NamespaceMode::Target as i32, main_id.clone()))
    );
    assert_eq!(
        pid_namespace(fake.container_config(&main_id)),
        Some((cri::NamespaceMode::Container as i32, String::new()))
    );
    let status = status_of(&fake).await;
    assert_eq!(status.latest("debugger").map(|d| d.restart_count), Some(0));

    // It exits: never restarted, whatever the pod's restart policy says.
    fake.exit_container(&debugger_id, 0);
    let outcome = m
        .sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert!(mutating(fake.take_calls()).is_empty());
    fake.exit_container(&debugger_id, 1);
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert!(mutating(fake.take_calls()).is_empty());
    assert_eq!(fake.container_ids().len(), 2, "main was not replaced");
}

#[tokio::test]
async fn none_is_started_on_a_pod_being_deleted() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let p = pod(vec![], vec![container("main", "IfNotPresent")], "Always");
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/p",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await;
    let mut p = with_ephemeral(p, vec![debugger("debugger", None)]);
    let status = status_of(&fake).await;
    assert_eq!(
        compute_pod_actions(&p, &status, &NoProbes).ephemeral_containers_to_start,
        vec![0]
    );
    p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let actions = compute_pod_actions(&p, &status, &NoProbes);
    assert!(actions.ephemeral_containers_to_start.is_empty());
    assert!(actions.is_noop(), "{actions:?}");
}

#[tokio::test]
async fn one_named_like_another_container_is_refused_with_a_warning() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let cancel = CancellationToken::new();
    let p = pod(
        vec![container("init", "IfNotPresent")],
        vec![container("main", "IfNotPresent")],
        "Always",
    );
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    fake.take_calls();
    // A hostile object: names the API server would have refused.
    let p = with_ephemeral(
        p,
        vec![
            debugger("main", None),
            debugger("init", None),
            debugger("dbg", None),
            debugger("dbg", None),
        ],
    );
    let actions = compute_pod_actions(&p, &status_of(&fake).await, &NoProbes);
    let refused: Vec<(usize, &str)> = actions
        .ephemeral_containers_refused
        .iter()
        .map(|r| (r.index, r.name.as_str()))
        .collect();
    assert_eq!(refused, vec![(0, "main"), (1, "init"), (3, "dbg")]);
    assert_eq!(actions.ephemeral_containers_to_start, vec![2]);

    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let created: Vec<String> = mutating(fake.take_calls())
        .into_iter()
        .filter(|c| c.starts_with("Create"))
        .collect();
    // Only the valid debugger, while the init container still runs: none of the colliding
    // ones was created (as "main" or "init" they would pass for those containers).
    assert_eq!(created, vec!["Create dbg#0"]);
    let warnings: Vec<String> = recorder
        .summary()
        .into_iter()
        .filter(|(t, _, _)| *t == "Warning")
        .map(|(_, reason, note)| format!("{reason}: {note}"))
        .collect();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings[0].starts_with(
            "Failed: Error: ephemeral container \"main\" (spec.ephemeralContainers[0]) is not started: its name is already another container's"
        ),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn a_target_that_is_not_a_running_container_fails_as_a_config_error() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = manager(&fake);
    let cancel = CancellationToken::new();
    let p = pod(vec![], vec![container("main", "IfNotPresent")], "Always");
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    fake.take_calls();
    // Another ephemeral container is no target, and neither is a name the pod does not have.
    let p = with_ephemeral(
        p,
        vec![debugger("first", None), debugger("second", Some("first"))],
    );
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    assert_eq!(mutating(fake.take_calls()), vec!["Create first#0", "Start"]);
    let reason = reasons.lock().ok().and_then(|r| {
        r.get(&"uid-1".into(), "second")
            .map(|f| (f.reason, f.message.clone()))
    });
    assert_eq!(
        reason,
        Some((
            StartFailureReason::CreateContainerConfigError,
            "unable to find target container first".to_owned()
        ))
    );
}
