//! The events a sync reports, in order, with upstream's reasons and messages.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{IMAGE, container, manager, pod, status_of};
use crate::{
    cri::{Operation, fake::FakeRuntime},
    events::fake::FakeRecorder,
    kuberuntime::{NoProbes, ProbeOutcome, fixtures::FakeProbes},
};

fn pairs(recorder: &FakeRecorder) -> Vec<(String, String)> {
    recorder
        .summary()
        .into_iter()
        .map(|(_, reason, note)| (reason, note))
        .collect()
}

fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn a_container_is_pulled_created_started_backed_off_and_killed_with_events() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let p = pod(vec![], vec![container("app", "IfNotPresent")], "Always");
    let cancel = CancellationToken::new();
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let started = owned(&[
        (
            "Pulled",
            "Container image \"localhost/swiftlet/busybox:latest\" already present on machine",
        ),
        ("Created", "Created container: app"),
        ("Started", "Started container app"),
    ]);
    assert_eq!(pairs(&recorder), started);
    let events = recorder.events();
    assert!(events.iter().all(|e| {
        e.regarding.field_path.as_deref() == Some("spec.containers{app}")
            && e.regarding.uid.as_deref() == Some("uid-1")
            && e.type_ == crate::events::EventType::Normal
    }));

    // It crashes: the first restart goes ahead, the next waits out its back-off.
    let first = fake.container_ids()[0].clone();
    fake.exit_container(&first, 1);
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let second = fake
        .container_ids()
        .into_iter()
        .find(|id| *id != first)
        .expect("a second instance");
    fake.exit_container(&second, 1);
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let events = recorder.events();
    let back_off = events.last().expect("an event");
    assert_eq!(back_off.reason, "BackOff");
    assert_eq!(back_off.type_, crate::events::EventType::Warning);
    assert_eq!(
        back_off.note,
        "Back-off restarting failed container app in pod web_default(uid-1)"
    );
    assert_eq!(pairs(&recorder)[3..6], started[..]);
}

#[tokio::test]
async fn a_liveness_failure_kills_with_its_reason_and_a_pod_kill_says_stopping() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let p = pod(
        vec![],
        vec![
            container("app", "IfNotPresent"),
            container("side", "IfNotPresent"),
        ],
        "Always",
    );
    let cancel = CancellationToken::new();
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let status = status_of(&fake).await;
    let probes = FakeProbes::default().liveness(&status, "app", ProbeOutcome::Failure);
    let before = recorder.events().len();
    m.sync_pod(&p, &status, "/p", &probes, &cancel).await;
    let killing = &recorder.events()[before];
    assert_eq!(killing.reason, "Killing");
    assert_eq!(
        killing.note,
        "Container app failed liveness probe, will be restarted"
    );
    assert_eq!(
        killing.regarding.field_path.as_deref(),
        Some("spec.containers{app}")
    );

    let before = recorder.events().len();
    m.kill_pod_status(
        Some(&p),
        &status_of(&fake).await,
        std::time::Duration::from_secs(5),
    )
    .await
    .expect("killed");
    let mut kills: Vec<(String, String)> = pairs(&recorder)[before..].to_vec();
    kills.sort();
    assert_eq!(
        kills,
        owned(&[
            ("Killing", "Stopping container app"),
            ("Killing", "Stopping container side")
        ])
    );
}

#[tokio::test]
async fn a_failed_pull_reports_the_failure_then_its_back_off() {
    let fake = Arc::new(FakeRuntime::new());
    fake.fail_always(Operation::PullImage, tonic::Code::NotFound);
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let p = pod(vec![], vec![container("app", "Always")], "Always");
    let cancel = CancellationToken::new();
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    m.sync_pod(&p, &status_of(&fake).await, "/p", &NoProbes, &cancel)
        .await;
    let summary = recorder.summary();
    let reasons: Vec<(&str, &str)> = summary.iter().map(|(t, r, _)| (*t, r.as_str())).collect();
    assert_eq!(
        reasons,
        [
            ("Normal", "Pulling"),
            ("Warning", "Failed"),
            ("Warning", "Failed"),
            ("Normal", "BackOff"),
            ("Warning", "Failed"),
        ]
    );
    let notes: Vec<&str> = summary.iter().map(|(_, _, n)| n.as_str()).collect();
    assert_eq!(
        notes[0],
        "Pulling image \"localhost/swiftlet/busybox:latest\""
    );
    assert!(
        notes[1].starts_with("Failed to pull image \"localhost/swiftlet/busybox:latest\": "),
        "{}",
        notes[1]
    );
    assert_eq!(notes[2], "Error: ErrImagePull");
    assert_eq!(
        notes[3],
        "Back-off pulling image \"localhost/swiftlet/busybox:latest\""
    );
    assert_eq!(notes[4], "Error: ImagePullBackOff");
}

#[tokio::test]
async fn a_pull_reports_its_duration_and_the_image_size() {
    let fake = Arc::new(FakeRuntime::new());
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let p = pod(vec![], vec![container("app", "IfNotPresent")], "Always");
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/p",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await;
    let summary = pairs(&recorder);
    assert_eq!(summary[0].0, "Pulling");
    let (reason, note) = &summary[1];
    assert_eq!(reason, "Pulled");
    let prefix = "Successfully pulled image \"localhost/swiftlet/busybox:latest\" in ";
    assert!(note.starts_with(prefix), "{note}");
    let spec = k8s_cri::v1::ImageSpec {
        image: IMAGE.into(),
        ..Default::default()
    };
    let size = crate::cri::ImageService::image_status(fake.as_ref(), spec)
        .await
        .expect("status")
        .expect("pulled")
        .size;
    assert!(size > 0);
    assert!(
        note.ends_with(&format!(" including waiting). Image size: {size} bytes.")),
        "{note}"
    );
}

#[tokio::test]
async fn a_sandbox_that_cannot_be_made_is_reported_on_the_pod() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    fake.fail_next(Operation::RunPodSandbox, tonic::Code::Unavailable);
    let recorder = FakeRecorder::new();
    let (m, _) = manager(&fake);
    let m = m.with_events(recorder.clone());
    let p = pod(vec![], vec![container("app", "IfNotPresent")], "Always");
    m.sync_pod(
        &p,
        &status_of(&fake).await,
        "/p",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await;
    let events = recorder.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "FailedCreatePodSandBox");
    assert!(events[0].note.starts_with("Failed to create pod sandbox: "));
    assert_eq!(events[0].regarding.field_path, None);
    assert_eq!(events[0].regarding.kind.as_deref(), Some("Pod"));
}
