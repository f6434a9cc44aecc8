//! Mirror pods, end to end: `swiftlet run --manifests DIR --kubeconfig` against the project's own
//! API server process and the real containerd. A static pod gets its mirror pod on the API
//! server (`kubernetes.io/config.mirror` = its hash, the Node as controlling owner) carrying its
//! status; a mirror pod deleted through the API comes back without the static pod's container
//! restarting; a changed manifest replaces it; a removed manifest deletes it; a mirror pod no
//! static pod has (made by the test before the agent starts) is deleted and never run.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as ApiNode, Pod};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::runtime,
    manifest::PodManifest,
    node::{BUSYBOX, Node, status::phase},
    test_apiserver::TestApiServer,
    with_cri,
};

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The container ID of the pod's one container, from its status.
fn container_id(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()
}

/// Polls `name` on the API server until `want` holds for it (`None`: it does not exist).
fn wait_api(
    rt: &tokio::runtime::Runtime,
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    want: impl Fn(Option<&Pod>) -> bool,
) -> Option<Pod> {
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let pod = rt.block_on(pods.get_opt(name)).expect("a read of the pod");
        if want(pod.as_ref()) {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never got {what}; last seen: {pod:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The runtime's containers of pods named `name` (any state).
fn containers_of_pod_named(test: &str, name: &str) -> usize {
    let name = name.to_owned();
    with_cri(test, |runtime| async move {
        use swiftlet::cri::RuntimeService as _;
        runtime
            .list_containers(Some(k8s_cri::v1::ContainerFilter {
                label_selector: [("io.kubernetes.pod.name".to_owned(), name)].into(),
                ..Default::default()
            }))
            .await
            .expect("list containers")
            .len()
    })
}

#[test]
fn a_static_pod_has_a_mirror_pod_that_follows_it() {
    let test = "a_static_pod_has_a_mirror_pod_that_follows_it";
    let server = TestApiServer::start("mirror");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let nodes: Api<ApiNode> = Api::all(rt.block_on(server.client()));

    // An orphan, there before the agent: a mirror pod for this node no static pod has. (The
    // node's name is what `Node` makes of the one given: the test process's id appended.)
    let node_name = format!("apimirror{}", std::process::id());
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("orphan-{node_name}"),
            "namespace": "default",
            "annotations": {"kubernetes.io/config.mirror": "0123", "kubernetes.io/config.source": "file"},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
        },
    }))
    .expect("a pod");
    rt.block_on(pods.create(&PostParams::default(), &orphan))
        .expect("the orphan is created");

    let Some(node) = Node::for_test(test, "apimirror", &["--kubeconfig", &kubeconfig]) else {
        return;
    };
    assert_eq!(node.name, node_name);
    let orphan_name = format!("orphan-{}", node.name);
    wait_api(&rt, &pods, &orphan_name, "deleted as an orphan", |p| {
        p.is_none()
    });
    assert_eq!(
        containers_of_pod_named(test, &orphan_name),
        0,
        "a mirror pod is never run"
    );

    let manifest = |label: &str| {
        PodManifest::new("web")
            .metadata(&format!("  labels:\n    round: \"{label}\"\n"))
            .grace(1)
            .shell("main", "sleep 3600", "")
            .yaml()
    };
    node.write_manifest("web.yaml", &manifest("1"));
    let name = format!("web-{}", node.name);
    let running = |p: Option<&Pod>| {
        p.is_some_and(|p| {
            phase(p) == "Running"
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .is_some_and(|c| {
                        c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some())
                    })
        })
    };
    let mirror = wait_api(
        &rt,
        &pods,
        &name,
        "the static pod's running status",
        running,
    )
    .expect("the mirror pod");

    // The mirror pod: the static pod's hash, its labels, this node as owner and as nodeName.
    let static_pod = node.pod("web").expect("the static pod");
    let hash = annotation(&static_pod, "kubernetes.io/config.hash")
        .expect("a config hash")
        .to_owned();
    assert_eq!(
        annotation(&mirror, "kubernetes.io/config.mirror"),
        Some(hash.as_str())
    );
    assert_eq!(
        annotation(&mirror, "kubernetes.io/config.source"),
        Some("file")
    );
    assert_ne!(
        mirror.metadata.uid, static_pod.metadata.uid,
        "the API server's own UID"
    );
    let node_object = rt.block_on(nodes.get(&node.name)).expect("the Node");
    let owners = mirror.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].controller
        ),
        ("Node", node.name.as_str(), Some(true))
    );
    assert_eq!(Some(&owners[0].uid), node_object.metadata.uid.as_ref());
    assert_eq!(
        mirror.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name.as_str())
    );
    assert_eq!(
        mirror
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("round"))
            .map(String::as_str),
        Some("1")
    );
    let container = container_id(&mirror).expect("a container id");
    assert_eq!(container_id(&static_pod).as_ref(), Some(&container));

    // Deleted through the API (gracefully, as kubectl does): it comes back, with the status,
    // and the static pod's container runs on.
    let first_uid = mirror.metadata.uid.clone();
    rt.block_on(pods.delete(&name, &DeleteParams::default()))
        .expect("the delete is accepted");
    let again = wait_api(&rt, &pods, &name, "a new mirror pod", |p| {
        p.is_some_and(|p| p.metadata.uid != first_uid && p.metadata.deletion_timestamp.is_none())
            && running(p)
    })
    .expect("the new mirror pod");
    assert_eq!(
        container_id(&again).as_ref(),
        Some(&container),
        "not restarted"
    );
    let static_pod = node.pod("web").expect("the static pod");
    assert_eq!(container_id(&static_pod).as_ref(), Some(&container));
    let restarts = static_pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count);
    assert_eq!(restarts, Some(0));

    // A changed manifest is a new static pod: its mirror pod replaces the old one.
    node.write_manifest("web.yaml", &manifest("2"));
    let replaced = wait_api(&rt, &pods, &name, "the new manifest's mirror pod", |p| {
        p.is_some_and(|p| {
            annotation(p, "kubernetes.io/config.mirror").is_some_and(|h| h != hash)
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("round"))
                    .map(String::as_str)
                    == Some("2")
        }) && running(p)
    })
    .expect("the replaced mirror pod");
    let new_static = node.pod("web").expect("the new static pod");
    assert_eq!(
        annotation(&replaced, "kubernetes.io/config.mirror"),
        annotation(&new_static, "kubernetes.io/config.hash")
    );

    // A removed manifest: the mirror pod goes with the static pod.
    node.remove_manifest("web.yaml");
    wait_api(&rt, &pods, &name, "deleted with its manifest", |p| {
        p.is_none()
    });
    node.wait_gone("web");
}
