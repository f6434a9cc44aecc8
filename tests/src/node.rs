//! A `swiftlet run` under test: its own manifest folder, ports (healthz, read-only and kubelet
//! server), socket and node name, talking to the private containerd; pods read back through its read-only
//! `/pods`, as a user would.
//!
//! Runs that share one containerd (or one machine's `/kubepods`) must not overlap: each agent
//! stops pods it does not know. So [`Node::start`] takes a lock that the returned node holds:
//! a process-wide one for the tests of one binary, and a machine-wide one (`flock` on
//! [`ONE_AGENT_LOCK_FILE`]) for test processes started side by side, e.g. by two `cargo test`s.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;

use crate::{event_wait, process::Running, swiftlet_bin};

static ONE_AGENT: Mutex<()> = Mutex::new(());

/// The machine-wide lock of a running agent under test.
pub const ONE_AGENT_LOCK_FILE: &str = "/tmp/swiftlet-tests-one-agent.lock";

/// Waits for the machine-wide lock (see the module's docs); `None` if the lock file cannot be
/// opened, which only costs the protection against another test process. The benchmarks' agents
/// take it too.
pub fn machine_lock() -> Option<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(ONE_AGENT_LOCK_FILE)
        .ok()?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok()
}

pub struct Node {
    pub name: String,
    pub manifests: PathBuf,
    pub port: u16,
    /// The kubelet server's (TLS) port; 0 when a test disabled it with `--port 0`.
    pub kubelet_port: u16,
    /// The healthz port (`/healthz` only); 0 when a test gave its own `--http-address`.
    pub healthz_port: u16,
    dir: PathBuf,
    endpoint: String,
    pub agent: Option<Running>,
    /// The agent's log up to "swiftlet is running" (its start-up), of its latest start.
    pub startup_log: Vec<String>,
    extra_args: Vec<String>,
    // Dropped in field order: the machine-wide lock goes after the agent field above.
    _machine: Option<nix::fcntl::Flock<std::fs::File>>,
    _exclusive: MutexGuard<'static, ()>,
}

/// Three distinct free ports: each listener is held until all are bound, since a port released
/// by one probe may be the very one the kernel hands the next (the agent then fails "Address
/// already in use" on its second listener).
fn free_ports() -> [u16; 3] {
    let listeners: Vec<std::net::TcpListener> = (0..3)
        .filter_map(|_| std::net::TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    let port = |i: usize| {
        listeners
            .get(i)
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port())
    };
    [port(0), port(1), port(2)]
}

/// The busybox image test pods run (`cargo xtask` builds and imports it; there is no registry).
pub const BUSYBOX: &str = "localhost/swiftlet/busybox:latest";

impl Node {
    /// The agent of test `test` with `extra_args`, or `None` when the test cannot run here (not
    /// root outside CI, or no runtime endpoint; the helpers say why, and fail in CI).
    pub fn for_test(test: &str, name: &str, extra_args: &[&str]) -> Option<Node> {
        if !crate::privileged(test) {
            return None;
        }
        let endpoint = crate::runtime_endpoint(test)?;
        Some(Node::start_with(name, &endpoint, extra_args))
    }

    /// Starts an agent named `name` on the runtime at `endpoint`, with an empty manifest folder.
    pub fn start(name: &str, endpoint: &str) -> Node {
        Self::start_with(name, endpoint, &[])
    }

    /// The same with more `swiftlet run` flags.
    pub fn start_with(name: &str, endpoint: &str, extra_args: &[&str]) -> Node {
        let exclusive = ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner());
        let machine = machine_lock();
        let dir = std::env::temp_dir().join(format!("swiftlet-node-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", manifests.display()));
        // Unique per test process: pods' UIDs derive from their node's name, and a run must not
        // adopt what an earlier, interrupted run left in the runtime.
        let name = format!("{name}{}", std::process::id());
        let mut node = Node {
            name,
            manifests,
            port: 0,
            kubelet_port: 0,
            healthz_port: 0,
            dir,
            endpoint: endpoint.to_owned(),
            agent: None,
            startup_log: Vec::new(),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            _machine: machine,
            _exclusive: exclusive,
        };
        node.restart();
        node
    }

    /// (Re)starts the agent process (stopping the running one first, with SIGTERM).
    pub fn restart(&mut self) {
        self.stop();
        let [port, kubelet_port, healthz_port] = free_ports();
        self.port = port;
        // Nodes run side by side: never the default 10250. A test's own --port wins.
        let port_given = self.extra_args.iter().any(|a| a == "--port");
        self.kubelet_port = match self.extra_args.iter().position(|a| a == "--port") {
            Some(i) => self
                .extra_args
                .get(i + 1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
            None => kubelet_port,
        };
        let own_port = (!port_given).then(|| ["--port".to_owned(), self.kubelet_port.to_string()]);
        let healthz_given = self.extra_args.iter().any(|a| a == "--http-address");
        self.healthz_port = if healthz_given { 0 } else { healthz_port };
        let own_healthz = (!healthz_given).then(|| {
            [
                "--http-address".to_owned(),
                format!("127.0.0.1:{}", self.healthz_port),
            ]
        });
        let agent = Running::start(
            Command::new(swiftlet_bin())
                .args(["run", "--node-name", &self.name])
                .arg("--manifests")
                .arg(&self.manifests)
                .args(["--runtime-endpoint", &self.endpoint])
                .args(["--read-only-port", &self.port.to_string()])
                .args(own_port.iter().flatten())
                .args(own_healthz.iter().flatten())
                .arg("--grpc-socket")
                .arg(self.dir.join("swiftlet.sock"))
                .arg("--root-dir")
                .arg(self.dir.join("root"))
                // containerd 1.6 does not pin its sandbox image: image GC must be told it.
                .args([
                    "--pod-infra-container-image",
                    "localhost/swiftlet/pause:latest",
                ])
                .args(crate::default_image_gc_args(&self.extra_args))
                .args(crate::default_container_gc_args(&self.extra_args))
                // Its own pod log directory: the container GC removes those of pods it does not
                // run, and agents of other test runs may share this machine.
                .arg("--pod-logs-dir")
                .arg(self.pod_logs_dir())
                .args(self.with_driver(&self.extra_args))
                .args(crate::default_eviction_args(&self.extra_args))
                .env("RUST_LOG", "info,swiftlet=debug"),
        );
        self.startup_log = agent.wait_stderr_lines("swiftlet is running");
        self.agent = Some(agent);
    }

    /// `args` with the run's cgroup driver (`crate::driver`) in the agent's configuration file:
    /// the test's own `--config` file copied with the driver's line added, or a file of that
    /// line alone. Unchanged under the default driver.
    fn with_driver(&self, args: &[String]) -> Vec<String> {
        let Some(line) = crate::driver::config_line() else {
            return args.to_vec();
        };
        let merged = self.dir.join("config-with-driver.yaml");
        let mut args = args.to_vec();
        let given = args.iter().position(|a| a == "--config");
        let mut text = match given.and_then(|i| args.get(i + 1)) {
            Some(file) => std::fs::read_to_string(file)
                .unwrap_or_else(|e| panic!("the test's --config {file}: {e}")),
            None => String::new(),
        };
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
        std::fs::write(&merged, text).unwrap_or_else(|e| panic!("write {}: {e}", merged.display()));
        let merged = merged.to_string_lossy().into_owned();
        match given {
            Some(i) if i + 1 < args.len() => args[i + 1] = merged,
            _ => args.extend(["--config".to_owned(), merged]),
        }
        args
    }

    /// Restarts the agent with `extra_args` in place of the flags it was started with.
    pub fn restart_with(&mut self, extra_args: &[&str]) {
        self.extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        self.restart();
    }

    /// Stops the agent with SIGTERM and waits for it (pods keep running, as with the kubelet).
    pub fn stop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let pid = nix::unistd::Pid::from_raw(agent.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + event_wait();
            while Instant::now() < deadline {
                if let Ok(Some(_)) = agent.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("swiftlet did not stop within {:?} of SIGTERM", event_wait());
        }
    }

    pub fn write_manifest(&self, file: &str, yaml: &str) {
        // Written aside and renamed in, so the agent never reads half a file.
        let tmp = self.dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, self.manifests.join(file))
            .unwrap_or_else(|e| panic!("rename {file}: {e}"));
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file))
            .unwrap_or_else(|e| panic!("remove {file}: {e}"));
    }

    /// The pods `/pods` lists now.
    pub fn pods(&self) -> Vec<Pod> {
        let body = crate::http_get(self.port, "/pods");
        let list: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|p| serde_json::from_value(p.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pod named `<name>-<node>` as `/pods` shows it, if listed.
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let full = format!("{name}-{}", self.name);
        self.pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(full.as_str()))
    }

    /// Polls `/pods` until `want` holds for pod `name` (bounded: a missing state fails the test
    /// with the last status seen, it never hangs it).
    pub fn wait_pod(&self, name: &str, what: &str, want: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + event_wait();
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(pod) = self.pod(name) {
                if want(&pod) {
                    return pod;
                }
                last = Some(pod);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = self.log_lines();
        let tail = &log[log.len().saturating_sub(60)..];
        panic!(
            "pod {name} never got {what}; last seen: {:#?}\nthe agent's last log lines:\n{}",
            last.map(|p| p.status),
            tail.join("\n")
        );
    }

    /// Polls until pod `name` is no longer listed.
    pub fn wait_gone(&self, name: &str) {
        let deadline = Instant::now() + event_wait();
        while Instant::now() < deadline {
            if self.pod(name).is_none() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "pod {name} is still listed: {:#?}",
            self.pod(name).map(|p| p.status)
        );
    }

    /// The agent's `/metrics` text (on its read-only port).
    pub fn metrics(&self) -> String {
        crate::http_get(self.port, "/metrics")
    }

    /// The agent's `/metrics/probes` text (the prober's series, apart as upstream's).
    pub fn probe_metrics(&self) -> String {
        crate::http_get(self.port, "/metrics/probes")
    }

    /// One sample of the agent's metrics: the value of the line starting with `series`
    /// (e.g. `swiftlet_pleg_mode{mode="ebpf"}`), 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix(series)?;
                rest.strip_prefix(' ')?.trim().parse().ok()
            })
            .unwrap_or(0.0)
    }

    /// The agent's gRPC socket.
    pub fn grpc_socket(&self) -> PathBuf {
        self.dir.join("swiftlet.sock")
    }

    /// The agent's log so far (stderr lines received).
    pub fn log_lines(&self) -> Vec<String> {
        self.agent
            .as_ref()
            .map(|a| a.stderr.try_iter().collect())
            .unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The UID swiftlet gave pod `name` (which it must list).
    pub fn pod_uid(&self, name: &str) -> String {
        self.pod(name)
            .and_then(|p| p.metadata.uid)
            .unwrap_or_else(|| panic!("pod {name} is listed with a uid"))
    }

    /// `<rootDir>/pods/<uid>`: where this agent keeps the pod's volumes and files.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.dir.join("root/pods").join(uid)
    }

    /// The kubelet server's certificate directory (the default `<root-dir>/pki`).
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.join("root/pki")
    }

    /// Where the agent keeps its pods' container logs (`--pod-logs-dir`).
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.dir.join("pods")
    }
}

/// How many of the agent's last log lines a failed test prints.
const LOG_TAIL_ON_PANIC: usize = 200;

impl Drop for Node {
    fn drop(&mut self) {
        // A test that failed after its waits succeeded (an assertion on what it waited for)
        // would otherwise show nothing of the agent's side.
        if std::thread::panicking() {
            let log = self.log_lines();
            let tail = &log[log.len().saturating_sub(LOG_TAIL_ON_PANIC)..];
            eprintln!(
                "the agent's ({}) last log lines before the failure:\n{}",
                self.name,
                tail.join("\n")
            );
        }
        // Removing every manifest lets the agent stop and remove its pods before it goes. Only
        // those leave, and the API server's pods being deleted: one still bound to the node stays
        // listed (as upstream, the agent keeps it while it runs), and waiting for it would only
        // wait out the deadline before the same stop.
        if let Ok(entries) = std::fs::read_dir(&self.manifests) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let deadline = Instant::now() + event_wait();
        while self.agent.is_some()
            && Instant::now() < deadline
            && self.pods().iter().any(leaves_at_drop)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `pod` goes away once a node's manifests are removed: a pod of the manifest folder
/// (any source but `api` in `kubernetes.io/config.source`, which the agent sets on every pod it
/// stores, as upstream's config merge), or one the API server is deleting.
fn leaves_at_drop(pod: &Pod) -> bool {
    let source = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubernetes.io/config.source"));
    source.is_none_or(|s| s != "api") || pod.metadata.deletion_timestamp.is_some()
}

/// Accessors for statuses, so tests read as assertions.
pub mod status {
    use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

    pub fn phase(pod: &Pod) -> &str {
        pod.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or_default()
    }

    pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
        pod.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == name)
    }

    pub fn init_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
        pod.status
            .as_ref()?
            .init_container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == name)
    }

    pub fn running(c: Option<&ContainerStatus>) -> bool {
        c.and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    }

    /// (reason, exit code) of a terminated container.
    pub fn terminated(c: Option<&ContainerStatus>) -> Option<(String, i32)> {
        let t = c?.state.as_ref()?.terminated.as_ref()?;
        Some((t.reason.clone().unwrap_or_default(), t.exit_code))
    }

    pub fn waiting_reason(c: Option<&ContainerStatus>) -> Option<String> {
        c?.state.as_ref()?.waiting.as_ref()?.reason.clone()
    }

    pub fn condition(pod: &Pod, kind: &str) -> Option<String> {
        pod.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == kind)
            .map(|c| c.status.clone())
    }
}
