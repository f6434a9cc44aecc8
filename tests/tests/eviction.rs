//! The eviction manager on the real kernel, cgroups and containerd. Memory pressure is made safe
//! for the machine: `--system-reserved` leaves the pods 1 GiB (the pods' cgroup is limited to
//! it, as the kubelet enforces node allocatable), the thresholds are on
//! `allocatableMemory.available`, and pods allocate a few hundred MiB. Each agent has its own
//! cgroup root, so the limit never touches another test's pods.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use swiftlet_tests::{
    manifest::{self, PodManifest},
    node::{Node, status},
    privileged, runtime_endpoint,
};

const MI: u64 = 1 << 20;
/// What the pods may use in total (node allocatable memory).
const ALLOCATABLE: u64 = 1024 * MI;

/// A pod whose `main` allocates `mib` MiB of anonymous memory (a shell variable holding it), then
/// runs `then` (followed by `true`, so the shell does not exec it and let go of the memory).
fn pod(name: &str, mib: u64, then: &str, resources: &str) -> String {
    let bytes = mib * MI;
    let command = format!("v=$(head -c {bytes} /dev/zero | tr '\\0' x); {then}; true");
    manifest(name, &command, resources)
}

fn manifest(name: &str, command: &str, resources: &str) -> String {
    PodManifest::new(name)
        .restart("Never")
        .grace(1)
        .shell("main", command, resources)
        .yaml()
}

fn guaranteed(memory: &str) -> String {
    manifest::guaranteed("100m", memory)
}

fn burstable(memory: &str) -> String {
    manifest::burstable(memory)
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .expect("meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("MemTotal")
        * 1024
}

/// An agent whose pods may use [`ALLOCATABLE`] in their own cgroup root, with `extra` flags.
fn node(test: &str, name: &str, extra: &[&str]) -> Option<Node> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let config = std::env::temp_dir().join(format!("swiftlet-{name}-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        // A slice under the systemd driver (`swiftlet_tests::driver`).
        format!(
            "cgroupRoot: {}\n",
            swiftlet_tests::driver::own_cgroup_root(&format!("swiftlet-eviction-{name}"))
        ),
    )
    .expect("config file");
    let reserved = format!("memory={}", mem_total() - ALLOCATABLE);
    let mut args = vec![
        "--config",
        config.to_str().expect("utf-8 path"),
        "--system-reserved",
        reserved.as_str(),
    ];
    args.extend_from_slice(extra);
    Some(Node::start_with(name, &endpoint, &args))
}

fn evicted(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    status::phase(pod) == "Failed"
        && pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Waits until the node reports (or stops reporting) MemoryPressure; fails with what the agent
/// observed and logged otherwise.
fn wait_memory_pressure(node: &Node, want: bool, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = node.metric("swiftlet_node_pressure_condition{condition=\"MemoryPressure\"}");
        if (now > 0.0) == want {
            return;
        }
        if Instant::now() > deadline {
            let metrics = node.metrics();
            let eviction: Vec<&str> = metrics
                .lines()
                .filter(|l| l.contains("eviction") && !l.starts_with('#'))
                .collect();
            let log = node.log_lines();
            panic!(
                "MemoryPressure never became {want}; eviction metrics:\n{}\nlog tail:\n{}",
                eviction.join("\n"),
                log[log.len().saturating_sub(30)..].join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn restarts(pod: &k8s_openapi::api::core::v1::Pod) -> i32 {
    status::container(pod, "main").map_or(-1, |c| c.restart_count)
}

/// Whether this node's memory controller is cgroup v1 (where usage thresholds notify).
fn memory_v1() -> bool {
    std::path::Path::new("/sys/fs/cgroup/memory/cgroup.event_control").exists()
}

#[test]
fn memory_pressure_evicts_the_best_effort_pod_and_no_other() {
    let Some(node) = node(
        "memory_pressure_evicts_the_best_effort_pod_and_no_other",
        "evict",
        &["--eviction-hard", "allocatableMemory.available<600Mi"],
    ) else {
        return;
    };
    node.write_manifest(
        "guaranteed.yaml",
        &pod("guaranteed", 100, "sleep 3600", &guaranteed("300Mi")),
    );
    node.write_manifest(
        "bystander.yaml",
        &pod("bystander", 0, "sleep 3600", &burstable("50Mi")),
    );
    for name in ["guaranteed", "bystander"] {
        node.wait_pod(name, "Running", |p| status::phase(p) == "Running");
    }
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        0.0
    );

    // 100 MiB + 450 MiB of the pods' 1 GiB: less than 600 MiB left.
    node.write_manifest("hog.yaml", &pod("hog", 450, "sleep 3600", ""));
    let hog = node.wait_pod("hog", "Evicted", evicted);
    let message = hog
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: 600Mi"),
        "{message}"
    );
    assert!(
        message.contains("Container main was using"),
        "names the container: {message}"
    );
    assert_eq!(
        status::condition(&hog, "DisruptionTarget").as_deref(),
        Some("True")
    );
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        1.0
    );
    assert_eq!(
        node.metric("swiftlet_node_pressure_condition{condition=\"MemoryPressure\"}"),
        1.0,
        "MemoryPressure holds for the transition period"
    );
    if memory_v1() {
        assert!(
            node.metric("swiftlet_eviction_wakeups_total{source=\"memcg\"}") >= 1.0,
            "the memory cgroup usage threshold woke the manager"
        );
    }

    // Nothing else was touched, and nothing more is evicted once the pressure is gone.
    std::thread::sleep(Duration::from_secs(2));
    for name in ["guaranteed", "bystander"] {
        let pod = node.pod(name).expect("still listed");
        assert_eq!(status::phase(&pod), "Running", "{name} untouched");
        assert_eq!(restarts(&pod), 0, "{name} never restarted");
    }
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        1.0
    );

    // Under memory pressure a new BestEffort pod is turned away; a Burstable one is admitted.
    node.write_manifest("late.yaml", &pod("late", 0, "sleep 3600", ""));
    let late = node.wait_pod("late", "rejected", |p| status::phase(p) == "Failed");
    assert_eq!(
        late.status.as_ref().and_then(|s| s.message.as_deref()),
        Some("The node had condition: [MemoryPressure]. ")
    );
    node.write_manifest(
        "welcome.yaml",
        &pod("welcome", 0, "sleep 3600", &burstable("10Mi")),
    );
    node.wait_pod("welcome", "Running", |p| status::phase(p) == "Running");
}

#[test]
fn a_soft_threshold_evicts_only_after_its_grace_period() {
    let Some(node) = node(
        "a_soft_threshold_evicts_only_after_its_grace_period",
        "soft",
        &[
            "--eviction-hard",
            "allocatableMemory.available<10Mi",
            "--eviction-soft",
            "allocatableMemory.available<600Mi",
            "--eviction-soft-grace-period",
            "allocatableMemory.available=6s",
        ],
    ) else {
        return;
    };
    node.write_manifest("hog.yaml", &pod("hog", 500, "sleep 3600", ""));
    node.wait_pod("hog", "Running", |p| status::phase(p) == "Running");
    // The condition comes first (the threshold is met), the eviction only after the grace period.
    wait_memory_pressure(&node, true, Duration::from_secs(60));
    let pod = node.pod("hog").expect("listed");
    assert!(
        !evicted(&pod),
        "evicted as soon as the soft threshold was met"
    );
    node.wait_pod("hog", "Evicted", evicted);
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        1.0
    );
}

#[test]
fn pressure_that_ends_within_the_grace_period_evicts_nothing() {
    let Some(node) = node(
        "pressure_that_ends_within_the_grace_period_evicts_nothing",
        "brief",
        &[
            "--eviction-hard",
            "allocatableMemory.available<10Mi",
            "--eviction-soft",
            "allocatableMemory.available<600Mi",
            "--eviction-soft-grace-period",
            "allocatableMemory.available=40s",
            "--eviction-pressure-transition-period",
            "2s",
        ],
    ) else {
        return;
    };
    // Holds 500 MiB for 12 s, then exits: the pressure is over long before 40 s, and lasts
    // longer than the 10 s check, so MemoryPressure shows whichever wake-up sees it first.
    node.write_manifest("brief.yaml", &pod("brief", 500, "sleep 12", ""));
    wait_memory_pressure(&node, true, Duration::from_secs(60));
    let done = node.wait_pod("brief", "Succeeded", |p| {
        status::phase(p) != "Pending" && status::phase(p) != "Running"
    });
    assert_eq!(status::phase(&done), "Succeeded", "{:?}", done.status);
    // The transition period passes and the condition clears, with no eviction ever.
    wait_memory_pressure(&node, false, Duration::from_secs(60));
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        0.0
    );
}

#[test]
fn a_container_over_its_own_limit_is_oom_killed_not_evicted() {
    let Some(node) = node(
        "a_container_over_its_own_limit_is_oom_killed_not_evicted",
        "ownlimit",
        &["--eviction-hard", "allocatableMemory.available<100Mi"],
    ) else {
        return;
    };
    let resources = "      resources:\n        limits:\n          memory: 32Mi\n";
    node.write_manifest(
        "hog.yaml",
        // `tail` keeps all it reads (no newline): it grows until the limit kills it, and the
        // container with it.
        &manifest("hog", "head -c 1000m /dev/zero | tail", resources),
    );
    let pod = node.wait_pod("hog", "Failed", |p| status::phase(p) == "Failed");
    let (reason, code) = status::terminated(status::container(&pod, "main")).unwrap_or_default();
    assert_eq!(reason, "OOMKilled", "exit code {code}");
    assert_ne!(
        pod.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("Evicted")
    );
    // The kill woke the manager, which found the node fine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.metric("swiftlet_eviction_wakeups_total{source=\"oom\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the OOM kill never woke the eviction manager"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        node.metric("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"}"),
        0.0
    );
    assert_eq!(
        node.metric("swiftlet_node_pressure_condition{condition=\"MemoryPressure\"}"),
        0.0
    );
}
