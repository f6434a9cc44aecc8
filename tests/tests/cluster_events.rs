//! The Kubernetes Events a node reports, as `kubectl describe` reads them: `swiftlet run
//! --kubeconfig` against the project's own API server process (which stores events.k8s.io/v1
//! Events) with the real containerd, and, without an API server, the same events on the gRPC
//! Watch stream. Reasons and messages are upstream's (`pkg/kubelet/events`, the kubelet's call
//! sites); an Event's `regarding` is the Pod (the container in `fieldPath`) or the Node, its
//! `reportingController` `kubelet` and its `reportingInstance` the node's name.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::{Node as ApiNode, Pod},
    events::v1::Event as ApiEvent,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use swiftlet_proto::v1::{self, events_client::EventsClient};
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::runtime,
    manifest::{container, pod},
    node::{BUSYBOX, Node},
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};

/// A pod bound to `node` with one busybox container `app` (the local image, `IfNotPresent`)
/// that stops at once on SIGTERM; `container` and `spec` fields are merged in.
fn busybox_pod(name: &str, node: &str, container: Value, spec: Value) -> Pod {
    let mut app = json!({
        "name": "app",
        "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
    });
    merge(&mut app, container);
    let mut spec_value = json!({
        "nodeName": node,
        "terminationGracePeriodSeconds": 5,
        "containers": [app],
    });
    merge(&mut spec_value, spec);
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec_value,
    }))
    .expect("a pod")
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// What a test reads of a stored Event.
#[derive(Clone, Debug)]
struct Seen {
    type_: String,
    reason: String,
    note: String,
    action: String,
    kind: String,
    name: String,
    uid: String,
    field_path: Option<String>,
    controller: String,
    instance: String,
    /// `series.count`, when the Event became a series.
    count: Option<i32>,
}

impl Seen {
    fn of(event: &ApiEvent) -> Seen {
        let text = |s: &Option<String>| s.clone().unwrap_or_default();
        let regarding = event.regarding.clone().unwrap_or_default();
        Seen {
            type_: text(&event.type_),
            reason: text(&event.reason),
            note: text(&event.note),
            action: text(&event.action),
            kind: text(&regarding.kind),
            name: text(&regarding.name),
            uid: text(&regarding.uid),
            field_path: regarding.field_path,
            controller: text(&event.reporting_controller),
            instance: text(&event.reporting_instance),
            count: event.series.as_ref().map(|s| s.count),
        }
    }
}

/// Lists the Events in `default` until `done` holds for them (bounded: the test fails saying
/// `what` and what it saw).
fn wait_for_events(
    rt: &tokio::runtime::Runtime,
    events: &Api<ApiEvent>,
    what: &str,
    done: impl Fn(&[Seen]) -> bool,
) -> Vec<Seen> {
    let deadline = Instant::now() + EVENT_WAIT * 2;
    loop {
        let seen: Vec<Seen> = rt
            .block_on(events.list(&ListParams::default()))
            .expect("the events are listed")
            .items
            .iter()
            .map(Seen::of)
            .collect();
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen; the events: {seen:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn find<'a>(seen: &'a [Seen], name: &str, reason: &str) -> Vec<&'a Seen> {
    seen.iter()
        .filter(|s| s.name == name && s.reason == reason)
        .collect()
}

/// One pod runs and is deleted (Pulled "already present", Created, Started, then Killing
/// "Stopping container"), one fails its liveness probe until it backs off (Unhealthy as one
/// series, Killing with the probe's reason, BackOff), one has a volume that cannot be set up
/// (FailedMount), one asks for more CPU than the node has (OutOfcpu); the node, found Unknown as the node controller leaves a node whose kubelet
/// went away, reports its start and its conditions (Starting, NodeHasSufficientMemory,
/// NodeReady).
#[test]
fn a_pods_life_and_the_nodes_start_are_events_on_the_api_server() {
    let test = "a_pods_life_and_the_nodes_start_are_events_on_the_api_server";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("events");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let rt = runtime();
    let client = rt.block_on(server.client());
    // The node helper names a node `<name><pid>`: the Node is there before the agent starts.
    let name = format!("apievents{}", std::process::id());
    let unknown = |type_: &str| {
        json!({
            "type": type_,
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        })
    };
    let stale: ApiNode = serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"conditions": [
            unknown("MemoryPressure"),
            unknown("DiskPressure"),
            unknown("PIDPressure"),
            unknown("Ready"),
        ]},
    }))
    .expect("a node");
    let nodes: Api<ApiNode> = Api::all(client.clone());
    rt.block_on(nodes.create(&PostParams::default(), &stale))
        .expect("the stale Node is created");
    let node = Node::start_with("apievents", &endpoint, &["--kubeconfig", &kubeconfig]);
    assert_eq!(node.name, name, "the node helper's naming changed");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let create = |pod: Pod| {
        rt.block_on(pods.create(&PostParams::default(), &pod))
            .expect("the pod is created")
            .metadata
            .uid
            .expect("a uid")
    };
    let plain_uid = create(busybox_pod("plain", &name, json!({}), json!({})));
    let live_uid = create(busybox_pod(
        "live",
        &name,
        json!({"livenessProbe": {
            "exec": {"command": ["sh", "-c", "echo dead; exit 1"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        }}),
        json!({}),
    ));
    create(busybox_pod(
        "mount",
        &name,
        json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
        json!({"volumes": [{
            "name": "data",
            "hostPath": {"path": "/nonexistent/swiftlet-events", "type": "Directory"},
        }]}),
    ));
    create(busybox_pod(
        "greedy",
        &name,
        json!({"resources": {"requests": {"cpu": "100000"}}}),
        json!({}),
    ));

    let events: Api<ApiEvent> = Api::namespaced(client, "default");
    let seen = wait_for_events(&rt, &events, "the pods' and the node's events", |seen| {
        !find(seen, "plain", "Started").is_empty()
            && find(seen, "live", "Unhealthy")
                .iter()
                .any(|s| s.count.is_some_and(|c| c > 1))
            && !find(seen, "live", "BackOff").is_empty()
            && !find(seen, "mount", "FailedMount").is_empty()
            && !find(seen, "greedy", "OutOfcpu").is_empty()
            && !find(seen, &name, "NodeReady").is_empty()
            && !find(seen, &name, "Starting").is_empty()
    });

    // Every Event names the kubelet on this node as its reporter, and what it did.
    for s in &seen {
        assert_eq!(
            (s.controller.as_str(), s.instance.as_str()),
            ("kubelet", name.as_str()),
            "{s:?}"
        );
        assert!(!s.action.is_empty(), "{s:?}");
    }

    // A pod's start: each event about its container.
    let one = |name: &str, reason: &str| -> Seen {
        let found = find(&seen, name, reason);
        assert_eq!(found.len(), 1, "{name} {reason}: {seen:#?}");
        found[0].clone()
    };
    let starts = [
        (
            "Pulled",
            format!("Container image \"{BUSYBOX}\" already present on machine"),
        ),
        ("Created", "Created container: app".to_owned()),
        ("Started", "Started container app".to_owned()),
    ];
    for (reason, note) in &starts {
        let s = one("plain", reason);
        assert_eq!(s.note, *note);
        assert_eq!(s.type_, "Normal");
        assert_eq!(
            (s.kind.as_str(), s.uid.as_str()),
            ("Pod", plain_uid.as_str())
        );
        assert_eq!(s.field_path.as_deref(), Some("spec.containers{app}"));
    }

    // A failing liveness probe: one Event whose series counts the failures, the kill that
    // follows each, and the back-off once it crash-loops.
    let unhealthy = one("live", "Unhealthy");
    assert_eq!(unhealthy.type_, "Warning");
    assert!(
        unhealthy.note.starts_with("Liveness probe failed: dead"),
        "{unhealthy:?}"
    );
    assert!(unhealthy.count.is_some_and(|c| c > 1), "{unhealthy:?}");
    assert_eq!(
        unhealthy.field_path.as_deref(),
        Some("spec.containers{app}")
    );
    let killing = find(&seen, "live", "Killing");
    assert!(
        !killing.is_empty()
            && killing
                .iter()
                .all(|k| k.note == "Container app failed liveness probe, will be restarted"),
        "{killing:#?}"
    );
    let back_off = one("live", "BackOff");
    assert_eq!(back_off.type_, "Warning");
    assert_eq!(
        back_off.note,
        format!("Back-off restarting failed container app in pod live_default({live_uid})")
    );

    // A volume that cannot be set up: about the pod, with the plugin's reason.
    let failed_mount = find(&seen, "mount", "FailedMount");
    assert!(
        failed_mount.iter().any(|s| s.note.starts_with(
            "MountVolume.SetUp failed for volume \"data\" : hostPath type check failed: \
             /nonexistent/swiftlet-events"
        ) && s.field_path.is_none()
            && s.type_ == "Warning"),
        "{failed_mount:#?}"
    );
    assert!(find(&seen, "mount", "Started").is_empty());

    // Admission turned one away: its admit handler's reason and message, about the pod.
    let rejected = one("greedy", "OutOfcpu");
    assert_eq!(rejected.type_, "Warning");
    assert!(
        rejected
            .note
            .starts_with("Node didn't have enough resource: cpu, requested: 100000000, used: "),
        "{rejected:?}"
    );
    assert_eq!((rejected.kind.as_str(), rejected.field_path), ("Pod", None));

    // The node: its start, and each condition the agent changed from Unknown.
    let starting = one(&name, "Starting");
    assert_eq!(starting.note, "Starting kubelet.");
    assert_eq!(
        (starting.kind.as_str(), starting.uid.as_str()),
        ("Node", name.as_str())
    );
    for reason in [
        "NodeReady",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
    ] {
        let s = one(&name, reason);
        assert_eq!(s.note, format!("Node {name} status is now: {reason}"));
        assert_eq!(s.kind, "Node");
    }

    // Deleting a running pod stops its container: Killing, as upstream says it.
    rt.block_on(pods.delete("plain", &DeleteParams::default().grace_period(5)))
        .expect("the delete is accepted");
    let seen = wait_for_events(&rt, &events, "the deleted pod's Killing", |seen| {
        !find(seen, "plain", "Killing").is_empty()
    });
    let killing = find(&seen, "plain", "Killing");
    assert_eq!(killing.len(), 1, "{killing:#?}");
    assert_eq!(killing[0].note, "Stopping container app");
    assert_eq!(
        killing[0].field_path.as_deref(),
        Some("spec.containers{app}")
    );
    // The rest go at once, so the node stops them before it is stopped.
    for pod in ["live", "mount", "greedy"] {
        rt.block_on(pods.delete(pod, &DeleteParams::default().grace_period(0)))
            .expect("the delete is accepted");
    }
    drop(node);
}

/// Without an API server, a static pod's events reach the gRPC Watch stream (kind
/// `kube_event`) as they would the API server: started, then stopped once its manifest goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_api_server_events_reach_the_grpc_stream() {
    let test = "without_an_api_server_events_reach_the_grpc_stream";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let node = Node::start("grpcevents", &endpoint);
    let channel = swiftlet_tests::unix_channel(node.grpc_socket())
        .await
        .expect("connect");
    let mut stream = EventsClient::new(channel)
        .watch(v1::WatchRequest {
            kinds: vec!["kube_event".into()],
            cgroup_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner();
    node.write_manifest(
        "static.yaml",
        &pod(
            "web",
            "",
            &[container(
                "app",
                "trap 'exit 0' TERM; while true; do sleep 0.2; done",
                "",
            )],
        ),
    );
    let pod_name = format!("web-{}", node.name);
    let mut seen: Vec<v1::KubernetesEvent> = Vec::new();
    let mut next = async |want: &str| -> v1::KubernetesEvent {
        tokio::time::timeout(EVENT_WAIT, async {
            loop {
                let event = stream.message().await.expect("stream").expect("open");
                let Some(v1::event::Kind::KubeEvent(e)) = event.kind else {
                    panic!("only kube_event was asked for: {event:?}");
                };
                assert!(event.ts_ns > 0);
                if e.reason == want && e.regarding.as_ref().is_some_and(|r| r.name == pod_name) {
                    return e;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {want} event in time"))
    };
    for reason in ["Pulled", "Created", "Started"] {
        seen.push(next(reason).await);
    }
    node.remove_manifest("static.yaml");
    seen.push(next("Killing").await);

    let notes: Vec<(&str, &str)> = seen
        .iter()
        .map(|e| (e.reason.as_str(), e.note.as_str()))
        .collect();
    let pulled = format!("Container image \"{BUSYBOX}\" already present on machine");
    assert_eq!(
        notes,
        [
            ("Pulled", pulled.as_str()),
            ("Created", "Created container: app"),
            ("Started", "Started container app"),
            ("Killing", "Stopping container app"),
        ]
    );
    for e in &seen {
        let regarding = e.regarding.as_ref().expect("regarding");
        assert_eq!(
            (
                regarding.kind.as_str(),
                regarding.namespace.as_str(),
                regarding.field_path.as_str()
            ),
            ("Pod", "default", "spec.containers{app}")
        );
        assert!(!regarding.uid.is_empty());
        assert_eq!(
            (
                e.r#type.as_str(),
                e.reporting_controller.as_str(),
                e.reporting_instance.as_str(),
                e.count
            ),
            ("Normal", "kubelet", node.name.as_str(), 1)
        );
    }
}
