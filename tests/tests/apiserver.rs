//! The project's API server process driven over HTTPS by kube-rs, the client swiftlet uses:
//! what the agent does against the API (create, get, list, watch with a field selector,
//! strategic-merge `patch_status`, the uid precondition, graceful deletion, leases, tokens)
//! answered as the Kubernetes API documents it; and the kubelet TLS bootstrap's server side
//! (bootstrap tokens, CSRs approved and signed, client certificates). No root, no containerd.
#![expect(clippy::expect_used, reason = "tests")]

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    certificates::v1::CertificateSigningRequest,
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod, ServiceAccount},
};
use kube::{
    Api,
    api::{
        DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
        WatchParams,
    },
    runtime::watcher,
};
use serde_json::json;
use swiftlet_tests::test_apiserver::{
    ApiServerOptions, Credentials, TestApiServer, client_identity, new_bootstrap_token,
};
use tokio_stream::StreamExt as _;
use watching::next_event;

/// A pod bound to `node` in `default`.
fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .expect("a pod")
}

fn api_code(error: &kube::Error) -> Option<(u16, String)> {
    match error {
        kube::Error::Api(status) => Some((status.code, status.reason.clone())),
        _ => None,
    }
}

/// Reads watcher events until `want` matches one (bounded by `EVENT_WAIT`), skipping errors
/// (a watcher reports a 410 as an error item, then relists).
mod watching {
    use std::pin::Pin;

    use kube::runtime::watcher;
    use tokio_stream::{Stream, StreamExt as _};

    pub type Events<K> =
        Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>;

    pub async fn next_event<K>(
        events: &mut Events<K>,
        mut want: impl FnMut(&watcher::Event<K>) -> bool,
        errors: &mut Vec<String>,
    ) -> watcher::Event<K> {
        let found = tokio::time::timeout(swiftlet_tests::EVENT_WAIT, async {
            loop {
                match events.next().await {
                    Some(Ok(event)) if want(&event) => return event,
                    Some(Ok(_)) => {}
                    Some(Err(error)) => errors.push(error.to_string()),
                    None => panic!("the watcher stream ended"),
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no matching watcher event; errors: {errors:?}"))
    }
}

fn name_of<K: kube::Resource>(object: &K) -> &str {
    object.meta().name.as_deref().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_create_get_list_and_patch_status_with_a_strategic_merge() {
    let server = TestApiServer::start("crud");
    let client = server.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("a", "n1"))
        .await
        .expect("created");
    pods.create(&PostParams::default(), &pod("b", "n2"))
        .await
        .expect("created");
    let uid = created.metadata.uid.clone().expect("a uid");
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );

    let duplicate = pods
        .create(&PostParams::default(), &pod("a", "n1"))
        .await
        .expect_err("exists");
    assert_eq!(
        api_code(&duplicate),
        Some((409, "AlreadyExists".to_owned()))
    );
    let missing = pods.get("zz").await.expect_err("missing");
    assert_eq!(api_code(&missing), Some((404, "NotFound".to_owned())));
    assert!(pods.get_opt("zz").await.expect("a 404 is None").is_none());

    let all: Api<Pod> = Api::all(client.clone());
    let on_n1 = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .expect("listed");
    assert_eq!(on_n1.items.iter().map(name_of).collect::<Vec<_>>(), ["a"]);
    assert!(
        on_n1
            .metadata
            .resource_version
            .is_some_and(|v| !v.is_empty())
    );

    // What swiftlet's status manager sends: the uid as a precondition, conditions by type.
    let patch = json!({
        "metadata": {"uid": uid},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"running": {}}}]},
    });
    pods.patch_status("a", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patched");
    let second = json!({"metadata": {"uid": uid}, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}});
    let patched = pods
        .patch_status("a", &PatchParams::default(), &Patch::Strategic(&second))
        .await
        .expect("patched");
    let status = patched.status.expect("a status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let conditions: Vec<&str> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(conditions, ["Ready", "PodScheduled"]);
    assert_eq!(status.container_statuses.map(|c| c.len()), Some(1));

    // A status patch for another incarnation of the pod fails (the uid is immutable).
    let stale = json!({"metadata": {"uid": "00000000-0000-4000-8000-000000000000"}, "status": {"phase": "Failed"}});
    let error = pods
        .patch_status("a", &PatchParams::default(), &Patch::Strategic(&stale))
        .await
        .expect_err("refused");
    assert_eq!(api_code(&error).map(|(code, _)| code), Some(422));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_selector_watcher_sees_changes_and_relists_after_410() {
    let server = TestApiServer::start_with("watch", &["--bookmark-interval-ms", "60000"]);
    let client = server.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("before", "n1"))
        .await
        .expect("created");
    pods.create(&PostParams::default(), &pod("elsewhere", "n2"))
        .await
        .expect("created");
    let all: Api<Pod> = Api::all(client.clone());
    let mut events: watching::Events<Pod> = Box::pin(watcher(
        all,
        watcher::Config::default().fields("spec.nodeName=n1"),
    ));
    let mut errors = Vec::new();
    let mut listed = Vec::new();
    next_event(
        &mut events,
        |e| {
            if let watcher::Event::InitApply(p) = e {
                listed.push(name_of(p).to_owned());
            }
            matches!(e, watcher::Event::InitDone)
        },
        &mut errors,
    )
    .await;
    assert_eq!(listed, ["before"]);

    pods.create(&PostParams::default(), &pod("after", "n1"))
        .await
        .expect("created");
    next_event(
        &mut events,
        |e| matches!(e, watcher::Event::Apply(p) if name_of(p) == "after"),
        &mut errors,
    )
    .await;
    let labels = json!({"metadata": {"labels": {"x": "1"}}});
    pods.patch("after", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("patched");
    let modified = next_event(
        &mut events,
        |e| matches!(e, watcher::Event::Apply(p) if name_of(p) == "after"),
        &mut errors,
    )
    .await;
    let watcher::Event::Apply(modified) = modified else {
        unreachable!("matched above")
    };
    assert_eq!(
        modified
            .metadata
            .labels
            .and_then(|l| l.get("x").cloned())
            .as_deref(),
        Some("1")
    );
    pods.delete(
        "after",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("deleted");
    next_event(
        &mut events,
        |e| matches!(e, watcher::Event::Delete(p) if name_of(p) == "after"),
        &mut errors,
    )
    .await;
    assert!(errors.is_empty(), "no errors so far: {errors:?}");

    // A pod watcher's version trails the global revision while other resources change (no
    // bookmark here: their interval is a minute). Compacting past it and dropping the watch
    // makes the resumed watch 410 Gone, and the watcher relists.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "other"}})).expect("a configmap");
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    server.compact();
    server.drop_watches();
    let relisted = relist(&mut events, &mut errors).await;
    assert_eq!(relisted, ["before"]);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("410") || e.contains("Expired")),
        "the watcher saw the 410: {errors:?}"
    );

    // The same after a restart with fresh resourceVersions: every version the watcher holds
    // is expired; what changed meanwhile is in the new list.
    errors.clear();
    server.restart_fresh();
    pods.create(&PostParams::default(), &pod("after-restart", "n1"))
        .await
        .expect("created");
    let mut relisted = relist(&mut events, &mut errors).await;
    relisted.sort();
    assert!(
        relisted == ["after-restart", "before"] || relisted == ["before"],
        "a relist of the current pods: {relisted:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("410") || e.contains("Expired")),
        "{errors:?}"
    );
    if relisted == ["before"] {
        // Created after the relist: it comes as a change.
        next_event(
            &mut events,
            |e| matches!(e, watcher::Event::Apply(p) if name_of(p) == "after-restart"),
            &mut errors,
        )
        .await;
    }
}

/// The names of a relist (the watcher's `Init` … `InitDone`).
async fn relist(events: &mut watching::Events<Pod>, errors: &mut Vec<String>) -> Vec<String> {
    let mut listed = Vec::new();
    next_event(events, |e| matches!(e, watcher::Event::Init), errors).await;
    next_event(
        events,
        |e| {
            if let watcher::Event::InitApply(p) = e {
                listed.push(name_of(p).to_owned());
            }
            matches!(e, watcher::Event::InitDone)
        },
        errors,
    )
    .await;
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_and_the_uid_precondition() {
    let server = TestApiServer::start("delete");
    let client = server.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut spec = pod("graceful", "n1");
    if let Some(s) = spec.spec.as_mut() {
        s.termination_grace_period_seconds = Some(20);
    }
    let created = pods
        .create(&PostParams::default(), &spec)
        .await
        .expect("created");
    let uid = created.metadata.uid.clone().expect("a uid");

    let first = pods
        .delete("graceful", &DeleteParams::default())
        .await
        .expect("deleting");
    let deleting = first.left().expect("a bound pod stays while it terminates");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(20));
    let longer = pods
        .delete(
            "graceful",
            &DeleteParams {
                grace_period_seconds: Some(60),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("no-op");
    assert_eq!(
        longer
            .left()
            .and_then(|p| p.metadata.deletion_grace_period_seconds),
        Some(20)
    );
    let shorter = pods
        .delete(
            "graceful",
            &DeleteParams {
                grace_period_seconds: Some(5),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("shortened");
    assert_eq!(
        shorter
            .left()
            .and_then(|p| p.metadata.deletion_grace_period_seconds),
        Some(5)
    );
    assert!(pods.get_opt("graceful").await.expect("read").is_some());

    // The kubelet's final DELETE: grace 0 with the uid precondition.
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-4000-8000-000000000000".to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let conflict = pods.delete("graceful", &wrong).await.expect_err("conflict");
    assert_eq!(api_code(&conflict), Some((409, "Conflict".to_owned())));
    let right = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("graceful", &right).await.expect("deleted");
    assert!(pods.get_opt("graceful").await.expect("read").is_none());

    // An unbound pod goes at once.
    let mut unbound = pod("unbound", "");
    if let Some(s) = unbound.spec.as_mut() {
        s.node_name = None;
    }
    pods.create(&PostParams::default(), &unbound)
        .await
        .expect("created");
    pods.delete("unbound", &DeleteParams::default())
        .await
        .expect("deleted");
    assert!(pods.get_opt("unbound").await.expect("read").is_none());

    // A stale resourceVersion in a replace conflicts.
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}}))
            .expect("a configmap");
    let stored = configmaps
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    let mut changed = stored.clone();
    changed
        .data
        .get_or_insert_default()
        .insert("k".to_owned(), "w".to_owned());
    configmaps
        .replace("c", &PostParams::default(), &changed)
        .await
        .expect("replaced");
    // A replace that changes nothing writes nothing: the version stays (etcd3's store).
    let same = configmaps.get("c").await.expect("read");
    let unchanged = configmaps
        .replace("c", &PostParams::default(), &same)
        .await
        .expect("no-op");
    assert_eq!(
        unchanged.metadata.resource_version,
        same.metadata.resource_version
    );
    let stale = configmaps
        .replace("c", &PostParams::default(), &stored)
        .await
        .expect_err("stale");
    assert_eq!(api_code(&stale), Some((409, "Conflict".to_owned())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_leases_tokens_and_faults() {
    let server = TestApiServer::start("node");
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
        "status": {"conditions": [{"type": "Ready", "status": "False"}], "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }))
    .expect("a node");
    let created = nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("created");
    assert_eq!(
        created
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(Vec::len),
        Some(1)
    );
    let patch = json!({"metadata": {"labels": {"extra": "x"}}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]}});
    let patched = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patched");
    let conditions: Vec<(String, String)> = patched
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            ("Ready".into(), "True".into()),
            ("MemoryPressure".into(), "False".into())
        ]
    );
    assert_eq!(
        patched
            .metadata
            .labels
            .and_then(|l| l.get("extra").cloned())
            .as_deref(),
        Some("x")
    );

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}})).expect("a lease");
    let mut stored = leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("created");
    stored.spec.get_or_insert_default().lease_duration_seconds = Some(41);
    let renewed = leases
        .replace("n1", &PostParams::default(), &stored)
        .await
        .expect("renewed");
    assert_ne!(
        renewed.metadata.resource_version,
        stored.metadata.resource_version
    );

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "sa"}})).expect("an account");
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("created");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["api".to_owned()],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request("sa", &PostParams::default(), &request)
        .await
        .expect("issued");
    assert!(issued.status.is_some_and(|s| !s.token.is_empty()));
    assert!(
        client
            .apiserver_version()
            .await
            .is_ok_and(|v| v.major == "1")
    );

    server.set_unavailable(true);
    let (status, down) = server.request("GET", "/api/v1/nodes/n1", None);
    assert_eq!(
        (status, down["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    server.set_unavailable(false);
    server.clear_requests();
    server.set_delay(Duration::from_millis(50));
    nodes.get("n1").await.expect("slow but served");
    server.set_delay(Duration::ZERO);
    let (total, requests) = server.requests();
    assert_eq!(total, 1);
    assert_eq!(
        requests.first().map(|r| r.path.as_str()),
        Some("/api/v1/nodes/n1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_events_are_created_then_patched_into_a_series() {
    use k8s_openapi::api::{core::v1::Service, events::v1::Event as ApiEvent};
    use kube::{
        Resource as _,
        runtime::events::{Event, EventType, Recorder, Reporter},
    };

    let server = TestApiServer::start("events");
    let client = server.client().await;
    // The Service the API server keeps for itself, as upstream's recorder test uses.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let kubernetes = services
        .get("kubernetes")
        .await
        .expect("the kubernetes service");
    let port = kubernetes
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port);
    assert_eq!(port, Some(443));
    let reporter = Reporter {
        controller: "swiftlet".to_owned(),
        instance: Some("n1".to_owned()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let event = Event {
        type_: EventType::Normal,
        reason: "Pulled".to_owned(),
        note: Some("Container image \"busybox\" already present on machine".to_owned()),
        action: "Pull".to_owned(),
        secondary: None,
    };
    let reference = kubernetes.object_ref(&());
    recorder.publish(&event, &reference).await.expect("created");
    recorder
        .publish(&event, &reference)
        .await
        .expect("patched into a series");
    let events: Api<ApiEvent> = Api::namespaced(client, "default");
    let stored = events.list(&ListParams::default()).await.expect("listed");
    assert_eq!(stored.items.len(), 1);
    let stored = &stored.items[0];
    assert_eq!(stored.reason.as_deref(), Some("Pulled"));
    assert_eq!(stored.series.as_ref().map(|s| s.count), Some(2));
    let (_, requests) = server.requests();
    let writes: Vec<(&str, &str)> = requests
        .iter()
        .filter(|r| r.path.starts_with("/apis/events.k8s.io/v1/"))
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .filter(|(m, _)| *m != "GET")
        .collect();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!((writes[0].0, writes[1].0), ("POST", "PATCH"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_watcher_gets_the_initial_events_and_their_end_bookmark() {
    let server = TestApiServer::start("streaming");
    let client = server.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("before", "n1"))
        .await
        .expect("created");
    let all: Api<Pod> = Api::all(client);
    // `sendInitialEvents=true`: the current objects as ADDED, then the bookmark annotated
    // `k8s.io/initial-events-end` that the watcher takes as the end of its initial list.
    let config = watcher::Config::default()
        .fields("spec.nodeName=n1")
        .streaming_lists();
    let mut events: watching::Events<Pod> = Box::pin(watcher(all, config));
    let mut errors = Vec::new();
    let mut listed = Vec::new();
    next_event(
        &mut events,
        |e| {
            if let watcher::Event::InitApply(p) = e {
                listed.push(name_of(p).to_owned());
            }
            matches!(e, watcher::Event::InitDone)
        },
        &mut errors,
    )
    .await;
    assert_eq!(listed, ["before"]);
    pods.create(&PostParams::default(), &pod("after", "n1"))
        .await
        .expect("created");
    next_event(
        &mut events,
        |e| matches!(e, watcher::Event::Apply(p) if name_of(p) == "after"),
        &mut errors,
    )
    .await;
    assert!(errors.is_empty(), "{errors:?}");
    let (_, requests) = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.query.contains("sendInitialEvents=true") && r.query.contains("watch=true")),
        "the watcher asked for a streaming list: {requests:?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true")),
        "and listed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_refuses_connections_then_the_same_state_is_served_again() {
    let server = TestApiServer::start("outage");
    let client = server.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("kept", "n1"))
        .await
        .expect("created");
    let all: Api<Pod> = Api::all(client.clone());
    let mut events: watching::Events<Pod> = Box::pin(watcher(
        all,
        watcher::Config::default().fields("spec.nodeName=n1"),
    ));
    let mut errors = Vec::new();
    next_event(
        &mut events,
        |e| matches!(e, watcher::Event::InitDone),
        &mut errors,
    )
    .await;

    // Blocking calls: the helper waits until the port refuses connections.
    let outage = Duration::from_secs(2);
    tokio::task::block_in_place(|| server.go_down(outage));
    let refused = pods.get("kept").await.expect_err("down");
    assert!(
        api_code(&refused).is_none(),
        "a refused connection, not an API answer: {refused}"
    );

    // Back with the same objects and versions: the watcher resumes (its stream was cut) and
    // sees what changes next, without a relist.
    let deadline = std::time::Instant::now() + swiftlet_tests::EVENT_WAIT;
    let kept = loop {
        match pods.get("kept").await {
            Ok(pod) => break pod,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(error) => panic!("the server never came back: {error}"),
        }
    };
    assert!(kept.metadata.uid.is_some());
    pods.create(&PostParams::default(), &pod("after-outage", "n1"))
        .await
        .expect("created");
    let mut relisted = false;
    next_event(
        &mut events,
        |e| {
            relisted |= matches!(e, watcher::Event::Init);
            matches!(e, watcher::Event::Apply(p) | watcher::Event::InitApply(p) if name_of(p) == "after-outage")
        },
        &mut errors,
    )
    .await;
    assert!(
        !relisted,
        "the history was kept: no relist needed ({errors:?})"
    );
}

/// A node's CSR as the kubelet makes one: a fresh key, CN `system:node:<name>`, O
/// `system:nodes`, the given SANs; (PEM request, PKCS#8 key DER).
fn node_csr(node: &str, sans: &[&str]) -> (String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let pem = params
        .serialize_request(&key)
        .expect("a CSR")
        .pem()
        .expect("PEM");
    (pem, key.serialize_der())
}

fn csr_body(name: &str, pem: &str, signer: &str, usages: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": k8s_openapi::ByteString(pem.as_bytes().to_vec()),
            "signerName": signer,
            "usages": usages,
        },
    })
}

fn certificate_of(csr: &CertificateSigningRequest) -> Option<Vec<u8>> {
    csr.status
        .as_ref()?
        .certificate
        .as_ref()
        .map(|c| c.0.clone())
}

/// The kubelet TLS bootstrap against the server as CA: a bootstrap token may only request
/// certificates; its node client CSR is auto-approved and signed (seen by its own watch);
/// the certificate authenticates as the node; a serving CSR waits for an approval through
/// the API; the short-lived client certificate stops authenticating once expired, on the
/// connection that used it and on a new one; another CA's certificate never authenticates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_gets_a_node_certificate_that_authenticates_until_it_expires() {
    const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    let token = new_bootstrap_token();
    let id = token.split('.').next().expect("an id").to_owned();
    let server = TestApiServer::start_with_options(
        "csr",
        &ApiServerOptions {
            bootstrap_tokens: vec![token.clone()],
            cluster_signing_duration: Some(Duration::from_secs(8)),
            ..ApiServerOptions::default()
        },
    );
    let boot = Credentials::Token(&token);
    let (code, review) = server.request_as(
        boot,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
    );
    assert_eq!(code, 201, "{review}");
    assert_eq!(
        review["status"]["userInfo"]["username"],
        format!("system:bootstrap:{id}")
    );
    let (code, forbidden) = server.request_as(boot, "GET", "/api/v1/pods", None);
    assert_eq!(code, 403, "{forbidden}");
    assert_eq!(
        forbidden["message"],
        format!(
            "pods is forbidden: User \"system:bootstrap:{id}\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        )
    );
    let (code, _) = server.request_as(
        Credentials::Token("abcdef.0000000000000000"),
        "GET",
        CSRS,
        None,
    );
    assert_eq!(code, 401, "an unknown token");
    // A certificate of another CA gets through the handshake and names no one, as with
    // kube-apiserver's `RequestClientCert` and x509 authenticator.
    let stranger =
        swiftlet_tests::tls::TestCa::new("another-ca").client("system:node:x", &["system:nodes"]);
    let (code, _) = server.request_as(
        Credentials::Certificate(&stranger),
        "GET",
        "/api/v1/nodes",
        None,
    );
    assert_eq!(code, 401, "another CA's certificate");

    // The agent's side: kube-rs from the bootstrap kubeconfig, a create and a watch.
    let client = swiftlet::sources::client_from_kubeconfig(
        &server.bootstrap_kubeconfig(&token),
        "swiftlet-tests",
    )
    .await
    .expect("a client from the bootstrap kubeconfig");
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let node = "csr-node-1";
    let (pem, key) = node_csr(node, &[]);
    let body = csr_body(
        "node-csr-1",
        &pem,
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "key encipherment", "client auth"],
    );
    let created = csrs
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).expect("a CSR"),
        )
        .await
        .expect("a bootstrapper creates a CSR");
    assert_eq!(
        created.spec.username.as_deref(),
        Some(format!("system:bootstrap:{id}").as_str())
    );
    let version = created
        .metadata
        .resource_version
        .clone()
        .expect("a version");
    let mut events = Box::pin(
        csrs.watch(
            &WatchParams::default().fields("metadata.name=node-csr-1"),
            &version,
        )
        .await
        .expect("a bootstrapper watches CSRs"),
    );
    let mut approved_first = false;
    let signed = tokio::time::timeout(swiftlet_tests::EVENT_WAIT, async {
        while let Some(event) = events.next().await {
            if let WatchEvent::Modified(csr) = event.expect("a watch event") {
                let conditions = csr
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default();
                let approved = conditions
                    .iter()
                    .any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some("AutoApproved"));
                match certificate_of(&csr) {
                    Some(certificate) => return (approved, certificate),
                    None => approved_first |= approved,
                }
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the CSR is signed");
    assert!(signed.0, "the signed CSR is approved");
    assert!(approved_first, "approved before signed, in two changes");

    // The node's identity from the issued certificate, on a connection it keeps.
    let identity = client_identity(&signed.1, key);
    let mut kept = server.connect_as(Credentials::Certificate(&identity));
    let (code, nodes) = kept.request("GET", "/api/v1/nodes");
    assert_eq!(code, 200, "{nodes}");
    let (code, review) = server.request_as(
        Credentials::Certificate(&identity),
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(&json!({})),
    );
    assert_eq!(code, 201, "{review}");
    assert_eq!(
        review["status"]["userInfo"]["username"],
        format!("system:node:{node}")
    );
    assert_eq!(
        review["status"]["userInfo"]["groups"],
        json!(["system:nodes", "system:authenticated"])
    );

    // A serving CSR from the node waits for an operator's approval.
    let (serving_pem, _) = node_csr(node, &[node, "127.0.0.1"]);
    let serving = csr_body(
        "node-serving-1",
        &serving_pem,
        "kubernetes.io/kubelet-serving",
        &["digital signature", "key encipherment", "server auth"],
    );
    let (code, created) = server.request_as(
        Credentials::Certificate(&identity),
        "POST",
        CSRS,
        Some(&serving),
    );
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["username"], format!("system:node:{node}"));
    let (code, denied) = server.request_as(
        boot,
        "PUT",
        &format!("{CSRS}/node-serving-1/approval"),
        Some(&created),
    );
    assert_eq!(code, 403, "a bootstrapper cannot approve: {denied}");
    server.approve_csr("node-serving-1");
    swiftlet_tests::eventually("the serving CSR is signed", || {
        server
            .get_csr("node-serving-1")
            .is_some_and(|c| c["status"]["certificate"].is_string())
    });
    let serving = server.get_csr("node-serving-1").expect("the serving CSR");
    let conditions = serving["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        conditions.len(),
        1,
        "approved once, by the operator: {conditions:?}"
    );
    assert_eq!(conditions[0]["reason"], "KubectlApprove");
    assert_eq!(server.list_csrs().len(), 2);

    // The client certificate expires: the kept connection's next request is refused, and so
    // is a new connection's.
    let kept = std::cell::RefCell::new(kept);
    swiftlet_tests::eventually("the expired certificate gets 401", || {
        kept.borrow_mut().request("GET", "/api/v1/nodes").0 == 401
    });
    let (code, _) = server.request_as(
        Credentials::Certificate(&identity),
        "GET",
        "/api/v1/nodes",
        None,
    );
    assert_eq!(code, 401);
}
