//! The probe manager and its workers against the fake CRI (exec probes) and a target whose state
//! the test sets; time is tokio's paused clock, so periods pass at once.

use crate::lock::MutexExt as _;
use crate::testing;
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, ExecAction, Pod, Probe};
use tokio::sync::mpsc;

use super::{
    ProbeKind, ProbeManager, ProbeTarget, ProbeUpdate, TargetStatus, manager::TargetContainer,
    metrics::ProberMetrics,
};
use crate::{
    container::{ContainerId, PodUid},
    cri::fake::{Call, FakeRuntime},
    prober::{ContainerProbeResults, ProbeOutcome},
    status::ContainerReadiness,
};

#[derive(Default)]
struct FakeTarget(Mutex<Option<TargetStatus>>);

impl FakeTarget {
    fn set(&self, status: TargetStatus) {
        *self.0.lock_unpoisoned() = Some(status);
    }
}

impl ProbeTarget for FakeTarget {
    fn status(&self, _: &PodUid, _: &str) -> Option<TargetStatus> {
        self.0.lock_unpoisoned().clone()
    }
}

fn exec_probe(failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["check".into()]),
        }),
        period_seconds: Some(10),
        timeout_seconds: Some(1),
        success_threshold: Some(1),
        failure_threshold: Some(failure_threshold),
        initial_delay_seconds: Some(0),
        ..Default::default()
    }
}

fn pod(container: Container) -> Arc<Pod> {
    testing::pod()
        .named("default", "web", "u1")
        .container(container)
        .arc()
}

struct Setup {
    fake: Arc<FakeRuntime>,
    events: Arc<crate::events::fake::FakeRecorder>,
    target: Arc<FakeTarget>,
    probes: ProbeManager,
    updates: mpsc::UnboundedReceiver<ProbeUpdate>,
    id: String,
}

async fn setup() -> Setup {
    setup_with(ProberMetrics::unregistered().expect("metrics")).await
}

async fn setup_with(metrics: ProberMetrics) -> Setup {
    let fake = Arc::new(FakeRuntime::new());
    let (_, ids) = fake
        .start_pod("u1", "web", "default", &["app"])
        .await
        .expect("pod");
    let id = ids[0].clone();
    let target = Arc::new(FakeTarget::default());
    target.set(running(&id, true));
    let events = crate::events::fake::FakeRecorder::new();
    let (probes, updates) =
        ProbeManager::new(fake.clone(), target.clone(), metrics, events.clone());
    Setup {
        fake,
        events,
        target,
        probes,
        updates,
        id,
    }
}

fn running(id: &str, started: bool) -> TargetStatus {
    TargetStatus {
        terminal: false,
        pod_ip: Some("10.0.0.7".into()),
        container: Some(TargetContainer {
            id: format!("containerd://{id}"),
            running_since: Some(SystemTime::now() - Duration::from_secs(60)),
            terminated: false,
            started,
        }),
    }
}

fn execs(fake: &FakeRuntime) -> usize {
    fake.calls()
        .iter()
        .filter(|c| matches!(c, Call::ExecSync { .. }))
        .count()
}

fn fail_exec(fake: &FakeRuntime, id: &str) {
    fake.set_exec_result(
        id,
        cri::ExecSyncResponse {
            stdout: b"not alive".to_vec(),
            stderr: Vec::new(),
            exit_code: 1,
        },
    );
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("condition not reached in 300 s of paused time");
}

#[tokio::test(start_paused = true)]
async fn liveness_fails_only_after_the_threshold_and_then_holds() {
    let mut s = setup().await;
    fail_exec(&s.fake, &s.id);
    let container = Container {
        name: "app".into(),
        liveness_probe: Some(exec_probe(3)),
        ..Default::default()
    };
    s.probes.add_pod(&pod(container));
    let cid = ContainerId::new("containerd", &s.id);
    // The new instance starts out alive.
    let first = s.updates.recv().await.expect("update");
    assert_eq!(first.outcome, ProbeOutcome::Success);
    let failed = s.updates.recv().await.expect("update");
    assert_eq!(
        (failed.kind, failed.outcome),
        (ProbeKind::Liveness, ProbeOutcome::Failure)
    );
    assert_eq!(execs(&s.fake), 3, "three failures make the threshold");
    assert_eq!(s.probes.liveness(&cid), Some(ProbeOutcome::Failure));
    // Each failed probe is an event about the container, the threshold's or not.
    let events = s.events.events();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.reason == "Unhealthy"
        && e.type_ == crate::events::EventType::Warning
        && e.note == "Liveness probe failed: not alive"
        && e.regarding.field_path.as_deref() == Some("spec.containers{app}")));
    // On hold: the instance is being killed; no more probes of it.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(execs(&s.fake), 3);
    assert!(s.updates.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn readiness_starts_not_ready_and_turns_ready_on_success() {
    let mut s = setup().await;
    let container = Container {
        name: "app".into(),
        readiness_probe: Some(exec_probe(3)),
        ..Default::default()
    };
    let p = pod(container.clone());
    s.probes.add_pod(&p);
    let cid = ContainerId::new("containerd", &s.id);
    let initial = s.updates.recv().await.expect("update");
    assert_eq!(
        (initial.kind, initial.outcome),
        (ProbeKind::Readiness, ProbeOutcome::Failure)
    );
    let passed = s.updates.recv().await.expect("update");
    assert_eq!(passed.outcome, ProbeOutcome::Success);
    assert!(s.probes.ready(&p, &container, &cid));
    // A failing probe takes readiness away after the failure threshold, never before.
    fail_exec(&s.fake, &s.id);
    let before = execs(&s.fake);
    let lost = s.updates.recv().await.expect("update");
    assert_eq!(lost.outcome, ProbeOutcome::Failure);
    assert_eq!(execs(&s.fake) - before, 3);
    assert!(!s.probes.ready(&p, &container, &cid));
}

#[tokio::test(start_paused = true)]
async fn a_container_with_a_probe_is_not_ready_before_any_result() {
    let s = setup().await;
    let with = Container {
        name: "app".into(),
        readiness_probe: Some(exec_probe(3)),
        startup_probe: Some(exec_probe(3)),
        ..Default::default()
    };
    let without = Container {
        name: "app".into(),
        ..Default::default()
    };
    let cid = ContainerId::new("containerd", &s.id);
    let p = pod(with.clone());
    assert!(!s.probes.ready(&p, &with, &cid));
    assert!(!s.probes.started(&p, &with, &cid));
    assert!(s.probes.ready(&p, &without, &cid));
    assert!(s.probes.started(&p, &without, &cid));
}

#[tokio::test(start_paused = true)]
async fn liveness_waits_for_startup_and_startup_stops_once_started() {
    let mut s = setup().await;
    s.target.set(running(&s.id, false));
    fail_exec(&s.fake, &s.id);
    let container = Container {
        name: "app".into(),
        liveness_probe: Some(exec_probe(1)),
        ..Default::default()
    };
    s.probes.add_pod(&pod(container));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        execs(&s.fake),
        0,
        "no liveness probe before the container started"
    );
    let initial = s.updates.recv().await.expect("update");
    assert_eq!(initial.outcome, ProbeOutcome::Success);
    s.target.set(running(&s.id, true));
    let failed = s.updates.recv().await.expect("update");
    assert_eq!(failed.outcome, ProbeOutcome::Failure);
}

#[tokio::test(start_paused = true)]
async fn an_initial_delay_holds_the_first_probe_back() {
    let s = setup().await;
    let mut probe = exec_probe(3);
    probe.initial_delay_seconds = Some(100_000);
    let container = Container {
        name: "app".into(),
        liveness_probe: Some(probe),
        ..Default::default()
    };
    s.probes.add_pod(&pod(container));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(execs(&s.fake), 0);
}

#[tokio::test(start_paused = true)]
async fn workers_end_with_their_pod() {
    let s = setup().await;
    let container = Container {
        name: "app".into(),
        liveness_probe: Some(exec_probe(3)),
        readiness_probe: Some(exec_probe(3)),
        startup_probe: Some(exec_probe(3)),
        ..Default::default()
    };
    let p = pod(container);
    s.probes.add_pod(&p);
    s.probes.add_pod(&p);
    assert_eq!(
        s.probes.worker_count(),
        3,
        "one worker per probe, added once"
    );
    s.probes.stop_liveness_and_startup(&PodUid("u1".into()));
    wait_for(|| s.probes.worker_count() == 1).await;
    s.probes.cleanup_pods(&HashSet::new());
    wait_for(|| s.probes.worker_count() == 0).await;
    // A terminal pod's workers end by themselves.
    s.probes.add_pod(&p);
    s.target.set(TargetStatus {
        terminal: true,
        ..TargetStatus::default()
    });
    wait_for(|| s.probes.worker_count() == 0).await;
}

/// `/metrics/probes`' series: counted with the pod's labels (escaped in the exposition, however
/// the spec spells them), and gone with the pod, so a node's series stay bounded by its pods.
#[tokio::test(start_paused = true)]
async fn probe_series_carry_the_pods_labels_and_go_with_it() {
    let registry = prometheus::Registry::new();
    let s = setup_with(ProberMetrics::register(&registry).expect("metrics")).await;
    let hostile = "app\"} 1\nfake_series{x=\"";
    let container = Container {
        name: hostile.into(),
        readiness_probe: Some(exec_probe(3)),
        ..Default::default()
    };
    s.probes.add_pod(&pod(container));
    let render = || {
        let mut buf = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut buf,
        )
        .expect("encode");
        String::from_utf8(buf).expect("utf-8")
    };
    wait_for(|| render().contains("prober_probe_total{")).await;
    let text = render();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{"))
        .collect();
    assert_eq!(series.len(), 1, "{text}");
    for label in [
        "probe_type=\"Readiness\"",
        "result=\"successful\"",
        "pod=\"web\"",
        "namespace=\"default\"",
        "pod_uid=\"u1\"",
        // The quote and the newline are escaped: no series of the spec's making.
        "container=\"app\\\"} 1\\nfake_series{x=\\\"\"",
    ] {
        assert!(series[0].contains(label), "{label} not in {}", series[0]);
    }
    assert!(
        !text.lines().any(|l| l.starts_with("fake_series")),
        "{text}"
    );
    assert!(
        text.contains("prober_probe_duration_seconds_bucket{"),
        "{text}"
    );
    s.probes.remove_pod(&PodUid("u1".into()));
    wait_for(|| s.probes.worker_count() == 0).await;
    let text = render();
    assert!(
        !text.lines().any(|l| l.starts_with("prober_probe")),
        "series outlived the pod:\n{text}"
    );
}
