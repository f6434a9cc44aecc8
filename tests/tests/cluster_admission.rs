//! Registration and admission as a member of a cluster: `swiftlet run --kubeconfig` against the
//! project's own API server process over HTTPS, with the real containerd. The Node on the API
//! server carries the flags' labels, taints and addresses; pods bound to the node that fail one
//! of upstream's predicates are `Failed` there with the predicate's reason and message; a pod
//! that passes every one runs, with its RuntimeClass's handler; a RuntimeClass that is missing or
//! names a handler containerd does not know leaves its pod Pending, saying why.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::net::IpAddr;

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node as ApiNode, Pod},
    node::v1::RuntimeClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use swiftlet::node::addresses::{HostNetwork, is_global};
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::{self, runtime},
    node::{BUSYBOX, Node, status::phase},
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};

/// Polls `read` until it gives a value `want` holds of (bounded by twice [`EVENT_WAIT`]).
fn wait_for<T: std::fmt::Debug>(
    what: &str,
    read: impl FnMut() -> Option<T>,
    want: impl Fn(&T) -> bool,
) -> T {
    cluster::wait_for(&format!("never {what}"), EVENT_WAIT * 2, read, |v| {
        v.as_ref().is_some_and(&want)
    })
    .expect("a value that holds")
}

/// The host's global IPv4 address and, if it has one, its global IPv6 address (what
/// `--node-ip` may name).
fn host_ips() -> (IpAddr, Option<IpAddr>) {
    let host = HostNetwork::read();
    let global = |v6: bool| {
        host.addresses
            .iter()
            .find(|a| a.up && a.ip.is_ipv6() == v6 && is_global(a.ip))
            .map(|a| a.ip)
    };
    (global(false).expect("a global IPv4 address"), global(true))
}

/// A pod bound to `node` running one sleeping busybox container, with `spec` merged in.
fn pod(name: &str, node: &str, spec: Value) -> Pod {
    let mut object = json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    });
    for (key, value) in spec.as_object().into_iter().flatten() {
        object["spec"][key] = value.clone();
    }
    serde_json::from_value(object).expect("a pod")
}

/// The reason and message of the pod's status.
fn rejection(pod: &Pod) -> (String, String) {
    let status = pod.status.clone().unwrap_or_default();
    (
        status.reason.unwrap_or_default(),
        status.message.unwrap_or_default(),
    )
}

/// The waiting reason and message of the pod's one container.
fn waiting(pod: &Pod) -> Option<(String, String)> {
    let waiting = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((
        waiting.reason.unwrap_or_default(),
        waiting.message.unwrap_or_default(),
    ))
}

/// The runtime handlers of the sandboxes of the pod with `uid`.
fn sandbox_handlers(uid: &str) -> Vec<String> {
    cluster::pod_sandboxes(uid)
        .into_iter()
        .map(|s| s.runtime_handler)
        .collect()
}

/// The node registers with its flags' labels, taints and dual-stack addresses (kept through its
/// status patches), and admits pods as upstream's predicates do: each rejected pod is `Failed`
/// on the API server with the predicate's reason and message and never gets a sandbox, the pod
/// that passes every predicate runs with its RuntimeClass's handler, a static pod is not held to
/// the taints, and a missing RuntimeClass or a handler containerd does not know leaves a pod
/// Pending with the reason in its container's waiting state.
#[test]
fn the_node_registers_with_its_flags_and_admits_pods_as_upstream() {
    let test = "the_node_registers_with_its_flags_and_admits_pods_as_upstream";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("admission");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let (v4, v6) = host_ips();
    let node_ip = match v6 {
        Some(v6) => format!("{v4},{v6}"),
        None => v4.to_string(),
    };
    // Status updates every second (and, that written alone, reports as often: upstream's
    // default), so status patches follow the registration within the test.
    let config_dir =
        std::env::temp_dir().join(format!("swiftlet-admission-{}", std::process::id()));
    std::fs::create_dir_all(&config_dir).expect("config dir");
    let config = config_dir.join("swiftlet.yaml");
    std::fs::write(&config, "nodeStatusUpdateFrequency: 1s\n").expect("config file");
    let node = Node::start_with(
        "admit",
        &endpoint,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--config",
            config.to_str().expect("utf-8 path"),
            "--node-labels",
            "swiftlet.test/disk=ssd,swiftlet.test/cores=8,node.kubernetes.io/pool=e2e",
            "--register-with-taints",
            "swiftlet.test/dedicated=e2e:NoExecute,swiftlet.test/soft:NoSchedule",
            "--node-ip",
            &node_ip,
        ],
    );
    let rt = runtime();
    let client = rt.block_on(server.client());
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let classes: Api<RuntimeClass> = Api::all(client);

    // The Node as registered.
    let registered = wait_for(
        "the Node registered",
        || rt.block_on(nodes.get_opt(&node.name)).expect("GET node"),
        |n| n.status.is_some(),
    );
    let labels = registered.metadata.labels.clone().unwrap_or_default();
    for (key, value) in [
        ("swiftlet.test/disk", "ssd"),
        ("swiftlet.test/cores", "8"),
        ("node.kubernetes.io/pool", "e2e"),
        ("kubernetes.io/hostname", node.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/os", "linux"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{labels:?}"
        );
    }
    assert!(labels.contains_key("kubernetes.io/arch"), "{labels:?}");
    let taints: Vec<(String, Option<String>, String)> = registered
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value, t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            (
                "swiftlet.test/dedicated".to_owned(),
                Some("e2e".to_owned()),
                "NoExecute".to_owned()
            ),
            (
                "swiftlet.test/soft".to_owned(),
                None,
                "NoSchedule".to_owned()
            ),
        ]
    );
    let version = registered
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
        .unwrap_or_default();
    // A semantic version with build metadata: vMAJOR.MINOR.PATCH+swiftlet.<crate version>.
    let (release, build) = version.split_once('+').expect("build metadata");
    let numbers: Vec<&str> = release.trim_start_matches('v').split('.').collect();
    assert!(
        release.starts_with('v')
            && numbers.len() == 3
            && numbers.iter().all(|n| n.parse::<u32>().is_ok())
            && build.starts_with("swiftlet."),
        "{version}"
    );
    let mut want_addresses = vec![
        ("InternalIP".to_owned(), v4.to_string()),
        ("Hostname".to_owned(), node.name.clone()),
    ];
    want_addresses.extend(v6.map(|v6| ("InternalIP".to_owned(), v6.to_string())));
    let addresses = |n: &ApiNode| -> Vec<(String, String)> {
        n.status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect()
    };
    assert_eq!(addresses(&registered), want_addresses);
    // After a status patch the API server merged, both InternalIPs are still there.
    let status_path = format!("/api/v1/nodes/{}/status", node.name);
    wait_for(
        "a status patch of the Node",
        || Some(server.requests().1),
        |log| {
            log.iter()
                .any(|r| r.method == "PATCH" && r.path == status_path && r.code == 200)
        },
    );
    let patched = rt.block_on(nodes.get(&node.name)).expect("GET node");
    assert_eq!(addresses(&patched), want_addresses);

    for (name, handler) in [
        ("swiftlet-runc", "runc"),
        ("swiftlet-bogus", "swiftlet-no-such-handler"),
    ] {
        let class: RuntimeClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "handler": handler}))
                .expect("a RuntimeClass");
        rt.block_on(classes.create(&PostParams::default(), &class))
            .expect("RuntimeClass created");
    }

    // The pod that passes every predicate: selector, each operator of the required affinity,
    // matchFields, a toleration of the NoExecute taint, a free host port, its RuntimeClass.
    let port = 40_000 + i32::try_from(std::process::id() % 10_000).unwrap_or(0);
    let tolerate =
        json!([{"key": "swiftlet.test/dedicated", "operator": "Exists", "effect": "NoExecute"}]);
    let fits = pod(
        "fits",
        &node.name,
        json!({
            "hostNetwork": true,
            "runtimeClassName": "swiftlet-runc",
            "tolerations": tolerate,
            "nodeSelector": {"swiftlet.test/disk": "ssd"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{
                    "matchExpressions": [
                        {"key": "swiftlet.test/disk", "operator": "In", "values": ["ssd", "nvme"]},
                        {"key": "swiftlet.test/disk", "operator": "NotIn", "values": ["hdd"]},
                        {"key": "node.kubernetes.io/pool", "operator": "Exists"},
                        {"key": "swiftlet.test/gpu", "operator": "DoesNotExist"},
                        {"key": "swiftlet.test/cores", "operator": "Gt", "values": ["4"]},
                        {"key": "swiftlet.test/cores", "operator": "Lt", "values": ["16"]},
                    ],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}],
                }],
            }}},
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "ports": [{"containerPort": port, "hostPort": port}],
            }],
        }),
    );
    let fits = rt
        .block_on(pods.create(&PostParams::default(), &fits))
        .expect("pod created");
    let fits_uid = fits.metadata.uid.clone().expect("a uid");
    let running = wait_for(
        "the fitting pod running",
        || rt.block_on(pods.get_opt("fits")).expect("GET pod"),
        |p| phase(p) == "Running",
    );
    assert_eq!(rejection(&running).0, "");
    assert_eq!(sandbox_handlers(&fits_uid), ["runc"]);

    // One pod per predicate it fails, each otherwise admissible.
    let rejected: Vec<(&str, Value, &str, Option<String>)> = vec![
        (
            "selector-miss",
            json!({"tolerations": tolerate, "nodeSelector": {"swiftlet.test/disk": "hdd"}}),
            "NodeAffinity",
            Some(
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
                    .to_owned(),
            ),
        ),
        (
            "affinity-miss",
            json!({"tolerations": tolerate, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                    "matchExpressions": [{"key": "swiftlet.test/cores", "operator": "Gt", "values": ["8"]}],
                }]},
            }}}),
            "NodeAffinity",
            None,
        ),
        (
            "untolerated",
            json!({}),
            "TaintToleration",
            Some(
                "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
                    .to_owned(),
            ),
        ),
        (
            "port-clash",
            json!({"tolerations": tolerate, "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "ports": [{"containerPort": 8080, "hostPort": port, "protocol": "TCP"}],
            }]}),
            "NodePorts",
            Some(
                "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
                    .to_owned(),
            ),
        ),
        (
            // What the API server's RuntimeClass admission would copy in: counted with the
            // requests, it is more than the node has.
            "overhead",
            json!({"tolerations": tolerate, "overhead": {"memory": "1Pi"}, "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"requests": {"memory": "1Mi"}},
            }]}),
            "OutOfmemory",
            None,
        ),
    ];
    let mut rejected_uids = Vec::new();
    for (name, spec, _, _) in &rejected {
        let created = rt
            .block_on(pods.create(&PostParams::default(), &pod(name, &node.name, spec.clone())))
            .expect("pod created");
        rejected_uids.push(created.metadata.uid.clone().expect("a uid"));
    }
    // Pods whose sandbox cannot be made: no such RuntimeClass, a handler containerd lacks.
    for (name, class) in [
        ("no-class", "swiftlet-absent"),
        ("bogus-handler", "swiftlet-bogus"),
    ] {
        let spec = json!({"tolerations": tolerate, "runtimeClassName": class});
        rt.block_on(pods.create(&PostParams::default(), &pod(name, &node.name, spec)))
            .expect("pod created");
    }
    // A static pod does not tolerate the NoExecute taint, and runs: taints are not checked
    // for static pods.
    node.write_manifest(
        "static.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\nspec:\n  terminationGracePeriodSeconds: 0\n  \
         containers:\n  - name: main\n    image: localhost/swiftlet/busybox:latest\n    \
         imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n",
    );

    for (name, _, reason, message) in &rejected {
        let failed = wait_for(
            &format!("{name} rejected"),
            || rt.block_on(pods.get_opt(name)).expect("GET pod"),
            |p| phase(p) == "Failed",
        );
        let (got_reason, got_message) = rejection(&failed);
        assert_eq!(got_reason, *reason, "{name}: {got_message}");
        if let Some(message) = message {
            assert_eq!(&got_message, message, "{name}");
        }
    }
    let overhead = rt.block_on(pods.get("overhead")).expect("GET pod");
    assert!(
        rejection(&overhead)
            .1
            .starts_with("Node didn't have enough resource: memory, requested: 1125899907891200, "),
        "1 PiB of overhead plus 1 MiB of requests: {:?}",
        rejection(&overhead)
    );
    for uid in &rejected_uids {
        assert!(
            sandbox_handlers(uid).is_empty(),
            "a rejected pod got a sandbox"
        );
    }

    let no_class = wait_for(
        "the pod without its RuntimeClass waiting with the reason",
        || rt.block_on(pods.get_opt("no-class")).expect("GET pod"),
        |p| waiting(p).is_some_and(|(_, m)| !m.is_empty()),
    );
    assert_eq!(phase(&no_class), "Pending");
    assert_eq!(
        waiting(&no_class),
        Some((
            "ContainerCreating".to_owned(),
            "Failed to create pod sandbox: runtimeclasses.node.k8s.io \"swiftlet-absent\" not found"
                .to_owned()
        ))
    );
    let bogus = wait_for(
        "the pod with an unknown handler waiting with the runtime's error",
        || rt.block_on(pods.get_opt("bogus-handler")).expect("GET pod"),
        |p| waiting(p).is_some_and(|(_, m)| !m.is_empty()),
    );
    assert_eq!(phase(&bogus), "Pending");
    let (reason, message) = waiting(&bogus).unwrap_or_default();
    assert_eq!(reason, "ContainerCreating");
    assert!(
        message.starts_with("Failed to create pod sandbox: ")
            && message.contains("swiftlet-no-such-handler"),
        "{message}"
    );

    node.wait_pod("static", "Running", |p| {
        swiftlet_tests::node::status::phase(p) == "Running"
    });

    // Done: every API pod goes (grace 0), so the agent stops what runs before it is stopped.
    let names: Vec<String> = rt
        .block_on(pods.list(&ListParams::default()))
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    for name in names {
        let _ = rt.block_on(pods.delete(&name, &DeleteParams::default().grace_period(0)));
    }
    swiftlet_tests::eventually("the API pods gone from the node", || {
        node.pods()
            .iter()
            .all(|p| p.metadata.name.as_deref() == Some(format!("static-{}", node.name).as_str()))
    });
    let _ = std::fs::remove_dir_all(&config_dir);
}

/// With `--register-node=false` the agent never creates its Node: it reads it until someone
/// does, then reports its status (and holds its Lease) without touching its labels.
#[test]
fn without_register_node_the_agent_only_updates_a_node_someone_created() {
    let test = "without_register_node_the_agent_only_updates_a_node_someone_created";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("noregister");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    // A 4 s Lease is renewed every second: its creation follows the Node's within the test.
    let config_dir =
        std::env::temp_dir().join(format!("swiftlet-noregister-{}", std::process::id()));
    std::fs::create_dir_all(&config_dir).expect("config dir");
    let config = config_dir.join("swiftlet.yaml");
    std::fs::write(&config, "nodeLeaseDurationSeconds: 4\n").expect("config file");
    let node = Node::start_with(
        "noreg",
        &endpoint,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--config",
            config.to_str().expect("utf-8 path"),
            "--register-node=false",
        ],
    );
    let rt = runtime();
    let client = rt.block_on(server.client());
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let node_path = format!("/api/v1/nodes/{}", node.name);
    // The agent looks for its Node a few times and gets 404s...
    let log = wait_for(
        "the agent reading its missing Node twice",
        || Some(server.requests().1),
        |log| {
            log.iter()
                .filter(|r| r.method == "GET" && r.path == node_path && r.code == 404)
                .count()
                >= 2
        },
    );
    // ...and never creates it.
    assert!(
        !log.iter()
            .any(|r| r.method == "POST" && r.path == "/api/v1/nodes"),
        "{log:?}"
    );
    assert!(
        rt.block_on(nodes.get_opt(&node.name))
            .expect("GET")
            .is_none()
    );

    // Someone else creates it: the agent reports its status into it.
    let created: ApiNode = serde_json::from_value(json!({
        "metadata": {"name": node.name, "labels": {"team": "storage"}},
    }))
    .expect("a Node");
    rt.block_on(nodes.create(&PostParams::default(), &created))
        .expect("Node created");
    let reported = wait_for(
        "the agent's Ready condition on the Node",
        || rt.block_on(nodes.get_opt(&node.name)).expect("GET node"),
        |n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        },
    );
    // Labels are its creator's: without registration the agent does not reconcile them.
    assert_eq!(
        reported.metadata.labels,
        Some([("team".to_owned(), "storage".to_owned())].into())
    );
    let (_, log) = server.requests();
    assert_eq!(
        log.iter()
            .filter(|r| r.method == "POST" && r.path == "/api/v1/nodes")
            .count(),
        1,
        "only the test created the Node"
    );
    // The Lease follows, owned by the Node.
    let lease = wait_for(
        "the node's Lease",
        || rt.block_on(leases.get_opt(&node.name)).expect("GET lease"),
        |_| true,
    );
    assert_eq!(
        lease
            .metadata
            .owner_references
            .unwrap_or_default()
            .first()
            .map(|o| o.uid.clone()),
        reported.metadata.uid
    );
    let _ = std::fs::remove_dir_all(&config_dir);
}
