//! The agent's listeners and the bounds on what pods and clients control, attacked over the real
//! agent and the real containerd: the healthz port serves `/healthz` only; floods of idle
//! connections to every listener (healthz, read-only, the TLS kubelet server, the gRPC socket)
//! leave `/healthz` answering and a pod's probes passing; a container printing a 100 MiB line
//! read through `/containerLogs` costs the agent little memory; a pod whose postStart never ends
//! is deleted within its grace period; the agent's own oom_score_adj. Needs root and the private
//! containerd that `cargo xtask test` starts.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use swiftlet_proto::v1::{self, events_client::EventsClient};
use swiftlet_tests::{
    EVENT_WAIT, http_response,
    manifest::{container, pod},
    node::{Node, status},
    privileged, runtime_endpoint,
    tls::{self, TestCa},
};

/// Idle connections opened to each listener (the number).
const FLOOD: usize = 5_000;
/// How fast `/healthz` must answer during a flood (the requirement).
const HEALTHZ_WITHIN: Duration = Duration::from_secs(1);
/// The line the logs test prints: 100 MiB without a newline.
const LINE_BYTES: u64 = 100 * 1024 * 1024;
/// What containerd keeps of a line that has not ended (its `max_container_log_line_size`).
const RUNTIME_LINE_BUFFER: u64 = 16 * 1024;
/// How much the agent's resident memory may grow while serving it (the bound).
const RSS_GROWTH_LIMIT: u64 = 50 * 1024 * 1024;

/// The test CA whose client certificates the agents' kubelet servers trust, and its file.
fn ca() -> &'static (TestCa, PathBuf) {
    static CA: OnceLock<(TestCa, PathBuf)> = OnceLock::new();
    CA.get_or_init(|| {
        let ca = TestCa::new("swiftlet-listeners-test-ca");
        let file = std::env::temp_dir().join(format!(
            "swiftlet-listeners-{}-client-ca.crt",
            std::process::id()
        ));
        std::fs::write(&file, &ca.pem).expect("write the client CA");
        (ca, file)
    })
}

/// An agent trusting the test CA's client certificates, with `flags`.
fn node(test: &str, name: &str, flags: &[&str]) -> Option<Node> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let ca_file = ca().1.display().to_string();
    let mut args = vec!["--client-ca-file", ca_file.as_str()];
    args.extend(flags);
    Some(Node::start_with(name, &endpoint, &args))
}

fn agent_pid(node: &Node) -> u32 {
    node.agent.as_ref().expect("running").child.id()
}

/// A plain GET on loopback: status and body (status 0 when nothing answers).
fn get(port: u16, path: &str, timeout: Duration) -> (u16, String) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return (0, String::new());
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    http_response(&response)
}

/// A GET on the kubelet server with a client certificate: the status, or why it failed.
fn kubelet_get(node: &Node, path: &str) -> Result<u16, String> {
    let config = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca().0.client("listener-test", &[])),
    );
    tls::request(node.kubelet_port, &node.name, config, "GET", path, &[]).map(|a| a.status)
}

/// Raises this process's open files limit to its hard limit (the floods need thousands).
fn raise_open_files() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    hard
}

/// Opens up to `count` idle connections with `connect`, giving up at a deadline; they close
/// when the returned vector is dropped.
fn flood<T>(count: usize, connect: impl Fn() -> std::io::Result<T>) -> Vec<T> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut open = Vec::with_capacity(count);
    let mut failures = 0usize;
    while open.len() < count && Instant::now() < deadline {
        match connect() {
            Ok(c) => open.push(c),
            // A full accept queue or an evicted peer: bounded retries.
            Err(_) => {
                failures += 1;
                assert!(failures < count, "the flood could not connect");
            }
        }
    }
    assert_eq!(open.len(), count, "the flood was not complete in time");
    open
}

/// The value of `series` in the agent's metrics (0 when absent).
fn listener_metric(node: &Node, name: &str, listener: &str) -> f64 {
    node.metric(&format!("{name}{{listener=\"{listener}\"}}"))
}

/// `/healthz` on a fresh connection answers 200 "ok" within [`HEALTHZ_WITHIN`].
fn assert_healthz_answers(node: &Node, during: &str) {
    let started = Instant::now();
    let (status, body) = get(node.healthz_port, "/healthz", Duration::from_secs(10));
    let took = started.elapsed();
    assert_eq!(status, 200, "/healthz during {during}: {body:?}");
    assert!(body.starts_with("ok"), "/healthz during {during}: {body:?}");
    // The requirement: within 1 s during a flood.
    assert!(
        took < HEALTHZ_WITHIN,
        "/healthz took {took:?} during {during}"
    );
}

fn ready(pod: &Pod) -> bool {
    status::container(pod, "web").is_some_and(|c| c.ready)
}

fn restarts(pod: &Pod) -> i32 {
    status::container(pod, "web").map_or(0, |c| c.restart_count)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn the_healthz_port_serves_healthz_only_and_the_agent_lowers_its_oom_score_adj() {
    let Some(node) = node(
        "the_healthz_port_serves_healthz_only_and_the_agent_lowers_its_oom_score_adj",
        "healthz",
        &[],
    ) else {
        return;
    };
    let timeout = Duration::from_secs(10);
    let (status, body) = get(node.healthz_port, "/healthz", timeout);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    for path in [
        "/pods",
        "/node",
        "/metrics",
        "/stats/summary",
        "/containerLogs/a/b/c",
    ] {
        assert_eq!(get(node.healthz_port, path, timeout).0, 404, "{path}");
    }
    // They are where they belong: the read-only port and the kubelet server.
    for path in ["/pods", "/node", "/metrics"] {
        assert_eq!(get(node.port, path, timeout).0, 200, "{path}");
        assert_eq!(kubelet_get(&node, path), Ok(200), "{path}");
    }
    // The agent's own oom_score_adj: upstream's -999 where it may lower it, else the log says
    // why not (here: no CAP_SYS_RESOURCE).
    let pid = agent_pid(&node);
    let adj: i32 = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .expect("oom_score_adj")
        .trim()
        .parse()
        .expect("a number");
    if adj != -999 {
        let said = node.startup_log.iter().find(|l| {
            l.contains("cannot set the agent's own oom_score_adj") && l.contains("CAP_SYS_RESOURCE")
        });
        assert!(
            said.is_some(),
            "oom_score_adj is {adj} and the log does not say why: {:#?}",
            node.startup_log
        );
    }
    assert_eq!(node.metric("swiftlet_oom_score_adj"), f64::from(adj));
    // The open files limit was raised to the hard one.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let numbers: Vec<&str> = files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers.first(), numbers.get(1), "{files}");
    // The gRPC socket only root can reach, in a directory only root can enter.
    let mode = |p: &Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).expect("stat").mode() & 0o777
    };
    assert_eq!(mode(&node.grpc_socket()), 0o600);
}

#[test]
fn floods_of_idle_connections_to_every_listener_leave_healthz_and_probes_working() {
    let open_files = raise_open_files();
    assert!(
        open_files > (FLOOD as u64) + 1024,
        "this process may open only {open_files} files"
    );
    let Some(node) = node(
        "floods_of_idle_connections_to_every_listener_leave_healthz_and_probes_working",
        "flood",
        &[],
    ) else {
        return;
    };
    let web = free_port();
    let probe = |kind: &str| {
        format!(
            "      {kind}:
        httpGet:
          host: 127.0.0.1
          path: /index.html
          port: {web}
        periodSeconds: 1
        failureThreshold: 1
"
        )
    };
    let serve = format!(
        "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 127.0.0.1:{web} -h /www"
    );
    node.write_manifest(
        "web.yaml",
        &pod(
            "web",
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n",
            &[container(
                "web",
                &serve,
                &format!("{}{}", probe("readinessProbe"), probe("livenessProbe")),
            )],
        ),
    );
    node.wait_pod("web", "ready", ready);

    let healthz = SocketAddr::from(([127, 0, 0, 1], node.healthz_port));
    let read_only = SocketAddr::from(([127, 0, 0, 1], node.port));
    let kubelet = SocketAddr::from(([127, 0, 0, 1], node.kubelet_port));
    let tcp = |addr: SocketAddr| move || TcpStream::connect_timeout(&addr, Duration::from_secs(2));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for listener in ["healthz", "read-only", "kubelet", "grpc"] {
        let evicted_before =
            listener_metric(&node, "swiftlet_server_connections_evicted_total", listener);
        let timed_out_before = listener_metric(
            &node,
            "swiftlet_server_connections_timed_out_total",
            listener,
        );
        let flood_began = Instant::now();
        let idle: Vec<Box<dyn std::any::Any>> = match listener {
            "healthz" => boxed(flood(FLOOD, tcp(healthz))),
            "read-only" => boxed(flood(FLOOD, tcp(read_only))),
            "kubelet" => boxed(flood(FLOOD, tcp(kubelet))),
            _ => boxed(flood(FLOOD, || UnixStream::connect(node.grpc_socket()))),
        };
        assert_healthz_answers(
            &node,
            &format!("a flood of {FLOOD} idle connections to {listener}"),
        );
        // The flooded listener itself still serves a real client.
        match listener {
            "read-only" => {
                let (status, body) = get(node.port, "/pods", Duration::from_secs(10));
                assert_eq!(status, 200, "{body}");
                assert!(body.contains("\"PodList\""), "{body}");
            }
            "kubelet" => assert_eq!(kubelet_get(&node, "/healthz"), Ok(200)),
            "grpc" => runtime.block_on(async {
                let channel = swiftlet_tests::unix_channel(node.grpc_socket())
                    .await
                    .expect("connect to the gRPC socket");
                let watch = EventsClient::new(channel)
                    .watch(v1::WatchRequest {
                        kinds: vec!["exit".into()],
                        cgroup_ids: vec![],
                    })
                    .await;
                assert!(watch.is_ok(), "Watch during the flood: {watch:?}");
            }),
            _ => {}
        }
        let flooded_in = flood_began.elapsed();
        let metric = |name: &str| listener_metric(&node, name, listener);
        let limit = metric("swiftlet_server_connections_limit");
        let open = metric("swiftlet_server_connections");
        let accepted = metric("swiftlet_server_connections_accepted_total");
        let evicted = metric("swiftlet_server_connections_evicted_total") - evicted_before;
        let timed_out = metric("swiftlet_server_connections_timed_out_total") - timed_out_before;
        println!(
            "{listener}: a flood of {FLOOD} in {flooded_in:?}: limit {limit}, open {open}, \
             accepted {accepted}, evicted {evicted}, timed out {timed_out}"
        );
        assert!(limit > 0.0, "no limit for {listener}");
        assert!(
            open <= limit,
            "{listener}: {open} open over its limit {limit}"
        );
        assert!(
            accepted >= FLOOD as f64,
            "{listener}: the flood was not accepted"
        );
        drop(idle);
    }
    // The pod's probes passed throughout: still ready, never restarted, no failed probe.
    let pod = node.pod("web").expect("listed");
    assert!(ready(&pod), "{:#?}", pod.status);
    assert_eq!(restarts(&pod), 0, "{:#?}", pod.status);
    let failed: f64 = node
        .probe_metrics()
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains("result=\"failed\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(failed, 0.0, "probes failed during the floods");
}

fn boxed<T: 'static>(connections: Vec<T>) -> Vec<Box<dyn std::any::Any>> {
    connections
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn std::any::Any>)
        .collect()
}

/// `VmRSS`/`VmHWM` of `pid`, in bytes.
fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Reads `/containerLogs` of `pod`'s container `main` with `query` over TLS, counting its `x`
/// bytes without keeping them, until `want` of them came or the answer ended.
fn count_log_bytes(node: &Node, pod: &str, query: &str, want: u64) -> u64 {
    let config = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca().0.client("log-reader", &[])),
    );
    let mut stream = tls::connect(node.kubelet_port, &node.name, config).expect("connect");
    write!(
        stream,
        "GET /containerLogs/default/{pod}-{}/main{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        node.name, node.name
    )
    .expect("request");
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut buf = vec![0u8; 256 * 1024];
    let mut head = Vec::new();
    let mut in_body = false;
    let mut count = 0u64;
    while count < want && Instant::now() < deadline {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the log ({query}): {e} after {count} bytes"),
        };
        let mut data = &buf[..n];
        if !in_body {
            head.extend_from_slice(data);
            let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let status = String::from_utf8_lossy(&head[..at]).into_owned();
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            in_body = true;
            let body_start = at + 4 - (head.len() - n);
            data = &buf[body_start..n];
        }
        // Chunk sizes are hexadecimal digits: `x` is only ever content.
        count += data.iter().filter(|b| **b == b'x').count() as u64;
    }
    count
}

#[test]
fn a_100_mib_line_read_through_container_logs_costs_the_agent_little_memory() {
    // No rotation during the test: the plain read then finds the whole line in one file.
    let Some(node) = node(
        "a_100_mib_line_read_through_container_logs_costs_the_agent_little_memory",
        "biglog",
        &["--container-log-max-size", "1Gi"],
    ) else {
        return;
    };
    let pid = agent_pid(&node);
    // A line of 100 MiB without a newline, then the container stays.
    let print = format!("sleep 2; head -c {LINE_BYTES} /dev/zero | tr '\\000' x; exec sleep 3600");
    node.write_manifest(
        "biglog.yaml",
        &pod(
            "biglog",
            "  terminationGracePeriodSeconds: 1\n",
            &[container("main", &print, "")],
        ),
    );
    node.wait_pod("biglog", "running", |p| {
        status::running(status::container(p, "main"))
    });
    // The peak resident memory restarts from the current one (writing 5 to clear_refs).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
    let before = memory(pid, "VmRSS");
    // containerd writes a line that never ends in records of its 16 KiB buffer, and the last
    // buffer only once the line ends or the buffer fills: up to that much stays in the runtime.
    let in_file = LINE_BYTES - RUNTIME_LINE_BUFFER..=LINE_BYTES;
    // Followed while the container writes it, then read whole once written, then its last line.
    let followed = count_log_bytes(&node, "biglog", "?follow=true", *in_file.start());
    assert!(
        in_file.contains(&followed),
        "the followed log: {followed} bytes"
    );
    let read = count_log_bytes(&node, "biglog", "", LINE_BYTES);
    assert!(in_file.contains(&read), "the whole log: {read} bytes");
    let tailed = count_log_bytes(&node, "biglog", "?tailLines=1&timestamps=true", LINE_BYTES);
    assert_eq!(tailed, read, "the last line is the whole unended line");
    let peak = memory(pid, "VmHWM");
    let growth = peak.saturating_sub(before);
    println!(
        "agent RSS before {} MiB, peak while serving {} MiB: growth {} KiB",
        before >> 20,
        peak >> 20,
        growth >> 10
    );
    // The bound: under 50 MiB of growth for a 100 MiB line (measured, not timed).
    assert!(
        growth < RSS_GROWTH_LIMIT,
        "the agent grew by {} MiB serving a {} MiB line",
        growth >> 20,
        LINE_BYTES >> 20
    );
}

/// The host processes of the pod with `uid` (by their cgroup), with their command lines.
fn pod_processes(uid: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(uid))
        })
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

#[test]
fn a_pod_whose_post_start_never_ends_is_deleted_within_its_grace_period() {
    let Some(node) = node(
        "a_pod_whose_post_start_never_ends_is_deleted_within_its_grace_period",
        "hook",
        &[],
    ) else {
        return;
    };
    let grace = Duration::from_secs(20);
    let main = container(
        "main",
        "trap 'exit 0' TERM; while true; do sleep 1; done",
        "      lifecycle:
        postStart:
          exec:
            command: [\"sleep\", \"1000000\"]
",
    );
    node.write_manifest(
        "hook.yaml",
        &pod(
            "hook",
            &format!("  terminationGracePeriodSeconds: {}\n", grace.as_secs()),
            &[main],
        ),
    );
    let uid = node
        .wait_pod("hook", "listed with a UID", |p| p.metadata.uid.is_some())
        .metadata
        .uid
        .expect("uid");
    // The hook runs (its sleep is in the container) and would for eleven days.
    let deadline = Instant::now() + EVENT_WAIT;
    while !pod_processes(&uid)
        .iter()
        .any(|(_, cmd)| cmd.starts_with("sleep 1000000"))
    {
        assert!(Instant::now() < deadline, "the postStart hook never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let running = pod_processes(&uid);
    println!("running with its hook: {running:?}");

    // Deletion asked ...
    let asked = Instant::now();
    node.remove_manifest("hook.yaml");
    // ... the container and its hook gone ...
    let deadline = asked + grace + EVENT_WAIT;
    let mut left = pod_processes(&uid);
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the pod's processes outlived the deletion: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        left = pod_processes(&uid);
    }
    let stopped = asked.elapsed();
    // ... and the pod gone.
    node.wait_gone("hook");
    let gone = asked.elapsed();
    println!("deletion asked at 0 s; container and hook gone at {stopped:?}; pod gone at {gone:?}");
    assert!(stopped <= gone);
    // The requirement: deleted within its grace period (it takes a few seconds).
    assert!(
        gone < grace,
        "the pod took {gone:?} to go, past its grace period of {grace:?}"
    );
}
