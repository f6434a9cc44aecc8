//! `/metrics/cadvisor` from fixture cgroup and /proc files on cgroup v2 and on v1 controllers,
//! read back through a small exposition-format parser.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use k8s_openapi::{
    api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};

use super::super::{SummaryProvider, cgroup::weight_to_shares};
use crate::{cm::CgroupLayout, eviction::observe::NodeObserver};

const POD: &str = "kubepods/burstable/podu1";
const MI: u64 = 1 << 20;
const T0: u64 = 1_700_000_100;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn pod(name: &str) -> Pod {
    pod_with_id(name, "containerd://c0ffee")
}

fn pod_with_id(name: &str, container_id: &str) -> Pod {
    let started = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time");
    crate::testing::pod()
        .named("default", name, "u1")
        .container_statuses(vec![ContainerStatus {
            name: "app".into(),
            image: "docker.io/library/busybox:1.36".into(),
            container_id: Some(container_id.into()),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(started)),
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }])
        .build()
}

fn provider(layout: CgroupLayout, dir: &Path, pod: Pod) -> SummaryProvider {
    let proc = dir.join("proc");
    write(
        &proc.join("meminfo"),
        "MemTotal:       4194304 kB\nMemFree:        1048576 kB\nInactive(file):  524288 kB\n",
    );
    write(
        &proc.join("stat"),
        "cpu  1 2 3\ncpu0 1 1 1\ncpu1 1 1 1\nintr 5\nbtime 1700000000\n",
    );
    write(&proc.join("sys/kernel/random/boot_id"), "b007\n");
    let observer = NodeObserver {
        layout,
        pods_cgroup: "kubepods".into(),
        pod_cgroups: crate::cgroup::PodCgroupLayout::new(Path::new("/"), true),
        memory_capacity: 4 << 30,
        allocatable_memory: 3 << 30,
        nodefs: dir.to_owned(),
        imagefs: dir.to_owned(),
        proc,
        psi: Vec::new(),
    };
    SummaryProvider::new(
        "node-1".into(),
        dir.join("logs"),
        observer,
        Arc::new(move || vec![pod.clone()]),
        Arc::new(|_| Some(POD.to_owned())),
        Arc::new(|| UNIX_EPOCH + Duration::from_secs(T0)),
    )
}

/// One sample line: name, labels, value, timestamp.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
    at: Option<i64>,
}

/// Parses the text format strictly: each sample's family declared by `# TYPE` before it, label
/// values unescaped, a float value and an optional integer timestamp. Panics on anything else.
fn parse(text: &str) -> Vec<Series> {
    let mut typed = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(["counter", "gauge"].contains(&kind), "{line}");
            typed.push(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let end = line.find(['{', ' ']).expect("a sample line");
        let name = &line[..end];
        assert!(typed.iter().any(|t| t == name), "undeclared {name}: {line}");
        let mut labels = BTreeMap::new();
        let mut rest = &line[end..];
        if let Some(mut inner) = rest.strip_prefix('{') {
            loop {
                if let Some(after) = inner.strip_prefix('}') {
                    rest = after;
                    break;
                }
                inner = inner.strip_prefix(',').unwrap_or(inner);
                let (key, after) = inner.split_once("=\"").expect("label=\"");
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "label name {key:?} in {line}"
                );
                let mut value = String::new();
                let mut chars = after.char_indices();
                let close = loop {
                    let (i, c) = chars.next().expect("closing quote");
                    match c {
                        '\\' => match chars.next().expect("escape").1 {
                            'n' => value.push('\n'),
                            c @ ('\\' | '"') => value.push(c),
                            c => panic!("bad escape \\{c} in {line}"),
                        },
                        '"' => break i,
                        c => value.push(c),
                    }
                };
                labels.insert(key.to_owned(), value);
                inner = &after[close + 1..];
            }
        }
        let mut fields = rest.split_whitespace();
        let value = fields.next().expect("value").parse().expect("float value");
        let at = fields.next().map(|t| t.parse().expect("integer timestamp"));
        assert!(fields.next().is_none(), "trailing text: {line}");
        out.push(Series {
            name: name.to_owned(),
            labels,
            value,
            at,
        });
    }
    out
}

fn find<'a>(series: &'a [Series], name: &str, id: &str) -> Option<&'a Series> {
    series
        .iter()
        .find(|s| s.name == name && s.labels.get("id").map(String::as_str) == Some(id))
}

fn value(series: &[Series], name: &str, id: &str) -> f64 {
    find(series, name, id)
        .unwrap_or_else(|| panic!("no {name} for {id}"))
        .value
}

fn v2_cgroup(dir: &Path, usage_usec: u64, current: u64) {
    write(
        &dir.join("cpu.stat"),
        &format!(
            "usage_usec {usage_usec}\nuser_usec 2000000\nsystem_usec 1000000\nnr_periods 40\nnr_throttled 4\nthrottled_usec 250000\n"
        ),
    );
    write(&dir.join("memory.current"), &format!("{current}\n"));
    write(
        &dir.join("memory.stat"),
        &format!(
            "anon {}\nfile {}\nfile_mapped 4096\ninactive_file {}\n",
            current / 2,
            current / 4,
            current / 4
        ),
    );
}

#[test]
fn cgroup_v2_figures_become_cadvisors_series() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    v2_cgroup(&root, 50_000_000, 0);
    v2_cgroup(&root.join(POD), 4_000_000, 200 * MI);
    write(&root.join(POD).join("memory.max"), "max\n");
    let c = root.join(POD).join("c0ffee");
    v2_cgroup(&c, 3_000_000, 160 * MI);
    write(&c.join("memory.max"), &format!("{}\n", 256 * MI));
    write(&c.join("memory.peak"), &format!("{}\n", 180 * MI));
    write(&c.join("memory.swap.current"), "0\n");
    write(
        &c.join("memory.events"),
        "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    );
    write(&c.join("cpu.max"), "50000 100000\n");
    write(&c.join("cpu.weight"), "39\n");
    write(&c.join("pids.current"), "7\n");
    let provider = provider(CgroupLayout::Unified { root }, tmp.path(), pod("web"));

    let text = provider.cadvisor().expect("render");
    let series = parse(&text);
    let id = "/kubepods/burstable/podu1/c0ffee";
    let usage = find(&series, "container_cpu_usage_seconds_total", id).expect("cpu usage");
    let want: BTreeMap<String, String> = [
        ("container", "app"),
        ("cpu", "total"),
        ("id", id),
        ("image", "docker.io/library/busybox:1.36"),
        ("name", "c0ffee"),
        ("namespace", "default"),
        ("pod", "web"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(usage.labels, want);
    assert_eq!(usage.value, 3.0);
    assert_eq!(usage.at, Some(T0 as i64 * 1000));
    assert_eq!(value(&series, "container_cpu_user_seconds_total", id), 2.0);
    assert_eq!(
        value(&series, "container_cpu_system_seconds_total", id),
        1.0
    );
    assert_eq!(value(&series, "container_cpu_cfs_periods_total", id), 40.0);
    assert_eq!(
        value(&series, "container_cpu_cfs_throttled_periods_total", id),
        4.0
    );
    assert_eq!(
        value(&series, "container_cpu_cfs_throttled_seconds_total", id),
        0.25
    );
    assert_eq!(value(&series, "container_spec_cpu_quota", id), 50_000.0);
    assert_eq!(value(&series, "container_spec_cpu_period", id), 100_000.0);
    assert_eq!(value(&series, "container_spec_cpu_shares", id), 998.0);
    assert_eq!(
        value(&series, "container_spec_memory_limit_bytes", id),
        (256 * MI) as f64
    );
    assert_eq!(
        value(&series, "container_memory_working_set_bytes", id),
        (120 * MI) as f64
    );
    assert_eq!(
        value(&series, "container_memory_usage_bytes", id),
        (160 * MI) as f64
    );
    assert_eq!(value(&series, "container_memory_rss", id), (80 * MI) as f64);
    assert_eq!(
        value(&series, "container_memory_cache", id),
        (40 * MI) as f64
    );
    assert_eq!(value(&series, "container_memory_mapped_file", id), 4096.0);
    assert_eq!(value(&series, "container_memory_swap", id), 0.0);
    assert_eq!(
        value(&series, "container_memory_max_usage_bytes", id),
        (180 * MI) as f64
    );
    assert_eq!(value(&series, "container_oom_events_total", id), 1.0);
    assert_eq!(value(&series, "container_threads", id), 7.0);
    assert_eq!(
        value(&series, "container_start_time_seconds", id),
        1_700_000_000.0
    );
    assert_eq!(value(&series, "container_last_seen", id), T0 as f64);
    // Spec series carry no timestamp, as cAdvisor's.
    assert_eq!(
        find(&series, "container_spec_cpu_period", id)
            .expect("period")
            .at,
        None
    );

    // The pod's cgroup: no container, image nor name; no limit is 0; no quota, no CFS series.
    let pod_id = "/kubepods/burstable/podu1";
    let pod = find(&series, "container_memory_working_set_bytes", pod_id).expect("pod ws");
    assert_eq!(pod.labels["container"], "");
    assert_eq!(pod.labels["image"], "");
    assert_eq!(pod.labels["name"], "");
    assert_eq!(pod.labels["pod"], "web");
    assert_eq!(pod.value, (150 * MI) as f64);
    assert_eq!(
        value(&series, "container_spec_memory_limit_bytes", pod_id),
        0.0
    );
    assert!(find(&series, "container_cpu_cfs_periods_total", pod_id).is_none());
    assert!(find(&series, "container_spec_cpu_quota", pod_id).is_none());
    // Missing files: no peak, swap, events, pids nor cpu.max for the pod: left out, not zero.
    for name in [
        "container_memory_max_usage_bytes",
        "container_memory_swap",
        "container_oom_events_total",
        "container_threads",
        "container_spec_cpu_period",
    ] {
        assert!(find(&series, name, pod_id).is_none(), "{name} for the pod");
    }

    // The root: id="/", the node's figures.
    assert_eq!(
        value(&series, "container_cpu_usage_seconds_total", "/"),
        50.0
    );
    assert_eq!(
        value(&series, "container_memory_working_set_bytes", "/"),
        (2560 * MI) as f64
    );
    let cores = series
        .iter()
        .find(|s| s.name == "machine_cpu_cores")
        .expect("machine_cpu_cores");
    assert_eq!(cores.value, 2.0);
    assert_eq!(cores.labels["boot_id"], "b007");
    let memory = series
        .iter()
        .find(|s| s.name == "machine_memory_bytes")
        .expect("machine_memory_bytes");
    assert_eq!(memory.value, (4u64 << 30) as f64);
    assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));
    assert!(
        text.contains("# HELP container_memory_working_set_bytes Current working set in bytes.\n")
    );
}

#[test]
fn v1_controllers_give_the_same_series() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let v1 = tmp.path().join("cgroup");
    let c = format!("{POD}/c0ffee");
    for (path, usage) in [("", 3000 * MI), (POD, 200 * MI), (c.as_str(), 100 * MI)] {
        let mem = v1.join("memory").join(path);
        write(&mem.join("memory.usage_in_bytes"), &format!("{usage}\n"));
        write(
            &mem.join("memory.stat"),
            &format!(
                "cache 1\ntotal_cache {}\ntotal_rss {}\ntotal_mapped_file 8192\ntotal_inactive_file {}\n",
                usage / 4,
                usage / 2,
                usage / 4
            ),
        );
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        let acct = v1.join("cpuacct").join(path);
        write(&acct.join("cpuacct.usage"), "1500000000\n");
        write(&acct.join("cpuacct.stat"), "user 100\nsystem 50\n");
        let cpu = v1.join("cpu").join(path);
        write(&cpu.join("cpu.shares"), "1024\n");
        write(&cpu.join("cpu.cfs_period_us"), "100000\n");
        write(&cpu.join("cpu.cfs_quota_us"), "-1\n");
        write(
            &cpu.join("cpu.stat"),
            "nr_periods 10\nnr_throttled 2\nthrottled_time 300000000\n",
        );
    }
    let mem = v1.join("memory").join(&c);
    write(
        &mem.join("memory.limit_in_bytes"),
        &format!("{}\n", 128 * MI),
    );
    write(
        &mem.join("memory.max_usage_in_bytes"),
        &format!("{}\n", 110 * MI),
    );
    write(
        &mem.join("memory.memsw.usage_in_bytes"),
        &format!("{}\n", 101 * MI),
    );
    write(
        &mem.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    );
    write(&v1.join("cpu").join(&c).join("cpu.cfs_quota_us"), "20000\n");
    write(&v1.join("pids").join(&c).join("pids.current"), "3\n");
    let provider = provider(
        CgroupLayout::Hybrid {
            unified: v1.join("unified"),
            v1_root: v1.clone(),
        },
        tmp.path(),
        pod("web"),
    );

    let series = parse(&provider.cadvisor().expect("render"));
    let id = format!("/{c}");
    let id = id.as_str();
    assert_eq!(value(&series, "container_cpu_usage_seconds_total", id), 1.5);
    // cpuacct.stat counts USER_HZ ticks.
    assert_eq!(value(&series, "container_cpu_user_seconds_total", id), 1.0);
    assert_eq!(
        value(&series, "container_cpu_system_seconds_total", id),
        0.5
    );
    assert_eq!(
        value(&series, "container_cpu_cfs_throttled_seconds_total", id),
        0.3
    );
    assert_eq!(value(&series, "container_spec_cpu_quota", id), 20_000.0);
    assert_eq!(value(&series, "container_spec_cpu_shares", id), 1024.0);
    assert_eq!(
        value(&series, "container_spec_memory_limit_bytes", id),
        (128 * MI) as f64
    );
    assert_eq!(
        value(&series, "container_memory_working_set_bytes", id),
        (75 * MI) as f64
    );
    assert_eq!(value(&series, "container_memory_rss", id), (50 * MI) as f64);
    assert_eq!(
        value(&series, "container_memory_cache", id),
        (25 * MI) as f64
    );
    assert_eq!(value(&series, "container_memory_mapped_file", id), 8192.0);
    assert_eq!(value(&series, "container_memory_swap", id), MI as f64);
    assert_eq!(
        value(&series, "container_memory_max_usage_bytes", id),
        (110 * MI) as f64
    );
    assert_eq!(value(&series, "container_oom_events_total", id), 2.0);
    assert_eq!(value(&series, "container_threads", id), 3.0);
    // The pod: quota -1 is none, so neither the quota nor the CFS series; the v1 "unlimited"
    // limit is cAdvisor's 0.
    let pod_id = format!("/{POD}");
    assert!(find(&series, "container_spec_cpu_quota", &pod_id).is_none());
    assert!(find(&series, "container_cpu_cfs_periods_total", &pod_id).is_none());
    assert_eq!(
        value(&series, "container_spec_memory_limit_bytes", &pod_id),
        0.0
    );
}

#[test]
fn a_container_without_its_files_has_no_series_and_no_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    v2_cgroup(&root, 50_000_000, 0);
    v2_cgroup(&root.join(POD), 4_000_000, 200 * MI);
    // The container's directory exists, but holds only a garbled memory.current.
    let c = root.join(POD).join("c0ffee");
    write(&c.join("memory.current"), "not a number\n");
    // A file beyond the read cap is not read (a cgroup file is never that large).
    write(&c.join("cpu.stat"), &"usage_usec 1\n".repeat(10_000));
    let provider = provider(CgroupLayout::Unified { root }, tmp.path(), pod("web"));
    let series = parse(&provider.cadvisor().expect("render"));
    let id = "/kubepods/burstable/podu1/c0ffee";
    for name in [
        "container_cpu_usage_seconds_total",
        "container_cpu_user_seconds_total",
        "container_memory_usage_bytes",
        "container_memory_working_set_bytes",
        "container_spec_memory_limit_bytes",
    ] {
        assert!(find(&series, name, id).is_none(), "{name}: {series:?}");
    }
    // What is known is still told, and the pod is unaffected.
    assert_eq!(
        value(&series, "container_start_time_seconds", id),
        1_700_000_000.0
    );
    assert_eq!(
        value(
            &series,
            "container_cpu_usage_seconds_total",
            "/kubepods/burstable/podu1"
        ),
        4.0
    );
}

#[test]
fn a_hostile_pod_name_stays_one_series() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    v2_cgroup(&root, 50_000_000, 0);
    v2_cgroup(&root.join(POD), 4_000_000, 200 * MI);
    v2_cgroup(&root.join(POD).join("c0ffee"), 3_000_000, 100 * MI);
    let hostile = "web\"} 1\nfake_series{pod=\"x\\\"} 2";
    let provider = provider(CgroupLayout::Unified { root }, tmp.path(), pod(hostile));
    let text = provider.cadvisor().expect("render");
    let series = parse(&text);
    assert!(series.iter().all(|s| s.name != "fake_series"), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("fake_series")),
        "{text}"
    );
    let with_pod: Vec<&Series> = series
        .iter()
        .filter(|s| s.name == "container_memory_working_set_bytes")
        .filter(|s| s.labels.get("pod").map(String::as_str) == Some(hostile))
        .collect();
    // The container's and the pod's cgroup, each one series carrying the name unchanged.
    assert_eq!(with_pod.len(), 2, "{text}");
}

#[test]
fn a_container_id_that_walks_out_of_its_pod_is_not_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    v2_cgroup(&root, 50_000_000, 0);
    v2_cgroup(&root.join(POD), 4_000_000, 200 * MI);
    // What "../podu2" would name: another pod's cgroup, with figures of its own.
    v2_cgroup(&root.join("kubepods/burstable/podu2"), 9_000_000, 300 * MI);
    for id in ["containerd://../podu2", "containerd://..", "containerd://"] {
        let provider = provider(
            CgroupLayout::Unified { root: root.clone() },
            tmp.path(),
            pod_with_id("web", id),
        );
        let series = parse(&provider.cadvisor().expect("render"));
        assert!(
            series
                .iter()
                .all(|s| s.labels.get("container").is_none_or(String::is_empty)),
            "{id}: {series:?}"
        );
        assert!(
            series
                .iter()
                .all(|s| !s.labels.get("id").is_some_and(|i| i.contains("podu2"))),
            "{id}"
        );
        // The pod itself is still reported.
        assert_eq!(
            value(
                &series,
                "container_cpu_usage_seconds_total",
                "/kubepods/burstable/podu1"
            ),
            4.0
        );
    }
}

#[test]
fn cpu_weight_maps_back_to_shares_as_cadvisor() {
    assert_eq!(weight_to_shares(1), Some(2));
    assert_eq!(weight_to_shares(10_000), Some(262_144));
    assert_eq!(weight_to_shares(100), Some(2597));
    assert_eq!(weight_to_shares(0), None);
    assert_eq!(weight_to_shares(10_001), None);
}

#[test]
fn a_symlinked_cgroup_file_is_not_followed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let secret = tmp.path().join("secret");
    write(&secret, "usage_usec 42\n");
    let dir: PathBuf = tmp.path().join("cg");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::os::unix::fs::symlink(&secret, dir.join("cpu.stat")).expect("symlink");
    assert_eq!(
        super::super::cgroup::read_capped(&dir.join("cpu.stat")),
        None
    );
    assert!(super::super::cgroup::read_capped(&secret).is_some());
}
