//! The PLEG benchmark (`swiftlet-bench pleg`): how soon each PLEG tells that a container died, and
//! what it costs while nothing happens, with the same workload against `--pleg relist` (1 s, the
//! kubelet's default), `--pleg evented` (upstream's Evented PLEG, on the runtime's CRI
//! `GetContainerEvents`) and `--pleg ebpf`, one after the other in one run, for each number of
//! containers.
//!
//! Where each latency comes from is measured too, per exit, from the instants the event itself
//! carries: when the kernel saw the exit (kernel-event PLEG), when the runtime reaped it (the
//! status's `finished_at`, from containerd's shim), and when the status the event carries was
//! observed (the moment a relist or a kernel-triggered refresh asked the runtime, or the
//! runtime's own timestamp of its container event — for containerd, taken after its exit handling,
//! `runc delete` included, is done).
//!
//! One configuration (a PLEG and N) has its own swiftlet. It runs generations of N static pods
//! (one busybox `sleep` container each, `restartPolicy: Never`):
//! - once the first generation runs and has settled, the agent is left idle for a window, over
//!   which its CPU time (from a cgroup of its own), containerd's CPU time, the CRI calls it made
//!   (its own `kubelet_runtime_operations_total`) and its RSS are taken. The pod workers' resync
//!   (`--sync-frequency`, 1 min by default) is set to 10 min for both PLEGs, so that the window
//!   holds what the PLEG costs and not N resyncs that either PLEG would do alike;
//! - then the init process of every container is SIGKILLed, one at a time in a random order, a
//!   random 100–500 ms apart; the time from just before `kill(2)` to the arrival of the
//!   `ContainerDied` pod lifecycle event for that container on swiftlet's gRPC stream
//!   (`swiftlet.v1.Events/Watch`), which carries the status CRI reported, is one sample. The
//!   killed containers stay in the runtime as exited containers, so a relist lists N containers
//!   throughout;
//! - the pods are deleted and the next generation starts, until enough exits were measured.
//!
//! Submodules: `report` (table, JSON, plot).

pub mod report;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use nix::{sys::signal::Signal, unistd::Pid};
use serde::Serialize;
use swiftlet_proto::v1::{self, events_client::EventsClient};
use tokio::sync::mpsc;

use super::harness::{
    self, NODE_NAME,
    agent::{Agent, AgentOptions},
    cgroups,
    cri::Cri,
    http, manifests,
};
use super::{driver::Benchmark, machine::Machine, report::rfc3339};

/// Every PLEG, in the order each N runs them.
pub const PLEGS: [&str; 3] = ["relist", "evented", "ebpf"];

/// The relist PLEG's period: the kubelet's default (`relistPeriod`).
const RELIST_PERIOD: &str = "1s";

/// swiftlet's (and the kubelet's) default `maxPods`.
const DEFAULT_MAX_PODS: usize = 110;

/// The pod workers' resync period for both PLEGs: beyond the idle window.
const SYNC_FREQUENCY: &str = "10m";

/// Time between two kills: drawn uniformly from this range (ms), so that kills fall at every
/// phase of the relist period.
const KILL_GAP_MS: (u64, u64) = (100, 500);

/// How long a generation waits for its pods to run.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// How long after the last kill the events still missing are waited for: far above what either
/// PLEG takes (the relist period plus its own time), so that a missing event is a miss, not a
/// slow one.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// After a generation runs, before the idle window: the start's own work (statuses, on-demand
/// relists, the first resync) is done by then.
const SETTLE: Duration = Duration::from_secs(5);

/// Bound on a generation's teardown.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(120);

/// The seed of the kill order and gaps: runs are repeatable.
const SEED: u64 = 0x5EED_F1E7;

/// What to run, and against what.
#[derive(Clone, Debug)]
pub struct Settings {
    pub swiftlet: PathBuf,
    pub runtime_endpoint: String,
    /// Running containers (one per pod), each run with every PLEG of `plegs`.
    pub sizes: Vec<usize>,
    /// The PLEGs to compare, in order (of [`PLEGS`]).
    pub plegs: Vec<String>,
    /// Exits to measure per configuration, at least.
    pub exits: usize,
    /// The idle window over which the steady-state cost is taken.
    pub idle: Duration,
    /// Where each configuration's swiftlet log and `/metrics` snapshot go.
    pub log_dir: PathBuf,
}

/// One configuration's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigOutcome {
    pub pleg: String,
    /// The container runtime, as CRI `Version` names it.
    pub runtime: String,
    pub containers: usize,
    /// Kill → `ContainerDied` received, per exit measured, ascending.
    pub latencies_ns: Vec<u64>,
    /// Kills whose `ContainerDied` did not come within [`EVENT_TIMEOUT`].
    pub missed: usize,
    /// Events whose status was not `exited` with code 137 (SIGKILL).
    pub wrong_status: usize,
    /// Of the events measured, those a kernel event caused (a kernel timestamp on the event).
    pub kernel_caused: usize,
    pub generations: usize,
    pub idle: IdleCost,
    /// Where the latencies come from, per exit measured.
    pub phases: Phases,
    /// Container events the runtime streamed to the Evented PLEG over the whole configuration
    /// (`swiftlet_evented_pleg_events_total`), and the seconds it ran.
    pub stream_events: f64,
    pub run_seconds: f64,
}

/// The instants an exit's event carries, each as the time since the kill, ascending; an exit whose
/// event lacks one (or carries one from before the kill: a status observed earlier and amended by
/// the kernel's account) adds no sample to it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    /// Kill → the kernel saw the init exit (kernel-event PLEG only).
    pub kernel_ns: Vec<u64>,
    /// Kill → the runtime reaped it (the status's `finished_at`).
    pub reaped_ns: Vec<u64>,
    /// Kill → the status the event carries was observed.
    pub observed_ns: Vec<u64>,
}

impl Phases {
    fn sort(&mut self) {
        self.kernel_ns.sort_unstable();
        self.reaped_ns.sort_unstable();
        self.observed_ns.sort_unstable();
    }
}

/// The steady-state cost over the idle window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IdleCost {
    pub seconds: f64,
    /// swiftlet's CPU time (user + system).
    pub agent_cpu_seconds: f64,
    /// containerd's (the CRI server's) CPU time; `None` if its process was not found.
    pub runtime_cpu_seconds: Option<f64>,
    /// CRI calls swiftlet made, by operation.
    pub cri_calls: BTreeMap<String, f64>,
    /// swiftlet's resident set at the end of the window.
    pub rss_bytes: u64,
    /// Full relists during the window.
    pub relists: f64,
    /// Container events the runtime streamed to the Evented PLEG during the window.
    pub stream_events: f64,
}

impl IdleCost {
    fn per_minute(&self, value: f64) -> f64 {
        if self.seconds > 0.0 {
            value * 60.0 / self.seconds
        } else {
            0.0
        }
    }

    pub fn agent_cpu_per_minute(&self) -> f64 {
        self.per_minute(self.agent_cpu_seconds)
    }

    pub fn runtime_cpu_per_minute(&self) -> Option<f64> {
        self.runtime_cpu_seconds.map(|s| self.per_minute(s))
    }

    pub fn cri_calls_per_minute(&self) -> f64 {
        // A fold from +0.0: an empty f64 `sum()` is -0.0, which prints as "-0".
        self.per_minute(self.cri_calls.values().fold(0.0, |sum, calls| sum + calls))
    }
}

/// Runs every configuration, each N with both PLEGs back to back.
pub async fn run(settings: &Settings) -> Result<Vec<ConfigOutcome>> {
    if settings.sizes.contains(&0) || settings.exits == 0 {
        bail!("container counts and exits must not be zero");
    }
    if let Some(unknown) = settings.plegs.iter().find(|p| !PLEGS.contains(&p.as_str())) {
        bail!("--pleg {unknown}: expected one of {}", PLEGS.join(", "));
    }
    let _ = std::fs::remove_dir_all(&settings.log_dir);
    std::fs::create_dir_all(&settings.log_dir)
        .with_context(|| format!("creating {}", settings.log_dir.display()))?;
    let mut cri = Cri::connect(&settings.runtime_endpoint).await?;
    clear(&mut cri)
        .await
        .context("clearing an earlier run's pods")?;
    let runtime = cri.runtime_version().await?;
    let containerd = runtime_pid(&settings.runtime_endpoint);
    if containerd.is_none() {
        eprintln!(
            "note: no containerd process serves {}; its CPU time is not reported",
            settings.runtime_endpoint
        );
    }
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut outcomes = Vec::new();
    for &size in &settings.sizes {
        for pleg in &settings.plegs {
            let config = Config {
                settings,
                pleg,
                runtime: &runtime,
                size,
                containerd,
            };
            let outcome = config
                .run(&mut cri, &mut rng)
                .await
                .with_context(|| format!("--pleg {pleg} with {size} containers"))?;
            eprintln!("{}", progress_line(&outcome));
            outcomes.push(outcome);
        }
    }
    Ok(outcomes)
}

/// Clears every pod of the benchmark from the runtime at `endpoint` and their cgroups, after an
/// interrupted run.
pub async fn clean_up(endpoint: &str) -> Result<usize> {
    let mut cri = Cri::connect(endpoint).await?;
    clear(&mut cri).await
}

async fn clear(cri: &mut Cri) -> Result<usize> {
    let cleared = cri.clear().await?;
    cgroups::remove_pod_dirs(&cleared.pod_uids);
    Ok(cleared.found)
}

fn progress_line(o: &ConfigOutcome) -> String {
    let latency = super::stats::Latency::of(&o.latencies_ns);
    let ms = |ns: u64| ns as f64 / 1e6;
    format!(
        "--pleg {} with {} containers: {} exits, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} \
         missed; idle: {:.3} CPU s/min, {:.0} CRI calls/min",
        o.pleg,
        o.containers,
        latency.count,
        ms(latency.p50_ns),
        ms(latency.p99_ns),
        ms(latency.max_ns),
        o.missed,
        o.idle.agent_cpu_per_minute(),
        o.idle.cri_calls_per_minute(),
    )
}

/// One PLEG with one number of containers.
struct Config<'a> {
    settings: &'a Settings,
    pleg: &'a str,
    runtime: &'a str,
    size: usize,
    containerd: Option<u32>,
}

/// A `ContainerDied` as it arrived.
struct Died {
    container_id: String,
    at: Instant,
    status_ok: bool,
    kernel_caused: bool,
    /// CLOCK_MONOTONIC ns, 0 when no kernel event caused it.
    kernel_ts_ns: u64,
    /// Unix ns, 0 when unknown.
    finished_unix_ns: u64,
    observed_unix_ns: u64,
}

/// A kill, on the clocks the event's instants are on.
#[derive(Clone, Copy)]
struct Killed {
    at: Instant,
    monotonic_ns: u64,
    unix_ns: u64,
}

impl Killed {
    fn now() -> Killed {
        Killed {
            monotonic_ns: swiftlet::kernel::monotonic_ns(),
            unix_ns: unix_ns(SystemTime::now()),
            at: Instant::now(),
        }
    }
}

fn unix_ns(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, nanos)
}

/// `instant - since` when the event carried the instant and it is not before the kill.
fn after(instant: u64, since: u64) -> Option<u64> {
    (instant != 0 && instant >= since).then(|| instant - since)
}

impl Config<'_> {
    fn pod_name(&self, generation: usize, index: usize) -> String {
        format!("pleg-{}-{}-g{generation}-{index:03}", self.pleg, self.size)
    }

    async fn run(&self, cri: &mut Cri, rng: &mut fastrand::Rng) -> Result<ConfigOutcome> {
        let label = format!("{}-{}", self.pleg, self.size);
        let work = harness::WorkDir::with_manifests("pleg", &label)?;
        let (staging, manifest_dir) = (work.staging(), work.manifests());
        // The kubelet's default of 110 pods per node would reject the pods of a larger N.
        let max_pods = self.size.max(DEFAULT_MAX_PODS);
        let mut extra_args = vec![
            "--sync-frequency".to_owned(),
            SYNC_FREQUENCY.to_owned(),
            "--max-pods".to_owned(),
            max_pods.to_string(),
        ];
        if self.pleg == "relist" {
            extra_args.extend(["--pleg-relist-period".to_owned(), RELIST_PERIOD.to_owned()]);
        }
        let options = AgentOptions {
            swiftlet: self.settings.swiftlet.clone(),
            runtime_endpoint: self.settings.runtime_endpoint.clone(),
            manifests: manifest_dir.clone(),
            work_dir: work.0.clone(),
            log: self.settings.log_dir.join(format!("swiftlet-{label}.log")),
            pleg: self.pleg.to_owned(),
            extra_args,
        };
        let agent = Agent::start(&options).await?;
        let measured = match CpuAccount::new(&label, agent.pid()) {
            Ok(account) => {
                self.measure(
                    &agent,
                    &account,
                    &options,
                    cri,
                    rng,
                    &staging,
                    &manifest_dir,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let stopped = agent
            .stop_after_snapshot(&self.settings.log_dir.join(format!("metrics-{label}.txt")))
            .await;
        let cleared = clear(cri)
            .await
            .context("clearing the configuration's pods");
        let outcome = measured?;
        stopped.context("stopping swiftlet")?;
        cleared?;
        Ok(outcome)
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one configuration's parts, all borrowed"
    )]
    async fn measure(
        &self,
        agent: &Agent,
        account: &CpuAccount,
        options: &AgentOptions,
        cri: &mut Cri,
        rng: &mut fastrand::Rng,
        staging: &Path,
        manifest_dir: &Path,
    ) -> Result<ConfigOutcome> {
        let mut deaths = watch_deaths(&options.grpc_socket()).await?;
        let began = Instant::now();
        let mut outcome = ConfigOutcome {
            pleg: self.pleg.to_owned(),
            runtime: self.runtime.to_owned(),
            containers: self.size,
            latencies_ns: Vec::new(),
            missed: 0,
            wrong_status: 0,
            kernel_caused: 0,
            generations: 0,
            idle: IdleCost::default(),
            phases: Phases::default(),
            stream_events: 0.0,
            run_seconds: 0.0,
        };
        while outcome.latencies_ns.len() + outcome.missed < self.settings.exits {
            let generation = outcome.generations;
            let names: Vec<String> = (0..self.size)
                .map(|i| self.pod_name(generation, i))
                .collect();
            let files: Vec<(String, String)> = names
                .iter()
                .map(|n| (format!("{n}.yaml"), manifest(n)))
                .collect();
            manifests::write_all(&files, staging, manifest_dir)?;
            let node_names: Vec<String> =
                names.iter().map(|n| format!("{n}-{NODE_NAME}")).collect();
            let containers = harness::wait_running(agent, &node_names, START_TIMEOUT).await?;
            if generation == 0 {
                tokio::time::sleep(SETTLE).await;
                outcome.idle = self.idle_cost(agent, account).await?;
            }
            let mut pids = Vec::with_capacity(containers.len());
            for id in &containers {
                pids.push((id.clone(), cri.container_pid(id).await?));
            }
            rng.shuffle(&mut pids);
            // What came before this generation's kills (its starts) is not measured.
            while deaths.try_recv().is_ok() {}
            self.kill_all(&pids, &mut deaths, rng, &mut outcome).await?;
            let removed = {
                let files: Vec<String> = files.into_iter().map(|(f, _)| f).collect();
                manifests::remove_all(&files, manifest_dir)?;
                harness::wait_removed(agent.port, cri, &node_names, TEARDOWN_TIMEOUT).await?
            };
            if !removed {
                eprintln!(
                    "--pleg {} generation {generation}: swiftlet did not remove its pods within \
                     {TEARDOWN_TIMEOUT:?}; clearing them over CRI",
                    self.pleg
                );
                clear(cri).await?;
            }
            outcome.generations += 1;
        }
        outcome.latencies_ns.sort_unstable();
        outcome.phases.sort();
        outcome.stream_events = stream_events(&http::get(agent.port, "/metrics").await?);
        outcome.run_seconds = began.elapsed().as_secs_f64();
        Ok(outcome)
    }

    /// Kills every `(container, pid)` in turn and collects the latencies of their deaths.
    async fn kill_all(
        &self,
        pids: &[(String, u32)],
        deaths: &mut mpsc::UnboundedReceiver<Died>,
        rng: &mut fastrand::Rng,
        outcome: &mut ConfigOutcome,
    ) -> Result<()> {
        let mut killed_at: HashMap<&str, Killed> = HashMap::with_capacity(pids.len());
        let mut record = |died: Died, killed_at: &mut HashMap<&str, Killed>| {
            if let Some(t0) = killed_at.remove(died.container_id.as_str()) {
                outcome
                    .latencies_ns
                    .push(nanos(died.at.saturating_duration_since(t0.at)));
                outcome.wrong_status += usize::from(!died.status_ok);
                outcome.kernel_caused += usize::from(died.kernel_caused);
                let phases = &mut outcome.phases;
                phases
                    .kernel_ns
                    .extend(after(died.kernel_ts_ns, t0.monotonic_ns));
                phases
                    .reaped_ns
                    .extend(after(died.finished_unix_ns, t0.unix_ns));
                phases
                    .observed_ns
                    .extend(after(died.observed_unix_ns, t0.unix_ns));
            }
        };
        for (id, pid) in pids {
            let gap = Duration::from_millis(rng.u64(KILL_GAP_MS.0..=KILL_GAP_MS.1));
            let next = tokio::time::Instant::now() + gap;
            while let Ok(Some(died)) = tokio::time::timeout_at(next, deaths.recv()).await {
                record(died, &mut killed_at);
            }
            let t0 = Killed::now();
            nix::sys::signal::kill(Pid::from_raw(i32::try_from(*pid)?), Signal::SIGKILL)
                .with_context(|| format!("killing the init (pid {pid}) of container {id}"))?;
            killed_at.insert(id.as_str(), t0);
        }
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        while !killed_at.is_empty() {
            match tokio::time::timeout_at(deadline, deaths.recv()).await {
                Ok(Some(died)) => record(died, &mut killed_at),
                Ok(None) => bail!("swiftlet's event stream ended"),
                Err(_) => break,
            }
        }
        outcome.missed += killed_at.len();
        Ok(())
    }

    /// Leaves the agent alone for the idle window and takes what it cost.
    async fn idle_cost(&self, agent: &Agent, account: &CpuAccount) -> Result<IdleCost> {
        let pid = agent.pid().context("swiftlet has no pid")?;
        let before_metrics = http::get(agent.port, "/metrics").await?;
        let (agent_before, runtime_before) = (account.seconds()?, self.containerd.map(cpu_seconds));
        let start = Instant::now();
        tokio::time::sleep(self.settings.idle).await;
        let (agent_after, runtime_after) = (account.seconds()?, self.containerd.map(cpu_seconds));
        let seconds = start.elapsed().as_secs_f64();
        let after_metrics = http::get(agent.port, "/metrics").await?;
        let before_calls = samples(&before_metrics, "kubelet_runtime_operations_total");
        let cri_calls = samples(&after_metrics, "kubelet_runtime_operations_total")
            .into_iter()
            .map(|(labels, after)| {
                let before = before_calls.get(&labels).copied().unwrap_or(0.0);
                (operation(&labels), after - before)
            })
            .filter(|(_, calls)| *calls > 0.0)
            .collect();
        let relists = |text: &str| {
            samples(text, "kubelet_pleg_relist_duration_seconds_count")
                .values()
                .fold(0.0, |sum, n| sum + n)
        };
        let runtime_cpu_seconds = match (runtime_before, runtime_after) {
            (Some(Ok(before)), Some(Ok(after))) => Some(after - before),
            _ => None,
        };
        Ok(IdleCost {
            seconds,
            agent_cpu_seconds: agent_after - agent_before,
            runtime_cpu_seconds,
            cri_calls,
            rss_bytes: rss_bytes(pid)?,
            relists: relists(&after_metrics) - relists(&before_metrics),
            stream_events: stream_events(&after_metrics) - stream_events(&before_metrics),
        })
    }
}

/// The container events the Evented PLEG has received, every type together (0 for the others).
fn stream_events(metrics: &str) -> f64 {
    samples(metrics, "swiftlet_evented_pleg_events_total")
        .values()
        .fold(0.0, |sum, n| sum + n)
}

/// One busybox `sleep` container that is never restarted.
fn manifest(name: &str) -> String {
    harness::sleep_pod(name, "swiftlet-bench-pleg", "Never")
}

/// Subscribes to swiftlet's pod lifecycle events; every `ContainerDied` is passed on with the
/// instant it arrived.
async fn watch_deaths(socket: &Path) -> Result<mpsc::UnboundedReceiver<Died>> {
    let socket = socket.to_owned();
    let channel = crate::unix_channel(socket)
        .await
        .context("connecting to swiftlet's gRPC socket")?;
    let mut stream = EventsClient::new(channel)
        .watch(v1::WatchRequest {
            kinds: vec!["pod".into()],
            cgroup_ids: vec![],
        })
        .await
        .context("Events/Watch")?
        .into_inner();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.message().await {
            let at = Instant::now();
            if let Some(v1::event::Kind::Pod(pod)) = event.kind
                && pod.r#type == "ContainerDied"
            {
                let died = Died {
                    status_ok: pod.state == "exited" && pod.exit_code == Some(137),
                    kernel_caused: pod.kernel_ts_ns > 0,
                    kernel_ts_ns: pod.kernel_ts_ns,
                    finished_unix_ns: pod.finished_unix_ns,
                    observed_unix_ns: pod.observed_unix_ns,
                    container_id: pod.container_id,
                    at,
                };
                if tx.send(died).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// The containerd process that serves `endpoint` (`unix://DIR/containerd.sock`, its config in
/// `DIR/config.toml` as xtask writes it, or the socket named on its command line).
fn runtime_pid(endpoint: &str) -> Option<u32> {
    let socket = Path::new(endpoint.strip_prefix("unix://")?);
    let dir = socket.parent()?.display().to_string();
    let socket = socket.display().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            if comm.trim() != "containerd" {
                return None;
            }
            let cmdline = std::fs::read_to_string(entry.path().join("cmdline")).ok()?;
            (cmdline.contains(&format!("{dir}/config.toml")) || cmdline.contains(&socket))
                .then_some(pid)
        })
}

/// A cgroup (v2) of its own for swiftlet: its `cpu.stat` counts the agent's CPU time in µs, every
/// thread included, also those that came and went (tokio's blocking pool), where
/// `/proc/PID/stat` has 10 ms ticks, too coarse for an idle agent. The agent is moved back to the
/// root and the cgroup removed when dropped.
struct CpuAccount {
    dir: PathBuf,
    root: PathBuf,
    pid: u32,
}

impl CpuAccount {
    fn new(label: &str, pid: Option<u32>) -> Result<CpuAccount> {
        let pid = pid.context("swiftlet has no pid")?;
        let root = cgroup2_mount().context("no cgroup2 mount in /proc/mounts")?;
        let dir = root.join(format!("swiftlet-bench-{}-{label}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let account = CpuAccount { dir, root, pid };
        let procs = account.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving swiftlet (pid {pid}) into {}", procs.display()))?;
        Ok(account)
    }

    fn seconds(&self) -> Result<f64> {
        let path = self.dir.join("cpu.stat");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let usec = cpu_stat_usage_usec(&text)
            .with_context(|| format!("{}: no usage_usec", path.display()))?;
        Ok(usec as f64 / 1e6)
    }
}

impl Drop for CpuAccount {
    fn drop(&mut self) {
        // Back to the root if it still runs (an agent that did not stop), then the empty cgroup
        // goes; the kernel may take a moment to let go of an exited process.
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("note: cannot remove {}", self.dir.display());
    }
}

/// Where cgroup2 is mounted (the root on a pure v2 layout, `unified` on a hybrid one).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(target))
    })
}

/// `usage_usec` of a `cpu.stat`.
fn cpu_stat_usage_usec(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
}

/// User + system CPU time of process `pid`, every thread included.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = stat_cpu_ticks(&stat).with_context(|| format!("{path}: no utime/stime"))?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&hz| hz > 0)
        .context("sysconf(CLK_TCK)")?;
    Ok(ticks as f64 / hz as f64)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line; the command name (field 2) may
/// hold spaces and parentheses, so fields are counted from its closing parenthesis.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, i.e. index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` of process `pid`, in bytes.
fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| {
            let kb = l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok()
        })
        .map(|kb| kb * 1024)
        .with_context(|| format!("{path}: no VmRSS"))
}

/// Every sample of the metric `name` in a Prometheus text exposition, by its label set.
fn samples(text: &str, name: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = if let Some(labelled) = rest.strip_prefix('{') {
                let (labels, value) = labelled.split_once('}')?;
                (labels.to_owned(), value)
            } else if rest.starts_with(' ') {
                (String::new(), rest)
            } else {
                // Another metric whose name starts with this one.
                return None;
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// The `operation_type` of a label set (the whole set when it has none).
fn operation(labels: &str) -> String {
    labels
        .split(',')
        .find_map(|l| l.strip_prefix("operation_type=\""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(labels)
        .to_owned()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Benchmark for Settings {
    const NAME: &'static str = "pleg";
    const NEEDS_ROOT: &'static str = "swiftlet loads eBPF programs and manages cgroups, and the \
                                      benchmark kills containers, which needs root";
    const RUNS_PODS: bool = true;
    type Outcome = Vec<ConfigOutcome>;
    type Report = Vec<report::Entry>;

    fn announce(&self) -> Option<String> {
        Some(format!(
            "pleg: {:?} containers, each with --pleg {}; {} exits each, {} s idle window; \
             swiftlet logs in {}",
            self.sizes,
            self.plegs.join(", --pleg "),
            self.exits,
            self.idle.as_secs(),
            self.log_dir.display()
        ))
    }

    async fn run(&self) -> Result<Vec<ConfigOutcome>> {
        run(self).await
    }

    async fn clean_up(&self) -> Result<()> {
        clean_up(&self.runtime_endpoint).await.map(drop)
    }

    fn report(
        &self,
        outcomes: &Vec<ConfigOutcome>,
        machine: &Machine,
        now: SystemTime,
    ) -> Vec<report::Entry> {
        let date = rfc3339(now);
        outcomes
            .iter()
            .map(|o| report::Entry::new(o, machine, &date))
            .collect()
    }

    fn markdown(entries: &Vec<report::Entry>) -> String {
        report::markdown(entries)
    }

    fn verdicts(entries: &Vec<report::Entry>) -> Vec<String> {
        report::verdicts(entries)
    }

    fn warnings(entries: &Vec<report::Entry>) -> Vec<String> {
        report::warnings(entries)
    }

    fn plot(&self, path: &Path, machine: &Machine, outcomes: &Vec<ConfigOutcome>) -> Result<()> {
        let title = format!(
            "Container exit → pod lifecycle event, {} (Linux {}, {} CPUs{})",
            self.plegs.join(" vs "),
            machine.kernel_release,
            machine.cpus,
            outcomes
                .first()
                .map(|o| format!(", {}", o.runtime))
                .unwrap_or_default()
        );
        report::plot(path, &title, outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 9000 0 0 0 \
                    150 37 0 0 20 0 9 0 100 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(187));
        assert_eq!(stat_cpu_ticks("4242 (x) S 1"), None);
    }

    #[test]
    fn cgroup_cpu_usage_is_read_in_microseconds() {
        let stat = "usage_usec 263609\nuser_usec 200000\nsystem_usec 63609\n";
        assert_eq!(cpu_stat_usage_usec(stat), Some(263_609));
        assert_eq!(cpu_stat_usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn samples_by_label_set_and_operation() {
        let text = "# HELP kubelet_runtime_operations_total ...\n\
                    kubelet_runtime_operations_total{operation_type=\"list_containers\"} 120\n\
                    kubelet_runtime_operations_total{operation_type=\"container_status\"} 3\n\
                    kubelet_runtime_operations_total_other 5\n\
                    kubelet_pleg_relist_duration_seconds_count 61\n";
        let calls = samples(text, "kubelet_runtime_operations_total");
        assert_eq!(calls.len(), 2);
        let ops: Vec<String> = calls.keys().map(|l| operation(l)).collect();
        assert_eq!(ops, ["container_status", "list_containers"]);
        assert_eq!(
            samples(text, "kubelet_pleg_relist_duration_seconds_count").get(""),
            Some(&61.0)
        );
    }

    #[test]
    fn idle_costs_are_scaled_to_a_minute() {
        let idle = IdleCost {
            seconds: 30.0,
            agent_cpu_seconds: 0.5,
            runtime_cpu_seconds: Some(1.0),
            cri_calls: BTreeMap::from([("list_containers".into(), 30.0), ("x".into(), 30.0)]),
            rss_bytes: 1,
            relists: 30.0,
            stream_events: 0.0,
        };
        assert!((idle.agent_cpu_per_minute() - 1.0).abs() < 1e-9);
        assert_eq!(idle.runtime_cpu_per_minute(), Some(2.0));
        assert!((idle.cri_calls_per_minute() - 120.0).abs() < 1e-9);
        // Not -0.0, which would print as "-0".
        assert!(
            IdleCost::default()
                .cri_calls_per_minute()
                .is_sign_positive()
        );
    }

    #[test]
    fn a_phase_counts_only_instants_the_event_carried_after_the_kill() {
        assert_eq!(after(0, 100), None);
        assert_eq!(after(90, 100), None);
        assert_eq!(after(100, 100), Some(0));
        assert_eq!(after(350, 100), Some(250));
    }

    #[test]
    fn pods_are_named_per_pleg_size_and_generation() {
        let settings = Settings {
            swiftlet: PathBuf::new(),
            runtime_endpoint: String::new(),
            sizes: vec![10],
            plegs: vec!["ebpf".into()],
            exits: 1,
            idle: Duration::ZERO,
            log_dir: PathBuf::new(),
        };
        let config = Config {
            settings: &settings,
            pleg: "ebpf",
            runtime: "containerd 2.1.9",
            size: 100,
            containerd: None,
        };
        assert_eq!(config.pod_name(2, 7), "pleg-ebpf-100-g2-007");
        let text = manifest("x");
        assert!(text.contains("restartPolicy: Never"), "{text}");
        assert!(
            text.contains(&format!("namespace: {}", harness::NAMESPACE)),
            "{text}"
        );
    }
}
