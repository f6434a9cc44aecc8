//! The CPU manager's static policy on the real kernel, cgroups and containerd, with
//! `--reserved-cpus 0` on these 2-CPU machines: a Guaranteed pod with `cpu: 1` gets CPU 1 alone,
//! everything else runs on CPU 0, deleting the pod gives CPU 1 back, a restart restores the
//! assignment from the checkpoint, an agent started over the checkpoint of a killed agent whose
//! pod is gone releases that pod's CPU before it admits the next, and the scheduler audit sees
//! foreign work on CPU 1. What a
//! container may run on is read where the kernel enforces it: its processes' `Cpus_allowed_list`.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use swiftlet_tests::{
    event_wait,
    manifest::{self, PodManifest},
    node::{Node, status},
    privileged, runtime_endpoint, with_cri,
};

fn manifest(name: &str, command: &str, resources: &str) -> String {
    PodManifest::new(name)
        .grace(1)
        .shell("main", command, resources)
        .yaml()
}

fn guaranteed(cpu: &str) -> String {
    manifest::guaranteed(cpu, "32Mi")
}

/// A pod that keeps a CPU busy: work for whatever CPUs it may use.
const SPIN: &str = "while :; do :; done";
/// A pod that wakes up ten times a second (run-queue latency samples).
const TICK: &str = "while :; do sleep 0.1; done";

fn node(test: &str, name: &str, extra: &[&str]) -> Option<Node> {
    if !privileged(test) {
        return None;
    }
    if std::thread::available_parallelism().map_or(0, usize::from) < 2 {
        // Not a skip: the machines this runs on have 2 CPUs; fewer is a broken setup.
        panic!("{test} needs at least 2 CPUs (CPU 0 reserved, CPU 1 exclusive)");
    }
    let endpoint = runtime_endpoint(test)?;
    let mut args = vec!["--cpu-manager-policy", "static", "--reserved-cpus", "0"];
    args.extend_from_slice(extra);
    Some(Node::start_with(name, &endpoint, &args))
}

/// The cgroup2 directory of the container `main` of pod `name`.
fn container_dir(node: &Node, name: &str) -> PathBuf {
    let pod = node.pod(name).expect("listed");
    let id = status::container(&pod, "main")
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.split_once("://").map(|(_, id)| id.to_owned()))
        .expect("container id");
    let uid = pod.metadata.uid.clone().expect("uid");
    swiftlet_tests::driver::container_cgroup(&uid, &id)
        .unwrap_or_else(|| panic!("no cgroup for {name}'s container {id}"))
}

/// The CPUs the processes of pod `name`'s container may run on, as the kernel enforces them
/// (the first process's `Cpus_allowed_list`; a shell's children inherit it).
fn cpus_allowed(node: &Node, name: &str) -> String {
    let procs = container_dir(node, name).join("cgroup.procs");
    let pid = std::fs::read_to_string(&procs)
        .expect("cgroup.procs")
        .lines()
        .next()
        .map(str::to_owned)
        .expect("a process in the container");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
        .expect("Cpus_allowed_list")
}

/// Waits until pod `name`'s container may run on exactly `want`.
fn wait_cpus(node: &Node, name: &str, want: &str) {
    let deadline = Instant::now() + event_wait();
    let mut last = String::new();
    while Instant::now() < deadline {
        last = cpus_allowed(node, name);
        if last == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = node.log_lines();
    panic!(
        "{name} runs on CPUs {last}, not {want}; log tail:\n{}",
        log[log.len().saturating_sub(30)..].join("\n")
    );
}

fn checkpoint(node: &Node) -> serde_json::Value {
    let path = node.dir().join("root").join("cpu_manager_state");
    let text = std::fs::read_to_string(&path).expect("the checkpoint exists");
    serde_json::from_str(&text).expect("the checkpoint is JSON")
}

fn running(node: &Node, name: &str) {
    node.wait_pod(name, "Running", |p| status::phase(p) == "Running");
}

fn uid(node: &Node, name: &str) -> String {
    node.pod(name)
        .and_then(|p| p.metadata.uid)
        .expect("the pod has a uid")
}

/// The foreign-time series of pod `name`'s `main` on CPU 1 from `intruder` (`pod`, `other`).
fn foreign(node: &Node, pod: &str, intruder: &str) -> f64 {
    node.metric(&format!(
        "swiftlet_exclusive_cpu_foreign_seconds_total{{namespace=\"default\",pod=\"{pod}-{}\",container=\"main\",cpu=\"1\",intruder=\"{intruder}\"}}",
        node.name
    ))
}

/// The CPU manager's and the audit's series, for failure messages.
fn audit_metrics(node: &Node) -> String {
    node.metrics()
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.contains("cpu_manager")
                    || l.contains("foreign")
                    || l.contains("runqueue_latency_seconds_count"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pod-resources API (on root's own socket) lists `exclusive`'s CPU 1 for its container,
/// no CPU for the shared pods, and CPU 1 as all the node can hand out (CPU 0 is reserved).
fn pod_resources_list_the_assignment(node: &Node) {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use swiftlet_proto::podresources::{
        AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest,
        pod_resources_lister_client::PodResourcesListerClient,
    };
    let socket = node.dir().join("root/pod-resources/kubelet.sock");
    let meta = std::fs::metadata(&socket).expect("the pod-resources socket");
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o600));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (listed, allocatable, get) = runtime.block_on(async {
        let channel = swiftlet_tests::unix_channel(socket)
            .await
            .expect("connect to the pod-resources socket");
        let mut client = PodResourcesListerClient::new(channel);
        let listed = client
            .list(ListPodResourcesRequest {})
            .await
            .expect("List")
            .into_inner();
        let allocatable = client
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await
            .expect("GetAllocatableResources")
            .into_inner();
        let get = client
            .get(GetPodResourcesRequest {
                pod_name: format!("exclusive-{}", node.name),
                pod_namespace: "default".into(),
            })
            .await;
        (listed, allocatable, get)
    });
    let cpus: Vec<(String, String, Vec<i64>)> = listed
        .pod_resources
        .iter()
        .flat_map(|p| {
            p.containers
                .iter()
                .map(|c| (p.name.clone(), c.name.clone(), c.cpu_ids.clone()))
        })
        .collect();
    let of = |pod: &str| {
        let name = format!("{pod}-{}", node.name);
        cpus.iter()
            .find(|(p, c, _)| *p == name && c == "main")
            .map(|(_, _, ids)| ids.clone())
    };
    assert_eq!(of("exclusive"), Some(vec![1]), "{cpus:?}");
    assert_eq!(of("spinner"), Some(vec![]), "{cpus:?}");
    assert_eq!(of("burstable"), Some(vec![]), "{cpus:?}");
    assert_eq!(allocatable.cpu_ids, [1]);
    // `Get` is alpha upstream, behind its gate, which this node leaves off.
    let refused = get.expect_err("Get is gated");
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
}

#[test]
fn a_guaranteed_pod_gets_cpu_1_alone_until_it_is_deleted() {
    let Some(node) = node(
        "a_guaranteed_pod_gets_cpu_1_alone_until_it_is_deleted",
        "cpus",
        &[],
    ) else {
        return;
    };
    node.write_manifest("spinner.yaml", &manifest("spinner", SPIN, ""));
    // Burstable by memory only: allocatable CPU is 1 (2 minus the reserved CPU 0), all of it for
    // the Guaranteed pod below.
    let burstable = "      resources:\n        requests:\n          memory: 16Mi\n";
    node.write_manifest("burstable.yaml", &manifest("burstable", TICK, burstable));
    running(&node, "spinner");
    running(&node, "burstable");
    wait_cpus(&node, "spinner", "0-1");

    node.write_manifest(
        "exclusive.yaml",
        &manifest("exclusive", TICK, &guaranteed("1")),
    );
    running(&node, "exclusive");
    assert_eq!(cpus_allowed(&node, "exclusive"), "1", "created on its CPU");
    wait_cpus(&node, "spinner", "0");
    wait_cpus(&node, "burstable", "0");
    let cp = checkpoint(&node);
    assert_eq!(cp["policyName"], "static");
    assert_eq!(cp["defaultCpuSet"], "0");
    assert_eq!(cp["entries"][uid(&node, "exclusive")]["main"], "1");
    let annotations = node
        .pod("exclusive")
        .and_then(|p| p.metadata.annotations)
        .unwrap_or_default();
    assert_eq!(
        annotations
            .get("cpumanager.swiftlet.io/exclusive-cpus")
            .map(String::as_str),
        Some("{\"main\":\"1\"}"),
        "/pods shows the assignment: {annotations:?}"
    );
    assert!(
        annotations.contains_key("cpumanager.swiftlet.io/foreign-seconds"),
        "{annotations:?}"
    );
    pod_resources_list_the_assignment(&node);
    assert_eq!(
        node.metric("kubelet_cpu_manager_exclusive_cpu_allocation_count"),
        1.0
    );
    assert_eq!(
        node.metric("kubelet_cpu_manager_shared_pool_size_millicores"),
        1000.0
    );

    // A second one cannot fit: rejected before anything starts. With whole reserved CPUs the
    // resource fit turns it away first (allocatable CPU is 1, as upstream computes it); the CPU
    // manager's own refusal (`UnexpectedAdmissionError`) needs a topology this machine lacks and
    // is unit-tested. Either way nothing is allocated.
    node.write_manifest("second.yaml", &manifest("second", TICK, &guaranteed("1")));
    let second = node.wait_pod("second", "Failed", |p| status::phase(p) == "Failed");
    let pod_status = second.status.expect("status");
    assert_eq!(pod_status.reason.as_deref(), Some("OutOfcpu"));
    let message = pod_status.message.unwrap_or_default();
    assert!(
        message.contains("cpu, requested: 1000, used: 1000, capacity: 1000"),
        "{message}"
    );
    assert_eq!(checkpoint(&node), cp, "the rejected pod holds no CPU");
    node.remove_manifest("second.yaml");

    // Once assigned, no other pod's work runs on CPU 1, although the spinner wants every CPU it
    // can get; a process pinned there by hand shows up as foreign work of the system.
    let pods_before = foreign(&node, "exclusive", "pod");
    let other_before = foreign(&node, "exclusive", "other");
    let mut pinned = Command::new("taskset")
        .args(["-c", "1", "sh", "-c", SPIN])
        .spawn()
        .expect("taskset");
    std::thread::sleep(Duration::from_secs(2));
    let _ = pinned.kill();
    let _ = pinned.wait();
    assert_eq!(
        foreign(&node, "exclusive", "pod"),
        pods_before,
        "no pod ran on CPU 1"
    );
    let other_after = foreign(&node, "exclusive", "other");
    assert!(
        other_after > other_before + 0.1,
        "the pinned process's time on CPU 1 is counted: {other_before} -> {other_after}; \
         metrics:\n{}\nlog:\n{}",
        audit_metrics(&node),
        node.log_lines()
            .iter()
            .filter(|l| l.contains("cpumanager") || l.contains("sched") || l.contains("CPU"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        node.metric("swiftlet_cpu_manager_exclusivity_violations_total"),
        0.0
    );
    let runq = node.metric(&format!(
        "swiftlet_runqueue_latency_seconds_count{{namespace=\"default\",pod=\"exclusive-{}\",container=\"main\"}}",
        node.name
    ));
    assert!(
        runq > 0.0,
        "run-queue latency of the exclusive container is measured"
    );

    // Deleting it gives CPU 1 back to everyone.
    node.remove_manifest("exclusive.yaml");
    node.wait_gone("exclusive");
    wait_cpus(&node, "spinner", "0-1");
    wait_cpus(&node, "burstable", "0-1");
    let cp = checkpoint(&node);
    assert_eq!(cp["defaultCpuSet"], "0-1");
    assert!(
        cp.get("entries")
            .is_none_or(|e| e.as_object().is_none_or(|o| o.is_empty()))
    );
}

#[test]
fn a_restart_restores_the_assignment_and_a_bad_checkpoint_stops_swiftlet() {
    let Some(mut node) = node(
        "a_restart_restores_the_assignment_and_a_bad_checkpoint_stops_swiftlet",
        "cpurestart",
        &[],
    ) else {
        return;
    };
    node.write_manifest(
        "exclusive.yaml",
        &manifest("exclusive", TICK, &guaranteed("1")),
    );
    running(&node, "exclusive");
    let exclusive_uid = uid(&node, "exclusive");
    node.restart();
    // A pod created after the restart stays off the restored exclusive CPU.
    node.write_manifest("later.yaml", &manifest("later", TICK, ""));
    running(&node, "later");
    assert_eq!(cpus_allowed(&node, "later"), "0");
    assert_eq!(cpus_allowed(&node, "exclusive"), "1");
    assert_eq!(checkpoint(&node)["entries"][&exclusive_uid]["main"], "1");

    // A corrupt checkpoint stops swiftlet with the file's name and the way out.
    node.stop();
    let path = node.dir().join("root").join("cpu_manager_state");
    std::fs::write(
        &path,
        "{\"policyName\":\"static\",\"defaultCpuSet\":\"0-1\",\"checksum\":7}",
    )
    .expect("corrupt the checkpoint");
    let output = Command::new(swiftlet_tests::swiftlet_bin())
        .args([
            "run",
            "--cpu-manager-policy",
            "static",
            "--reserved-cpus",
            "0",
        ])
        .arg("--root-dir")
        .arg(node.dir().join("root"))
        .args([
            "--runtime-endpoint",
            &runtime_endpoint("bad checkpoint").expect("endpoint"),
        ])
        .args(["--read-only-port", "0", "--http-address", "127.0.0.1:0"])
        .arg("--grpc-socket")
        .arg(node.dir().join("bad.sock"))
        .args(["--pleg", "relist"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "started with a corrupt checkpoint: {stderr}"
    );
    assert!(
        stderr.contains(&path.display().to_string()) && stderr.contains("is corrupt"),
        "{stderr}"
    );
    assert!(stderr.contains("--cpu-manager-reset-state"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&path).ok().as_deref(),
        Some("{\"policyName\":\"static\",\"defaultCpuSet\":\"0-1\",\"checksum\":7}"),
        "left as it was"
    );
    assert!(Path::new(&path).exists());
}

#[test]
fn a_container_done_for_good_gives_its_cpu_back() {
    let Some(node) = node(
        "a_container_done_for_good_gives_its_cpu_back",
        "cpuexit",
        &[],
    ) else {
        return;
    };
    node.write_manifest("spinner.yaml", &manifest("spinner", SPIN, ""));
    running(&node, "spinner");
    // `restartPolicy: Never`: once `main` exits it never runs again, so CPU 1 is free at once,
    // though the pod stays listed (Succeeded).
    let once = manifest("once", "sleep 3", &guaranteed("1"))
        .replace("spec:\n", "spec:\n  restartPolicy: Never\n");
    node.write_manifest("once.yaml", &once);
    running(&node, "once");
    wait_cpus(&node, "spinner", "0");
    node.wait_pod("once", "Succeeded", |p| status::phase(p) == "Succeeded");
    wait_cpus(&node, "spinner", "0-1");
    let cp = checkpoint(&node);
    assert_eq!(cp["defaultCpuSet"], "0-1");
    assert!(node.pod("once").is_some(), "the pod itself is still there");
}

/// Removes pod `uid`'s containers and sandboxes through CRI, as a node reboot or an operator
/// cleaning up after a killed agent would.
fn remove_from_runtime(uid: &str) {
    with_cri("remove_from_runtime", |runtime| async move {
        use std::collections::HashMap;
        use swiftlet::cri::RuntimeService as _;
        let of_pod = HashMap::from([("io.kubernetes.pod.uid".to_owned(), uid.to_owned())]);
        let containers = runtime
            .list_containers(Some(k8s_cri::v1::ContainerFilter {
                label_selector: of_pod.clone(),
                ..Default::default()
            }))
            .await
            .expect("list containers");
        assert!(
            !containers.is_empty(),
            "the killed agent's pod has containers"
        );
        for c in containers {
            runtime
                .stop_container(&c.id, Duration::ZERO)
                .await
                .expect("stop container");
            runtime
                .remove_container(&c.id)
                .await
                .expect("remove container");
        }
        let sandboxes = runtime
            .list_pod_sandbox(Some(k8s_cri::v1::PodSandboxFilter {
                label_selector: of_pod,
                ..Default::default()
            }))
            .await
            .expect("list sandboxes");
        for s in sandboxes {
            runtime.stop_pod_sandbox(&s.id).await.expect("stop sandbox");
            runtime
                .remove_pod_sandbox(&s.id)
                .await
                .expect("remove sandbox");
        }
    });
}

#[test]
fn an_agent_started_over_the_cpus_of_a_killed_agents_pod_releases_them_before_admission() {
    let Some(mut node) = node(
        "an_agent_started_over_the_cpus_of_a_killed_agents_pod_releases_them_before_admission",
        "cpustale",
        &[],
    ) else {
        return;
    };
    node.write_manifest("old.yaml", &manifest("old", TICK, &guaranteed("1")));
    running(&node, "old");
    let old_uid = uid(&node, "old");
    assert_eq!(checkpoint(&node)["entries"][&old_uid]["main"], "1");

    // The agent is killed (no shutdown of its own), then its pod leaves both the runtime and
    // the sources while no agent runs: the checkpoint still gives CPU 1 to a pod that is gone.
    let mut killed = node.agent.take().expect("the agent runs");
    killed.child.kill().expect("SIGKILL the agent");
    killed.child.wait().expect("reap the agent");
    node.remove_manifest("old.yaml");
    remove_from_runtime(&old_uid);
    assert_eq!(checkpoint(&node)["entries"][&old_uid]["main"], "1");

    // The new agent finds a Guaranteed pod that needs CPU 1 in its first set of pods.
    node.write_manifest("new.yaml", &manifest("new", TICK, &guaranteed("1")));
    node.restart();
    let new = node.wait_pod("new", "Running or Failed", |p| {
        matches!(status::phase(p), "Running" | "Failed")
    });
    let pod_status = new.status.clone().expect("status");
    assert_eq!(
        status::phase(&new),
        "Running",
        "admitted: {:?} {:?}",
        pod_status.reason,
        pod_status.message
    );
    assert_eq!(cpus_allowed(&node, "new"), "1");
    let cp = checkpoint(&node);
    assert!(cp["entries"].get(&old_uid).is_none(), "{cp}");
    assert_eq!(cp["entries"][uid(&node, "new")]["main"], "1");
}
