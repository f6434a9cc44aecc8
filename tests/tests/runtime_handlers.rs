//! Runtime handlers: the same pod under runc and under crun, each chosen through its pod's
//! RuntimeClass (`node.k8s.io/v1`, read from the project's API server process over HTTPS) and
//! the private containerd's handlers of those names. Each OCI runtime's own state folder holds
//! exactly its pod's sandbox and container, and both pods' containers live, exit and die by a signal
//! with the same statuses, their deaths seen by the kernel-event PLEG.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{collections::BTreeSet, path::Path};

use k8s_openapi::api::{core::v1::Pod, node::v1::RuntimeClass};
use kube::{Api, api::PostParams};
use serde_json::json;
use swiftlet_tests::{
    cluster::{self, runtime},
    event_wait,
    node::{
        BUSYBOX, Node,
        status::{container, phase, running, terminated},
    },
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};

/// The handlers under test: (RuntimeClass, handler), each handler's OCI runtime keeping its
/// containers' state in the folder of its name under the private containerd's state folder.
const HANDLERS: [(&str, &str); 2] = [("swiftlet-runc", "runc"), ("swiftlet-crun", "crun")];

/// The containers whose state an OCI runtime keeps (one folder each) for the CRI namespace.
fn held_by(state: &Path, runtime: &str) -> BTreeSet<String> {
    let root = state.join(runtime).join("k8s.io");
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        // Made by the runtime's first container.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeSet::new(),
        Err(e) => panic!("{}: {e}", root.display()),
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The host pid of container `id`'s first process (pid 1 of its namespace).
fn init_pid(id: &str) -> i32 {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .find(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id))
                && swiftlet::pleg::index::is_namespace_init(pid)
        })
        .and_then(|pid| i32::try_from(pid).ok())
        .unwrap_or_else(|| panic!("no init process for container {id}"))
}

/// The pod named `name` as the agent's `/pods` shows it, once `want` holds of it.
fn wait_pod(node: &Node, name: &str, what: &str, want: impl Fn(&Pod) -> bool) -> Pod {
    cluster::wait_for(
        &format!("pod {name} never {what}"),
        event_wait() * 2,
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

/// Why crun cannot make containers' cgroups on this host, if it cannot: on a hybrid layout
/// (cgroup v1 controllers, cgroup2 at `/sys/fs/cgroup/unified`) crun refuses to run unless the
/// cgroup2 hierarchy holds no controller ("cgroups in hybrid mode not supported, drop all
/// controllers from cgroupv2"); runc puts such controllers' cgroups nowhere and runs.
fn crun_refuses_this_layout() -> Option<String> {
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").ok()?;
    let controllers = controllers.trim();
    (!controllers.is_empty()).then(|| {
        format!("hybrid cgroups with the controllers {controllers:?} on the cgroup2 hierarchy")
    })
}

/// The same pod under runc and under crun: each handler's OCI runtime holds exactly its pod's
/// sandbox and container; in both, a container's own exit code and a SIGKILL's 137 reach the
/// status through the kernel's exit events, and the pods end `Failed`. On a host whose cgroup
/// layout crun refuses (hybrid, with controllers on cgroup2, as these CI machines), the pod
/// under crun is checked to have been handed to crun and to wait with crun's refusal as its
/// reason, while the pod under runc runs all the way.
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
    let crun_refusal = crun_refuses_this_layout();
    if let Some(why) = &crun_refusal {
        eprintln!(
            "{test}: NOTE: crun cannot run containers here ({why}); the pod under crun is checked \
             to be refused by crun with that reason, the pod under runc to run"
        );
    }
    let server = TestApiServer::start("handlers");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("handlers", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let client = rt.block_on(server.client());
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let exits = r#"swiftlet_pleg_kernel_triggers_total{kind="exit"}"#;
    let exits_before = node.metric(exits);

    let mut running_pods = Vec::new();
    let mut refused = Vec::new();
    for (class, handler) in HANDLERS {
        let object: RuntimeClass =
            serde_json::from_value(json!({"metadata": {"name": class}, "handler": handler}))
                .expect("a RuntimeClass");
        rt.block_on(classes.create(&PostParams::default(), &object))
            .expect("RuntimeClass created");
        let name = format!("under-{handler}");
        rt.block_on(pods.create(&PostParams::default(), &pod(&name, &node.name, class)))
            .expect("pod created");
        if handler == "crun" && crun_refusal.is_some() {
            refused.push(name);
        } else {
            running_pods.push((name, handler));
        }
    }

    for name in &refused {
        let waiting = wait_pod(&node, name, "waited with crun's refusal", |p| {
            container(p, "main")
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                .is_some_and(|m| !m.is_empty())
        });
        assert_eq!(phase(&waiting), "Pending");
        let main = container(&waiting, "main").and_then(|c| c.state.as_ref()?.waiting.clone());
        let (reason, message) = main
            .map(|w| (w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
            .unwrap_or_default();
        assert_eq!(reason, "ContainerCreating");
        assert!(
            message.starts_with("Failed to create pod sandbox: ")
                && message.contains("cgroups in hybrid mode not supported"),
            "crun's own refusal: {message}"
        );
        assert!(
            held_by(state, "crun").is_empty(),
            "crun holds no container it refused"
        );
    }

    let mut ids = Vec::new();
    for (name, handler) in &running_pods {
        let seen = wait_pod(&node, name, "had main running and quits exited 3", |p| {
            running(container(p, "main"))
                && terminated(container(p, "quits")).is_some_and(|(_, code)| code == 3)
        });
        let uid = seen.metadata.uid.clone().expect("a uid");
        let sandboxes = cluster::pod_sandboxes(&uid);
        assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
        assert_eq!(&sandboxes[0].runtime_handler, handler);
        // The exited container's state is gone already (the shim deletes it at the exit).
        let pod_ids: BTreeSet<String> =
            [sandboxes[0].id.clone(), container_id(&seen, "main")].into();
        ids.push((*handler, pod_ids, container_id(&seen, "main")));
    }
    // Each runtime holds its own pod's running sandbox and container, and none of another's.
    for (handler, own, _) in &ids {
        let held = held_by(state, handler);
        assert!(own.is_subset(&held), "{handler}: {held:?} lacks {own:?}");
        for (other_handler, other, _) in &ids {
            if other_handler != handler {
                assert!(
                    other.is_disjoint(&held),
                    "{handler}: {held:?} holds {other_handler}'s {other:?}"
                );
            }
        }
    }

    for (_, _, main) in &ids {
        let pid = init_pid(main);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL main");
    }
    for (name, _) in &running_pods {
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
    // The exits came as kernel events the PLEG mapped to their containers (counted only then):
    // two containers per running pod, an exit each at least.
    let exits_seen = node.metric(exits) - exits_before;
    let want = 2.0 * running_pods.len() as f64;
    assert!(
        exits_seen >= want,
        "{exits_seen} exits mapped, {want} wanted"
    );
}
