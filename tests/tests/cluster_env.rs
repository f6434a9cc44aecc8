//! Containers' environment and DNS as a cluster member: `swiftlet run --kubeconfig` against the
//! project's own API server process, with the real containerd. Each container prints its
//! environment and `/etc/resolv.conf` to its log, which the test reads from the node's pod logs
//! directory; what the control plane sees (a container waiting with `CreateContainerConfigError`
//! and upstream's message) is read from the API server.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::runtime,
    node::{BUSYBOX, Node},
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};

/// The namespace of every pod here.
const NS: &str = "shop";

/// What each container runs: its environment (as the runtime gave it to the shell, pid 1: the
/// shell itself passes on only names it could define) and resolv.conf into its log, then it
/// waits to be stopped.
const PRINT: &str = "tr '\\0' '\\n' < /proc/1/environ; echo ---; cat /etc/resolv.conf; echo END; \
                     trap 'exit 0' TERM; while true; do sleep 0.2; done";

fn object<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// A pod in [`NS`] bound to `node` whose containers (name, env, envFrom) print what they see.
fn pod(name: &str, node: &str, spec: Value, containers: &[(&str, Value, Value)]) -> Pod {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(c, env, env_from)| {
            json!({
                "name": c,
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", PRINT],
                "env": env,
                "envFrom": env_from,
            })
        })
        .collect();
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    spec["terminationGracePeriodSeconds"] = json!(2);
    spec["containers"] = json!(containers);
    object(json!({"metadata": {"name": name, "namespace": NS}, "spec": spec}))
}

/// The variables and resolv.conf a container printed: once its log says it is done.
struct Printed {
    env: BTreeMap<String, String>,
    resolv_conf: Vec<String>,
}

/// Reads the CRI log file of `container` of pod `name` (uid `uid`) until it has printed all.
fn printed(node: &Node, name: &str, uid: &str, container: &str) -> Printed {
    let log: PathBuf = node
        .pod_logs_dir()
        .join(format!("{NS}_{name}_{uid}"))
        .join(container)
        .join("0.log");
    let deadline = Instant::now() + EVENT_WAIT;
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // `<time> stdout F <line>`
        let lines: Vec<String> = text
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
            .collect();
        if lines.iter().any(|l| l == "END") {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "{}: never printed everything: {text:?}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let split = lines.iter().position(|l| l == "---").expect("a separator");
    let env = lines[..split]
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let resolv_conf = lines[split + 1..]
        .iter()
        .take_while(|l| *l != "END")
        .cloned()
        .collect();
    Printed { env, resolv_conf }
}

/// The pod's container `name`'s status on the API server once `want` holds for it.
fn wait_container(
    rt: &tokio::runtime::Runtime,
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    what: &str,
    want: impl Fn(&k8s_openapi::api::core::v1::ContainerState) -> bool,
) -> Pod {
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let found = rt.block_on(pods.get(pod)).expect("the pod");
        let state = found
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == container))
            .and_then(|c| c.state.clone());
        if state.as_ref().is_some_and(&want) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{pod}/{container} never {what}: {:?}",
            found.status
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn running(state: &k8s_openapi::api::core::v1::ContainerState) -> bool {
    state.running.is_some()
}

fn lines(items: &[&str]) -> Vec<String> {
    items.iter().map(|&s| s.to_owned()).collect()
}

/// One node with `clusterDNS`, `clusterDomain` and a `resolvConf` of the test's, one API server:
/// - a pod with `envFrom` a ConfigMap and (prefixed) a Secret, `env` from their keys (one
///   optional and missing), a value expanding a service variable, and one overriding a service
///   variable, in a namespace with a service (and a headless one): the order and precedence of
///   upstream's `makeEnvironmentVariables`, the `kubernetes` and the namespace's service
///   variables, and the ClusterFirst resolv.conf;
/// - `enableServiceLinks: false` with `dnsPolicy: Default`: only the master service's variables
///   and the node's `resolvConf`;
/// - `ClusterFirstWithHostNet` on the host network: the cluster's resolver;
/// - `dnsPolicy: None`: the pod's `dnsConfig` alone;
/// - a missing ConfigMap and a missing key: `CreateContainerConfigError` with upstream's
///   messages on the API server, and the containers start once the ConfigMap is created and the
///   key added.
#[test]
fn environment_and_dns_from_the_cluster() {
    let test = "environment_and_dns_from_the_cluster";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("env");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let dir = std::env::temp_dir().join(format!("swiftlet-cluster-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let resolv_conf = dir.join("resolv.conf");
    std::fs::write(
        &resolv_conf,
        "# the node's\nnameserver 192.0.2.53\nsearch node.example\noptions timeout:2\n",
    )
    .expect("write resolv.conf");
    let config = dir.join("swiftlet.yaml");
    std::fs::write(
        &config,
        format!(
            "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\nresolvConf: {}\n",
            resolv_conf.display()
        ),
    )
    .expect("write the config");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with(
        "envdns",
        &endpoint,
        &["--kubeconfig", &kubeconfig, "--config", &config],
    );
    let rt = runtime();
    let client = rt.block_on(server.client());
    let create = |api: &str, value: Value| match api {
        "namespace" => {
            let api: Api<Namespace> = Api::all(client.clone());
            rt.block_on(api.create(&PostParams::default(), &object(value)))
                .map(|_| ())
        }
        "service" => {
            let api: Api<Service> = Api::namespaced(client.clone(), NS);
            rt.block_on(api.create(&PostParams::default(), &object(value)))
                .map(|_| ())
        }
        "configmap" => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
            rt.block_on(api.create(&PostParams::default(), &object(value)))
                .map(|_| ())
        }
        "secret" => {
            let api: Api<Secret> = Api::namespaced(client.clone(), NS);
            rt.block_on(api.create(&PostParams::default(), &object(value)))
                .map(|_| ())
        }
        other => panic!("no {other}"),
    };
    create("namespace", json!({"metadata": {"name": NS}})).expect("the namespace");
    create(
        "service",
        json!({
            "metadata": {"name": "cart"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]},
        }),
    )
    .expect("a service");
    create(
        "service",
        json!({
            "metadata": {"name": "headless"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
        }),
    )
    .expect("a headless service");
    create(
        "configmap",
        json!({
            "metadata": {"name": "app-config"},
            "data": {"MODE": "fast", "LEVEL": "debug", "app.properties": "x=1"},
        }),
    )
    .expect("a configmap");
    create(
        "configmap",
        json!({"metadata": {"name": "partial"}, "data": {"other": "x"}}),
    )
    .expect("a configmap without the key");
    // "s3cret", base64.
    create(
        "secret",
        json!({"metadata": {"name": "db"}, "data": {"PASSWORD": "czNjcmV0"}}),
    )
    .expect("a secret");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let key_ref = |kind: &str, name: &str, key: &str, optional: bool| json!({"valueFrom": {kind: {"name": name, "key": key, "optional": optional}}});
    let var = |name: &str, mut value: Value| {
        value["name"] = json!(name);
        value
    };
    let manifests = [
        pod(
            "app",
            &node.name,
            json!({}),
            &[(
                "main",
                json!([
                    {"name": "LEVEL", "value": "info"},
                    var("GREETING", key_ref("configMapKeyRef", "app-config", "MODE", false)),
                    var("TOKEN", key_ref("secretKeyRef", "db", "PASSWORD", false)),
                    var("OPTIONAL", key_ref("configMapKeyRef", "app-config", "absent", true)),
                    {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)/$(MODE)"},
                    {"name": "CART_SERVICE_PORT", "value": "override"},
                ]),
                json!([
                    {"configMapRef": {"name": "app-config"}},
                    {"secretRef": {"name": "db"}, "prefix": "DB_"},
                ]),
            )],
        ),
        pod(
            "no-links",
            &node.name,
            json!({"enableServiceLinks": false, "dnsPolicy": "Default"}),
            &[("main", json!([]), json!([]))],
        ),
        pod(
            "hostnet",
            &node.name,
            json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
            &[("main", json!([]), json!([]))],
        ),
        pod(
            "none",
            &node.name,
            json!({
                "dnsPolicy": "None",
                "dnsConfig": {
                    "nameservers": ["192.0.2.99"],
                    "searches": ["custom.example"],
                    "options": [{"name": "ndots", "value": "1"}],
                },
            }),
            &[("main", json!([]), json!([]))],
        ),
        pod(
            "late",
            &node.name,
            json!({}),
            &[
                (
                    "a",
                    json!([var(
                        "GREETING",
                        key_ref("configMapKeyRef", "late", "greeting", false)
                    )]),
                    json!([]),
                ),
                (
                    "b",
                    json!([var(
                        "GREETING",
                        key_ref("configMapKeyRef", "partial", "greeting", false)
                    )]),
                    json!([]),
                ),
            ],
        ),
    ];
    for manifest in &manifests {
        rt.block_on(pods.create(&PostParams::default(), manifest))
            .expect("the pod is created");
    }
    let uid = |name: &str| {
        rt.block_on(pods.get(name))
            .expect("the pod")
            .metadata
            .uid
            .expect("a uid")
    };

    // The environment: envFrom, then env over it, then the services no one defined.
    let app = wait_container(&rt, &pods, "app", "main", "ran", running);
    let app_uid = app.metadata.uid.clone().expect("a uid");
    let seen = printed(&node, "app", &app_uid, "main");
    let env = |k: &str| seen.env.get(k).map(String::as_str);
    for (name, want) in [
        ("MODE", Some("fast")),
        ("LEVEL", Some("info")),
        ("app.properties", Some("x=1")),
        ("DB_PASSWORD", Some("s3cret")),
        ("GREETING", Some("fast")),
        ("TOKEN", Some("s3cret")),
        ("OPTIONAL", None),
        ("API", Some("https://10.96.0.1:443/fast")),
        ("KUBERNETES_SERVICE_HOST", Some("10.96.0.1")),
        ("KUBERNETES_SERVICE_PORT", Some("443")),
        ("KUBERNETES_SERVICE_PORT_HTTPS", Some("443")),
        ("KUBERNETES_PORT", Some("tcp://10.96.0.1:443")),
        ("KUBERNETES_PORT_443_TCP", Some("tcp://10.96.0.1:443")),
        ("KUBERNETES_PORT_443_TCP_PROTO", Some("tcp")),
        ("KUBERNETES_PORT_443_TCP_PORT", Some("443")),
        ("KUBERNETES_PORT_443_TCP_ADDR", Some("10.96.0.1")),
        ("CART_SERVICE_HOST", Some("10.96.0.7")),
        ("CART_SERVICE_PORT", Some("override")),
        ("CART_SERVICE_PORT_HTTP", Some("8080")),
        ("CART_PORT", Some("tcp://10.96.0.7:8080")),
        ("CART_PORT_8080_TCP_ADDR", Some("10.96.0.7")),
        ("HEADLESS_SERVICE_HOST", None),
    ] {
        assert_eq!(env(name), want, "{name} in {:?}", seen.env);
    }
    // ClusterFirst: the cluster's nameserver, its searches before the node's, ndots:5.
    assert_eq!(
        seen.resolv_conf,
        lines(&[
            "search shop.svc.cluster.local svc.cluster.local cluster.local node.example",
            "nameserver 10.96.0.10",
            "options ndots:5",
        ])
    );

    // enableServiceLinks: false keeps the master service's variables only; Default is the
    // node's resolvConf.
    wait_container(&rt, &pods, "no-links", "main", "ran", running);
    let seen = printed(&node, "no-links", &uid("no-links"), "main");
    assert_eq!(
        seen.env.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
        Some("10.96.0.1")
    );
    assert!(
        !seen.env.keys().any(|k| k.starts_with("CART_")),
        "{:?}",
        seen.env
    );
    assert_eq!(
        seen.resolv_conf,
        lines(&[
            "search node.example",
            "nameserver 192.0.2.53",
            "options timeout:2",
        ])
    );

    wait_container(&rt, &pods, "hostnet", "main", "ran", running);
    let seen = printed(&node, "hostnet", &uid("hostnet"), "main");
    assert_eq!(
        seen.resolv_conf,
        lines(&[
            "search shop.svc.cluster.local svc.cluster.local cluster.local node.example",
            "nameserver 10.96.0.10",
            "options ndots:5",
        ])
    );

    wait_container(&rt, &pods, "none", "main", "ran", running);
    let seen = printed(&node, "none", &uid("none"), "main");
    assert_eq!(
        seen.resolv_conf,
        lines(&[
            "search custom.example",
            "nameserver 192.0.2.99",
            "options ndots:1",
        ])
    );

    // What is missing: the containers wait, and the API server says why in upstream's words.
    for (container, message) in [
        ("a", "configmap \"late\" not found"),
        ("b", "couldn't find key greeting in ConfigMap shop/partial"),
    ] {
        let waiting = |s: &k8s_openapi::api::core::v1::ContainerState| {
            s.waiting.as_ref().is_some_and(|w| {
                w.reason.as_deref() == Some("CreateContainerConfigError")
                    && w.message.as_deref() == Some(message)
            })
        };
        wait_container(&rt, &pods, "late", container, "waited", waiting);
    }
    create(
        "configmap",
        json!({"metadata": {"name": "late"}, "data": {"greeting": "hello"}}),
    )
    .expect("the missing configmap");
    let partial: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    rt.block_on(partial.patch(
        "partial",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"greeting": "hi"}})),
    ))
    .expect("the missing key added");
    let late_uid = uid("late");
    for (container, greeting) in [("a", "hello"), ("b", "hi")] {
        wait_container(&rt, &pods, "late", container, "ran", running);
        let seen = printed(&node, "late", &late_uid, container);
        assert_eq!(seen.env.get("GREETING").map(String::as_str), Some(greeting));
    }

    // Every pod leaves through the node before the node goes.
    for manifest in &manifests {
        let name = manifest.metadata.name.as_deref().expect("a name");
        rt.block_on(pods.delete(name, &DeleteParams::default()))
            .expect("the delete is accepted");
    }
    swiftlet_tests::eventually("every pod left the API server", || {
        rt.block_on(pods.list(&Default::default()))
            .is_ok_and(|l| l.items.is_empty())
    });
    let _ = std::fs::remove_dir_all(&dir);
}
