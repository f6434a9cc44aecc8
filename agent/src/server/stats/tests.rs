//! The Summary from fixture cgroup and /proc files, on cgroup v2 and on v1 controllers (hybrid),
//! with an injected clock so `usageNanoCores` is exact.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
use serde_json::json;

use super::*;
use crate::cm::CgroupLayout;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

const POD: &str = "kubepods/burstable/podu1";
const MI: u64 = 1 << 20;

fn pod() -> Pod {
    crate::testing::pod()
        .named("default", "web", "u1")
        .container_statuses(vec![
            ContainerStatus {
                name: "app".into(),
                container_id: Some("containerd://c0ffee".into()),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            },
            // Not running: not reported.
            ContainerStatus {
                name: "done".into(),
                container_id: Some("containerd://dead".into()),
                ..ContainerStatus::default()
            },
        ])
        .build()
}

fn proc_files(proc: &Path) {
    write(
        &proc.join("meminfo"),
        "MemTotal:       4194304 kB\nMemFree:        1048576 kB\nInactive(file):  524288 kB\n",
    );
    write(&proc.join("stat"), "cpu  1 2 3\nbtime 1700000000\n");
    write(&proc.join("loadavg"), "0.00 0.01 0.05 2/321 4567\n");
    write(&proc.join("sys/kernel/pid_max"), "4194304\n");
    for r in ["cpu", "memory", "io"] {
        write(
            &proc.join("pressure").join(r),
            "some avg10=1.50 avg60=0.50 avg300=0.10 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n",
        );
    }
}

fn provider(layout: CgroupLayout, dir: &Path, clock: Arc<Mutex<SystemTime>>) -> SummaryProvider {
    let observer = NodeObserver {
        layout,
        pods_cgroup: "kubepods".into(),
        pod_cgroups: crate::cgroup::PodCgroupLayout::new(Path::new("/"), true),
        memory_capacity: 4 << 30,
        allocatable_memory: 3 << 30,
        nodefs: dir.to_owned(),
        imagefs: dir.to_owned(),
        proc: dir.join("proc"),
        psi: Vec::new(),
    };
    SummaryProvider::new(
        "node-1".into(),
        dir.join("logs"),
        observer,
        Arc::new(|| vec![pod()]),
        Arc::new(|_| Some(POD.to_owned())),
        Arc::new(move || *clock.lock().expect("lock")),
    )
}

fn v2_cgroup(dir: &Path, usage_usec: u64, current: u64, inactive: u64, max: &str) {
    write(
        &dir.join("cpu.stat"),
        &format!("usage_usec {usage_usec}\nuser_usec 1\n"),
    );
    write(&dir.join("memory.current"), &format!("{current}\n"));
    write(
        &dir.join("memory.stat"),
        &format!(
            "anon {}\ninactive_file {inactive}\npgfault 77\npgmajfault 3\n",
            current / 2
        ),
    );
    write(&dir.join("memory.max"), max);
}

/// The node part of `summary_on_cgroup_v2`'s first summary.
fn assert_v2_node(node: &serde_json::Value) {
    assert_eq!(node["nodeName"], "node-1");
    assert_eq!(node["startTime"], "2023-11-14T22:13:20Z");
    assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 50_000_000_000u64);
    // One reading: no rate yet.
    assert!(node["cpu"].get("usageNanoCores").is_none(), "{node}");
    // The v2 root: usage and working set from /proc/meminfo (4 GiB − 1 GiB free − 0.5 GiB).
    assert_eq!(node["memory"]["usageBytes"], 3072 * MI);
    assert_eq!(node["memory"]["workingSetBytes"], 2560 * MI);
    assert_eq!(node["memory"]["availableBytes"], 1536 * MI);
    assert_eq!(
        node["memory"]["psi"]["some"],
        json!({"total": 1234, "avg10": 1.5, "avg60": 0.5, "avg300": 0.1})
    );
    assert_eq!(node["systemContainers"][0]["name"], "pods");
    assert_eq!(
        node["systemContainers"][0]["memory"]["workingSetBytes"],
        200 * MI
    );
    assert_eq!(node["rlimit"]["maxpid"], 4194304);
    assert_eq!(node["rlimit"]["curproc"], 321);
    assert!(
        node["fs"]["capacityBytes"].as_u64().unwrap_or(0) > 0,
        "{node}"
    );
    assert!(
        node["runtime"]["imageFs"]["availableBytes"].is_u64(),
        "{node}"
    );
    assert_eq!(node["io"]["psi"]["full"]["total"], 5);
}

/// The pod part of `summary_on_cgroup_v2`'s first summary.
fn assert_v2_pod(pod: &serde_json::Value) {
    assert_eq!(
        pod["podRef"],
        json!({"name": "web", "namespace": "default", "uid": "u1"})
    );
    assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 4_000_000_000u64);
    assert_eq!(
        pod["memory"],
        json!({
            "time": "2023-11-14T22:15:00Z",
            "availableBytes": 362 * MI,
            "usageBytes": 200 * MI,
            "workingSetBytes": 150 * MI,
            "rssBytes": 100 * MI,
            "pageFaults": 77,
            "majorPageFaults": 3,
            "psi": {
                "some": {"total": 999, "avg10": 42.0, "avg60": 1.0, "avg300": 0.0},
                "full": {"total": 10, "avg10": 2.0, "avg60": 0.0, "avg300": 0.0},
            },
        })
    );
    assert_eq!(pod["process_stats"]["process_count"], 3);
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0]["name"], "app");
    assert_eq!(containers[0]["memory"]["workingSetBytes"], 100 * MI);
    assert_eq!(containers[0]["memory"]["availableBytes"], 156 * MI);
    assert_eq!(containers[0]["logs"]["usedBytes"], 1234);
    assert!(containers[0]["logs"]["capacityBytes"].is_u64());
}

/// A cgroup v2 node below `tmp`: its /proc files, the root cgroup and `kubepods`; returns the
/// cgroup root.
fn v2_node(tmp: &Path) -> PathBuf {
    let root = tmp.join("cgroup");
    proc_files(&tmp.join("proc"));
    v2_cgroup(&root, 50_000_000, 0, 0, "max\n");
    v2_cgroup(
        &root.join("kubepods"),
        9_000_000,
        300 * MI,
        100 * MI,
        "max\n",
    );
    root
}

#[test]
fn summary_on_cgroup_v2() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = v2_node(tmp.path());
    v2_cgroup(
        &root.join(POD),
        4_000_000,
        200 * MI,
        50 * MI,
        &format!("{}\n", 512 * MI),
    );
    v2_cgroup(
        &root.join(POD).join("c0ffee"),
        3_000_000,
        150 * MI,
        50 * MI,
        &format!("{}\n", 256 * MI),
    );
    write(&root.join(POD).join("pids.current"), "3\n");
    write(
        &tmp.path().join("logs/default_web_u1/app/0.log"),
        &"x".repeat(1000),
    );
    write(
        &tmp.path().join("logs/default_web_u1/app/1.log"),
        &"y".repeat(234),
    );
    for r in ["cpu", "memory", "io"] {
        write(
            &root.join(POD).join(format!("{r}.pressure")),
            "some avg10=42.00 avg60=1.00 avg300=0.00 total=999\nfull avg10=2.00 avg60=0.00 avg300=0.00 total=10\n",
        );
    }
    let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_100);
    let clock = Arc::new(Mutex::new(t0));
    let provider = provider(
        CgroupLayout::Unified { root: root.clone() },
        tmp.path(),
        clock.clone(),
    );

    let first = serde_json::to_value(provider.summary(false)).expect("JSON");
    assert_v2_node(&first["node"]);
    assert_v2_pod(&first["pods"][0]);

    // Two seconds later the container used one more CPU-second: half a core.
    *clock.lock().expect("lock") = t0 + Duration::from_secs(2);
    v2_cgroup(
        &root.join(POD).join("c0ffee"),
        4_000_000,
        150 * MI,
        50 * MI,
        "max\n",
    );
    let second = serde_json::to_value(provider.summary(false)).expect("JSON");
    let container = &second["pods"][0]["containers"][0];
    assert_eq!(container["cpu"]["usageNanoCores"], 500_000_000);
    assert_eq!(container["cpu"]["usageCoreNanoSeconds"], 4_000_000_000u64);
    // Unchanged pod counters: zero cores, still reported.
    assert_eq!(second["pods"][0]["cpu"]["usageNanoCores"], 0);
    // Without a limit there is no availableBytes.
    assert!(container["memory"].get("availableBytes").is_none());

    // The cheap form leaves out filesystems and limits.
    let cheap = serde_json::to_value(provider.summary(true)).expect("JSON");
    assert!(cheap["node"].get("fs").is_none());
    assert!(cheap["node"].get("rlimit").is_none());
    assert!(cheap["node"]["cpu"].is_object());
}

#[test]
fn summary_on_v1_controllers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let v1 = tmp.path().join("cgroup");
    let unified = v1.join("unified");
    proc_files(&tmp.path().join("proc"));
    let mem = v1.join("memory");
    let cpu = v1.join("cpuacct");
    for (path, usage, inactive) in [
        ("", 3000 * MI, 500 * MI),
        ("kubepods", 300 * MI, 100 * MI),
        (POD, 200 * MI, 50 * MI),
    ] {
        let dir = mem.join(path);
        write(&dir.join("memory.usage_in_bytes"), &format!("{usage}\n"));
        write(
            &dir.join("memory.stat"),
            &format!(
                "cache 1\ntotal_rss {}\ntotal_inactive_file {inactive}\ntotal_pgfault 9\ntotal_pgmajfault 1\n",
                usage / 4
            ),
        );
        write(&dir.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(&cpu.join(path).join("cpuacct.usage"), "123456789\n");
    }
    write(
        &mem.join(POD).join("memory.limit_in_bytes"),
        &format!("{}\n", 1024 * MI),
    );
    let clock = Arc::new(Mutex::new(UNIX_EPOCH + Duration::from_secs(1_700_000_100)));
    let provider = provider(
        CgroupLayout::Hybrid {
            unified,
            v1_root: v1.clone(),
        },
        tmp.path(),
        clock,
    );
    let summary = serde_json::to_value(provider.summary(false)).expect("JSON");
    let node = &summary["node"]["memory"];
    assert_eq!(node["usageBytes"], 3000 * MI);
    assert_eq!(node["workingSetBytes"], 2500 * MI);
    assert_eq!(node["rssBytes"], 750 * MI);
    assert_eq!(summary["node"]["cpu"]["usageCoreNanoSeconds"], 123_456_789);
    let pod = &summary["pods"][0]["memory"];
    assert_eq!(pod["workingSetBytes"], 150 * MI);
    assert_eq!(pod["availableBytes"], 874 * MI);
    assert_eq!(pod["pageFaults"], 9);
    // No cgroup2 pressure files for this pod: no PSI, not an error.
    assert!(pod.get("psi").is_none());
}

#[test]
fn the_sampler_needs_two_forward_readings() {
    let s = CpuSampler::default();
    let t0 = UNIX_EPOCH + Duration::from_secs(100);
    assert_eq!(s.nano_cores("a", t0, 1_000), None);
    assert_eq!(
        s.nano_cores("a", t0 + Duration::from_secs(1), 2_000_000_000),
        Some(1_999_999_000)
    );
    // An older reading (a concurrent request) is ignored; a reset counter gives no rate.
    assert_eq!(s.nano_cores("a", t0, 5), None);
    assert_eq!(s.nano_cores("a", t0 + Duration::from_secs(2), 10), None);
    s.retain(&|k| k != "a");
    assert_eq!(s.nano_cores("a", t0 + Duration::from_secs(3), 20), None);
}

#[test]
fn resource_metrics_as_metrics_server_reads_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = v2_node(tmp.path());
    v2_cgroup(&root.join(POD), 4_000_000, 200 * MI, 50 * MI, "max\n");
    v2_cgroup(
        &root.join(POD).join("c0ffee"),
        1_500_000,
        150 * MI,
        50 * MI,
        "max\n",
    );
    let clock = Arc::new(Mutex::new(UNIX_EPOCH + Duration::from_secs(1_700_000_100)));
    let provider = provider(CgroupLayout::Unified { root }, tmp.path(), clock);
    let text = resource_metrics::render(&provider.summary(true));
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "# TYPE container_cpu_usage_seconds_total counter",
        "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 1.5 1700000100000",
        "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 104857600 1700000100000",
        "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1700000100 1700000100000",
        "node_cpu_usage_seconds_total 50 1700000100000",
        "node_memory_working_set_bytes 2684354560 1700000100000",
        "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 4 1700000100000",
        "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 157286400 1700000100000",
        "resource_scrape_error 0",
    ] {
        assert!(lines.contains(&want), "missing {want:?} in\n{text}");
    }
}
