//! Pod-level fields: IPs, readiness and gates, what carries over from the previous status.

use k8s_openapi::api::core::v1::{PodCondition, PodReadinessGate, PodStatus as ApiPodStatus};

use super::{NODE_IP, NotReady, cond, cs, generate};
use crate::pod::fixtures::{container, pod, runtime, t};
use crate::status::{ReasonCache, RunningIsReady, api_time, generate_api_pod_status};

#[test]
fn ips_and_host_network() {
    let a = container("a");
    let rt = runtime()
        .ready_sandbox()
        .map_sandbox(|s| s.ips = vec!["fd00::5".into(), "10.0.0.5".into(), "10.0.0.6".into()])
        .running(&a)
        .build();
    let p = pod("Always", vec![], vec![a.clone()]);
    let s = generate(&p, &rt, &ReasonCache::new());
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
    let ips: Vec<&str> = s.pod_ips.iter().flatten().map(|i| i.ip.as_str()).collect();
    assert_eq!(ips, ["10.0.0.5", "fd00::5"]);
    assert_eq!(s.host_ip.as_deref(), Some(NODE_IP));
    let v6 = generate_api_pod_status(
        &p,
        &rt,
        &ReasonCache::new(),
        &RunningIsReady,
        Some("fd00::1"),
        t(0),
    );
    assert_eq!(v6.pod_ip.as_deref(), Some("fd00::5"));

    let mut host = p.clone();
    host.spec.as_mut().unwrap().host_network = Some(true);
    let rt = runtime()
        .ready_sandbox()
        .map_sandbox(|s| {
            s.host_network = true;
            s.ips.clear();
        })
        .running(&a)
        .build();
    let s = generate(&host, &rt, &ReasonCache::new());
    assert_eq!(s.pod_ip.as_deref(), Some(NODE_IP));

    // A dead sandbox has no IP to report.
    let dead = runtime()
        .sandbox(crate::container::SandboxState::NotReady, 0)
        .build();
    assert_eq!(generate(&p, &dead, &ReasonCache::new()).pod_ip, None);
}

#[test]
fn readiness_and_gates() {
    let a = container("a");
    let rt = runtime().ready_sandbox().running(&a).build();
    let mut p = pod("Always", vec![], vec![a.clone()]);
    let s = generate_api_pod_status(&p, &rt, &ReasonCache::new(), &NotReady("a"), None, t(0));
    assert!(!cs(&s, "a").ready);
    assert_eq!(cond(&s, "Ready").1.as_deref(), Some("ContainersNotReady"));
    assert_eq!(s.phase.as_deref(), Some("Running"));

    p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
        condition_type: "example.com/lb".into(),
    }]);
    let s = generate(&p, &rt, &ReasonCache::new());
    assert_eq!(cond(&s, "ContainersReady").0, "True");
    let (status, reason, message) = cond(&s, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("False", Some("ReadinessGatesNotReady"))
    );
    assert_eq!(
        message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );

    // The gate's condition is set by someone else and kept from the previous status.
    p.status = Some(ApiPodStatus {
        conditions: Some(vec![PodCondition {
            type_: "example.com/lb".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..ApiPodStatus::default()
    });
    let s = generate(&p, &rt, &ReasonCache::new());
    assert_eq!(cond(&s, "Ready").0, "True");
    assert_eq!(cond(&s, "example.com/lb").0, "True");
}

#[test]
fn previous_status_carries_over() {
    let a = container("a");
    let rt = runtime().ready_sandbox().running(&a).build();
    let mut p = pod("Always", vec![], vec![a.clone()]);
    p.metadata.generation = Some(3);
    let first = generate(&p, &rt, &ReasonCache::new());
    assert_eq!(first.start_time, api_time(t(1000)));
    assert_eq!(first.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(first.observed_generation, Some(3));

    // Later: start time and unchanged conditions keep their times; a changed one moves.
    p.status = Some(first.clone());
    let later =
        generate_api_pod_status(&p, &rt, &ReasonCache::new(), &NotReady("a"), None, t(2000));
    assert_eq!(later.start_time, api_time(t(1000)));
    let time = |s: &ApiPodStatus, type_: &str| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .unwrap()
            .last_transition_time
            .clone()
    };
    assert_eq!(time(&later, "PodScheduled"), api_time(t(1000)));
    assert_eq!(time(&later, "Ready"), api_time(t(2000)));
    assert_eq!(
        later.host_ip.as_deref(),
        Some(NODE_IP),
        "kept without a new node IP"
    );

    // A terminal phase sticks even if the runtime shows something running.
    p.status = Some(ApiPodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        ..ApiPodStatus::default()
    });
    let s = generate(&p, &rt, &ReasonCache::new());
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
}
