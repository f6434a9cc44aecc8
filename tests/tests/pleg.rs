//! The kernel-event PLEG on the real kernel and containerd: container deaths reach the pod's
//! status with no relist (relist period 300 s, resync 10 min), lost kernel events force a relist,
//! containers started before the agent are tracked, processes outside pods are ignored, and the
//! pod events reach gRPC watchers.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::process::Command;

use swiftlet_proto::v1::{self, events_client::EventsClient};
use swiftlet_tests::{
    http_get,
    manifest::PodManifest,
    node::{Node, status},
    privileged, runtime_endpoint,
};

/// No safety net within the test's time: only kernel events can tell the agent anything.
const NO_RELIST: [&str; 4] = ["--pleg-relist-period", "300s", "--sync-frequency", "10m"];

/// The agent's gRPC stream of pod events.
async fn watch_pods(node: &Node) -> tonic::Streaming<v1::Event> {
    let channel = swiftlet_tests::unix_channel(node.grpc_socket())
        .await
        .expect("connect");
    EventsClient::new(channel)
        .watch(v1::WatchRequest {
            kinds: vec!["pod".into()],
            cgroup_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner()
}

/// The first `ContainerDied` of a container named `container` on the stream.
async fn first_death(
    stream: &mut tonic::Streaming<v1::Event>,
    container: &str,
) -> v1::PodLifecycle {
    tokio::time::timeout(swiftlet_tests::event_wait(), async {
        loop {
            let event = stream.message().await.expect("stream").expect("open");
            if let Some(v1::event::Kind::Pod(pod)) = event.kind
                && pod.r#type == "ContainerDied"
                && pod.container_name == container
            {
                return pod;
            }
        }
    })
    .await
    .expect("a ContainerDied in time")
}

fn pod(name: &str, restart: &str, command: &str, resources: &str) -> String {
    PodManifest::new(name)
        .restart(restart)
        .grace(1)
        .shell("main", command, resources)
        .yaml()
}

fn node(test: &str, name: &str, extra: &[&str]) -> Option<Node> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let mut args: Vec<&str> = NO_RELIST.to_vec();
    args.extend_from_slice(extra);
    let node = Node::start_with(name, &endpoint, &args);
    assert_eq!(
        node.metric(r#"swiftlet_pleg_mode{mode="ebpf"}"#),
        1.0,
        "the kernel-event PLEG is in use"
    );
    Some(node)
}

/// The host pid of the container's init process (pid 1 in its namespace).
fn init_pid(container_id: &str) -> u32 {
    let id = container_id.trim_start_matches("containerd://");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .find(|pid| {
            let in_container = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(id));
            in_container && swiftlet::pleg::index::is_namespace_init(*pid)
        })
        .unwrap_or_else(|| panic!("no init process for container {id}"))
}

fn relists(node: &Node) -> f64 {
    node.metric("kubelet_pleg_relist_duration_seconds_count")
}

/// Without QoS cgroups (`cgroupsPerQOS: false`) pods' cgroups sit directly in `cgroupRoot`, not
/// below `kubepods`: the kernel-event PLEG watches them there, so their deaths still reach the
/// status from the kernel, with no relist.
#[test]
fn deaths_without_qos_cgroups_reach_the_status_with_no_relist() {
    let test = "deaths_without_qos_cgroups_reach_the_status_with_no_relist";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let root = format!("swiftlet-noqos-{}", std::process::id());
    let config = std::env::temp_dir().join(format!("{root}.yaml"));
    std::fs::write(
        &config,
        format!("cgroupsPerQOS: false\nenforceNodeAllocatable: []\ncgroupRoot: /{root}\n"),
    )
    .expect("config file");
    let mut args: Vec<&str> = NO_RELIST.to_vec();
    args.extend(["--config", config.to_str().expect("utf-8 path")]);
    let node = Node::start_with("noqos", &endpoint, &args);
    assert_eq!(
        node.metric(r#"swiftlet_pleg_mode{mode="ebpf"}"#),
        1.0,
        "the kernel-event PLEG is in use"
    );
    node.write_manifest("code.yaml", &pod("code", "Never", "sleep 2; exit 3", ""));
    let running = node.wait_pod("code", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let uid = running.metadata.uid.clone().expect("a uid");
    let in_root = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.contains(" - cgroup2 "))
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount| {
            std::path::Path::new(mount)
                .join(&root)
                .join(format!("pod{uid}"))
                .is_dir()
        });
    assert!(in_root, "the pod's cgroup is /{root}/pod{uid}");
    // The Summary API reads the pod where it lives; the pods' cgroup is cgroupRoot itself.
    let summary: serde_json::Value =
        serde_json::from_str(&http_get(node.port, "/stats/summary")).expect("summary JSON");
    let stats = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["podRef"]["uid"] == uid.as_str())
        .unwrap_or_else(|| panic!("no stats for the pod: {summary}"));
    assert!(
        stats["memory"]["usageBytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{stats}"
    );
    let pods = &summary["node"]["systemContainers"][0];
    assert_eq!(pods["name"], "pods");
    assert!(pods["cpu"]["usageCoreNanoSeconds"].is_u64(), "{pods}");
    let before = relists(&node);
    let exited = node.wait_pod("code", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&exited, "main")),
        Some(("Error".to_owned(), 3))
    );
    assert_eq!(
        relists(&node),
        before,
        "the death was learnt from the kernel: no relist ran in between"
    );
    assert!(node.metric(r#"swiftlet_pleg_kernel_triggers_total{kind="exit"}"#) >= 1.0);
    let _ = std::fs::remove_file(&config);
}

#[test]
fn deaths_reach_the_status_with_no_relist() {
    let Some(node) = node("deaths_reach_the_status_with_no_relist", "deaths", &[]) else {
        return;
    };
    let limit = "      resources:\n        limits:\n          memory: 32Mi\n";
    node.write_manifest("code.yaml", &pod("code", "Never", "sleep 2; exit 3", ""));
    node.write_manifest(
        "signal.yaml",
        &pod("signal", "Never", "exec sleep 3600", ""),
    );
    node.write_manifest(
        "oom.yaml",
        &pod(
            "oom",
            "Never",
            "sleep 2; head -c 1000m /dev/zero | tail",
            limit,
        ),
    );
    let victim = node.wait_pod("signal", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&victim, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    let before = relists(&node);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init_pid(&id) as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the container's init");

    let killed = node.wait_pod("signal", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&killed, "main")),
        Some(("Error".to_owned(), 137))
    );
    let exited = node.wait_pod("code", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&exited, "main")),
        Some(("Error".to_owned(), 3))
    );
    let oom = node.wait_pod("oom", "Failed", |p| status::phase(p) == "Failed");
    let (reason, _) = status::terminated(status::container(&oom, "main")).unwrap_or_default();
    assert_eq!(reason, "OOMKilled");
    assert_eq!(
        relists(&node),
        before,
        "every death was learnt from the kernel: no relist ran in between"
    );
    assert!(node.metric(r#"swiftlet_pleg_kernel_triggers_total{kind="exit"}"#) >= 3.0);
    // The statuses first came from the kernel's exit events; containerd then agreed with every
    // exit code.
    let metrics = node.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l == "swiftlet_pleg_exit_code_disagreements_total 0"),
        "{metrics}"
    );
    let series = format!(
        r#"swiftlet_oom_kills_total{{namespace="default",pod="oom-{}"}}"#,
        node.name
    );
    assert!(node.metric(&series) >= 1.0, "{series}");
}

#[test]
fn a_container_started_before_the_agent_is_tracked() {
    let Some(mut node) = node(
        "a_container_started_before_the_agent_is_tracked",
        "before",
        &[],
    ) else {
        return;
    };
    node.write_manifest("old.yaml", &pod("old", "Never", "exec sleep 3600", ""));
    let running = node.wait_pod("old", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&running, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    node.restart();
    node.wait_pod("old", "Running after the restart", |p| {
        status::running(status::container(p, "main"))
    });
    // Counted only for a kernel event the index maps to a known container. (Not the relist
    // count: the agent's first sync of the pod after the restart asks for a relist of it, which
    // may land after "Running" was seen.)
    let exit_triggers = r#"swiftlet_pleg_kernel_triggers_total{kind="exit"}"#;
    let triggers_before = node.metric(exit_triggers);
    let forced_before = forced_relists(&node);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init_pid(&id) as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let dead = node.wait_pod("old", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&dead, "main")).map(|(_, code)| code),
        Some(137)
    );
    assert!(
        node.metric(exit_triggers) > triggers_before,
        "the exit was mapped to the container through the index built at start"
    );
    assert_eq!(
        forced_relists(&node),
        forced_before,
        "no lost events or broken stream forced a relist"
    );
}

/// Relists forced by lost kernel events or a broken stream, whatever the reason.
fn forced_relists(node: &Node) -> f64 {
    node.metrics()
        .lines()
        .filter(|l| l.starts_with("swiftlet_pleg_forced_relists_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn lost_events_force_a_relist_and_no_death_is_missed() {
    // A one-page ring buffer, and the agent stopped (SIGSTOP: as if descheduled under load) while
    // a pod's container forks a storm and then exits: the ring overflows, the container's own
    // exit is among what is lost, and only the relist the loss forces can find it.
    let Some(node) = node(
        "lost_events_force_a_relist_and_no_death_is_missed",
        "lost",
        &["--ring-buffer-bytes", "4096"],
    ) else {
        return;
    };
    node.write_manifest(
        "storm.yaml",
        &pod(
            "storm",
            "Never",
            "read go < /dev/null; sleep 3; i=0; while [ $i -lt 2000 ]; do true & i=$((i+1)); done; wait; exit 4",
            "",
        ),
    );
    let running = node.wait_pod("storm", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&running, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    let init = init_pid(&id);
    let agent = nix::unistd::Pid::from_raw(
        node.agent
            .as_ref()
            .map(|a| a.child.id() as i32)
            .expect("agent running"),
    );
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let deadline = std::time::Instant::now() + swiftlet_tests::event_wait();
    while std::path::Path::new(&format!("/proc/{init}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    let done = node.wait_pod("storm", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&done, "main")),
        Some(("Error".to_owned(), 4))
    );
    let lost = node.metric(r#"swiftlet_kernel_events_lost_total{kind="exit"}"#);
    assert!(lost > 0.0, "the storm overflowed the ring");
    assert!(
        node.metric(r#"swiftlet_pleg_forced_relists_total{reason="lost"}"#) >= 1.0,
        "a loss forces a relist"
    );
}

#[test]
fn processes_outside_pods_are_ignored() {
    let Some(node) = node("processes_outside_pods_are_ignored", "outside", &[]) else {
        return;
    };
    node.write_manifest(
        "inside.yaml",
        &pod("inside", "Never", "exec sleep 3600", ""),
    );
    node.wait_pod("inside", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let exits = |n: &Node| n.metric(r#"swiftlet_kernel_events_received_total{kind="exit"}"#);
    let before = exits(&node);
    for _ in 0..20 {
        let _ = Command::new("true").status();
    }
    // The agent's own kernel filter keeps them out: nothing more reached it.
    assert_eq!(exits(&node), before);
}

#[tokio::test]
async fn pod_events_reach_grpc_watchers_with_the_refreshed_status() {
    let Some(node) = node(
        "pod_events_reach_grpc_watchers_with_the_refreshed_status",
        "grpc",
        &[],
    ) else {
        return;
    };
    let mut stream = watch_pods(&node).await;
    node.write_manifest(
        "watched.yaml",
        &pod("watched", "Never", "sleep 1; exit 9", ""),
    );
    let died = first_death(&mut stream, "main").await;
    assert_eq!(died.pod_name, format!("watched-{}", node.name));
    assert_eq!(died.state, "exited");
    assert_eq!(died.exit_code, Some(9));
    assert!(died.kernel_ts_ns > 0, "caused by a kernel event");
    assert!(died.sent_ns >= died.kernel_ts_ns);
}

/// `activeDeadlineSeconds` with no resync or relist within the test's time: the agent's timer
/// at the deadline syncs the pod, which fails it with `DeadlineExceeded` and kills its container,
/// whose death the kernel-event PLEG reports like any other.
#[tokio::test]
async fn a_pod_past_its_active_deadline_is_failed_and_killed() {
    let Some(node) = node(
        "a_pod_past_its_active_deadline_is_failed_and_killed",
        "deadline",
        &[],
    ) else {
        return;
    };
    let mut stream = watch_pods(&node).await;
    node.write_manifest(
        "deadline.yaml",
        &PodManifest::new("deadline")
            .restart("Always")
            .grace(1)
            .spec("  activeDeadlineSeconds: 3\n")
            .shell("main", "exec sleep 3600", "")
            .yaml(),
    );
    let died = first_death(&mut stream, "main").await;
    assert_eq!(died.pod_name, format!("deadline-{}", node.name));
    assert!(died.kernel_ts_ns > 0, "caused by a kernel event");

    // Failed first, as the kubelet reports it; its container terminated once the kill is done.
    let pod = node.wait_pod("deadline", "Failed with main terminated", |p| {
        status::phase(p) == "Failed" && status::terminated(status::container(p, "main")).is_some()
    });
    let s = pod.status.clone().unwrap_or_default();
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let terminated = status::container(&pod, "main")
        .and_then(|c| c.state.clone())
        .and_then(|s| s.terminated)
        .expect("main terminated");
    // `sleep` as pid 1 ignores SIGTERM: SIGKILL when the 1 s grace period ends.
    assert!(
        terminated.exit_code > 128,
        "killed by a signal: {terminated:?}"
    );
    let start = s.start_time.expect("startTime").0;
    let finished = terminated.finished_at.expect("finishedAt").0;
    let deadline = start
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3))
        .expect("deadline");
    assert!(
        finished >= deadline,
        "killed at {finished}, before its deadline {deadline}"
    );
    // Not restarted, whatever its restart policy: the pod is done.
    assert_eq!(
        status::container(&pod, "main").map(|c| c.restart_count),
        Some(0)
    );
}
