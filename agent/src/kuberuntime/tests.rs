//! Table tests for `compute_pod_actions`.

use super::fixtures::{
    FakeProbes, container, pod, runtime, sidecar, with_liveness_probe, with_startup_probe,
};
use super::{KillReason, NoProbes, ProbeOutcome, SandboxChange, compute_pod_actions};
use crate::container::{PodStatus, SandboxState};
use k8s_openapi::api::core::v1::Pod;

/// The expected plan, compactly.
#[derive(Debug, Default, PartialEq)]
struct Want {
    kill_pod: bool,
    create_sandbox: bool,
    attempt: u32,
    init: Vec<usize>,
    start: Vec<usize>,
    kill: Vec<(&'static str, KillReason)>,
}

struct Case {
    name: &'static str,
    pod: Pod,
    status: PodStatus,
    probes: FakeProbes,
    want: Want,
}

fn case(name: &'static str, pod: Pod, status: PodStatus, want: Want) -> Case {
    Case {
        name,
        pod,
        status,
        probes: FakeProbes::default(),
        want,
    }
}

fn probed(mut c: Case, f: impl FnOnce(FakeProbes, &PodStatus) -> FakeProbes) -> Case {
    c.probes = f(c.probes, &c.status);
    c
}

fn new_sandbox(attempt: u32, init: Vec<usize>, start: Vec<usize>) -> Want {
    Want {
        kill_pod: true,
        create_sandbox: true,
        attempt,
        init,
        start,
        ..Want::default()
    }
}

fn kill_pod() -> Want {
    Want {
        kill_pod: true,
        ..Want::default()
    }
}

fn start(start: Vec<usize>) -> Want {
    Want {
        start,
        ..Want::default()
    }
}

fn init(init: Vec<usize>) -> Want {
    Want {
        init,
        ..Want::default()
    }
}

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let (a, b) = (container("a"), container("b"));
    let (i0, i1) = (container("init0"), container("init1"));
    let side = sidecar("side");
    let side_startup = with_startup_probe(sidecar("side"));
    let a_live = with_liveness_probe(container("a"));
    let mut side_v2 = sidecar("side");
    side_v2.image = Some("registry.example/side:2".into());
    let mut a_v2 = container("a");
    a_v2.args = Some(vec!["--v2".into()]);
    let regular = |p: &str| pod(p, vec![], vec![a.clone()]);
    let two = |p: &str| pod(p, vec![], vec![a.clone(), b.clone()]);
    let with_inits = |p: &str| pod(p, vec![i0.clone(), i1.clone()], vec![a.clone()]);
    let with_side = |p: &str| pod(p, vec![side.clone(), i1.clone()], vec![a.clone()]);
    let ready = || runtime().ready_sandbox();
    let dead = || runtime().sandbox(SandboxState::NotReady, 0);

    vec![
        // Sandboxes.
        case("fresh pod: new sandbox, then every container", two("Always"), runtime().build(), new_sandbox(0, vec![], vec![0, 1])),
        case("fresh pod with init containers: the first init container only", with_inits("Always"), runtime().build(), new_sandbox(0, vec![0], vec![])),
        case("dead sandbox, Always: recreated with the next attempt", two("Always"), dead().exited(&a, 0).exited(&b, 1).build(), new_sandbox(1, vec![], vec![0, 1])),
        case("dead sandbox, Never, containers ran: not recreated", two("Never"), dead().exited(&a, 1).running(&b).build(), kill_pod()),
        case("dead sandbox, Never, no container ever created: retried", two("Never"), dead().build(), new_sandbox(1, vec![], vec![0, 1])),
        case("dead sandbox, OnFailure, all succeeded: not recreated", two("OnFailure"), dead().exited(&a, 0).exited(&b, 0).build(), kill_pod()),
        case("dead sandbox, OnFailure: only the failed container restarts", two("OnFailure"), dead().exited(&a, 0).exited(&b, 2).build(), new_sandbox(1, vec![], vec![1])),
        case("dead sandbox with init containers: initialization starts over", with_inits("Always"), dead().exited(&i0, 0).exited(&i1, 0).exited(&a, 1).build(), new_sandbox(1, vec![0], vec![])),
        case("two ready sandboxes: replaced by one", regular("Always"), runtime().sandbox(SandboxState::Ready, 0).sandbox(SandboxState::Ready, 3).running(&a).build(), new_sandbox(4, vec![], vec![0])),
        case("pod-network sandbox without IP: recreated", regular("Always"), ready().map_sandbox(|s| s.ips.clear()).running(&a).build(), new_sandbox(1, vec![], vec![0])),
        // Init containers.
        case("init sequence: the second after the first succeeded", with_inits("Always"), ready().exited(&i0, 0).build(), init(vec![1])),
        case("init sequence: wait while one runs", with_inits("Always"), ready().exited(&i0, 0).running(&i1).build(), Want::default()),
        case("init sequence done: regular containers start", with_inits("Always"), ready().exited(&i0, 0).exited(&i1, 0).build(), start(vec![0])),
        case("failed init container, Always: retried", with_inits("Always"), ready().exited(&i0, 1).build(), init(vec![0])),
        case("failed init container, OnFailure: retried", with_inits("OnFailure"), ready().exited(&i0, 0).exited(&i1, 3).build(), init(vec![1])),
        case("failed init container, Never: pod is done", with_inits("Never"), ready().exited(&i0, 0).exited(&i1, 3).build(), kill_pod()),
        case("OOM-killed init container counts as failed", with_inits("Never"), ready().exited(&i0, 0).map_latest(|c| c.reason = "OOMKilled".into()).build(), kill_pod()),
        case("init containers forgotten by the runtime once regular ones run", with_inits("Always"), ready().running(&a).build(), Want::default()),
        // Sidecars.
        case("sidecar started: the next init container runs", with_side("Always"), ready().running(&side).build(), init(vec![1])),
        case("sidecar running, init done: regular containers start", with_side("Always"), ready().running(&side).exited(&i1, 0).build(), start(vec![0])),
        case("sidecar exited: restarted, regular container kept", with_side("Always"), ready().exited(&i1, 0).running(&a).exited(&side, 1).build(), init(vec![0])),
        case("sidecar exited even with Never: restarted", with_side("Never"), ready().exited(&i1, 0).running(&a).exited(&side, 0).build(), init(vec![0])),
        case("sidecar removed from the runtime after initialization: started again", with_side("Always"), ready().running(&a).build(), init(vec![0])),
        case("sidecar spec changed: killed and restarted", pod("Always", vec![side_v2.clone()], vec![a.clone()]), ready().running(&side).running(&a).build(), Want { init: vec![0], kill: vec![("side", KillReason::SpecChanged)], ..Want::default() }),
        case("sidecars alone do not keep a finished pod", pod("Never", vec![side.clone()], vec![a.clone()]), ready().running(&side).exited(&a, 0).build(), kill_pod()),
        probed(case("sidecar startup probe pending: the next init container waits", pod("Always", vec![side_startup.clone(), i1.clone()], vec![a.clone()]), ready().running(&side_startup).build(), Want::default()), |p, _| p),
        probed(case("sidecar startup probe failed: killed and restarted", pod("Always", vec![side_startup.clone(), i1.clone()], vec![a.clone()]), ready().running(&side_startup).build(), Want { init: vec![0], kill: vec![("side", KillReason::StartupProbe)], ..Want::default() }), |p, s| p.startup(s, "side", ProbeOutcome::Failure)),
        probed(case("sidecar startup probe passed: the next init container runs", pod("Always", vec![side_startup.clone(), i1.clone()], vec![a.clone()]), ready().running(&side_startup).build(), init(vec![1])), |p, s| p.startup(s, "side", ProbeOutcome::Success)),
        // Regular containers and restart policies.
        case("ready sandbox, nothing created yet: start all", two("Always"), ready().build(), start(vec![0, 1])),
        case("all running: nothing to do", two("Always"), ready().running(&a).running(&b).build(), Want::default()),
        case("Always, exit 0: restarted", two("Always"), ready().exited(&a, 0).running(&b).build(), start(vec![0])),
        case("Always, exit 1: restarted", two("Always"), ready().exited(&a, 1).running(&b).build(), start(vec![0])),
        case("OnFailure, exit 0: left alone", two("OnFailure"), ready().exited(&a, 0).running(&b).build(), Want::default()),
        case("OnFailure, exit 1: restarted", two("OnFailure"), ready().exited(&a, 1).running(&b).build(), start(vec![0])),
        case("Never, exit 1: left alone", two("Never"), ready().exited(&a, 1).running(&b).build(), Want::default()),
        case("everything done: KillPod", two("OnFailure"), ready().exited(&a, 0).exited(&b, 0).build(), kill_pod()),
        case("only created, never started: started", regular("Always"), ready().created(&a).build(), start(vec![0])),
        case("unknown state: killed, then started", regular("Never"), ready().unknown(&a).build(), Want { start: vec![0], kill: vec![("a", KillReason::UnknownState)], ..Want::default() }),
        case("spec hash changed, even with Never: killed and restarted", pod("Never", vec![], vec![a_v2.clone()]), ready().running(&a).build(), Want { start: vec![0], kill: vec![("a", KillReason::SpecChanged)], ..Want::default() }),
        probed(case("liveness failed, Always: killed and restarted", pod("Always", vec![], vec![a_live.clone()]), ready().running(&a_live).build(), Want { start: vec![0], kill: vec![("a", KillReason::LivenessProbe)], ..Want::default() }), |p, s| p.liveness(s, "a", ProbeOutcome::Failure)),
        probed(case("liveness failed, Never: killed, pod done", pod("Never", vec![], vec![a_live.clone()]), ready().running(&a_live).build(), Want { kill_pod: true, kill: vec![("a", KillReason::LivenessProbe)], ..Want::default() }), |p, s| p.liveness(s, "a", ProbeOutcome::Failure)),
        probed(case("startup failed: killed and restarted", regular("OnFailure"), ready().running(&a).build(), Want { start: vec![0], kill: vec![("a", KillReason::StartupProbe)], ..Want::default() }), |p, s| p.startup(s, "a", ProbeOutcome::Failure)),
        case("deleted pod: exited containers stay down", { let mut p = regular("Always"); p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)); p }, ready().exited(&a, 1).build(), kill_pod()),
    ]
}

#[test]
fn compute_pod_actions_table() {
    let cases = cases();
    assert!(cases.len() >= 15);
    for c in cases {
        let got = compute_pod_actions(&c.pod, &c.status, &c.probes);
        let got = Want {
            kill_pod: got.kill_pod,
            create_sandbox: got.create_sandbox,
            attempt: if got.create_sandbox { got.attempt } else { 0 },
            init: got.init_containers_to_start,
            start: got.containers_to_start,
            kill: got
                .containers_to_kill
                .iter()
                .map(|k| (leak(&k.name), k.reason))
                .collect(),
        };
        assert_eq!(got, c.want, "case: {}", c.name);
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

#[test]
fn sandbox_reasons_and_ids() {
    let a = container("a");
    let p = pod("Always", vec![], vec![a.clone()]);
    let fresh = compute_pod_actions(&p, &runtime().build(), &NoProbes);
    assert_eq!(fresh.sandbox_change, Some(SandboxChange::NoSandbox));
    assert_eq!(fresh.sandbox_id, None);

    let dead = runtime().sandbox(SandboxState::NotReady, 2).build();
    let actions = compute_pod_actions(&p, &dead, &NoProbes);
    assert_eq!(actions.sandbox_change, Some(SandboxChange::NotReady));
    assert_eq!(actions.sandbox_id.as_deref(), Some("sandbox-2"));
    assert_eq!(actions.attempt, 3);

    // The pod asks for host networking but its sandbox has a pod network namespace.
    let mut host = p.clone();
    host.spec.as_mut().unwrap().host_network = Some(true);
    let actions = compute_pod_actions(&host, &runtime().ready_sandbox().build(), &NoProbes);
    assert_eq!(actions.sandbox_change, Some(SandboxChange::NetworkChanged));
    assert_eq!(actions.sandbox_id, None);

    // A host-network sandbox needs no IP of its own.
    let st = runtime()
        .ready_sandbox()
        .map_sandbox(|s| {
            s.host_network = true;
            s.ips.clear();
        })
        .running(&a)
        .build();
    assert!(compute_pod_actions(&host, &st, &NoProbes).is_noop());
}

#[test]
fn kill_messages_say_what_happens_next() {
    let a = with_liveness_probe(container("a"));
    let st = runtime().ready_sandbox().running(&a).build();
    let probes = FakeProbes::default().liveness(&st, "a", ProbeOutcome::Failure);
    let always = compute_pod_actions(&pod("Always", vec![], vec![a.clone()]), &st, &probes);
    assert_eq!(
        always.containers_to_kill[0].message,
        "Container a failed liveness probe, will be restarted"
    );
    assert_eq!(always.containers_to_kill[0].id, st.containers[0].id);
    let never = compute_pod_actions(&pod("Never", vec![], vec![a]), &st, &probes);
    assert_eq!(
        never.containers_to_kill[0].message,
        "Container a failed liveness probe"
    );
}
