//! Node registration and status against the scripted API server: the exact requests, in order.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::Duration,
};

use http::Method;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{
    sources::apiserver::KUBELET_VERSION,
    testing::fake_api::{FakeApi, fake_api, paused_clock, status_error, t0_plus},
};

const STRATEGIC: &str = "application/strategic-merge-patch+json";

fn description() -> NodeDescription {
    NodeDescription {
        hostname: "n1".into(),
        internal_ips: vec![
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
            "fd00::5"
                .parse()
                .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
        ],
        labels: crate::node::labels::node_labels(
            "n1",
            "amd64",
            &[("node.kubernetes.io/pool".to_owned(), "a".to_owned())].into(),
        ),
        taints: crate::node::taints::parse_taints(&["dedicated=batch:NoExecute"])
            .unwrap_or_default(),
        cpu_millis: 4000,
        memory_bytes: 8 * 1024 * 1024 * 1024,
        allocatable_cpu_millis: 3500,
        allocatable_memory_bytes: 7 * 1024 * 1024 * 1024,
        ephemeral_storage_bytes: Some(100 * 1024 * 1024 * 1024),
        allocatable_ephemeral_storage_bytes: Some(90 * 1024 * 1024 * 1024),
        hugepages_bytes_by_size: [(2 * 1024 * 1024, 0)].into(),
        max_pods: 110,
        kernel_version: "6.12.0".into(),
        os_image: "Debian GNU/Linux 13 (trixie)".into(),
        container_runtime_version: "containerd://2.1.0".into(),
        architecture: "amd64".into(),
        machine_id: "m-1".into(),
        boot_id: "b-1".into(),
    }
}

struct Harness {
    api: FakeApi,
    problem: Arc<Mutex<Option<String>>>,
    uid: watch::Receiver<Option<String>>,
    cancel: CancellationToken,
    nudge: Arc<tokio::sync::Notify>,
    lease_held: watch::Sender<bool>,
}

fn start() -> Harness {
    start_with(ApiServerOptions::new(
        "n1".into(),
        Duration::from_secs(10),
        40,
    ))
}

fn start_with(options: ApiServerOptions) -> Harness {
    let (client, api) = fake_api();
    let problem = Arc::new(Mutex::new(None::<String>));
    let readiness: ReadinessCheck = {
        let problem = problem.clone();
        Arc::new(move || problem.lock().expect("lock").clone())
    };
    let (uid_tx, uid) = watch::channel(None);
    let (lease_held, held) = watch::channel(true);
    let cancel = CancellationToken::new();
    let node_loop = NodeStatusLoop::new(
        client,
        &options,
        description(),
        readiness,
        paused_clock(),
        uid_tx,
    );
    let nudge = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(
        node_loop
            .with_nudge(nudge.clone())
            .with_lease(held)
            .run(cancel.clone()),
    );
    Harness {
        api,
        problem,
        uid,
        cancel,
        nudge,
        lease_held,
    }
}

fn ready(status: &Value) -> &Value {
    let conditions = status["conditions"].as_array().expect("conditions");
    conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .expect("a Ready condition")
}

/// The node's capacity as `start`'s machine gives it.
fn capacity() -> serde_json::Value {
    json!({
        "cpu": "4",
        "memory": "8388608Ki",
        "pods": "110",
        "ephemeral-storage": "104857600Ki",
        "hugepages-2Mi": "0",
    })
}

/// The Node object registration creates: labels and taints, capacity and allocatable, the
/// conditions, the node's info and addresses.
fn assert_registered_node(node: &serde_json::Value) {
    assert_eq!(node["metadata"]["name"], "n1");
    assert_eq!(
        node["metadata"]["labels"],
        json!({
            "kubernetes.io/hostname": "n1",
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            "node.kubernetes.io/pool": "a",
        })
    );
    assert_eq!(
        node["spec"]["taints"],
        json!([{ "key": "dedicated", "value": "batch", "effect": "NoExecute" }])
    );
    assert_eq!(node["status"]["capacity"], capacity());
    assert_eq!(
        node["status"]["allocatable"],
        json!({
            "cpu": "3500m",
            "memory": "7340032Ki",
            "pods": "110",
            "ephemeral-storage": "96636764160",
            "hugepages-2Mi": "0",
        })
    );
    // No pressure: the three conditions are reported False, before Ready, as upstream orders them.
    let kinds: Vec<(&str, &str, &str)> = node["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
    );
    assert_eq!(
        node["status"]["nodeInfo"],
        json!({
            "architecture": "amd64",
            "bootID": "b-1",
            "containerRuntimeVersion": "containerd://2.1.0",
            "kernelVersion": "6.12.0",
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "machineID": "m-1",
            "operatingSystem": "linux",
            "osImage": "Debian GNU/Linux 13 (trixie)",
            "systemUUID": "",
        })
    );
    assert!(KUBELET_VERSION.starts_with("v1.35.0+swiftlet."));
    // Created whole (no merge): both families' InternalIP, in upstream's order.
    assert_eq!(
        node["status"]["addresses"],
        json!([
            { "type": "InternalIP", "address": "10.0.0.5" },
            { "type": "Hostname", "address": "n1" },
            { "type": "InternalIP", "address": "fd00::5" },
        ])
    );
    assert_eq!(
        ready(&node["status"]),
        &json!({
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": t0_plus(Duration::ZERO),
            "lastTransitionTime": t0_plus(Duration::ZERO),
        })
    );
}

#[tokio::test(start_paused = true)]
async fn registers_the_node_then_heartbeats_its_ready_condition() {
    let mut h = start();

    // Registration waits upstream's first 100 ms step, then creates the Node.
    let create = h.api.expect(Method::POST, "/api/v1/nodes").await;
    assert_eq!(create.content_type.as_deref(), Some("application/json"));
    let node = &create.body;
    assert_registered_node(node);
    let mut created = node.clone();
    created["metadata"]["uid"] = json!("uid-1");
    create.reply(201, &created);

    h.uid.changed().await.expect("the UID is published");
    assert_eq!(h.uid.borrow().as_deref(), Some("uid-1"));

    // Every nodeStatusUpdateFrequency: a status patch with a fresh heartbeat.
    let beat = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(beat.content_type.as_deref(), Some(STRATEGIC));
    assert_eq!(
        beat.body.as_object().map(|o| o.len()),
        Some(1),
        "only the status"
    );
    let condition = ready(&beat.body["status"]);
    assert_eq!(condition["status"], "True");
    assert_eq!(
        condition["lastHeartbeatTime"],
        t0_plus(Duration::from_secs(10))
    );
    assert_eq!(condition["lastTransitionTime"], t0_plus(Duration::ZERO));
    assert_eq!(beat.body["status"]["capacity"], capacity());
    // The API merges addresses by type: the list is replaced, or the pair would fold into one.
    assert_eq!(
        beat.body["status"]["addresses"],
        json!([
            { "type": "InternalIP", "address": "10.0.0.5" },
            { "type": "Hostname", "address": "n1" },
            { "type": "InternalIP", "address": "fd00::5" },
            { "$patch": "replace" },
        ])
    );
    beat.reply(200, &created);

    // The PLEG turns unhealthy: NotReady with its message, and a new transition time.
    *h.problem.lock().expect("lock") =
        Some("PLEG is not healthy: pleg was last seen active 4m0s ago".into());
    let down = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(
        ready(&down.body["status"]),
        &json!({
            "type": "Ready",
            "status": "False",
            "reason": "KubeletNotReady",
            "message": "PLEG is not healthy: pleg was last seen active 4m0s ago",
            "lastHeartbeatTime": t0_plus(Duration::from_secs(20)),
            "lastTransitionTime": t0_plus(Duration::from_secs(20)),
        })
    );
    down.reply(200, &created);
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_existing_node_is_read_and_patched() {
    let mut h = start();
    let create = h.api.expect(Method::POST, "/api/v1/nodes").await;
    create.reply(409, &status_error(409, "AlreadyExists"));

    // Upstream tryRegisterWithAPIServer: GET the existing Node, then patch it.
    let get = h.api.expect(Method::GET, "/api/v1/nodes/n1").await;
    get.reply(
        200,
        &json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": "n1", "uid": "uid-old", "labels": { "kubernetes.io/hostname": "old" } },
            "status": { "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": "2023-01-01T00:00:00Z",
                "lastTransitionTime": "2023-01-01T00:00:00Z",
            }]},
        }),
    );
    let patch = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(patch.content_type.as_deref(), Some(STRATEGIC));
    // Upstream `updateDefaultLabels`: only the default labels; `--node-labels` and
    // `--register-with-taints` are set when the Node is created, never on an existing one.
    assert_eq!(
        patch.body["metadata"]["labels"],
        json!({
            "kubernetes.io/hostname": "n1",
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
        })
    );
    assert!(patch.body.get("spec").is_none(), "{}", patch.body);
    let condition = ready(&patch.body["status"]);
    assert_eq!(condition["lastHeartbeatTime"], t0_plus(Duration::ZERO));
    assert_eq!(
        condition["lastTransitionTime"], "2023-01-01T00:00:00Z",
        "still ready: the transition time is kept"
    );
    assert_eq!(
        patch.body["status"]["nodeInfo"]["kubeletVersion"],
        KUBELET_VERSION
    );
    patch.reply(200, &json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1", "uid": "uid-old" } }));

    h.uid.changed().await.expect("the UID is published");
    assert_eq!(h.uid.borrow().as_deref(), Some("uid-old"));
    // Registered: the next request is the periodic status update, not another registration.
    let beat = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(
        ready(&beat.body["status"])["lastTransitionTime"],
        "2023-01-01T00:00:00Z"
    );
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_registration_is_retried() {
    let mut h = start();
    let create = h.api.expect(Method::POST, "/api/v1/nodes").await;
    create.reply(500, &status_error(500, "InternalError"));
    let again = h.api.expect(Method::POST, "/api/v1/nodes").await;
    again.reply(201, &json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1", "uid": "uid-2" } }));
    h.uid.changed().await.expect("the UID is published");
    assert_eq!(h.uid.borrow().as_deref(), Some("uid-2"));
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_nudge_posts_a_change_before_the_next_tick() {
    let mut h = start();
    let create = h.api.expect(Method::POST, "/api/v1/nodes").await;
    let mut created = create.body.clone();
    created["metadata"]["uid"] = json!("uid-1");
    create.reply(201, &created);
    h.uid.changed().await.expect("the UID is published");

    *h.problem.lock().expect("lock") = Some("container runtime is down".into());
    h.nudge.notify_one();
    let down = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    let condition = ready(&down.body["status"]);
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["message"], "container runtime is down");
    // Posted at the nudge, not at the first 10 s tick (paused time: nothing else moved it).
    assert_eq!(condition["lastHeartbeatTime"], t0_plus(Duration::ZERO));
    down.reply(200, &created);
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_register_node_an_existing_node_is_only_updated() {
    let mut h = start_with(ApiServerOptions {
        register_node: false,
        ..ApiServerOptions::new("n1".into(), Duration::from_secs(10), 40)
    });
    // No Node yet: it is read, never created, and read again on the backoff.
    let get = h.api.expect(Method::GET, "/api/v1/nodes/n1").await;
    get.reply(404, &status_error(404, "NotFound"));
    let again = h.api.expect(Method::GET, "/api/v1/nodes/n1").await;
    again.reply(
        200,
        &json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": "n1", "uid": "uid-admin", "labels": { "team": "x" } },
        }),
    );
    let patch = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert!(patch.body.get("metadata").is_none(), "{}", patch.body);
    assert_eq!(ready(&patch.body["status"])["status"], "True");
    patch.reply(200, &json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1", "uid": "uid-admin" } }));
    h.uid.changed().await.expect("the UID is published");
    assert_eq!(h.uid.borrow().as_deref(), Some("uid-admin"));
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_status_waits_for_the_report_frequency_once_the_lease_is_held() {
    let mut h = start_with(ApiServerOptions {
        node_status_report_frequency: Duration::from_secs(300),
        ..ApiServerOptions::new("n1".into(), Duration::from_secs(10), 40)
    });
    h.lease_held.send_replace(false);
    let create = h.api.expect(Method::POST, "/api/v1/nodes").await;
    let mut created = create.body.clone();
    created["metadata"]["uid"] = json!("uid-1");
    create.reply(201, &created);
    // No Lease yet: the status is the heartbeat, sent at every update.
    let beat = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(
        ready(&beat.body["status"])["lastHeartbeatTime"],
        t0_plus(Duration::from_secs(10))
    );
    beat.reply(200, &created);
    // The Lease is held: nothing for the next 290 s of unchanged updates...
    h.lease_held.send_replace(true);
    h.api.assert_no_request(Duration::from_secs(295)).await;
    // ...then the report at 300 s after the last one.
    let report = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(
        ready(&report.body["status"])["lastHeartbeatTime"],
        t0_plus(Duration::from_secs(310))
    );
    report.reply(200, &created);
    // A change is sent at once, report period or not.
    *h.problem.lock().expect("lock") = Some("container runtime is down".into());
    let change = h.api.expect(Method::PATCH, "/api/v1/nodes/n1/status").await;
    assert_eq!(ready(&change.body["status"])["status"], "False");
    assert_eq!(
        ready(&change.body["status"])["lastHeartbeatTime"],
        t0_plus(Duration::from_secs(320))
    );
    change.reply(200, &created);
    h.cancel.cancel();
}
