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
    api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::json;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::{pod_containers, pod_sandboxes, running_containers, runtime, wait_for},
    node::{BUSYBOX, Node, status::phase},
    privileged, runtime_endpoint,
    test_apiserver::TestApiServer,
};
use tokio_stream::StreamExt as _;

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

/// A pod bound to `node` whose one container runs `script`, with `grace` seconds to stop.
fn busybox_pod(name: &str, node: &str, grace: i64, script: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))
    .expect("a pod")
}

/// Waits until every pod named in `names` is `Running` on the API server; returns the list's
/// resourceVersion then.
fn wait_running(rt: &tokio::runtime::Runtime, pods: &Api<Pod>, names: &[String]) -> String {
    let deadline = Instant::now() + EVENT_WAIT * 3;
    loop {
        let list = rt
            .block_on(pods.list(&Default::default()))
            .expect("a pod list");
        let running = list
            .items
            .iter()
            .filter(|p| {
                names.iter().any(|n| p.metadata.name.as_ref() == Some(n)) && phase(p) == "Running"
            })
            .count();
        if running == names.len() {
            return list.metadata.resource_version.expect("a resourceVersion");
        }
        assert!(
            Instant::now() < deadline,
            "{running} of {} pods ran",
            names.len()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The exit code of the pod's one container, as its status on the API server says.
fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// The order in which pods left the API server and the last version of each before it did,
/// from a watch of the namespace from `from`, until `count` pods are deleted.
fn watch_deletions(
    rt: &tokio::runtime::Runtime,
    pods: &Api<Pod>,
    from: &str,
    count: usize,
    wait: Duration,
) -> (Vec<String>, std::collections::HashMap<String, Pod>) {
    rt.block_on(async {
        let mut stream = Box::pin(
            pods.watch(&WatchParams::default(), from)
                .await
                .expect("a watch"),
        );
        let mut order = Vec::new();
        let mut last = std::collections::HashMap::new();
        let collect = async {
            while let Some(event) = stream.next().await {
                match event.expect("a watch event") {
                    WatchEvent::Modified(pod) => {
                        last.insert(pod.metadata.name.clone().unwrap_or_default(), pod);
                    }
                    WatchEvent::Deleted(pod) => {
                        order.push(pod.metadata.name.clone().unwrap_or_default());
                        if order.len() == count {
                            return;
                        }
                    }
                    _ => {}
                }
            }
        };
        let finished = tokio::time::timeout(wait, collect).await;
        assert!(
            finished.is_ok(),
            "only {} of {count} pods left the API server: {order:?}",
            order.len()
        );
        (order, last)
    })
}

/// Twenty pods deleted at once with different grace periods all leave the API server, and none
/// before its containers are gone: half of them ignore SIGTERM and are killed when their grace
/// period ends (exit 137), so they leave in the order of their grace periods, after every pod
/// that honours SIGTERM at once (exit 0); each pod's last status on the API server is terminal.
#[test]
fn twenty_pods_deleted_with_different_grace_periods_leave_in_their_order() {
    let test = "twenty_pods_deleted_with_different_grace_periods_leave_in_their_order";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("twenty");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("apitwenty", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    // Four grace periods, four seconds apart: far more than a kill's jitter on a loaded node.
    let graces = [4_i64, 8, 12, 16];
    let mut names = Vec::new();
    for i in 0..20 {
        let grace = graces[i % graces.len()];
        let ignores_term = i % 2 == 0;
        let name = format!(
            "p{i:02}-g{grace}-{}",
            if ignores_term { "stubborn" } else { "polite" }
        );
        let script = if ignores_term {
            "trap '' TERM; while true; do sleep 0.2; done"
        } else {
            "trap 'exit 0' TERM; while true; do sleep 0.2; done"
        };
        rt.block_on(pods.create(
            &PostParams::default(),
            &busybox_pod(&name, &node.name, grace, script),
        ))
        .expect("the pod is created");
        names.push(name);
    }
    let from = wait_running(&rt, &pods, &names);

    for name in &names {
        let deleting = rt
            .block_on(pods.delete(name, &DeleteParams::default()))
            .expect("the delete is accepted");
        assert!(
            deleting.is_left(),
            "{name}: a graceful delete keeps the pod until the node has stopped it"
        );
    }
    let (order, last) = watch_deletions(&rt, &pods, &from, names.len(), EVENT_WAIT * 2);

    let position = |name: &str| order.iter().position(|n| n == name).expect("deleted");
    let grace_of = |name: &str| -> i64 {
        name.split("-g")
            .nth(1)
            .and_then(|g| g.split('-').next())
            .and_then(|g| g.parse().ok())
            .expect("a grace period in the name")
    };
    for name in &names {
        let pod = last.get(name).expect("a version before the deletion");
        let stubborn = name.ends_with("stubborn");
        assert!(
            matches!(phase(pod), "Failed" | "Succeeded"),
            "{name} left with {:?}",
            pod.status
        );
        assert_eq!(
            exit_code(pod),
            Some(if stubborn { 137 } else { 0 }),
            "{name}: {:?}",
            pod.status
        );
        for other in &names {
            let (a, b) = (name.as_str(), other.as_str());
            let ordered = match (a.ends_with("stubborn"), b.ends_with("stubborn")) {
                // SIGTERM honoured at once comes before a kill at the end of a grace period.
                (false, true) => position(a) < position(b),
                (true, true) if grace_of(a) < grace_of(b) => position(a) < position(b),
                _ => true,
            };
            assert!(ordered, "{a} left after {b}: {order:?}");
        }
    }
    // The test's DELETE of each pod and the agent's final one, once each.
    let (_, log) = server.requests();
    let deletes = log.iter().filter(|r| r.method == "DELETE").count();
    assert_eq!(deletes, 2 * names.len(), "{order:?}");
    drop(node);
}

/// The running containers of the pod with `uid`, and whether any sandbox of it is ready.
fn runtime_leftovers(uid: &str) -> (usize, bool) {
    let ready = pod_sandboxes(uid)
        .iter()
        .any(|s| s.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32);
    (running_containers(uid), ready)
}

/// Waits until nothing of the pod with `uid` runs on the node.
fn wait_stopped(uid: &str, what: &str) {
    let deadline = Instant::now() + EVENT_WAIT * 2;
    loop {
        let (running, ready) = runtime_leftovers(uid);
        if running == 0 && !ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {running} containers still run, sandbox ready: {ready}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A force deletion (grace 0: the API server removes the pod at once) still stops the pod on the
/// node, with SIGTERM first as upstream (the kubelet gives a pod that vanished from the API its
/// own grace period); a pod deleted right after it was created, and one deleted while its
/// postStart hook runs, leave the API server and nothing of them keeps running or comes back.
#[test]
fn forced_deletions_and_pods_deleted_while_starting_stop_on_the_node() {
    let test = "forced_deletions_and_pods_deleted_while_starting_stop_on_the_node";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("force");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("apiforce", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let polite = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

    // Force deletion of a running pod.
    let forced = rt
        .block_on(pods.create(
            &PostParams::default(),
            &busybox_pod("forced", &node.name, 30, polite),
        ))
        .expect("the pod is created");
    let forced_uid = forced.metadata.uid.clone().expect("a uid");
    wait_running(&rt, &pods, &["forced".to_owned()]);
    rt.block_on(pods.delete("forced", &DeleteParams::default().grace_period(0)))
        .expect("the force delete is accepted");
    let gone = rt.block_on(pods.get_opt("forced")).expect("a get");
    assert!(
        gone.is_none(),
        "a force-deleted pod is gone from the API at once"
    );
    wait_stopped(&forced_uid, "the force-deleted pod");

    // Deleted right after it was created: the node may see both at once.
    let hasty = rt
        .block_on(pods.create(
            &PostParams::default(),
            &busybox_pod("hasty", &node.name, 30, polite),
        ))
        .expect("the pod is created");
    let hasty_uid = hasty.metadata.uid.clone().expect("a uid");
    let hasty_from = hasty
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");
    rt.block_on(pods.delete("hasty", &DeleteParams::default()))
        .expect("the delete is accepted");
    watch_deletions(&rt, &pods, &hasty_from, 1, EVENT_WAIT * 2);
    wait_stopped(&hasty_uid, "the pod deleted as it was created");

    // Deleted while its postStart hook runs: the hook would mark its end on the host after 15 s;
    // the pod leaves before that, its hook and container stopped with it.
    let marks_dir =
        std::env::temp_dir().join(format!("swiftlet-hook-marks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marks_dir);
    std::fs::create_dir_all(&marks_dir).expect("a marks directory");
    let mut hooked = busybox_pod("hooked", &node.name, 30, polite);
    let spec = hooked.spec.as_mut().expect("a spec");
    spec.volumes = Some(vec![
        serde_json::from_value(json!({
            "name": "marks",
            "hostPath": {"path": marks_dir, "type": "Directory"},
        }))
        .expect("a volume"),
    ]);
    spec.containers[0] = serde_json::from_value(json!({
        "name": "main",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", polite],
        "volumeMounts": [{"name": "marks", "mountPath": "/marks"}],
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "touch /marks/hook-began; sleep 15; touch /marks/hook-ended"]}}},
    }))
    .expect("a container");
    let hooked = rt
        .block_on(pods.create(&PostParams::default(), &hooked))
        .expect("the pod is created");
    let hooked_uid = hooked.metadata.uid.clone().expect("a uid");
    let deadline = Instant::now() + EVENT_WAIT;
    while !marks_dir.join("hook-began").exists() {
        assert!(Instant::now() < deadline, "the postStart hook never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let starting = rt.block_on(pods.get("hooked")).expect("the pod");
    assert_ne!(
        phase(&starting),
        "Running",
        "a container is not started while its postStart hook runs: {:?}",
        starting.status
    );
    let from = starting
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");
    rt.block_on(pods.delete("hooked", &DeleteParams::default()))
        .expect("the delete is accepted");
    watch_deletions(&rt, &pods, &from, 1, EVENT_WAIT * 2);
    assert!(
        !marks_dir.join("hook-ended").exists(),
        "the pod left the API server before its hook would have ended"
    );
    wait_stopped(&hooked_uid, "the pod deleted during its postStart hook");

    // Nothing of the three comes back.
    std::thread::sleep(Duration::from_secs(2));
    for (uid, what) in [
        (&forced_uid, "forced"),
        (&hasty_uid, "hasty"),
        (&hooked_uid, "hooked"),
    ] {
        assert_eq!(runtime_leftovers(uid), (0, false), "{what} came back");
    }
    drop(node);
    let _ = std::fs::remove_dir_all(&marks_dir);
}

/// The pod's one container: (its ID, restart count), as the API server holds them.
fn container_instance(pod: &Pod) -> (Option<String>, i32) {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    (
        status.and_then(|s| s.container_id.clone()),
        status.map_or(0, |s| s.restart_count),
    )
}

/// The node through the API server's faults (issue 16 item 8): down for two minutes, three times
/// the node lease's duration (pods keep running, nothing restarts, and the status of a pod that ended
/// meanwhile and the Lease catch up once it is back); every watch answered `410 Gone` after a
/// compaction, then a restart with fresh (lower) resourceVersions — after each the agent lists
/// again and a new pod runs, once; and an API server taking two seconds per request, during
/// which a container that exits is still restarted by its pod worker.
#[test]
fn the_node_rides_out_api_server_faults() {
    let test = "the_node_rides_out_api_server_faults";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let began = Instant::now();
    let step = |what: &str| eprintln!("{test}: {:>6.1?} {what}", began.elapsed());
    let server = TestApiServer::start("faults");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("apifaults", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let client = rt.block_on(server.client());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, "kube-node-lease");
    let polite = "trap 'exit 0' TERM; while true; do sleep 0.2; done";
    let create = |name: &str, script: &str, restart: &str| {
        let mut pod = busybox_pod(name, &node.name, 5, script);
        pod.spec.as_mut().expect("a spec").restart_policy = Some(restart.to_owned());
        rt.block_on(pods.create(&PostParams::default(), &pod))
            .expect("the pod is created")
    };
    let get = |name: &str| rt.block_on(pods.get(name)).expect("the pod");
    let renewed = || {
        rt.block_on(leases.get(&node.name))
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
    };

    create("steady", polite, "Always");
    wait_running(&rt, &pods, &["steady".to_owned()]);
    let steady_before = container_instance(&get("steady"));
    step("running");

    // 410 Gone for every watch, then fresh resourceVersions: a pod created after each runs.
    server.compact();
    server.drop_watches();
    create("after-gone", polite, "Always");
    server.restart_fresh();
    create("after-restart", polite, "Always");
    wait_running(
        &rt,
        &pods,
        &["after-gone".to_owned(), "after-restart".to_owned()],
    );
    step("after 410 and restart: running");
    for name in ["steady", "after-gone", "after-restart"] {
        let uid = get(name).metadata.uid.expect("a uid");
        assert_eq!(running_containers(&uid), 1, "{name} runs once");
    }
    assert_eq!(
        container_instance(&get("steady")),
        steady_before,
        "relisting did not restart a running pod"
    );

    // Two seconds per request: the pod worker restarts a container that exits meanwhile.
    let bouncer = create("bouncer", "sleep 3; exit 1", "Always");
    let bouncer_uid = bouncer.metadata.uid.clone().expect("a uid");
    wait_for(
        "the bouncer's first start",
        EVENT_WAIT,
        || runtime_leftovers(&bouncer_uid).0,
        |running| *running == 1,
    );
    server.set_delay(Duration::from_secs(2));
    let restarted = wait_for(
        "the bouncer's restart on the runtime",
        EVENT_WAIT * 2,
        || restart_attempts(&bouncer_uid),
        |attempts| *attempts >= 1,
    );
    server.set_delay(Duration::ZERO);
    assert!(restarted >= 1);
    wait_for(
        "the bouncer's restart on the API server",
        EVENT_WAIT * 2,
        || container_instance(&get("bouncer")).1,
        |count| *count >= 1,
    );
    step("bouncer restarted");

    // Ends ten seconds into the outage, with exit 3: its status waits for the server.
    create("finisher", "sleep 10; exit 3", "Never");
    wait_running(&rt, &pods, &["finisher".to_owned()]);
    let lease_before = wait_for("the node's Lease", EVENT_WAIT, renewed, Option::is_some);
    // Two minutes, as the issue asks: three times the lease's 40 s, and long enough for every
    // client back-off (kube-runtime's watcher backs off up to 30 s) to reach its cap.
    let outage = Duration::from_secs(120);
    server.go_down(outage);
    std::thread::sleep(outage + Duration::from_secs(1));
    step("outage over");
    let finisher = wait_for(
        "the status of the pod that ended during the outage",
        EVENT_WAIT * 2,
        || get("finisher"),
        |p| phase(p) == "Failed",
    );
    assert_eq!(exit_code(&finisher), Some(3), "{:?}", finisher.status);
    wait_for(
        "a Lease renewal after the outage",
        EVENT_WAIT * 2,
        renewed,
        |t| *t > lease_before,
    );
    step("status and lease caught up");
    let steady = get("steady");
    assert_eq!(phase(&steady), "Running");
    assert_eq!(
        container_instance(&steady),
        steady_before,
        "the running pod was not restarted by the outage"
    );
    drop(node);
}

/// The highest container attempt of the pod with `uid` on the runtime (0: first start).
fn restart_attempts(uid: &str) -> u32 {
    pod_containers(uid)
        .iter()
        .filter_map(|c| c.metadata.as_ref().map(|m| m.attempt))
        .max()
        .unwrap_or(0)
}

/// `kubeAPIQPS`/`kubeAPIBurst` (upstream's client-side token bucket): a node allowed two requests
/// a second with a burst of four, given ten pods at once, still runs them all and reports them
/// Running; over every stretch of its requests (by their arrival at the API server), its main
/// client made at most `burst + qps × t` of them (one more for the jitter between its sending
/// and their arrival). The heartbeat (Lease and Node status) goes on a client of its own and is
/// not counted, as upstream's is not limited; nor are the Events, which upstream's kubelet writes
/// through a client of their own limited by `eventRecordQPS`.
#[test]
fn the_agent_keeps_to_its_api_rate_limit() {
    let test = "the_agent_keeps_to_its_api_rate_limit";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let (qps, burst) = (2_u64, 4_u64);
    let server = TestApiServer::start("qps");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with(
        "apiqps",
        &endpoint,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--kube-api-qps",
            &qps.to_string(),
            "--kube-api-burst",
            &burst.to_string(),
        ],
    );
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let names: Vec<String> = (0..10).map(|i| format!("limited-{i}")).collect();
    for name in &names {
        rt.block_on(pods.create(
            &PostParams::default(),
            &busybox_pod(
                name,
                &node.name,
                1,
                "trap 'exit 0' TERM; while true; do sleep 0.2; done",
            ),
        ))
        .expect("the pod is created");
    }
    wait_running(&rt, &pods, &names);

    let (_, log) = server.requests();
    // The log is in the order the answers went out: the agent's requests by arrival.
    let mut agent: Vec<(u64, String)> = log
        .iter()
        .filter(|r| r.user_agent.starts_with("swiftlet/"))
        .filter(|r| {
            !r.path.contains("/leases")
                && !r.path.starts_with("/api/v1/nodes")
                && !r.path.starts_with("/apis/events.k8s.io/")
        })
        .map(|r| {
            (
                r.received_ms,
                format!("{} {}?{}", r.method, r.path, r.query),
            )
        })
        .collect();
    agent.sort_unstable();
    let requests: Vec<String> = agent.iter().map(|(_, r)| r.clone()).collect();
    let agent: Vec<u64> = agent.into_iter().map(|(at, _)| at).collect();
    let heartbeats = log
        .iter()
        .filter(|r| r.user_agent.starts_with("swiftlet/") && r.path.contains("/leases"))
        .count();
    assert!(heartbeats > 0, "the Lease was renewed");
    // Ten pods' statuses, each patched more than once, and the watch: the limit was reached.
    assert!(
        agent.len() as u64 > 3 * burst,
        "only {} requests from the agent",
        agent.len()
    );
    for (i, first) in agent.iter().enumerate() {
        for (j, last) in agent.iter().enumerate().skip(i) {
            let made = (j - i + 1) as u64;
            let allowed = burst + qps * (last - first) / 1000 + 1;
            assert!(
                made <= allowed,
                "{made} requests in {} ms, {allowed} allowed: {:?} {:?}",
                last - first,
                &agent[i..=j],
                &requests[i..=j]
            );
        }
    }
    drop(node);
}

/// `kubectl debug --target main` through the API (issue 20): an ephemeral container added to a
/// running pod with a strategic merge patch of `pods/ephemeralcontainers` runs once in the pod,
/// in `main`'s pid namespace (it finds `sleep 3600` among the processes it sees, which in a pid
/// namespace of its own it could not), ends terminated with exit 0 in
/// `ephemeralContainerStatuses`, and leaves `main` as it was (same container, no restart). The
/// API server refuses a change to it and an ephemeral container named like `main` with 422, and
/// the debugger dies with the pod.
#[test]
fn an_ephemeral_container_debugs_a_running_pod_in_its_targets_pid_namespace() {
    let test = "an_ephemeral_container_debugs_a_running_pod_in_its_targets_pid_namespace";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let server = TestApiServer::start("ephemeral");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with("apieph", &endpoint, &["--kubeconfig", &kubeconfig]);
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let name = "debugged";
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    }))
    .expect("a pod");
    let created = rt
        .block_on(pods.create(&PostParams::default(), &manifest))
        .expect("the pod is created");
    let uid = created.metadata.uid.clone().expect("a uid");
    wait_running(&rt, &pods, &[name.to_owned()]);
    let before = wait_for(
        "main's container id on the API server",
        EVENT_WAIT,
        || container_instance(&rt.block_on(pods.get(name)).expect("the pod")),
        |(id, _)| id.is_some(),
    );

    // What `kubectl debug -it debugged --image=busybox --target=main` sends.
    let script = "for f in /proc/[0-9]*/cmdline; do \
                  if tr '\\0' ' ' < \"$f\" | grep -q '^sleep 3600'; then exit 0; fi; \
                  done; exit 1";
    let debugger = json!({
        "name": "debugger",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "targetContainerName": "main",
        "command": ["sh", "-c", script],
    });
    let patch = Patch::Strategic(json!({"spec": {"ephemeralContainers": [debugger]}}));
    rt.block_on(pods.patch_ephemeral_containers(name, &PatchParams::default(), &patch))
        .expect("the ephemeral container is added");

    let debugged = wait_for(
        "the debugger's terminated state",
        EVENT_WAIT * 2,
        || rt.block_on(pods.get(name)).expect("the pod"),
        |p| ephemeral_exit(p).is_some(),
    );
    let status = debugged
        .status
        .as_ref()
        .and_then(|s| s.ephemeral_container_statuses.as_ref())
        .and_then(|l| l.first())
        .cloned()
        .expect("the debugger's status");
    assert_eq!(status.name, "debugger");
    assert_eq!(
        ephemeral_exit(&debugged),
        Some(0),
        "the debugger did not see main's processes: {status:?}"
    );
    assert_eq!(status.restart_count, 0);
    assert_eq!(
        container_instance(&debugged),
        before,
        "main was neither restarted nor replaced"
    );
    assert_eq!(phase(&debugged), "Running");
    // The runtime ran it once, in the pod's one sandbox.
    let instances: Vec<_> = pod_containers(&uid)
        .into_iter()
        .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == "debugger"))
        .collect();
    assert_eq!(instances.len(), 1, "{instances:?}");
    assert_eq!(pod_sandboxes(&uid).len(), 1);

    // A change to the existing one, and a name taken by a regular container: 422 Invalid.
    for (changed, field) in [
        (
            json!({"name": "debugger", "image": BUSYBOX, "imagePullPolicy": "Never", "targetContainerName": "main", "command": ["true"]}),
            "existing ephemeral containers \"debugger\" may not be changed",
        ),
        (
            json!({"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never"}),
            "Duplicate value: \"main\"",
        ),
    ] {
        let patch = Patch::Strategic(json!({"spec": {"ephemeralContainers": [changed]}}));
        let refused = rt
            .block_on(pods.patch_ephemeral_containers(name, &PatchParams::default(), &patch))
            .expect_err("the API server refuses it");
        let kube::Error::Api(status) = refused else {
            panic!("not an API error: {refused:?}");
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(status.message.contains(field), "{status:?}");
    }
    // Still one instance of it after the agent saw the refused writes (none reached the pod).
    std::thread::sleep(Duration::from_secs(2));
    let debuggers = pod_containers(&uid)
        .into_iter()
        .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == "debugger"))
        .count();
    assert_eq!(debuggers, 1);

    // A second one that keeps running: it dies with the pod.
    let sleeper = json!({"name": "sleeper", "image": BUSYBOX, "imagePullPolicy": "Never",
                         "targetContainerName": "main", "command": ["sleep", "3600"]});
    let patch = Patch::Strategic(json!({"spec": {"ephemeralContainers": [sleeper]}}));
    rt.block_on(pods.patch_ephemeral_containers(name, &PatchParams::default(), &patch))
        .expect("a second ephemeral container is added");
    wait_for(
        "the sleeper running",
        EVENT_WAIT * 2,
        || rt.block_on(pods.get(name)).expect("the pod"),
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.ephemeral_container_statuses.as_ref())
                .is_some_and(|l| {
                    l.iter().any(|c| {
                        c.name == "sleeper" && c.state.as_ref().is_some_and(|s| s.running.is_some())
                    })
                })
        },
    );
    assert_eq!(running_containers(&uid), 2, "main and the sleeper");
    let running = rt.block_on(pods.get(name)).expect("the pod");
    assert_eq!(container_instance(&running), before, "main still untouched");

    rt.block_on(pods.delete(name, &DeleteParams::default().grace_period(1)))
        .expect("the delete is accepted");
    wait_for(
        "the pod's containers stopped",
        EVENT_WAIT * 2,
        || running_containers(&uid),
        |n| *n == 0,
    );
    drop(node);
}

/// The exit code of the pod's first ephemeral container, once it terminated.
fn ephemeral_exit(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}
