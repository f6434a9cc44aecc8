//! Runtime handlers: the same pod under runc and under crun, each chosen through its pod's
//! RuntimeClass (`node.k8s.io/v1`, read from the project's API server process over HTTPS) and
//! the private containerd's handlers of those names. Each OCI runtime's own state lists exactly
//! its pod's sandbox and containers, and both pods' containers live, exit and die by a signal
//! with the same statuses, their deaths seen by the kernel-event PLEG.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{collections::BTreeSet, path::Path, process::Command};

use k8s_openapi::api::{core::v1::Pod, node::v1::RuntimeClass};
use kube::{Api, api::PostParams};
use serde_json::json;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::{self, runtime},
    node::{
        BUSYBOX, Node,
        status::{container, phase, running, terminated},
    },
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};

/// The handlers under test: (RuntimeClass, handler, the OCI runtime's binary, its root under
/// the private containerd's state folder).
const HANDLERS: [(&str, &str, &str, &str); 2] = [
    ("swiftlet-runc", "runc", "runc", "runc"),
    ("swiftlet-crun", "crun", "crun", "crun"),
];

/// The ids an OCI runtime's `list` shows in its root for the CRI namespace.
fn listed(binary: &str, state: &Path, root: &str) -> BTreeSet<String> {
    let root = state.join(root).join("k8s.io");
    let out = Command::new(binary)
        .arg("--root")
        .arg(&root)
        .args(["list", "--format", "json"])
        .output()
        .unwrap_or_else(|e| panic!("{binary} list: {e}"));
    assert!(
        out.status.success(),
        "{binary} --root {} list: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // `null` when there are none.
    let list: Option<Vec<serde_json::Value>> =
        serde_json::from_slice(&out.stdout).expect("the runtime's list as JSON");
    list.unwrap_or_default()
        .iter()
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect()
}

/// The pid of container `id`'s first process, as its OCI runtime's `state` tells it.
fn init_pid(binary: &str, state: &Path, root: &str, id: &str) -> i32 {
    let out = Command::new(binary)
        .arg("--root")
        .arg(state.join(root).join("k8s.io"))
        .args(["state", id])
        .output()
        .unwrap_or_else(|e| panic!("{binary} state: {e}"));
    let state: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the runtime's state as JSON");
    let pid = state["pid"].as_i64().expect("a pid in the state");
    i32::try_from(pid).expect("a pid")
}

/// The pod named `name` as the agent's `/pods` shows it, once `want` holds of it.
fn wait_pod(node: &Node, name: &str, what: &str, want: impl Fn(&Pod) -> bool) -> Pod {
    cluster::wait_for(
        &format!("pod {name} never {what}"),
        EVENT_WAIT * 2,
        || {
            node.pods()
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
        },
        |p| p.as_ref().is_some_and(&want),
    )
    .expect("the pod")
}

/// The runtime's id of the pod's container `name`.
fn container_id(pod: &Pod, name: &str) -> String {
    let id = container(pod, name)
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    id.strip_prefix("containerd://")
        .map(str::to_owned)
        .unwrap_or(id)
}

/// A pod bound to the node, run by `class`: `main` sleeps until it is killed, `quits` exits with
/// code 3 by itself.
fn pod(name: &str, node: &str, class: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "runtimeClassName": class,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                },
                {
                    "name": "quits",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 1; exit 3"],
                },
            ],
        },
    }))
    .expect("a pod")
}

/// The same pod under runc and under crun: each handler's OCI runtime holds exactly its pod's
/// sandbox and containers; in both, a container's own exit code and a SIGKILL's 137 reach the
/// status through the kernel's exit events, and the pods end `Failed`.
#[test]
fn the_same_pod_runs_under_runc_and_under_crun() {
    let test = "the_same_pod_runs_under_runc_and_under_crun";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    // Where the OCI runtimes' roots are: only `cargo xtask`'s private containerd is known to
    // have both handlers.
    let Some(state) = std::env::var_os("SWIFTLET_TEST_CONTAINERD_STATE") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: CI runs against the private containerd, which sets SWIFTLET_TEST_CONTAINERD_STATE"
        );
        eprintln!(
            "{test}: SKIPPED: SWIFTLET_TEST_CONTAINERD_STATE is not set (run it through `cargo xtask \
             test`, whose private containerd has the runc and crun handlers)"
        );
        return;
    };
    let state = Path::new(&state);
    let server = TestApiServer::start("handlers");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("handlers", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let client = rt.block_on(server.client());
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let exits = r#"swiftlet_pleg_kernel_triggers_total{kind="exit"}"#;
    let exits_before = node.metric(exits);

    let mut started = Vec::new();
    for (class, handler, binary, root) in HANDLERS {
        let object: RuntimeClass =
            serde_json::from_value(json!({"metadata": {"name": class}, "handler": handler}))
                .expect("a RuntimeClass");
        rt.block_on(classes.create(&PostParams::default(), &object))
            .expect("RuntimeClass created");
        let name = format!("under-{handler}");
        rt.block_on(pods.create(&PostParams::default(), &pod(&name, &node.name, class)))
            .expect("pod created");
        started.push((name, handler, binary, root));
    }

    let mut ids = Vec::new();
    for (name, handler, _, _) in &started {
        let seen = wait_pod(&node, name, "had main running and quits exited 3", |p| {
            running(container(p, "main"))
                && terminated(container(p, "quits")).is_some_and(|(_, code)| code == 3)
        });
        let uid = seen.metadata.uid.clone().expect("a uid");
        let sandboxes = cluster::pod_sandboxes(&uid);
        assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
        assert_eq!(&sandboxes[0].runtime_handler, handler);
        let pod_ids: BTreeSet<String> = [
            sandboxes[0].id.clone(),
            container_id(&seen, "main"),
            container_id(&seen, "quits"),
        ]
        .into();
        ids.push((pod_ids, container_id(&seen, "main")));
    }
    // Each runtime holds its own pod's sandbox and containers (the exited one until it is
    // removed), and none of the other's.
    for (i, (_, _, binary, root)) in started.iter().enumerate() {
        let listed = listed(binary, state, root);
        let (own, _) = &ids[i];
        let (other, _) = &ids[1 - i];
        assert!(own.is_subset(&listed), "{binary}: {listed:?} lacks {own:?}");
        assert!(
            other.is_disjoint(&listed),
            "{binary}: {listed:?} holds the other runtime's {other:?}"
        );
    }

    for (i, (_, _, binary, root)) in started.iter().enumerate() {
        let (_, main) = &ids[i];
        let pid = init_pid(binary, state, root, main);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL main");
    }
    for (name, _, _, _) in &started {
        let ended = wait_pod(&node, name, "ended Failed with main killed", |p| {
            phase(p) == "Failed"
        });
        assert_eq!(
            terminated(container(&ended, "main")),
            Some(("Error".to_owned(), 137)),
            "{name}"
        );
        assert_eq!(
            terminated(container(&ended, "quits")),
            Some(("Error".to_owned(), 3)),
            "{name}"
        );
    }
    // Both runtimes' exits came as kernel events the PLEG mapped to their containers (counted
    // only then): four containers, four exits at least.
    let exits_seen = node.metric(exits) - exits_before;
    assert!(exits_seen >= 4.0, "{exits_seen} exits mapped");
}
