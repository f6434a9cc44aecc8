//! swiftlet as a member of a cluster: `swiftlet run --kubeconfig` against the project's own API
//! server process over HTTPS (`swiftlet-test-apiserver`), with the real containerd. What the
//! control plane sees of the node's pods is asserted on the API server, as `kubectl` would read it.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::json;
use swiftlet_tests::{
    EVENT_WAIT,
    node::{BUSYBOX, Node},
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
    with_cri,
};
use tokio_stream::StreamExt as _;

/// The runtime a synchronous test makes its API calls on: one for the whole test, since the
/// client's connection tasks live on it.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The runtime's running containers of the pod with `uid`.
fn running_containers(uid: &str) -> usize {
    let uid = uid.to_owned();
    with_cri("running_containers", |runtime| async move {
        use swiftlet::cri::RuntimeService as _;
        runtime
            .list_containers(Some(k8s_cri::v1::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_owned(), uid)].into(),
                ..Default::default()
            }))
            .await
            .expect("list containers")
            .into_iter()
            .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
            .count()
    })
}

/// A pod deleted with a grace period stays `Terminating` on the API server while its container
/// stops (SIGTERM, which it takes two seconds to honour), and leaves the API only once the agent
/// has stopped it: the agent's final DELETE (grace 0, the pod's UID as precondition) comes after
/// the terminal status, when no container of the pod runs any more (upstream `canBeDeleted`).
#[test]
fn a_pod_deleted_through_the_api_leaves_it_once_its_containers_are_gone() {
    let test = "a_pod_deleted_through_the_api_leaves_it_once_its_containers_are_gone";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("delete");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("apidelete", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": "slow-stop", "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'sleep 2; exit 0' TERM; while true; do sleep 0.2; done"],
            }],
        },
    }))
    .expect("a pod");
    let created = rt
        .block_on(pods.create(&PostParams::default(), &manifest))
        .expect("the pod is created");
    let uid = created.metadata.uid.clone().expect("a uid");

    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let pod = rt.block_on(pods.get("slow-stop")).expect("the pod");
        if phase(&pod) == "Running" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod never ran: {:?}",
            pod.status
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(running_containers(&uid), 1);

    let deleting = rt
        .block_on(pods.delete("slow-stop", &DeleteParams::default().grace_period(20)))
        .expect("the delete is accepted");
    let deleting = deleting.left().expect("a graceful delete keeps the pod");
    assert!(deleting.metadata.deletion_timestamp.is_some());

    // Every version of the pod from the delete on, through a watch, until it is deleted: the
    // last one is what the agent left on the API server.
    let from = deleting
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");
    let versions: Vec<Pod> = rt.block_on(async {
        let params = WatchParams::default().fields("metadata.name=slow-stop");
        let mut stream = Box::pin(pods.watch(&params, &from).await.expect("a watch"));
        let mut versions = Vec::new();
        let collect = async {
            while let Some(event) = stream.next().await {
                match event.expect("a watch event") {
                    WatchEvent::Modified(pod) => versions.push(pod),
                    WatchEvent::Deleted(_) => return true,
                    _ => {}
                }
            }
            false
        };
        let deleted = tokio::time::timeout(EVENT_WAIT * 2, collect).await;
        assert_eq!(deleted, Ok(true), "the pod never left the API server");
        versions
    });
    let terminating_reads = versions.len();
    let last_seen = versions
        .last()
        .cloned()
        .expect("a version before the deletion");
    assert!(
        terminating_reads > 0,
        "the pod stayed Terminating while it stopped"
    );
    assert_eq!(
        running_containers(&uid),
        0,
        "no container of the pod runs once it left the API"
    );
    // The status the API server held last is the terminal one the agent sent before its DELETE:
    // the container honoured SIGTERM and exited 0.
    assert_eq!(phase(&last_seen), "Succeeded", "{:?}", last_seen.status);
    let terminated = last_seen
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(terminated, Some(0), "{:?}", last_seen.status);
    // One state at a time, as the kubelet reported it: nothing of the running state is left
    // beside the terminated one on the API server.
    let state = last_seen
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.clone())
        .unwrap_or_default();
    assert!(
        state.running.is_none() && state.waiting.is_none(),
        "{state:?}"
    );
    // The agent's DELETE: grace 0, after the status.
    let (_, log) = server.requests();
    let deletes: Vec<_> = log
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.ends_with("/pods/slow-stop"))
        .collect();
    assert_eq!(deletes.len(), 2, "the test's and the agent's: {deletes:?}");
}
