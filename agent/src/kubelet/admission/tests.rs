//! Admission's predicates as tables: each case a pod (as the API writes it), the active pods, and
//! the reason upstream's `predicateAdmitHandler` gives (or none).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;

const NODE: &str = "n1";

fn capacity() -> NodeCapacity {
    NodeCapacity {
        max_pods: 3,
        cpu_millis: 2000,
        memory_bytes: 1 << 30,
        // 4 pages of 2 MiB; no 1 GiB pages configured (the size exists, with none).
        hugepages: [(2 << 20, 8 << 20), (1 << 30, 0)].into_iter().collect(),
    }
}

fn registration() -> Registration {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", NODE),
        ("kubernetes.io/os", "linux"),
        ("disk", "ssd"),
        ("cores", "8"),
        ("example.com/zone", "a"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let taints =
        crate::node::taints::parse_taints(&["dedicated=batch:NoExecute", "soft=yes:NoSchedule"])
            .unwrap_or_default();
    Registration { labels, taints }
}

/// A pod from the `spec` (and `metadata`) fields given, with one container.
fn pod(spec: Value) -> Pod {
    let mut object = json!({
        "metadata": { "name": "p", "namespace": "default", "uid": "u" },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
    });
    for (key, value) in spec.as_object().into_iter().flatten() {
        if key == "metadata" {
            for (m, v) in value.as_object().into_iter().flatten() {
                object["metadata"][m] = v.clone();
            }
        } else {
            object["spec"][key] = value.clone();
        }
    }
    serde_json::from_value(object).unwrap_or_default()
}

/// A pod that tolerates the node's `NoExecute` taint, with `spec` on top.
fn tolerant(mut spec: Value) -> Pod {
    spec["tolerations"] = json!([{ "key": "dedicated", "operator": "Exists" }]);
    pod(spec)
}

fn term(expressions: Value, fields: Value) -> Value {
    json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{ "matchExpressions": expressions, "matchFields": fields }],
    }}})
}

fn reason(pod: &Pod, active: &[&Pod]) -> Option<String> {
    let registration = registration();
    let capacity = capacity();
    let node = AdmissionNode {
        name: NODE,
        capacity: &capacity,
        registration: &registration,
    };
    admit(pod, active, &node).err().map(|r| r.reason)
}

#[test]
fn node_selector_and_required_affinity() {
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "selector matches",
            json!({ "nodeSelector": { "disk": "ssd" } }),
            None,
        ),
        (
            "selector misses",
            json!({ "nodeSelector": { "disk": "hdd" } }),
            Some("NodeAffinity"),
        ),
        (
            "selector label absent",
            json!({ "nodeSelector": { "gpu": "" } }),
            Some("NodeAffinity"),
        ),
        (
            "every operator holds",
            json!({ "affinity": term(json!([
                { "key": "disk", "operator": "In", "values": ["ssd", "nvme"] },
                { "key": "disk", "operator": "NotIn", "values": ["hdd"] },
                { "key": "gpu", "operator": "NotIn", "values": ["yes"] },
                { "key": "example.com/zone", "operator": "Exists" },
                { "key": "gpu", "operator": "DoesNotExist" },
                { "key": "cores", "operator": "Gt", "values": ["4"] },
                { "key": "cores", "operator": "Lt", "values": ["16"] },
            ]), json!(null)) }),
            None,
        ),
        (
            "In misses",
            json!({ "affinity": term(json!([{ "key": "disk", "operator": "In", "values": ["hdd"] }]), json!(null)) }),
            Some("NodeAffinity"),
        ),
        (
            "Gt on a missing label",
            json!({ "affinity": term(json!([{ "key": "gpus", "operator": "Gt", "values": ["0"] }]), json!(null)) }),
            Some("NodeAffinity"),
        ),
        (
            "Gt with a value that is not an integer spoils the term",
            json!({ "affinity": term(json!([
                { "key": "cores", "operator": "Gt", "values": ["four"] },
                { "key": "disk", "operator": "In", "values": ["ssd"] },
            ]), json!(null)) }),
            Some("NodeAffinity"),
        ),
        (
            "Lt fails",
            json!({ "affinity": term(json!([{ "key": "cores", "operator": "Lt", "values": ["8"] }]), json!(null)) }),
            Some("NodeAffinity"),
        ),
        (
            "Exists with values spoils the term",
            json!({ "affinity": term(json!([{ "key": "disk", "operator": "Exists", "values": ["ssd"] }]), json!(null)) }),
            Some("NodeAffinity"),
        ),
        (
            "matchFields on the node's name",
            json!({ "affinity": term(json!(null), json!([{ "key": "metadata.name", "operator": "In", "values": [NODE] }])) }),
            None,
        ),
        (
            "matchFields on another node",
            json!({ "affinity": term(json!(null), json!([{ "key": "metadata.name", "operator": "In", "values": ["n2"] }])) }),
            Some("NodeAffinity"),
        ),
        (
            "matchFields NotIn another node",
            json!({ "affinity": term(json!(null), json!([{ "key": "metadata.name", "operator": "NotIn", "values": ["n2"] }])) }),
            None,
        ),
        (
            "matchFields with two values spoils the term",
            json!({ "affinity": term(json!(null), json!([{ "key": "metadata.name", "operator": "In", "values": [NODE, "n2"] }])) }),
            Some("NodeAffinity"),
        ),
        (
            "an empty term matches nothing",
            json!({ "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{}] } } } }),
            Some("NodeAffinity"),
        ),
        (
            "terms are ORed",
            json!({ "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    { "matchExpressions": [{ "key": "disk", "operator": "In", "values": ["hdd"] }] },
                    { "matchExpressions": [{ "key": "disk", "operator": "Unknown" }] },
                    { "matchExpressions": [{ "key": "disk", "operator": "In", "values": ["ssd"] }] },
                ] } } } }),
            None,
        ),
        (
            "selector and affinity must both hold",
            json!({
                "nodeSelector": { "disk": "hdd" },
                "affinity": term(json!([{ "key": "disk", "operator": "Exists" }]), json!(null)),
            }),
            Some("NodeAffinity"),
        ),
        (
            "preferred terms do not count",
            json!({ "affinity": { "nodeAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 1,
                "preference": { "matchExpressions": [{ "key": "disk", "operator": "In", "values": ["hdd"] }] },
            }] } } }),
            None,
        ),
    ];
    for (name, spec, want) in cases {
        assert_eq!(reason(&tolerant(spec), &[]).as_deref(), want, "{name}");
    }
    let rejected = registration();
    let capacity = capacity();
    let node = AdmissionNode {
        name: NODE,
        capacity: &capacity,
        registration: &rejected,
    };
    let miss = admit(
        &tolerant(json!({ "nodeSelector": { "disk": "hdd" } })),
        &[],
        &node,
    );
    assert_eq!(
        miss.err().map(|r| r.message).as_deref(),
        Some("Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")
    );
}

#[test]
fn no_execute_taints_unless_tolerated_or_static() {
    let untolerated = pod(json!({}));
    let rejection = {
        let registration = registration();
        let capacity = capacity();
        let node = AdmissionNode {
            name: NODE,
            capacity: &capacity,
            registration: &registration,
        };
        admit(&untolerated, &[], &node).err()
    };
    assert_eq!(
        rejection,
        Some(Rejection {
            reason: "TaintToleration".into(),
            message:
                "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
                    .into(),
        })
    );
    // The NoSchedule taint is the scheduler's business: tolerating the NoExecute one is enough.
    assert_eq!(reason(&tolerant(json!({})), &[]), None);
    let wrong_value = pod(json!({
        "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "web" }],
    }));
    assert_eq!(
        reason(&wrong_value, &[]).as_deref(),
        Some("TaintToleration")
    );
    let everything = pod(json!({ "tolerations": [{ "operator": "Exists" }] }));
    assert_eq!(reason(&everything, &[]), None);
    // Static pods are not checked against taints.
    let static_pod = pod(json!({
        "metadata": { "annotations": { "kubernetes.io/config.source": "file" } },
    }));
    assert_eq!(reason(&static_pod, &[]), None);
}

#[test]
fn host_ports_conflict_as_the_schedulers_node_ports() {
    let with_ports = |ports: Value| {
        tolerant(json!({
            "containers": [{ "name": "c", "image": "busybox", "ports": ports }],
        }))
    };
    let sidecar_with = |ports: Value| {
        tolerant(json!({
            "initContainers": [{ "name": "s", "image": "busybox", "restartPolicy": "Always", "ports": ports }],
        }))
    };
    let plain_init_with = |ports: Value| {
        tolerant(json!({
            "initContainers": [{ "name": "i", "image": "busybox", "ports": ports }],
        }))
    };
    let active = with_ports(json!([{ "containerPort": 80, "hostPort": 8080 }]));
    let on_ip =
        with_ports(json!([{ "containerPort": 80, "hostPort": 9090, "hostIP": "10.0.0.1" }]));
    let cases: Vec<(&str, Pod, &Pod, Option<&str>)> = vec![
        (
            "same port, protocol defaulted to TCP",
            with_ports(json!([{ "containerPort": 81, "hostPort": 8080, "protocol": "TCP" }])),
            &active,
            Some("NodePorts"),
        ),
        (
            "same port over UDP",
            with_ports(json!([{ "containerPort": 81, "hostPort": 8080, "protocol": "UDP" }])),
            &active,
            None,
        ),
        (
            "another port",
            with_ports(json!([{ "containerPort": 81, "hostPort": 8081 }])),
            &active,
            None,
        ),
        (
            "a specific IP against the wildcard",
            with_ports(json!([{ "containerPort": 81, "hostPort": 8080, "hostIP": "10.0.0.2" }])),
            &active,
            Some("NodePorts"),
        ),
        (
            "the wildcard against a specific IP",
            with_ports(json!([{ "containerPort": 81, "hostPort": 9090 }])),
            &on_ip,
            Some("NodePorts"),
        ),
        (
            "two specific IPs",
            with_ports(json!([{ "containerPort": 81, "hostPort": 9090, "hostIP": "10.0.0.2" }])),
            &on_ip,
            None,
        ),
        (
            "a container port without a host port",
            with_ports(json!([{ "containerPort": 8080 }])),
            &active,
            None,
        ),
        (
            "a sidecar's host port",
            sidecar_with(json!([{ "containerPort": 81, "hostPort": 8080 }])),
            &active,
            Some("NodePorts"),
        ),
        (
            "a plain init container's host port does not count",
            plain_init_with(json!([{ "containerPort": 81, "hostPort": 8080 }])),
            &active,
            None,
        ),
    ];
    for (name, pod, active, want) in cases {
        assert_eq!(reason(&pod, &[active]).as_deref(), want, "{name}");
    }
}

#[test]
fn resources_count_overhead_and_come_first() {
    let requesting = |cpu: &str, memory: &str, overhead: Value| {
        tolerant(json!({
            "containers": [{ "name": "c", "image": "busybox", "resources": {
                "requests": { "cpu": cpu, "memory": memory },
            }}],
            "overhead": overhead,
        }))
    };
    let small = requesting("500m", "100Mi", json!(null));
    assert_eq!(reason(&small, &[]), None);
    // 1 GiB of memory: 900 Mi of requests fit, with 200 Mi of overhead they do not.
    let heavy = requesting("100m", "900Mi", json!({ "memory": "200Mi" }));
    let registration = registration();
    let capacity = capacity();
    let node = AdmissionNode {
        name: NODE,
        capacity: &capacity,
        registration: &registration,
    };
    assert_eq!(
        admit(&heavy, &[], &node).err(),
        Some(Rejection {
            reason: "OutOfmemory".into(),
            message: format!(
                "Node didn't have enough resource: memory, requested: {}, used: 0, capacity: {}",
                1100 * 1024 * 1024,
                1u64 << 30
            ),
        })
    );
    // The active pods' overhead is used too: 1 CPU + 600m of overhead leaves exactly 400m.
    let cpu_overhead = requesting("1", "1Mi", json!({ "cpu": "600m" }));
    let fits_exactly = requesting("400m", "1Mi", json!(null));
    assert_eq!(reason(&fits_exactly, &[&cpu_overhead]), None);
    assert_eq!(
        reason(&small, &[&cpu_overhead]).as_deref(),
        Some("OutOfcpu")
    );
    assert_eq!(
        reason(&small, &[&small, &small, &small]).as_deref(),
        Some("OutOfpods")
    );
    // Resources come before every other predicate, the node name before the ports and taints.
    let everything_wrong = pod(json!({
        "nodeName": "n2",
        "nodeSelector": { "disk": "hdd" },
        "containers": [{ "name": "c", "image": "busybox", "resources": { "requests": { "cpu": "3" } } }],
    }));
    assert_eq!(reason(&everything_wrong, &[]).as_deref(), Some("OutOfcpu"));
    let elsewhere = pod(json!({ "nodeName": "n2" }));
    let rejected = admit(&elsewhere, &[], &node).err();
    assert_eq!(
        rejected,
        Some(Rejection {
            reason: "NodeName".into(),
            message: "Predicate NodeName failed: node(s) didn't match the requested node name"
                .into(),
        })
    );
    let bad_overhead = requesting("1", "1Mi", json!({ "memory": "lots" }));
    assert_eq!(
        reason(&bad_overhead, &[]).as_deref(),
        Some("UnexpectedAdmissionError")
    );
}

#[test]
fn the_pods_os_must_be_the_nodes() {
    let labelled = tolerant(json!({ "metadata": { "labels": { "kubernetes.io/os": "windows" } } }));
    assert_eq!(
        reason(&labelled, &[]).as_deref(),
        Some("PodOSSelectorNodeLabelDoesNotMatch")
    );
    let linux = tolerant(json!({ "metadata": { "labels": { "kubernetes.io/os": "linux" } } }));
    assert_eq!(reason(&linux, &[]), None);
    let windows = tolerant(json!({ "os": { "name": "windows" } }));
    assert_eq!(reason(&windows, &[]).as_deref(), Some("PodOSNotSupported"));
}

#[test]
fn hugepages_fit_the_pages_of_their_size_or_are_refused_naming_it() {
    let asking = |resource: &str, amount: &str| {
        let mut list = json!({ "memory": "1Mi" });
        list[resource] = json!(amount);
        tolerant(json!({
            "containers": [{ "name": "c", "image": "busybox", "resources": {
                "requests": list.clone(),
                "limits": list,
            }}],
        }))
    };
    let two = asking("hugepages-2Mi", "4Mi");
    assert_eq!(reason(&two, &[]), None);
    // 8 MiB of 2 MiB pages: 4 MiB used, 6 more do not fit.
    let six = asking("hugepages-2Mi", "6Mi");
    assert_eq!(reason(&six, &[&two]).as_deref(), Some("OutOfhugepages-2Mi"));
    // A size the node has no pages of, and one it does not have at all: no capacity.
    let registration = registration();
    let capacity = capacity();
    let node = AdmissionNode {
        name: NODE,
        capacity: &capacity,
        registration: &registration,
    };
    for (resource, reason) in [
        ("hugepages-1Gi", "OutOfhugepages-1Gi"),
        ("hugepages-32Mi", "OutOfhugepages-32Mi"),
    ] {
        let pod = asking(
            resource,
            if resource.ends_with("Gi") {
                "1Gi"
            } else {
                "32Mi"
            },
        );
        let rejected = admit(&pod, &[], &node).err();
        assert_eq!(rejected.as_ref().map(|r| r.reason.as_str()), Some(reason));
        let message = rejected.map(|r| r.message).unwrap_or_default();
        assert!(
            message.contains(&format!("resource: {resource},")) && message.contains("capacity: 0"),
            "{message}"
        );
    }
}
