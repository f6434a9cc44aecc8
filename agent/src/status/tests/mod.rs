//! Table tests for status generation: phase and conditions here, container statuses and
//! pod-level fields in the submodules.

mod containers;
mod pod;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus as ApiContainerStatus, Pod, PodCondition, PodStatus as ApiPodStatus,
};

use super::{
    ContainerReadiness, ReasonCache, RunningIsReady, StartFailure, StartFailureReason,
    generate_api_pod_status, generate_terminal_api_pod_status,
};
use crate::container::{ContainerId, PodStatus, PodUid};
use crate::pod::fixtures::{UID, container, pod, runtime, sidecar, t};

const NODE_IP: &str = "192.168.1.10";

fn generate(p: &Pod, rt: &PodStatus, reasons: &ReasonCache) -> ApiPodStatus {
    generate_api_pod_status(p, rt, reasons, &RunningIsReady, Some(NODE_IP), t(1000))
}

/// A condition as (type, status, reason, message).
fn cond(s: &ApiPodStatus, type_: &str) -> (String, Option<String>, Option<String>) {
    let c: &PodCondition = s
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn cs<'a>(s: &'a ApiPodStatus, name: &str) -> &'a ApiContainerStatus {
    s.container_statuses
        .iter()
        .chain(&s.init_container_statuses)
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status for {name}"))
}

fn waiting_reason(s: &ApiPodStatus, name: &str) -> Option<String> {
    cs(s, name)
        .state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.reason.clone())
}

fn crash_looping(name: &str) -> ReasonCache {
    let mut r = ReasonCache::new();
    r.add(
        &PodUid::from(UID),
        name,
        StartFailure::new(StartFailureReason::CrashLoopBackOff, "back-off 10s"),
    );
    r
}

/// (status, reason) of a condition, for compact tables.
type Sr = (&'static str, Option<&'static str>);

struct Case {
    name: &'static str,
    pod: Pod,
    runtime: PodStatus,
    reasons: ReasonCache,
    terminal: bool,
    phase: &'static str,
    initialized: Sr,
    containers_ready: Sr,
    ready: Sr,
}

/// Readiness from a fake: container "a" runs but is not ready.
struct NotReady(&'static str);

impl ContainerReadiness for NotReady {
    fn started(&self, _: &Pod, _: &Container, _: &ContainerId) -> bool {
        true
    }

    fn ready(&self, _: &Pod, c: &Container, _: &ContainerId) -> bool {
        c.name != self.0
    }
}

#[test]
#[rustfmt::skip]
fn phase_and_conditions_table() {
    let (a, b) = (container("a"), container("b"));
    let (i0, i1) = (container("init0"), container("init1"));
    let side = sidecar("side");
    let ready = || runtime().ready_sandbox();
    let none = ReasonCache::new;
    let yes: Sr = ("True", None);
    let not_ready: Sr = ("False", Some("ContainersNotReady"));
    let c = |name, pod, runtime, reasons, phase, initialized, containers_ready: Sr| Case {
        name,
        pod,
        runtime,
        reasons,
        terminal: false,
        phase,
        initialized,
        containers_ready,
        ready: containers_ready,
    };
    let cases = vec![
        c("fresh pod", pod("Always", vec![], vec![a.clone()]), runtime().build(), none(), "Pending", yes, not_ready),
        c("all running", pod("Always", vec![], vec![a.clone(), b.clone()]), ready().running(&a).running(&b).build(), none(), "Running", yes, yes),
        c("one of two created only", pod("Always", vec![], vec![a.clone(), b.clone()]), ready().running(&a).created(&b).build(), none(), "Pending", yes, not_ready),
        c("init container running", pod("Always", vec![i0.clone(), i1.clone()], vec![a.clone()]), ready().exited(&i0, 0).running(&i1).build(), none(), "Pending", ("False", Some("ContainersNotInitialized")), not_ready),
        c("init failed, Never", pod("Never", vec![i0.clone()], vec![a.clone()]), ready().exited(&i0, 1).build(), none(), "Failed", ("False", Some("ContainersNotInitialized")), ("False", Some("PodFailed"))),
        c("init failed, Always: retried", pod("Always", vec![i0.clone()], vec![a.clone()]), ready().exited(&i0, 1).build(), none(), "Pending", ("False", Some("ContainersNotInitialized")), not_ready),
        c("init done, regular running", pod("Always", vec![i0.clone()], vec![a.clone()]), ready().exited(&i0, 0).running(&a).build(), none(), "Running", yes, yes),
        c("all succeeded, OnFailure", pod("OnFailure", vec![i0.clone()], vec![a.clone(), b.clone()]), ready().exited(&i0, 0).exited(&a, 0).exited(&b, 0).build(), none(), "Succeeded", ("True", Some("PodCompleted")), ("False", Some("PodCompleted"))),
        c("one failed, Never", pod("Never", vec![], vec![a.clone(), b.clone()]), ready().exited(&a, 0).exited(&b, 1).build(), none(), "Failed", yes, ("False", Some("PodFailed"))),
        c("one failed, OnFailure, restarting", pod("OnFailure", vec![], vec![a.clone(), b.clone()]), ready().exited(&a, 0).exited(&b, 1).build(), none(), "Running", yes, not_ready),
        c("exited, Always: restarting", pod("Always", vec![], vec![a.clone()]), ready().exited(&a, 0).build(), none(), "Running", yes, not_ready),
        c("crash-looping, Always", pod("Always", vec![], vec![a.clone()]), ready().exited(&a, 1).build(), crash_looping("a"), "Running", yes, not_ready),
        c("crash-looping, OnFailure, nothing running", pod("OnFailure", vec![], vec![a.clone()]), ready().exited(&a, 1).build(), crash_looping("a"), "Running", yes, not_ready),
        c("sidecar running, regular not yet", pod("Always", vec![side.clone()], vec![a.clone()]), ready().running(&side).build(), none(), "Pending", yes, not_ready),
        c("sidecar and regular running", pod("Always", vec![side.clone()], vec![a.clone()]), ready().running(&side).running(&a).build(), none(), "Running", yes, yes),
        c("sidecar restarting after initialization", pod("Always", vec![side.clone()], vec![a.clone()]), ready().running(&a).exited(&side, 1).build(), crash_looping("side"), "Running", yes, not_ready),
        c("sidecar crash-looping in a Never pod: it restarts anyway", pod("Never", vec![side.clone()], vec![a.clone()]), ready().running(&a).exited(&side, 1).build(), crash_looping("side"), "Running", yes, not_ready),
        c("regular done, sidecar still running, Never", pod("Never", vec![side.clone()], vec![a.clone()]), ready().running(&side).exited(&a, 0).build(), none(), "Running", yes, not_ready),
        Case { terminal: true, ..c("terminal pod, Always, exited 0", pod("Always", vec![], vec![a.clone()]), ready().exited(&a, 0).build(), none(), "Succeeded", ("True", Some("PodCompleted")), ("False", Some("PodCompleted"))) },
        Case { terminal: true, ..c("terminal pod, Always, exited 1", pod("Always", vec![], vec![a.clone()]), ready().exited(&a, 1).build(), none(), "Failed", yes, ("False", Some("PodFailed"))) },
    ];
    assert!(cases.len() >= 12);
    for case in cases {
        let s = if case.terminal {
            generate_terminal_api_pod_status(&case.pod, &case.runtime, &case.reasons, &RunningIsReady, Some(NODE_IP), t(1000))
        } else {
            generate(&case.pod, &case.runtime, &case.reasons)
        };
        let name = case.name;
        assert_eq!(s.phase.as_deref(), Some(case.phase), "{name}: phase");
        let sr = |type_| {
            let (status, reason, _) = cond(&s, type_);
            (status, reason)
        };
        let own = |(st, r): Sr| (st.to_owned(), r.map(str::to_owned));
        assert_eq!(sr("Initialized"), own(case.initialized), "{name}: Initialized");
        assert_eq!(sr("ContainersReady"), own(case.containers_ready), "{name}: ContainersReady");
        assert_eq!(sr("Ready"), own(case.ready), "{name}: Ready");
        assert_eq!(sr("PodScheduled"), own(("True", None)), "{name}: PodScheduled");
    }
}

#[test]
fn condition_messages_and_order() {
    let (a, b) = (container("a"), container("b"));
    let p = pod(
        "Always",
        vec![container("init0")],
        vec![a.clone(), b.clone()],
    );
    let s = generate(&p, &runtime().build(), &ReasonCache::new());
    let types: Vec<&str> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled"
        ]
    );
    assert_eq!(cond(&s, "PodReadyToStartContainers").0, "False");
    assert_eq!(
        cond(&s, "Initialized").2.as_deref(),
        Some("containers with incomplete status: [init0]")
    );
    assert_eq!(
        cond(&s, "Ready").2.as_deref(),
        Some("containers with unready status: [a b]")
    );

    let ready = runtime().ready_sandbox().build();
    let s = generate(&p, &ready, &ReasonCache::new());
    assert_eq!(cond(&s, "PodReadyToStartContainers").0, "True");
}
