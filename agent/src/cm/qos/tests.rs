//! Table tests for QoS classes and OOM score adjustments.

use super::*;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::pod::{
    fixtures::{container, pod, sidecar},
    qos::{SYSTEM_CRITICAL_PRIORITY, SYSTEM_NODE_CRITICAL},
};
use k8s_openapi::api::core::v1::PodStatus as ApiPodStatus;

/// A container with `cpu`/`memory` requests and limits ("" = unset).
fn sized(name: &str, req: (&str, &str), lim: (&str, &str)) -> Container {
    let list = |(cpu, mem): (&str, &str)| {
        let mut m = BTreeMap::new();
        if !cpu.is_empty() {
            m.insert("cpu".to_owned(), ApiQuantity(cpu.into()));
        }
        if !mem.is_empty() {
            m.insert("memory".to_owned(), ApiQuantity(mem.into()));
        }
        (!m.is_empty()).then_some(m)
    };
    Container {
        resources: Some(ResourceRequirements {
            requests: list(req),
            limits: list(lim),
            ..ResourceRequirements::default()
        }),
        ..container(name)
    }
}

fn guaranteed(name: &str) -> Container {
    sized(name, ("1", "1Gi"), ("1", "1Gi"))
}

fn burstable(name: &str, mem: &str) -> Container {
    sized(name, ("100m", mem), ("", ""))
}

#[test]
fn qos_classes() {
    use QosClass::*;
    let cases: Vec<(&str, Vec<Container>, Vec<Container>, QosClass)> = vec![
        ("nothing set", vec![], vec![container("a")], BestEffort),
        ("no containers", vec![], vec![], BestEffort),
        (
            "requests equal limits",
            vec![],
            vec![guaranteed("a"), guaranteed("b")],
            Guaranteed,
        ),
        (
            "limits only: requests default to them",
            vec![],
            vec![sized("a", ("", ""), ("2", "1G"))],
            Guaranteed,
        ),
        (
            "same amount, different spelling",
            vec![],
            vec![sized("a", ("1000m", "1024Mi"), ("1", "1Gi"))],
            Guaranteed,
        ),
        (
            "cpu only",
            vec![],
            vec![sized("a", ("1", ""), ("1", ""))],
            Burstable,
        ),
        (
            "request below limit",
            vec![],
            vec![sized("a", ("1", "1Gi"), ("2", "1Gi"))],
            Burstable,
        ),
        (
            "requests only",
            vec![],
            vec![burstable("a", "64Mi")],
            Burstable,
        ),
        (
            "one guaranteed, one best-effort",
            vec![],
            vec![guaranteed("a"), container("b")],
            Burstable,
        ),
        (
            "zero requests are nothing",
            vec![],
            vec![sized("a", ("0", "0"), ("", ""))],
            BestEffort,
        ),
        (
            "init container counts",
            vec![burstable("init", "10Mi")],
            vec![container("a")],
            Burstable,
        ),
        (
            "guaranteed init and regular",
            vec![guaranteed("init")],
            vec![guaranteed("a")],
            Guaranteed,
        ),
        (
            "best-effort init makes a guaranteed pod burstable",
            vec![container("init")],
            vec![guaranteed("a")],
            Burstable,
        ),
        (
            "sidecar counts like an init container",
            vec![sidecar("side")],
            vec![guaranteed("a")],
            Burstable,
        ),
    ];
    for (name, inits, containers, want) in cases {
        let p = pod("Always", inits, containers);
        assert_eq!(compute_pod_qos(&p).unwrap(), want, "{name}");
    }
}

#[test]
fn pod_level_resources_and_recorded_class_win() {
    let mut p = pod("Always", vec![], vec![container("a")]);
    p.spec.as_mut().unwrap().resources = sized("<pod>", ("", ""), ("1", "1Gi")).resources;
    assert_eq!(pod_qos(&p).unwrap(), QosClass::Guaranteed);
    p.status = Some(ApiPodStatus {
        qos_class: Some("Burstable".into()),
        ..ApiPodStatus::default()
    });
    assert_eq!(pod_qos(&p).unwrap(), QosClass::Burstable);
    assert_eq!(compute_pod_qos(&p).unwrap(), QosClass::Guaranteed);
}

#[test]
fn bad_quantities_are_named() {
    let p = pod("Always", vec![], vec![sized("a", ("1", "lots"), ("", ""))]);
    let err = compute_pod_qos(&p).unwrap_err();
    assert_eq!(err.container, "a");
    assert_eq!(err.resource, "memory");
    assert!(err.to_string().contains("\"lots\""), "{err}");
}

#[test]
fn oom_score_adj() {
    let gib = NonZeroU64::new(1 << 30).unwrap();
    let cap = NonZeroU64::new(10 << 30).unwrap();
    let adj = |p: &Pod, c: &Container| container_oom_score_adj(p, c, cap).unwrap();

    let g = pod("Always", vec![], vec![guaranteed("a")]);
    assert_eq!(adj(&g, &guaranteed("a")), -997);
    let be = pod("Always", vec![], vec![container("a")]);
    assert_eq!(adj(&be, &container("a")), 1000);

    // 1 GiB of 10 GiB: 1000 - 100.
    let one = burstable("a", "1Gi");
    let b = pod("Always", vec![], vec![one.clone()]);
    assert_eq!(adj(&b, &one), 900);
    // Tiny request: 1000 would tie with BestEffort, so 999.
    let tiny = burstable("a", "1");
    assert_eq!(adj(&pod("Always", vec![], vec![tiny.clone()]), &tiny), 999);
    // Request above capacity: floored at 3, above every Guaranteed process.
    let huge = burstable("a", "20Gi");
    assert_eq!(adj(&pod("Always", vec![], vec![huge.clone()]), &huge), 3);
    assert_eq!(container_oom_score_adj(&b, &one, gib).unwrap(), 3);

    // A sidecar with a small request scores no higher than the smallest regular container.
    let side = Container {
        restart_policy: Some("Always".into()),
        ..burstable("side", "100Mi")
    };
    let app = burstable("app", "2Gi");
    let big = burstable("big", "4Gi");
    let p = pod("Always", vec![side.clone()], vec![app.clone(), big]);
    assert_eq!(adj(&p, &app), 800);
    assert_eq!(adj(&p, &side), 800);

    // Node-critical pods are protected whatever their resources.
    let mut critical = pod("Always", vec![], vec![container("a")]);
    critical.metadata.annotations =
        Some([(spec::CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned())].into());
    assert!(is_critical(&critical));
    assert_eq!(adj(&critical, &container("a")), 1000);
    critical.spec.as_mut().unwrap().priority_class_name = Some(SYSTEM_NODE_CRITICAL.into());
    assert_eq!(adj(&critical, &container("a")), -997);
    let mut by_priority = pod("Always", vec![], vec![container("a")]);
    by_priority.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
    by_priority.spec.as_mut().unwrap().priority_class_name = Some(SYSTEM_NODE_CRITICAL.into());
    assert!(is_node_critical(&by_priority));
}

#[test]
fn unprivileged_writes_are_clamped() {
    let cases = [
        (-997, false, 0, true),
        (-997, true, -997, false),
        (0, false, 0, false),
        (900, false, 900, false),
        (1000, true, 1000, false),
    ];
    for (adj, cap, value, clamped) in cases {
        assert_eq!(
            clamp_for_unprivileged(adj, cap),
            OomScoreAdj { value, clamped },
            "{adj} {cap}"
        );
    }
}
