//! Volumes that follow the API, end to end: `swiftlet run --kubeconfig` against the project's own
//! API server process and the real containerd. A running container reads a configMap, a secret
//! and a projected volume (the same ConfigMap and Secret, and a service account token) in a loop
//! and prints what it reads; the test changes the objects through the API and reads the
//! container's log: it sees the new content (upstream's remount at each sync, `syncFrequency`,
//! and the atomic writer's `..data` swap) and a renewed token (the API server grants 10 s, so the
//! token manager renews it at 80 % of that). A deleted ConfigMap leaves the last files in place.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::runtime,
    node::{BUSYBOX, Node},
    test_apiserver::TestApiServer,
};

/// What the container prints every 0.3 s: each file it reads, and a digest of the token.
const READER: &str = "while true; do \
    echo \"cfg=$(cat /cfg/greeting) sec=$(cat /sec/password) \
pcfg=$(cat /proj/greeting) psec=$(cat /proj/password) tok=$(md5sum /proj/token | cut -c1-8)\"; \
    sleep 0.3; done";

/// The last complete line the container printed (its CRI log file's message).
fn last_line(log: &PathBuf) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| l.contains(" stdout F cfg="))?;
    line.split_once(" stdout F ").map(|(_, m)| m.to_owned())
}

/// The value of `key=` in a line the container printed.
fn field(line: &str, key: &str) -> Option<String> {
    line.split(' ')
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
}

/// Waits until the container's last line satisfies `want`; returns it.
fn wait_line(log: &PathBuf, what: &str, wait: Duration, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + wait;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(line) = last_line(log) {
            if want(&line) {
                return line;
            }
            last = Some(line);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the container never showed {what}; it last printed {last:?}");
}

/// Failed volume set-ups of `plugin` the agent counted (upstream's
/// `storage_operation_duration_seconds`, status `fail-unknown`).
fn failed_mounts(node: &Node, plugin: &str) -> u64 {
    node.metrics()
        .lines()
        .filter(|l| {
            l.starts_with("storage_operation_duration_seconds_count")
                && l.contains("operation_name=\"volume_mount\"")
                && l.contains(&format!("volume_plugin=\"{plugin}\""))
                && l.contains("status=\"fail-unknown\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn config_map_secret_and_token_volumes_follow_the_api() {
    let test = "config_map_secret_and_token_volumes_follow_the_api";
    let server = TestApiServer::start_with("volumes", &["--max-token-expiration-seconds", "10"]);
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let Some(node) = Node::for_test(
        test,
        "apivolumes",
        &["--kubeconfig", &kubeconfig, "--sync-frequency", "2s"],
    ) else {
        return;
    };
    let rt = runtime();
    let client = rt.block_on(server.client());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let create = PostParams::default();
    rt.block_on(accounts.create(
        &create,
        &serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("an account"),
    ))
    .expect("the service account");
    rt.block_on(
        config_maps.create(
            &create,
            &serde_json::from_value(
                json!({"metadata": {"name": "app-config"}, "data": {"greeting": "hello"}}),
            )
            .expect("a ConfigMap"),
        ),
    )
    .expect("the ConfigMap");
    rt.block_on(
        secrets.create(
            &create,
            &serde_json::from_value(
                json!({"metadata": {"name": "app-secret"}, "data": {"password": "czNjcmV0"}}),
            )
            .expect("a Secret"),
        ),
    )
    .expect("the Secret");

    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reader", "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 1,
            "volumes": [
                {"name": "cfg", "configMap": {"name": "app-config"}},
                {"name": "sec", "secret": {"secretName": "app-secret"}},
                {"name": "proj", "projected": {"sources": [
                    {"configMap": {"name": "app-config", "items": [{"key": "greeting", "path": "greeting"}]}},
                    {"secret": {"name": "app-secret", "items": [{"key": "password", "path": "password"}]}},
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
                ]}},
            ],
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", READER],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "sec", "mountPath": "/sec"},
                    {"name": "proj", "mountPath": "/proj"},
                ],
            }],
        },
    }))
    .expect("a pod");
    let uid = rt
        .block_on(pods.create(&create, &pod))
        .expect("the pod is created")
        .metadata
        .uid
        .expect("a uid");
    let log = node
        .pod_logs_dir()
        .join(format!("default_reader_{uid}/main/0.log"));

    let first = wait_line(&log, "the objects' content", EVENT_WAIT, |l| {
        l.starts_with("cfg=hello sec=s3cret pcfg=hello psec=s3cret tok=")
    });
    let first_token = field(&first, "tok").expect("a token digest");
    assert_eq!(first_token.len(), 8, "{first}");
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~configmap/cfg");
    let first_payload = std::fs::read_link(volume.join("..data")).expect("..data is a link");

    // Both objects change through the API: the running container reads the new content within
    // a sync period or two, through every volume.
    let merge = PatchParams::default();
    rt.block_on(config_maps.patch(
        "app-config",
        &merge,
        &Patch::Merge(json!({"data": {"greeting": "bonjour"}})),
    ))
    .expect("the ConfigMap is updated");
    rt.block_on(secrets.patch(
        "app-secret",
        &merge,
        &Patch::Merge(json!({"data": {"password": "bjN3"}})),
    ))
    .expect("the Secret is updated");
    wait_line(&log, "the updated objects", Duration::from_secs(30), |l| {
        l.starts_with("cfg=bonjour sec=n3w pcfg=bonjour psec=n3w tok=")
    });
    let second_payload = std::fs::read_link(volume.join("..data")).expect("..data is a link");
    assert_ne!(first_payload, second_payload, "a new payload behind ..data");

    // The API server granted 10 s: the token is renewed before it runs out.
    wait_line(&log, "a renewed token", Duration::from_secs(30), |l| {
        field(l, "tok").is_some_and(|t| t.len() == 8 && t != first_token)
    });

    // Read through one watch per object (the `metadata.name` field selector), never one GET
    // per remount.
    let (_, requests) = server.requests();
    let watches = |resource: &str, name: &str| {
        requests
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.path == format!("/api/v1/namespaces/default/{resource}")
                    && r.query.contains("watch=true")
                    && r.query
                        .contains(&format!("fieldSelector=metadata.name%3D{name}"))
            })
            .count()
    };
    assert!(watches("configmaps", "app-config") >= 1, "{requests:?}");
    assert!(watches("secrets", "app-secret") >= 1, "{requests:?}");
    let direct_reads = requests
        .iter()
        .filter(|r| {
            r.method == "GET"
                && (r.path.ends_with("/configmaps/app-config")
                    || r.path.ends_with("/secrets/app-secret"))
        })
        .count();
    assert_eq!(direct_reads, 0, "{requests:?}");

    // Deleted: the next remount fails, and the container still reads the last content.
    let failed_before = failed_mounts(&node, "kubernetes.io/configmap");
    rt.block_on(config_maps.delete("app-config", &DeleteParams::default()))
        .expect("the ConfigMap is deleted");
    let deadline = Instant::now() + Duration::from_secs(30);
    while failed_mounts(&node, "kubernetes.io/configmap") <= failed_before {
        assert!(
            Instant::now() < deadline,
            "no remount of the configMap volume failed after its object was deleted"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read_to_string(volume.join("greeting")).expect("the file is still there"),
        "bonjour"
    );
    let line = wait_line(&log, "the last content", Duration::from_secs(5), |l| {
        l.starts_with("cfg=bonjour ")
    });
    assert!(line.contains("pcfg=bonjour"), "{line}");

    // All of it while the container ran on: it never restarted.
    let seen = rt.block_on(pods.get("reader")).expect("the pod");
    let restarts = seen
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count);
    assert_eq!(restarts, Some(0), "{:?}", seen.status);

    // Deleted through the API, the pod leaves the node (and the agent its objects' watches).
    rt.block_on(pods.delete("reader", &DeleteParams::default()))
        .expect("the pod is deleted");
    let deadline = Instant::now() + EVENT_WAIT;
    while !node.pods().is_empty() {
        assert!(Instant::now() < deadline, "the pod stayed on the node");
        std::thread::sleep(Duration::from_millis(200));
    }
}
