//! The Evented PLEG (`--pleg evented`) on the real containerd. On a runtime that streams CRI
//! container events (containerd >= 1.7): container deaths — an exit code, a SIGKILL, an OOM kill —
//! reach the pod's status from the events, with no relist (relist period 300 s, resync 10 min);
//! a stream lost with the connection to the runtime is subscribed to again, and once it is lost
//! for good the relist takes over and still finds every death. On a runtime without them
//! (containerd 1.6) the agent refuses `--pleg evented`, naming the runtime and what it needs:
//! that is the behaviour under test there, not a skip. On containerd 1.7, which hands each event
//! to one subscriber only (a gone one included), a death a stale subscription took is found by
//! the relist the agent runs until the new stream's first event.
//!
//! The lost stream is made without touching the runtime other tests share: the agent talks to it
//! through a proxy socket of the test's own, and cutting the proxy is what a runtime restart
//! does to the agent (every connection breaks; new ones are refused until it is back).
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    path::PathBuf,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use swiftlet::{cri::RuntimeService as _, pleg::evented::serves_each_event_once};
use swiftlet_tests::{
    EVENT_WAIT,
    manifest::PodManifest,
    node::{Node, status},
    privileged, runtime_endpoint, swiftlet_bin, with_cri,
};

/// The Evented PLEG, and no safety net within the test's time.
const EVENTED: [&str; 6] = [
    "--pleg",
    "evented",
    "--pleg-relist-period",
    "300s",
    "--sync-frequency",
    "10m",
];

fn pod(name: &str, command: &str, resources: &str) -> String {
    PodManifest::new(name)
        .restart("Never")
        .grace(1)
        .shell("main", command, resources)
        .yaml()
}

/// The test's runtime as the Evented PLEG sees it.
struct EventRuntime {
    /// Whether it streams container events.
    streams: bool,
    /// Its name and version.
    version: String,
    /// Whether it hands each event to one subscriber only (containerd 1.7).
    serves_each_event_once: bool,
}

fn container_events(test: &str) -> EventRuntime {
    with_cri(test, |runtime| async move {
        let info = runtime.version_info().clone();
        let streams = match runtime.get_container_events().await {
            Ok(_) => true,
            Err(e) if e.code() == tonic::Code::Unimplemented => false,
            Err(e) => panic!("GetContainerEvents: {e}"),
        };
        EventRuntime {
            streams,
            version: format!("{} {}", info.runtime_name, info.runtime_version),
            serves_each_event_once: serves_each_event_once(
                &info.runtime_name,
                &info.runtime_version,
            ),
        }
    })
}

/// The agent refuses `--pleg evented` on `endpoint`, before it does anything to pods.
fn assert_refused(endpoint: &str, runtime: &str) {
    let dir = std::env::temp_dir().join(format!("swiftlet-evented-refused-{}", std::process::id()));
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    let out = Command::new(swiftlet_bin())
        .args(["run", "--pleg", "evented", "--runtime-endpoint", endpoint])
        .args(["--node-name", &format!("refused{}", std::process::id())])
        .args(["--port", "0"])
        .args(["--read-only-port", &free_port().to_string()])
        .args(["--http-address", &format!("127.0.0.1:{}", free_port())])
        .arg("--manifests")
        .arg(dir.join("manifests"))
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.join("logs"))
        .arg("--grpc-socket")
        .arg(dir.join("swiftlet.sock"))
        .output()
        .expect("run swiftlet");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!(
        "error: --pleg evented needs the runtime's container events (CRI GetContainerEvents), \
         which {runtime} does not implement"
    );
    assert!(
        stderr.lines().any(|l| l.starts_with(&want)),
        "{want}\n{stderr}"
    );
    assert!(stderr.contains("containerd >= 1.7"), "{stderr}");
    assert!(stderr.contains("hint: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The endpoint of the test's runtime when it streams container events, and whether it hands
/// each event to one subscriber only; `None` (after checking the refusal) when it does not
/// stream them, or when the test cannot run here.
#[expect(
    clippy::print_stderr,
    reason = "the test log says which behaviour was checked"
)]
fn evented_runtime(test: &str) -> Option<(String, bool)> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let runtime = container_events(test);
    if !runtime.streams {
        eprintln!(
            "{test}: {} has no container events: checking the refusal instead",
            runtime.version
        );
        assert_refused(&endpoint, &runtime.version);
        return None;
    }
    Some((endpoint, runtime.serves_each_event_once))
}

fn start(name: &str, endpoint: &str) -> Node {
    let node = Node::start_with(name, endpoint, &EVENTED);
    assert_eq!(
        node.metric(r#"swiftlet_pleg_mode{mode="evented"}"#),
        1.0,
        "the Evented PLEG is in use"
    );
    node
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

fn kill_init(node: &Node, pod: &str) {
    let running = node.wait_pod(pod, "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&running, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init_pid(&id) as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the container's init");
}

fn relists(node: &Node) -> f64 {
    node.metric("kubelet_pleg_relist_duration_seconds_count")
}

fn wait_metric(node: &Node, what: &str, want: impl Fn(&Node) -> bool) {
    let deadline = Instant::now() + EVENT_WAIT;
    while !want(node) {
        assert!(Instant::now() < deadline, "{what} within {EVENT_WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn container_deaths_reach_the_status_from_the_runtimes_events() {
    let test = "container_deaths_reach_the_status_from_the_runtimes_events";
    let Some((endpoint, serves_each_event_once)) = evented_runtime(test) else {
        return;
    };
    let node = start("evented", &endpoint);
    let limit = "      resources:\n        limits:\n          memory: 32Mi\n";
    node.write_manifest("signal.yaml", &pod("signal", "exec sleep 3600", ""));
    node.write_manifest("code.yaml", &pod("code", "sleep 2; exit 3", ""));
    node.write_manifest(
        "oom.yaml",
        &pod("oom", "sleep 2; head -c 1000m /dev/zero | tail", limit),
    );
    node.wait_pod("code", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    node.wait_pod("oom", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let before = relists(&node);
    kill_init(&node, "signal");

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
    // On containerd 1.7 the relist also runs until the stream's first event (which the
    // subscriptions of the checks before the agent may delay past `before`); the deaths still
    // come from the events, as the count of stopped events says.
    if !serves_each_event_once {
        assert_eq!(
            relists(&node),
            before,
            "every death was learnt from the runtime's events: no relist ran in between"
        );
    }
    assert!(node.metric(r#"swiftlet_evented_pleg_events_total{type="stopped"}"#) >= 3.0);
    assert_eq!(
        node.metric("kubelet_evented_pleg_connection_success_count"),
        1.0
    );
    assert_eq!(
        node.metric("kubelet_evented_pleg_connection_error_count"),
        0.0
    );
    assert!(node.metric("kubelet_evented_pleg_connection_latency_seconds_count") >= 3.0);
}

/// A unix socket that forwards every connection to the runtime's socket, until cut.
struct Proxy {
    path: PathBuf,
    target: PathBuf,
    runtime: tokio::runtime::Runtime,
    accept: Option<tokio::task::JoinHandle<()>>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    fn start(path: PathBuf, endpoint: &str) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let mut proxy = Proxy {
            path,
            target: PathBuf::from(endpoint.trim_start_matches("unix://")),
            runtime,
            accept: None,
            connections: Arc::default(),
        };
        proxy.listen();
        proxy
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Accepts connections (again).
    fn listen(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = {
            let _entered = self.runtime.enter();
            tokio::net::UnixListener::bind(&self.path).expect("bind the proxy socket")
        };
        let target = self.target.clone();
        let connections = self.connections.clone();
        self.accept = Some(self.runtime.spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let forward = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::UnixStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                connections
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(forward.abort_handle());
            }
        }));
    }

    /// Breaks every connection and refuses new ones until [`Proxy::listen`].
    fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        let _ = std::fs::remove_file(&self.path);
        for connection in self
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

fn proxy_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("swiftlet-{test}-{}.sock", std::process::id()))
}

#[test]
fn a_lost_stream_is_subscribed_again_then_the_relist_takes_over() {
    let test = "a_lost_stream_is_subscribed_again_then_the_relist_takes_over";
    let Some((endpoint, serves_each_event_once)) = evented_runtime(test) else {
        return;
    };
    let mut proxy = Proxy::start(proxy_path("lost"), &endpoint);
    let node = start("evented-lost", &proxy.endpoint());
    node.write_manifest("first.yaml", &pod("first", "exec sleep 3600", ""));
    node.write_manifest("second.yaml", &pod("second", "exec sleep 3600", ""));
    node.wait_pod("second", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let successes = |n: &Node| n.metric("kubelet_evented_pleg_connection_success_count");
    let errors = |n: &Node| n.metric("kubelet_evented_pleg_connection_error_count");
    assert_eq!(successes(&node), 1.0);

    // The connection breaks and comes back at once: the stream is subscribed to again, after a
    // relist for what it may have carried.
    let relists_before = relists(&node);
    proxy.cut();
    proxy.listen();
    wait_metric(&node, "a second subscription", |n| successes(n) >= 2.0);
    wait_metric(&node, "the relist after the lost stream", |n| {
        relists(n) > relists_before
    });
    assert!(errors(&node) >= 1.0, "the lost stream is counted");
    assert!(errors(&node) < 5.0, "not given up");
    // Deaths reach the status from the new stream. On containerd 1.7 the broken connection's
    // subscription is still served and takes the next event, this death's: the relist, at its
    // own period until the new stream's first event, finds it.
    let before = relists(&node);
    kill_init(&node, "first");
    let killed = node.wait_pod("first", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&killed, "main")),
        Some(("Error".to_owned(), 137))
    );
    if serves_each_event_once {
        assert!(relists(&node) > before, "found by the relist");
    } else {
        assert_eq!(relists(&node), before, "learnt from the new stream");
    }

    // Lost for good (the runtime stays away): upstream's five tries, then the relist at 1 s.
    let pid = second_init(&node);
    proxy.cut();
    wait_metric(&node, "the fall back", |n| {
        n.metric("swiftlet_evented_pleg_fell_back") == 1.0
    });
    assert!(errors(&node) >= 5.0, "{}", errors(&node));
    proxy.listen();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the container's init");
    let before = relists(&node);
    let killed = node.wait_pod("second", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&killed, "main")).map(|(_, code)| code),
        Some(137)
    );
    assert!(relists(&node) > before, "the relist found the death");
    let subscriptions = successes(&node);
    wait_metric(&node, "two more relists", |n| relists(n) >= before + 2.0);
    assert_eq!(
        successes(&node),
        subscriptions,
        "no subscription after the fall back, as upstream"
    );
}

/// The host pid of pod `second`'s init, looked up while the runtime can still be reached.
fn second_init(node: &Node) -> u32 {
    let running = node.wait_pod("second", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&running, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    init_pid(&id)
}
