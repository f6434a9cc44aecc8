//! One `swiftlet run` per round: started on a fresh manifest directory, root directory and
//! sockets, with the PLEG asked for and a read-only port for `/pods`; ready when its log says
//! "swiftlet is running"; stopped with SIGTERM. Its log (stderr) goes to a file for the whole
//! round, read continuously so that a full pipe never stalls the agent being measured.

use std::{
    io::Write as _,
    net::{Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, ChildStderr, Command},
    sync::oneshot,
    task::JoinHandle,
};

use super::NODE_NAME;

/// The line swiftlet logs once its servers listen.
const READY_LINE: &str = "swiftlet is running";

/// Bound on the start (loading the eBPF programs, connecting to the runtime): far above what it
/// takes, only so that a broken start fails the benchmark instead of hanging it.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long swiftlet may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Lines of the log quoted when swiftlet fails.
const LOG_TAIL_LINES: usize = 20;

/// Where one round's swiftlet keeps everything, and how it is reached.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub swiftlet: PathBuf,
    pub runtime_endpoint: String,
    /// `--manifests`.
    pub manifests: PathBuf,
    /// Holds the gRPC socket and the root directory.
    pub work_dir: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// `--pleg` (`relist` or `ebpf`).
    pub pleg: String,
    /// Further arguments of `swiftlet run`.
    pub extra_args: Vec<String>,
}

impl AgentOptions {
    /// Where its gRPC API listens.
    pub fn grpc_socket(&self) -> PathBuf {
        self.work_dir.join("s.sock")
    }
}

/// A running swiftlet; SIGKILLed if dropped without [`Agent::stop`].
pub struct Agent {
    child: Child,
    /// The read-only port serving `/pods` and `/metrics`.
    pub port: u16,
    log: PathBuf,
    logger: JoinHandle<()>,
    /// No other agent under test runs on this machine meanwhile (each stops pods it does not
    /// know): [`crate::node::machine_lock`].
    _machine: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Agent {
    /// Starts swiftlet and waits until it is running.
    pub async fn start(options: &AgentOptions) -> Result<Agent> {
        let machine = tokio::task::spawn_blocking(crate::node::machine_lock)
            .await
            .context("waiting for the machine-wide agent lock")?;
        let port = free_port()?;
        let mut command = Command::new(&options.swiftlet);
        command
            .arg("run")
            .arg("--manifests")
            .arg(&options.manifests)
            .args(["--runtime-endpoint", &options.runtime_endpoint])
            .args(["--pleg", &options.pleg])
            .args(["--read-only-port", &port.to_string()])
            // The read-only port is unauthenticated: not on every interface.
            .args(["--address", "127.0.0.1"])
            // No kubelet server: benchmarks do not use it, and 10250 may be taken.
            .args(["--port", "0"])
            .args(["--http-address", "127.0.0.1:0"])
            .arg("--grpc-socket")
            .arg(options.grpc_socket())
            .arg("--root-dir")
            .arg(options.work_dir.join("root"))
            .args(["--node-name", NODE_NAME])
            // As the test agents: the sandbox image named for image GC (containerd 1.6 does not
            // pin it), image GC off unless asked for (this machine's disk is above its default
            // threshold and no registry could bring an image back), no container GC of young
            // containers (the benchmarks' agents run side by side on one containerd), and pod
            // logs of its own (container GC removes the log directories of pods it does not run).
            .args([
                "--pod-infra-container-image",
                "localhost/swiftlet/pause:latest",
            ])
            .args(crate::default_image_gc_args(&options.extra_args))
            .args(crate::default_container_gc_args(&options.extra_args))
            .arg("--pod-logs-dir")
            .arg(options.work_dir.join("pods"))
            .args(&options.extra_args)
            .args(crate::default_eviction_args(&options.extra_args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", options.swiftlet.display()))?;
        let stderr = child.stderr.take().context("swiftlet's stderr")?;
        let log = std::fs::File::create(&options.log)
            .with_context(|| format!("creating {}", options.log.display()))?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let logger = tokio::spawn(copy_log(stderr, log, ready_tx));

        let started = tokio::select! {
            ready = ready_rx => ready.map_err(|_| "its stderr closed".to_owned()),
            status = child.wait() => Err(match status {
                Ok(status) => format!("it exited ({status})"),
                Err(e) => format!("waiting for it failed: {e}"),
            }),
            () = tokio::time::sleep(READY_TIMEOUT) => Err(format!("not within {READY_TIMEOUT:?}")),
        };
        if let Err(why) = started {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let _ = logger.await;
            bail!(
                "swiftlet did not start ({why}); the end of {}:\n{}",
                options.log.display(),
                log_tail(&options.log)
            );
        }
        Ok(Agent {
            child,
            port,
            log: options.log.clone(),
            logger,
            _machine: machine,
        })
    }

    /// Its process id (for its CPU time and memory in /proc).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether swiftlet has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The end of its log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Saves what `/metrics` says now to `snapshot` (unless it does not answer), then
    /// [`Agent::stop`]s swiftlet.
    pub async fn stop_after_snapshot(self, snapshot: &Path) -> Result<ExitStatus> {
        if let Ok(text) = super::http::get(self.port, "/metrics").await {
            std::fs::write(snapshot, text)
                .with_context(|| format!("writing {}", snapshot.display()))?;
        }
        self.stop().await
    }

    /// SIGTERM, then SIGKILL if it does not exit in time. Its pods keep running (as the
    /// kubelet's do): clearing them is the caller's job.
    pub async fn stop(mut self) -> Result<ExitStatus> {
        if let Some(status) = self.exited() {
            let _ = self.logger.await;
            return Ok(status);
        }
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGTERM);
        }
        let status = match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                eprintln!("swiftlet did not exit within {STOP_TIMEOUT:?} of SIGTERM; killing it");
                self.child.kill().await?;
                self.child.wait().await?
            }
        };
        let _ = self.logger.await;
        Ok(status)
    }
}

/// A TCP port free right now on 127.0.0.1 (the kernel's pick; swiftlet binds it a moment later).
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free TCP port")?;
    Ok(listener.local_addr()?.port())
}

/// Copies swiftlet's stderr into `log` line by line until it closes, telling `ready` when the
/// ready line passes.
async fn copy_log(stderr: ChildStderr, mut log: std::fs::File, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        // A failed write loses a log line, not the measurement.
        let _ = writeln!(log, "{line}");
        if line.contains(READY_LINE)
            && let Some(ready) = ready.take()
        {
            let _ = ready.send(());
        }
    }
}

/// The last lines of `log`, indented.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read it: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[start..]
        .iter()
        .map(|l| format!("  | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
