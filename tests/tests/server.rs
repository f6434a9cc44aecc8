//! The kubelet server against the real agent and containerd: TLS with the self-signed
//! certificate it generates (and keeps across restarts), client certificates checked against
//! `--client-ca-file`, 401 without credentials, the read-only port that never offers container
//! access, `/stats/summary` checked against the cgroup files, `/metrics/cadvisor`'s series of a
//! busy and a memory-holding container, and a real exec through the CRI streaming server over
//! WebSocket.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    time::Instant,
};

use serde_json::Value;
use swiftlet::cm::CgroupLayout;
use swiftlet_tests::{
    EVENT_WAIT, exposition, http_get_status,
    manifest::{PodManifest, guaranteed},
    node::{Node, status},
    privileged, runtime_endpoint,
    tls::{self, TestCa},
};

/// A node whose kubelet server trusts the client certificates of a fresh CA.
fn node_with_ca(test: &str, name: &str) -> Option<(Node, TestCa, PathBuf)> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let ca = TestCa::new("swiftlet-test-ca");
    let ca_file = std::env::temp_dir().join(format!(
        "swiftlet-{}-{name}-client-ca.crt",
        std::process::id()
    ));
    std::fs::write(&ca_file, &ca.pem).expect("write the client CA");
    let ca_arg = ca_file.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with(name, &endpoint, &["--client-ca-file", &ca_arg]);
    Some((node, ca, ca_file))
}

/// `GET path` on the read-only port: (status code, body).

#[test]
fn client_certificates_tls_and_the_read_only_port() {
    let Some((mut node, ca, ca_file)) =
        node_with_ca("client_certificates_tls_and_the_read_only_port", "tls")
    else {
        return;
    };
    let cert_file = node.cert_dir().join("kubelet.crt");
    let generated = std::fs::read_to_string(&cert_file).expect("a self-signed kubelet.crt");
    assert!(node.cert_dir().join("kubelet.key").exists());
    let alice = ca.client("alice", &["dev"]);

    // The server's certificate chains to the CA it wrote and names the node.
    let anonymous = tls::client_config(&cert_file, None);
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        anonymous,
        "GET",
        "/pods",
        &[],
    )
    .expect("a TLS answer");
    assert_eq!((answer.status, answer.body.as_str()), (401, "Unauthorized"));

    // A bearer token proves nothing without the token webhook (standalone).
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        tls::client_config(&cert_file, None),
        "GET",
        "/pods",
        &[("Authorization", "Bearer abc")],
    )
    .expect("a TLS answer");
    assert_eq!(answer.status, 401);

    // A certificate from another CA: the handshake fails, no HTTP answer.
    let stranger = TestCa::new("stranger-ca").client("mallory", &["system:masters"]);
    let refused = tls::request(
        node.kubelet_port,
        &node.name,
        tls::client_config(&cert_file, Some(&stranger)),
        "GET",
        "/pods",
        &[],
    );
    assert!(
        refused.is_err(),
        "accepted a foreign certificate: {refused:?}"
    );

    let good = tls::client_config(&cert_file, Some(&alice));
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        good.clone(),
        "GET",
        "/pods",
        &[],
    )
    .expect("a TLS answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    let list: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(list["kind"], "PodList");
    for path in ["/healthz", "/metrics", "/runningpods/", "/stats/summary"] {
        let answer = tls::request(
            node.kubelet_port,
            &node.name,
            good.clone(),
            "GET",
            path,
            &[],
        )
        .expect("a TLS answer");
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
    }

    // The read-only port: the same reads, never container access.
    assert_eq!(http_get_status(node.port, "/pods").0, 200);
    for path in ["/stats/summary", "/metrics/resource"] {
        let (code, body) = http_get_status(node.port, path);
        assert_eq!(code, 200, "{path}: {body}");
    }
    for path in [
        "/exec/default/web/main?command=ls&stdout=1",
        "/attach/default/web/main?stdout=1",
        "/portForward/default/web",
        "/run/default/web/main?cmd=ls",
        "/runningpods/",
        "/containerLogs/default/web/main",
    ] {
        assert_eq!(http_get_status(node.port, path).0, 404, "read-only {path}");
    }

    // A restart keeps the generated pair, so clients that trusted it still connect.
    node.restart();
    assert_eq!(
        std::fs::read_to_string(&cert_file).expect("kubelet.crt"),
        generated
    );
    let answer = tls::request(node.kubelet_port, &node.name, good, "GET", "/healthz", &[])
        .expect("a TLS answer after the restart");
    assert_eq!(answer.status, 200);
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}

/// A one-container busybox pod running `script` with `sh -c`.
fn shell_pod(name: &str, script: &str) -> String {
    PodManifest::new(name)
        .restart("Never")
        .grace(1)
        .shell("main", script, "")
        .yaml()
}

/// A pod that holds ~16 MB in a shell variable and keeps forking a little.
fn busy_pod(name: &str) -> String {
    shell_pod(
        name,
        r"x=$(head -c 16000000 /dev/zero | tr '\0' a); while sleep 0.05; do :; done",
    )
}

/// A pod that prints `tick` five times a second.
fn ticking_pod(name: &str) -> String {
    shell_pod(name, "while true; do echo tick; sleep 0.2; done")
}

/// The container's cgroup memory directory and working set as the kernel has it now.
fn kernel_working_set(pod_uid: &str, container_id: &str) -> Option<(PathBuf, u64)> {
    let layout = CgroupLayout::detect().expect("layout");
    let (memory_root, usage_file, inactive_key) = match layout.v1_controller("memory") {
        Some(root) => (root, "memory.usage_in_bytes", "total_inactive_file"),
        None => (
            layout.cgroup2_root().expect("cgroup2").to_owned(),
            "memory.current",
            "inactive_file",
        ),
    };
    let pod_dir = find_dir(&memory_root.join("kubepods"), &format!("pod{pod_uid}"))?;
    let dir = pod_dir.join(container_id);
    let usage: u64 = std::fs::read_to_string(dir.join(usage_file))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{inactive_key} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((dir, usage.saturating_sub(inactive)))
}

fn find_dir(root: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if entry.file_name().to_str() == Some(name) {
            return Some(path);
        }
        if let Some(found) = find_dir(&path, name) {
            return Some(found);
        }
    }
    None
}

fn summary(node: &Node, client: &std::sync::Arc<rustls::ClientConfig>) -> Value {
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        client.clone(),
        "GET",
        "/stats/summary",
        &[],
    )
    .expect("a TLS answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).expect("a JSON summary")
}

fn pod_stats<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name)
}

#[test]
fn stats_summary_of_a_running_pod_matches_its_cgroups() {
    let Some((node, ca, ca_file)) = node_with_ca(
        "stats_summary_of_a_running_pod_matches_its_cgroups",
        "stats",
    ) else {
        return;
    };
    let client = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca.client("metrics", &[])),
    );
    node.write_manifest("busy.yaml", &busy_pod("busy"));
    let pod = node.wait_pod("busy", "running", |p| {
        status::container(p, "main")
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    });
    let full_name = pod.metadata.name.clone().expect("name");
    let uid = pod.metadata.uid.clone().expect("uid");
    let container_id = status::container(&pod, "main")
        .and_then(|c| c.container_id.clone())
        .expect("container id");
    let container_id = container_id
        .split_once("://")
        .map_or(container_id.as_str(), |(_, id)| id)
        .to_owned();

    // Wait until the shell holds its 16 MB, as the kernel counts it.
    let deadline = Instant::now() + EVENT_WAIT;
    let mut kernel_ws = 0;
    while Instant::now() < deadline {
        if let Some((_, ws)) = kernel_working_set(&uid, &container_id) {
            kernel_ws = ws;
            if ws > 16_000_000 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        kernel_ws > 16_000_000,
        "the container never held its memory: {kernel_ws}"
    );

    let first = summary(&node, &client);
    // The shape: field names of the Summary API.
    let n = &first["node"];
    assert_eq!(n["nodeName"], node.name.as_str());
    assert!(n["startTime"].is_string());
    assert!(n["cpu"]["usageCoreNanoSeconds"].is_u64(), "{n}");
    for field in [
        "availableBytes",
        "usageBytes",
        "workingSetBytes",
        "rssBytes",
        "pageFaults",
    ] {
        assert!(n["memory"][field].is_u64(), "node.memory.{field}: {n}");
    }
    for field in ["availableBytes", "capacityBytes", "usedBytes"] {
        assert!(n["fs"][field].is_u64(), "node.fs.{field}: {n}");
        assert!(
            n["runtime"]["imageFs"][field].is_u64(),
            "node.runtime.imageFs.{field}: {n}"
        );
    }
    assert!(
        n["rlimit"]["maxpid"].is_u64() && n["rlimit"]["curproc"].is_u64(),
        "{n}"
    );
    assert_eq!(n["systemContainers"][0]["name"], "pods");
    // This kernel has PSI: the node's and the pod's pressure are reported.
    assert!(n["memory"]["psi"]["some"]["avg10"].is_number(), "{n}");

    let p = pod_stats(&first, &full_name).expect("the pod in the summary");
    assert_eq!(p["podRef"]["uid"], uid.as_str());
    assert!(p["podRef"]["namespace"].is_string());
    assert!(p["cpu"]["psi"]["some"].is_object(), "{p}");
    let containers = p["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{containers:?}");
    let c = &containers[0];
    assert_eq!(c["name"], "main");
    assert!(c["startTime"].is_string());

    // Memory: the summary's working set is the kernel's, within the same order (they are read
    // at different moments), and the pod's covers its container's.
    let summary_ws = c["memory"]["workingSetBytes"]
        .as_u64()
        .expect("container working set");
    let (_, kernel_ws) = kernel_working_set(&uid, &container_id).expect("kernel working set");
    assert!(
        summary_ws * 2 > kernel_ws && summary_ws < kernel_ws * 2,
        "summary {summary_ws} vs kernel {kernel_ws}"
    );
    let pod_ws = p["memory"]["workingSetBytes"]
        .as_u64()
        .expect("pod working set");
    assert!(
        pod_ws * 10 >= summary_ws * 9,
        "pod {pod_ws} < container {summary_ws}"
    );
    let node_ws = n["memory"]["workingSetBytes"]
        .as_u64()
        .expect("node working set");
    assert!(node_ws > pod_ws, "node {node_ws} vs pod {pod_ws}");

    // CPU: cumulative usage only grows, and a later summary has a rate from the two readings.
    let cpu_before = c["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .expect("cpu usage");
    let deadline = Instant::now() + EVENT_WAIT;
    let mut later = summary(&node, &client);
    loop {
        let cpu_now = pod_stats(&later, &full_name).expect("pod")["containers"][0]["cpu"]
            ["usageCoreNanoSeconds"]
            .as_u64()
            .expect("cpu usage");
        assert!(
            cpu_now >= cpu_before,
            "went back: {cpu_before} -> {cpu_now}"
        );
        if cpu_now > cpu_before || Instant::now() > deadline {
            assert!(cpu_now > cpu_before, "the forking shell used no CPU");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        later = summary(&node, &client);
    }
    let rate =
        &pod_stats(&later, &full_name).expect("pod")["containers"][0]["cpu"]["usageNanoCores"];
    assert!(
        rate.is_u64(),
        "no usageNanoCores on a second reading: {later}"
    );

    // metrics-server's series: the same working set, labelled by container, namespace and pod.
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        client.clone(),
        "GET",
        "/metrics/resource",
        &[],
    )
    .expect("a TLS answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    let prefix = format!(
        "container_memory_working_set_bytes{{container=\"main\",namespace=\"{}\",pod=\"{full_name}\"}} ",
        p["podRef"]["namespace"].as_str().expect("namespace")
    );
    let value: f64 = answer
        .body
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{}", answer.body));
    assert!(value > 16e6, "{value}");

    node.remove_manifest("busy.yaml");
    node.wait_gone("busy");
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}

/// `GET /metrics/cadvisor` on the kubelet server, parsed; asserts a 200.
fn cadvisor_scrape(
    node: &Node,
    client: &std::sync::Arc<rustls::ClientConfig>,
) -> Vec<exposition::Sample> {
    let answer = tls::request(
        node.kubelet_port,
        &node.name,
        client.clone(),
        "GET",
        "/metrics/cadvisor",
        &[],
    )
    .expect("a TLS answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    exposition::parse(&answer.body)
        .unwrap_or_else(|e| panic!("not exposition format: {e}\n{}", answer.body))
}

/// The value of `name` for the cgroup with this `id` label.
fn cadvisor_value(samples: &[exposition::Sample], name: &str, id: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.name == name && s.label("id") == id)
        .map(|s| s.value)
}

/// The `cpu.shares` cAdvisor reports for `shares` set by the kubelet: exact on v1; on cgroup v2
/// the kubelet writes `cpu.weight` (`CpuSharesToCpuWeight`) and cAdvisor maps it back
/// (`convertCPUWeightToCPULimit`), both rounding down.
fn reported_shares(shares: u64, v1: bool) -> u64 {
    if v1 {
        return shares;
    }
    let weight = 1 + ((shares - 2) * 9999) / 262_142;
    2 + ((weight - 1) * 262_142) / 9999
}

#[test]
fn cadvisor_metrics_of_a_busy_and_a_memory_holding_container() {
    let Some((node, ca, ca_file)) = node_with_ca(
        "cadvisor_metrics_of_a_busy_and_a_memory_holding_container",
        "cadvisor",
    ) else {
        return;
    };
    let client = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca.client("prometheus", &[])),
    );
    let manifest = PodManifest::new("scraped")
        .restart("Never")
        .grace(1)
        .shell("spin", "while :; do :; done", &guaranteed("200m", "64Mi"))
        .shell(
            "hold",
            r"x=$(head -c 16000000 /dev/zero | tr '\0' a); while sleep 1; do :; done",
            &guaranteed("100m", "96Mi"),
        )
        .yaml();
    node.write_manifest("scraped.yaml", &manifest);
    let pod = node.wait_pod("scraped", "both containers running", |p| {
        ["spin", "hold"].iter().all(|c| {
            status::container(p, c)
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some())
        })
    });
    let full_name = pod.metadata.name.clone().expect("name");
    let uid = pod.metadata.uid.clone().expect("uid");
    let id_of = |container: &str| {
        let id = status::container(&pod, container)
            .and_then(|c| c.container_id.clone())
            .expect("container id");
        id.split_once("://")
            .map_or(id.as_str(), |(_, id)| id)
            .to_owned()
    };
    let (spin_id, hold_id) = (id_of("spin"), id_of("hold"));
    let series_of = |samples: &[exposition::Sample], container_id: &str| -> Option<String> {
        samples
            .iter()
            .find(|s| {
                s.name == "container_memory_working_set_bytes" && s.label("name") == container_id
            })
            .map(|s| s.label("id").to_owned())
    };

    // Until the holder's 16 MB is counted and the spinner has used some CPU.
    let deadline = Instant::now() + EVENT_WAIT;
    let (first, spin_cgroup, hold_cgroup) = loop {
        let samples = cadvisor_scrape(&node, &client);
        let ids = series_of(&samples, &spin_id).zip(series_of(&samples, &hold_id));
        if let Some((spin, hold)) = ids {
            let held = cadvisor_value(&samples, "container_memory_working_set_bytes", &hold);
            let spun = cadvisor_value(&samples, "container_cpu_usage_seconds_total", &spin);
            if held.is_some_and(|ws| ws >= 16e6) && spun.is_some_and(|cpu| cpu > 0.0) {
                break (samples, spin, hold);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the containers' series never showed their load"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    };

    // The labels: the container's name, the runtime id as `name`, its image, the pod's.
    let usage = first
        .iter()
        .find(|s| s.name == "container_cpu_usage_seconds_total" && s.label("id") == spin_cgroup)
        .expect("the spinner's CPU series");
    assert_eq!(usage.label("container"), "spin");
    assert_eq!(usage.label("cpu"), "total");
    assert_eq!(usage.label("name"), spin_id);
    assert_eq!(usage.label("pod"), full_name);
    assert!(usage.label("image").contains("busybox"), "{usage:?}");
    assert!(
        spin_cgroup.ends_with(&format!("/{spin_id}")) && spin_cgroup.contains(&uid),
        "{spin_cgroup}"
    );
    assert!(usage.timestamp_ms.is_some(), "{usage:?}");
    let spun_before = usage.value;

    // Its CPU time grows between two scrapes.
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let later = cadvisor_scrape(&node, &client);
        let now = cadvisor_value(&later, "container_cpu_usage_seconds_total", &spin_cgroup)
            .expect("the spinner's CPU series again");
        assert!(now >= spun_before, "went back: {spun_before} -> {now}");
        if now > spun_before {
            break;
        }
        assert!(Instant::now() < deadline, "the spinner used no CPU");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // The limits are the manifest's.
    let v1 = CgroupLayout::detect()
        .expect("layout")
        .v1_controller("cpu")
        .is_some();
    for (cgroup, memory, millicores) in [
        (&spin_cgroup, 64u64 << 20, 200),
        (&hold_cgroup, 96 << 20, 100),
    ] {
        let spec = |name: &str| {
            cadvisor_value(&first, name, cgroup).unwrap_or_else(|| panic!("no {name} for {cgroup}"))
        };
        assert_eq!(spec("container_spec_memory_limit_bytes"), memory as f64);
        assert_eq!(spec("container_spec_cpu_period"), 100_000.0);
        assert_eq!(spec("container_spec_cpu_quota"), (millicores * 100) as f64);
        assert_eq!(
            spec("container_spec_cpu_shares"),
            reported_shares(millicores * 1024 / 1000, v1) as f64
        );
        assert!(spec("container_cpu_cfs_periods_total") >= 0.0);
    }

    // The pod's cgroup: container="" and a working set covering the holder's.
    let pod_series = first
        .iter()
        .find(|s| {
            s.name == "container_memory_working_set_bytes"
                && s.label("pod") == full_name
                && s.label("container").is_empty()
        })
        .expect("the pod's own series");
    assert!(
        pod_series.label("id").ends_with(&format!("pod{uid}")),
        "{pod_series:?}"
    );
    assert_eq!(pod_series.label("image"), "");
    assert!(pod_series.value >= 16e6, "{pod_series:?}");
    // The node's root and the machine.
    assert!(
        cadvisor_value(&first, "container_cpu_usage_seconds_total", "/").is_some_and(|v| v > 0.0)
    );
    assert!(
        first
            .iter()
            .any(|s| s.name == "machine_cpu_cores" && s.value >= 1.0)
    );

    // The read-only port serves the same series.
    let (code, body) = http_get_status(node.port, "/metrics/cadvisor");
    assert_eq!(code, 200, "{body}");
    assert!(exposition::parse(&body).is_ok_and(|s| !s.is_empty()));

    node.remove_manifest("scraped.yaml");
    node.wait_gone("scraped");
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}

/// Opens a WebSocket session (`v4.channel.k8s.io`) on the kubelet server; asserts the switch.
fn websocket(
    node: &Node,
    client: &std::sync::Arc<rustls::ClientConfig>,
    path: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let mut stream = tls::connect(node.kubelet_port, &node.name, client.clone()).expect("TLS");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n",
        host = node.name
    )
    .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("the answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{path}: {head}");
    assert!(head.to_lowercase().contains("v4.channel.k8s.io"), "{head}");
    stream
}

/// The payloads of the binary frames on `channel`, concatenated.
fn channel_data(frames: &[(u8, Vec<u8>)], channel: u8) -> Vec<u8> {
    frames
        .iter()
        .filter(|(opcode, p)| *opcode == 2 && p.first() == Some(&channel))
        .flat_map(|(_, p)| p[1..].to_vec())
        .collect()
}

#[test]
fn exec_through_the_kubelet_server_over_websocket() {
    let Some((node, ca, ca_file)) =
        node_with_ca("exec_through_the_kubelet_server_over_websocket", "exec")
    else {
        return;
    };
    node.write_manifest("sleeper.yaml", &ticking_pod("sleeper"));
    let pod = node.wait_pod("sleeper", "running", |p| {
        status::container(p, "main")
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    });
    let name = pod.metadata.name.clone().expect("name");
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let client = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca.client("kube-apiserver", &[])),
    );

    let mut stream = websocket(
        &node,
        &client,
        &format!(
            "/exec/{namespace}/{name}/main?command=echo&command=hello%20from%20exec&stdout=1&stderr=1"
        ),
    );
    let frames = tls::read_ws_frames(&mut stream, 64);
    assert_eq!(
        String::from_utf8_lossy(&channel_data(&frames, 1)),
        "hello from exec\n",
        "{frames:?}"
    );
    let status: Value =
        serde_json::from_slice(&channel_data(&frames, 3)).expect("a status on channel 3");
    assert_eq!(status["status"], "Success", "{status}");

    // Attach: the container's own output, as it comes.
    let mut stream = websocket(
        &node,
        &client,
        &format!("/attach/{namespace}/{name}/main?stdout=1"),
    );
    let deadline = Instant::now() + EVENT_WAIT;
    let mut seen = Vec::new();
    while Instant::now() < deadline && !String::from_utf8_lossy(&seen).contains("tick") {
        let frames = tls::read_ws_frames(&mut stream, 1);
        if frames.is_empty() {
            break;
        }
        seen.extend(channel_data(&frames, 1));
    }
    assert!(String::from_utf8_lossy(&seen).contains("tick"), "{seen:?}");

    node.remove_manifest("sleeper.yaml");
    node.wait_gone("sleeper");
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}

#[test]
fn port_forward_through_the_kubelet_server_over_websocket() {
    let Some((node, ca, ca_file)) = node_with_ca(
        "port_forward_through_the_kubelet_server_over_websocket",
        "portfwd",
    ) else {
        return;
    };
    node.write_manifest(
        "listener.yaml",
        &shell_pod(
            "listener",
            "while true; do echo hello-pf | nc -l -p 8080; done",
        ),
    );
    let pod = node.wait_pod("listener", "running", |p| {
        status::container(p, "main")
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    });
    let name = pod.metadata.name.clone().expect("name");
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let client = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca.client("kube-apiserver", &[])),
    );

    // nc may not listen yet when the container is running: retry the session a few times.
    let deadline = Instant::now() + EVENT_WAIT;
    let mut last = Vec::new();
    let received = loop {
        let mut stream = websocket(
            &node,
            &client,
            &format!("/portForward/{namespace}/{name}?port=8080"),
        );
        // Each channel first says its port (8080, little-endian), then the data flows on
        // channel 0 and errors on channel 1.
        let frames = tls::read_ws_frames(&mut stream, 4);
        let mut data = Vec::new();
        let mut ports = Vec::new();
        for (opcode, payload) in &frames {
            if *opcode != 2 || payload.is_empty() {
                continue;
            }
            let (channel, rest) = (payload[0], &payload[1..]);
            if rest.len() == 2 && ports.len() < 2 {
                ports.push((channel, u16::from_le_bytes([rest[0], rest[1]])));
            } else if channel == 0 {
                data.extend_from_slice(rest);
            }
        }
        assert_eq!(ports, vec![(0, 8080), (1, 8080)], "{frames:?}");
        if String::from_utf8_lossy(&data).contains("hello-pf") || Instant::now() > deadline {
            break data;
        }
        last = frames.into_iter().map(|(_, p)| p).collect();
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(
        String::from_utf8_lossy(&received),
        "hello-pf\n",
        "last frames: {last:?}"
    );

    node.remove_manifest("listener.yaml");
    node.wait_gone("listener");
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}

#[test]
fn webhook_authorization_without_an_api_server_is_a_config_error() {
    // The configuration is validated before anything privileged, so this runs as anyone.
    let out = std::process::Command::new(swiftlet_tests::swiftlet_bin())
        .args(["run", "--authorization-mode", "Webhook"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("error: ")
            && l.contains("flag --authorization-mode")
            && l.contains("`authorization.mode`")
            && l.contains("needs an API server")),
        "{stderr}"
    );
    assert!(stderr.contains("hint: "), "{stderr}");
}

/// Kubernetes' atomic writer (a Secret volume, cert-manager's CSI driver): each file a symlink
/// through `..data`, itself a symlink to a versioned directory, swapped by one rename.
fn atomic_write(dir: &Path, version: &str, files: &[(&str, &str)]) {
    let data = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&data).expect("version dir");
    for (name, text) in files {
        std::fs::write(data.join(name), text).expect("write");
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).expect("link");
        }
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("data link");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
}

/// The leaf certificate the kubelet server presents now, and whether `client` gets an answer.
fn served(node: &Node, client: &std::sync::Arc<rustls::ClientConfig>) -> (Vec<u8>, bool) {
    let leaf = tls::connect(node.kubelet_port, "localhost", client.clone())
        .ok()
        .and_then(|s| {
            s.conn
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.to_vec())
        })
        .unwrap_or_default();
    let answered = tls::request(
        node.kubelet_port,
        "localhost",
        client.clone(),
        "GET",
        "/healthz",
        &[],
    )
    .is_ok_and(|a| a.status == 200);
    (leaf, answered)
}

fn der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::{CertificateDer, pem::PemObject as _};
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("certificate PEM")
        .to_vec()
}

#[test]
fn rotated_certificate_and_client_ca_files_apply_without_a_restart() {
    let test = "rotated_certificate_and_client_ca_files_apply_without_a_restart";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("swiftlet-{}-tls-rotation", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    let server_ca = TestCa::new("serving-ca");
    let trust = dir.join("serving-ca.crt");
    std::fs::write(&trust, &server_ca.pem).expect("serving CA");
    let (old, new) = (server_ca.serving("old"), server_ca.serving("new"));
    let (ca1, ca2) = (TestCa::new("client-ca-1"), TestCa::new("client-ca-2"));
    let client_ca = dir.join("client-ca.crt");
    std::fs::write(&client_ca, &ca1.pem).expect("client CA");
    atomic_write(&certs, "v1", &[("tls.crt", &old.0), ("tls.key", &old.1)]);
    let arg = |p: PathBuf| p.to_str().expect("utf-8 path").to_owned();
    let (cert_arg, key_arg, ca_arg) = (
        arg(certs.join("tls.crt")),
        arg(certs.join("tls.key")),
        arg(client_ca.clone()),
    );
    let node = Node::start_with(
        "tlsrot",
        &endpoint,
        &[
            "--tls-cert-file",
            &cert_arg,
            "--tls-private-key-file",
            &key_arg,
            "--client-ca-file",
            &ca_arg,
        ],
    );
    let pid = node.agent.as_ref().map(|a| a.child.id());
    let alice = tls::client_config(&trust, Some(&ca1.client("alice", &[])));
    let bob = tls::client_config(&trust, Some(&ca2.client("bob", &[])));
    assert_eq!(served(&node, &alice), (der(&old.0), true));
    assert!(
        !served(&node, &bob).1,
        "a client of CA 2 before CA 2 is trusted"
    );

    // A pair whose key is not the certificate's is refused; the old pair is still served.
    let (stray_cert, _) = server_ca.serving("stray");
    atomic_write(
        &certs,
        "v2",
        &[("tls.crt", &stray_cert), ("tls.key", &old.1)],
    );
    let errors =
        r#"swiftlet_server_certificate_reload_errors_total{content="serving_certificate"}"#;
    swiftlet_tests::eventually("the mismatched pair is refused", || {
        node.metric(errors) == 1.0
    });
    assert_eq!(served(&node, &alice), (der(&old.0), true));

    // The new pair by a `..data` swap, the new client CA by a plain rename.
    atomic_write(&certs, "v3", &[("tls.crt", &new.0), ("tls.key", &new.1)]);
    let aside = dir.join(".client-ca.crt.new");
    std::fs::write(&aside, &ca2.pem).expect("new client CA");
    std::fs::rename(&aside, &client_ca).expect("rename the client CA in");
    swiftlet_tests::eventually("the new certificate and client CA are used", || {
        served(&node, &bob) == (der(&new.0), true)
    });
    assert!(
        !served(&node, &alice).1,
        "a client of CA 1 after CA 1 is gone"
    );
    assert_eq!(node.agent.as_ref().map(|a| a.child.id()), pid, "no restart");
    let reloads = |content: &str| {
        node.metric(&format!(
            r#"swiftlet_server_certificate_reloads_total{{content="{content}"}}"#
        ))
    };
    assert_eq!(reloads("serving_certificate"), 1.0);
    assert_eq!(reloads("client_ca"), 1.0);
    assert_eq!(node.metric(errors), 1.0);
    drop(node);
    let _ = std::fs::remove_dir_all(dir);
}

/// One sample of a Prometheus text exposition: the family, its labels, the value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses the text exposition (format 0.0.4): comment lines skipped, label values unescaped.
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().expect("a sample value");
        let Some((name, labels)) = series.split_once('{') else {
            out.push((series.to_owned(), Vec::new(), value));
            continue;
        };
        let mut parsed = Vec::new();
        let mut rest = labels.strip_suffix('}').expect("closed labels");
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").expect("label=\"");
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next().expect("closed label value") {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().expect("escape").1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            parsed.push((key.to_owned(), value));
            rest = after[end + 1..].trim_start_matches(',');
        }
        out.push((name.to_owned(), parsed, value));
    }
    out
}

fn label<'a>(sample: &'a Sample, key: &str) -> Option<&'a str> {
    sample
        .1
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn family<'a>(all: &'a [Sample], name: &str) -> Vec<&'a Sample> {
    all.iter().filter(|s| s.0 == name).collect()
}

/// What observability users scrape (issue 20): `/configz` behind the kubelet server's auth,
/// `/healthz/syncloop` and the other checks alone, `process_*` and `swiftlet_build_info` on
/// `/metrics`, the prober's series on `/metrics/probes` (and gone with their pod).
#[test]
fn configz_healthz_checks_process_and_probe_metrics() {
    let Some((node, ca, ca_file)) = node_with_ca(
        "configz_healthz_checks_process_and_probe_metrics",
        "observe",
    ) else {
        return;
    };
    let cert_file = node.cert_dir().join("kubelet.crt");
    let alice = tls::client_config(&cert_file, Some(&ca.client("alice", &["dev"])));
    let get = |client, path: &str| {
        tls::request(node.kubelet_port, &node.name, client, "GET", path, &[]).expect("a TLS answer")
    };

    // /configz: the effective configuration under KubeletConfiguration names.
    let answer = get(alice.clone(), "/configz");
    assert_eq!(answer.status, 200, "{answer:?}");
    let configz: Value = serde_json::from_str(&answer.body).expect("JSON");
    let kubelet = &configz["kubeletconfig"];
    assert_eq!(kubelet["kind"], "KubeletConfiguration", "{configz:#}");
    assert_eq!(kubelet["nodeName"], node.name.as_str());
    assert_eq!(kubelet["port"], node.kubelet_port);
    assert_eq!(kubelet["readOnlyPort"], node.port);
    assert_eq!(kubelet["syncFrequency"], "1m0s", "the default");
    assert_eq!(
        kubelet["authentication"]["x509"]["clientCAFile"],
        ca_file.to_str().expect("utf-8 path")
    );
    // Nothing secret: no PEM block of any key or certificate.
    assert!(!answer.body.contains("-----BEGIN"), "{}", answer.body);
    let anonymous = get(tls::client_config(&cert_file, None), "/configz");
    assert_eq!(anonymous.status, 401);
    assert_eq!(http_get_status(node.port, "/configz").0, 404, "read-only");

    // The checks alone, as upstream's per-check paths answer them.
    for port in [node.port, node.healthz_port] {
        assert_eq!(
            http_get_status(port, "/healthz/syncloop"),
            (200, "ok".to_owned())
        );
        assert_eq!(
            http_get_status(port, "/healthz/ping"),
            (200, "ok".to_owned())
        );
        assert_eq!(http_get_status(port, "/healthz/nosuch").0, 404);
    }
    assert_eq!(get(alice.clone(), "/healthz/syncloop").status, 200);

    // process_* and the build.
    let metrics = samples(&node.metrics());
    // The collector counts CPU in whole seconds: a fresh agent may still be at 0.
    assert_eq!(family(&metrics, "process_cpu_seconds_total").len(), 1);
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        let found = family(&metrics, name);
        assert_eq!(found.len(), 1, "{name}");
        assert!(found[0].2 > 0.0, "{name} = {}", found[0].2);
    }
    let build = family(&metrics, "swiftlet_build_info");
    assert_eq!(build.len(), 1);
    assert_eq!(build[0].2, 1.0);
    assert_eq!(
        label(build[0], "git_commit"),
        Some(swiftlet::metrics::GIT_COMMIT)
    );
    assert_eq!(label(build[0], "version"), Some(env!("CARGO_PKG_VERSION")));
    assert!(label(build[0], "rust_version").is_some_and(|v| v.starts_with("1.")));
    assert!(
        family(&metrics, "prober_probe_total").is_empty(),
        "the prober's series are on /metrics/probes only"
    );

    // /metrics/probes: a pod's readiness probe counted with its labels, then gone with it.
    node.write_manifest(
        "probed.yaml",
        &PodManifest::new("probed")
            .restart("Never")
            .grace(1)
            .shell(
                "main",
                "exec sleep 3600",
                "      readinessProbe:\n        exec:\n          command: [\"true\"]\n        periodSeconds: 1\n",
            )
            .yaml(),
    );
    let pod_name = format!("probed-{}", node.name);
    node.wait_pod("probed", "ready", |p| {
        status::container(p, "main").is_some_and(|c| c.ready)
    });
    let uid = node.pod_uid("probed");
    let probes = samples(&node.probe_metrics());
    let counted: Vec<&Sample> = family(&probes, "prober_probe_total")
        .into_iter()
        .filter(|s| label(s, "pod") == Some(pod_name.as_str()))
        .collect();
    assert_eq!(counted.len(), 1, "{probes:?}");
    let sample = counted[0];
    assert_eq!(label(sample, "probe_type"), Some("Readiness"));
    assert_eq!(label(sample, "result"), Some("successful"));
    assert_eq!(label(sample, "container"), Some("main"));
    assert_eq!(label(sample, "namespace"), Some("default"));
    assert_eq!(label(sample, "pod_uid"), Some(uid.as_str()));
    assert!(sample.2 >= 1.0);
    assert!(
        family(&probes, "prober_probe_duration_seconds_count")
            .iter()
            .any(|s| label(s, "pod") == Some(pod_name.as_str()) && s.2 >= 1.0)
    );
    assert_eq!(family(&probes, "process_start_time_seconds").len(), 1);
    node.remove_manifest("probed.yaml");
    node.wait_gone("probed");
    let deadline = Instant::now() + EVENT_WAIT;
    while node.probe_metrics().contains(&pod_name) {
        assert!(
            Instant::now() < deadline,
            "probe series outlived the pod:\n{}",
            node.probe_metrics()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(node);
    let _ = std::fs::remove_file(ca_file);
}
