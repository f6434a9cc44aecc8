//! The eviction benchmark (`swiftlet-bench eviction`): how soon after the pods' memory crosses an
//! eviction threshold the eviction manager decides to evict, and the evicted pod's containers have
//! stopped, when the manager is woken by the kernel (memory cgroup usage thresholds, OOM kills,
//! reclaim, PSI), by PSI triggers alone, and when it only looks every 10 s as the kubelet does.
//!
//! One mode (a set of `--eviction-wakeups`) has its own swiftlet, on the same containerd, in a
//! cgroup root of its own (`cgroupRoot: /swiftlet-bench-eviction`) whose pods may use 1 GiB:
//! `--system-reserved memory=<MemTotal − 1 GiB>` limits the pods' cgroup to it, so the pressure
//! is the pods' alone and nothing else on the machine is squeezed. The hard threshold is
//! `allocatableMemory.available<400Mi`; the pressure transition period 1 s, so that the
//! MemoryPressure condition clears between runs.
//!
//! Each mode keeps a bystander (Guaranteed, 50 of its 100 MiB held) running throughout, which
//! must never be evicted, and makes runs of a hog (Burstable): a static pod that allocates past
//! the threshold (with, for PSI, a container beside it that stalls on the page cache from the
//! start; see [`Mode::hog`]). A run:
//! - waits until MemoryPressure is off and the working set is well below the threshold's bar,
//!   then a random 0–10 s (so that crossings fall at every phase of the periodic check);
//! - starts a sampling thread (`sampler`) reading the pods' cgroup's working set every ~1 ms,
//!   writes the hog's manifest, and takes the first sample past the bar as the crossing;
//! - takes from the gRPC stream (`stream`) the first decision naming the hog (its `decided_ns`
//!   and wake-up source) and the hog's `ContainerDied`s (the kernel's time of the last exit),
//!   with the PSI stalls of the trigger window before the deciding wake-up; a run with no
//!   eviction of the hog within 30 s of the crossing, or with another pod evicted, is a failure,
//!   counted;
//! - deletes the hog's manifest and waits until `/pods` no longer lists it.
//!
//! Submodules: `pods` (manifests, `/pods`, `/metrics`), `sampler` (the working set and PSI),
//! `stream` (the gRPC watch), `outcome` (what a run and a mode measured), `report`.

mod outcome;
mod pods;
pub mod report;
pub mod sampler;
pub mod stream;

use std::{
    collections::{BTreeSet, VecDeque},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::{sync::mpsc, time::Instant};

use self::{
    outcome::judge,
    sampler::{Crossing, MemoryFiles, PsiTotals, Sampler, StallMs},
    stream::Heard,
};
pub use self::{
    outcome::{ModeOutcome, RunOutcome},
    pods::Hog,
};
use super::harness::{
    self, NODE_NAME, WorkDir,
    agent::{Agent, AgentOptions},
    cri::Cri,
    http, manifests,
};
use super::{driver::Benchmark, machine::Machine, report::rfc3339};

/// The cgroup root of every mode's swiftlet.
pub const CGROUP_ROOT: &str = "/swiftlet-bench-eviction";

const MI: u64 = 1 << 20;

/// What the pods may use (node allocatable memory).
pub const ALLOCATABLE_BYTES: u64 = 1024 * MI;

/// The hard eviction threshold on `allocatableMemory.available`, in MiB.
pub const THRESHOLD_MIB: u64 = 400;

/// The periodic check (`--eviction-monitoring-period`, the kubelet's default).
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);

/// `--eviction-pressure-transition-period`.
const TRANSITION_PERIOD: &str = "1s";

/// Before a run, the working set must be this far below the bar.
const SETTLE_MARGIN_BYTES: u64 = 200 * MI;

/// Bound on the wait for MemoryPressure to clear (a check comes at least every 10 s).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

/// From the hog's manifest to the crossing, its start and allocation: the wait goes on while the
/// working set keeps growing by [`CROSS_PROGRESS_BYTES`] every [`CROSS_STALL`], up to
/// [`CROSS_LIMIT`]. A fixed bound failed hogs that were only slow: under software emulation a
/// busybox shell's allocation runs at a few MB/s, and on some kernels slower still.
pub const CROSS_STALL: Duration = Duration::from_secs(60);
const CROSS_PROGRESS_BYTES: u64 = 8 * MI;
pub const CROSS_LIMIT: Duration = Duration::from_secs(600);

/// From the crossing to a decision naming the hog: beyond that, a failure.
const DECISION_TIMEOUT: Duration = Duration::from_secs(30);

/// From the decision to the hog's `ContainerDied`.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A hog that died without being evicted: how long a decision naming it is still waited for
/// (the two come on different streams).
const DIED_GRACE: Duration = Duration::from_secs(3);

/// How often the PSI totals are read during a run, and how long they are kept.
const PSI_SAMPLE: Duration = Duration::from_millis(100);
const PSI_KEEP_NS: u64 = 5_000_000_000;

/// The PSI triggers' window.
const PSI_WINDOW_NS: u64 = 2_000_000_000;

/// Bounds on the bystander's start and on a hog's removal.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

const POLL: Duration = Duration::from_millis(100);

/// The seed of the random waits: runs are repeatable.
const SEED: u64 = 0x00EF_1C7E;

/// What wakes the eviction manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every wake-up (the default): PSI, kernel OOM kills and reclaim, memory cgroup thresholds
    /// (v1) or the pods' memory level (v2: the kernel's charge trigger, else a poll).
    Kernel,
    /// The periodic check alone: the kubelet's model.
    Periodic,
    /// PSI triggers alone.
    Psi,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Kernel, Mode::Periodic, Mode::Psi];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Periodic => "periodic",
            Mode::Psi => "psi",
        }
    }

    /// `--eviction-wakeups`.
    pub fn wakeups(self) -> &'static str {
        match self {
            Mode::Kernel => "psi,kernel,memcg,level",
            Mode::Periodic => "none",
            Mode::Psi => "psi",
        }
    }

    /// The hog's scenario: PSI fires only on real stalls, so its mode's hog pod has a container
    /// that thrashes the page cache in its own limit beside the one that holds the memory; the
    /// others hold it.
    pub fn hog(self) -> Hog {
        match self {
            Mode::Kernel | Mode::Periodic => Hog::Hold { mib: 720 },
            Mode::Psi => Hog::ThrashBeside {
                mib: 640,
                limit_mib: 32,
                file_mib: 64,
                warmup_s: 3,
            },
        }
    }

    /// The wake-up sources that count as this mode's own.
    pub fn expected_sources(self) -> &'static [&'static str] {
        match self {
            Mode::Kernel => &[
                "memcg",
                "memcg_level",
                "memcg_poll",
                "oom",
                "reclaim",
                "psi",
            ],
            Mode::Periodic => &["periodic"],
            Mode::Psi => &["psi"],
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown mode {s:?}: expected kernel, periodic or psi"))
    }
}

/// What to run, and against what.
#[derive(Clone, Debug)]
pub struct Settings {
    pub swiftlet: PathBuf,
    pub runtime_endpoint: String,
    /// Run in this order, each with its own swiftlet.
    pub modes: Vec<Mode>,
    pub runs: usize,
    /// The random wait before each hog is drawn from 0 to this ([`MONITORING_PERIOD`], so that
    /// crossings fall at every phase of the periodic check; zero for a smoke run).
    pub max_delay: Duration,
    /// Where each mode's swiftlet log and `/metrics` snapshot go.
    pub log_dir: PathBuf,
}

/// Runs every mode, one after another.
pub async fn run(settings: &Settings) -> Result<Vec<ModeOutcome>> {
    if settings.modes.is_empty() || settings.runs == 0 {
        bail!("modes and runs must not be empty");
    }
    let _ = std::fs::remove_dir_all(&settings.log_dir);
    std::fs::create_dir_all(&settings.log_dir)
        .with_context(|| format!("creating {}", settings.log_dir.display()))?;
    let mut cri = Cri::connect(&settings.runtime_endpoint).await?;
    clear(&mut cri)
        .await
        .context("clearing an earlier run's pods")?;
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut outcomes = Vec::with_capacity(settings.modes.len());
    for &mode in &settings.modes {
        let outcome = run_mode(settings, mode, &mut cri, &mut rng)
            .await
            .with_context(|| format!("--eviction-wakeups {}", mode.wakeups()))?;
        eprintln!("{}", progress_line(&outcome));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Clears every pod of the benchmark from the runtime at `endpoint` and the benchmark's cgroup
/// root, after an interrupted run.
pub async fn clean_up(endpoint: &str) -> Result<usize> {
    let mut cri = Cri::connect(endpoint).await?;
    clear(&mut cri).await
}

async fn clear(cri: &mut Cri) -> Result<usize> {
    harness::clear_with_root(cri, CGROUP_ROOT).await
}

fn progress_line(o: &ModeOutcome) -> String {
    let d = super::stats::Latency::of(&o.decision_latencies_ns());
    let s = super::stats::Latency::of(&o.stopped_latencies_ns());
    let ms = |ns: u64| ns as f64 / 1e6;
    format!(
        "--eviction-wakeups {}: {} runs, {} evictions, {} failures; crossing → decision p50 {:.1} \
         ms, p99 {:.1} ms, max {:.1} ms; → stopped p50 {:.1} ms, max {:.1} ms; decided by {:?}; \
         bystander evicted {} times",
        o.wakeups,
        o.runs.len(),
        o.evictions(),
        o.failures(),
        ms(d.p50_ns),
        ms(d.p99_ns),
        ms(d.max_ns),
        ms(s.p50_ns),
        ms(s.max_ns),
        o.decided_by(),
        o.bystander_evictions
    )
}

fn run_line(mode: Mode, r: &RunOutcome) -> String {
    let ms =
        |ns: Option<i64>| ns.map_or_else(|| "-".to_owned(), |ns| format!("{:.1}", ns as f64 / 1e6));
    format!(
        "  {} run {}: decision {} ms ({}), stopped {} ms; {} dips below the bar before it ({:.0} \
         ms); pods' memory stall {}{}{}",
        mode.name(),
        r.run,
        ms(r.decision_after_ns),
        r.decision.as_ref().map_or("-", |d| d.source.as_str()),
        ms(r.stopped_after_ns),
        r.dips_before_decision,
        r.below_bar_before_decision_ms,
        r.stall_before_decision.map_or_else(
            || "-".to_owned(),
            |s| {
                let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
                format!(
                    "{} (io {}; node memory {}, io {}) in the {:.0} ms before the wake-up",
                    ms(s.pods_memory),
                    ms(s.pods_io),
                    ms(s.node_memory),
                    ms(s.node_io),
                    s.over_ms
                )
            }
        ),
        if r.other_decisions.is_empty() {
            String::new()
        } else {
            format!("; other decisions: {}", r.other_decisions.join(", "))
        },
        r.failure
            .as_ref()
            .map_or_else(String::new, |f| format!("; FAILED: {f}")),
    )
}

/// MemTotal in bytes.
fn mem_total() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .context("/proc/meminfo has no MemTotal")
}

/// The working set above which allocatable − working set is below the threshold.
pub fn bar() -> u64 {
    ALLOCATABLE_BYTES - THRESHOLD_MIB * MI
}

/// Tallies what is heard outside the runs' own matching: bystander evictions, evictions between
/// runs, losses.
#[derive(Default)]
struct Tally {
    bystander: String,
    bystander_evictions: usize,
    stray: Vec<String>,
    lost: u64,
}

impl Tally {
    fn note(&mut self, heard: &Heard) {
        match heard {
            Heard::Decision(d) if d.pod_name == self.bystander => self.bystander_evictions += 1,
            Heard::Lost(n) => self.lost += n,
            _ => {}
        }
    }

    /// Everything heard between runs.
    fn drain(&mut self, heard: &mut mpsc::UnboundedReceiver<Heard>) {
        while let Ok(h) = heard.try_recv() {
            self.note(&h);
            if let Heard::Decision(d) = &h
                && !d.pod_name.is_empty()
            {
                self.stray
                    .push(format!("{} (woken by {})", d.pod_name, d.source));
            }
        }
    }
}

async fn run_mode(
    settings: &Settings,
    mode: Mode,
    cri: &mut Cri,
    rng: &mut fastrand::Rng,
) -> Result<ModeOutcome> {
    let work = WorkDir::with_manifests("eviction", mode.name())?;
    let (staging, manifest_dir) = (work.staging(), work.manifests());
    let config = work.cgroup_root_config(CGROUP_ROOT)?;
    let reserved = mem_total()?
        .checked_sub(ALLOCATABLE_BYTES)
        .context("this machine has less than 1 GiB of memory")?;
    let extra_args = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "--system-reserved".to_owned(),
        format!("memory={reserved}"),
        "--eviction-hard".to_owned(),
        format!("allocatableMemory.available<{THRESHOLD_MIB}Mi"),
        "--eviction-pressure-transition-period".to_owned(),
        TRANSITION_PERIOD.to_owned(),
        "--eviction-monitoring-period".to_owned(),
        format!("{}s", MONITORING_PERIOD.as_secs()),
        "--eviction-wakeups".to_owned(),
        mode.wakeups().to_owned(),
    ];
    let log = settings
        .log_dir
        .join(format!("swiftlet-{}.log", mode.name()));
    let options = AgentOptions {
        swiftlet: settings.swiftlet.clone(),
        runtime_endpoint: settings.runtime_endpoint.clone(),
        manifests: manifest_dir.clone(),
        work_dir: work.0.clone(),
        log: log.clone(),
        pleg: "ebpf".to_owned(),
        extra_args,
    };
    eprintln!(
        "eviction: --eviction-wakeups {} (hog {}), {} runs",
        mode.wakeups(),
        mode.hog().describe(),
        settings.runs
    );
    let agent = Agent::start(&options).await?;
    let mode_run = ModeRun {
        mode,
        settings,
        agent: &agent,
        staging: &staging,
        manifest_dir: &manifest_dir,
        files: MemoryFiles::detect(CGROUP_ROOT),
    };
    let measured = mode_run.measure(&options, rng).await;
    let stopped = agent
        .stop_after_snapshot(
            &settings
                .log_dir
                .join(format!("metrics-{}.txt", mode.name())),
        )
        .await;
    let cleared = clear(cri).await.context("clearing the mode's pods");
    let mut outcome = measured?;
    stopped.context("stopping swiftlet")?;
    cleared?;
    outcome.woken_by = woken_by(&log);
    Ok(outcome)
}

/// The agent's account of what wakes its eviction manager (its "eviction manager" log line).
fn woken_by(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains("eviction manager") && l.contains("woken_by"))
        .and_then(|l| l.split_once("woken_by="))
        .map(|(_, rest)| rest.trim().to_owned())
        .unwrap_or_default()
}

/// One mode's swiftlet and folders.
struct ModeRun<'a> {
    mode: Mode,
    settings: &'a Settings,
    agent: &'a Agent,
    staging: &'a Path,
    manifest_dir: &'a Path,
    files: MemoryFiles,
}

impl ModeRun<'_> {
    async fn measure(
        &self,
        options: &AgentOptions,
        rng: &mut fastrand::Rng,
    ) -> Result<ModeOutcome> {
        let mut heard = stream::watch(&options.grpc_socket()).await?;
        let bystander = format!("bystander-{}", self.mode.name());
        let bystander_full = format!("{bystander}-{NODE_NAME}");
        manifests::write_all(
            &[(format!("{bystander}.yaml"), pods::bystander(&bystander))],
            self.staging,
            self.manifest_dir,
        )?;
        self.wait_running(&bystander_full).await?;
        let mut tally = Tally {
            bystander: bystander_full.clone(),
            ..Tally::default()
        };
        let mut runs = Vec::with_capacity(self.settings.runs);
        for run in 1..=self.settings.runs {
            self.settle()
                .await
                .with_context(|| format!("before run {run}"))?;
            let max_ms = u64::try_from(self.settings.max_delay.as_millis()).unwrap_or(u64::MAX);
            let delay = Duration::from_millis(rng.u64(0..=max_ms));
            tokio::time::sleep(delay).await;
            tally.drain(&mut heard);
            let outcome = self
                .one_run(run, delay, &mut heard, &mut tally)
                .await
                .with_context(|| format!("run {run}"))?;
            eprintln!("{}", run_line(self.mode, &outcome));
            runs.push(outcome);
        }
        let list = http::get(self.agent.port, "/pods").await?;
        let state = pods::pod_state(&list, &bystander_full).unwrap_or_default();
        let metrics = http::get(self.agent.port, "/metrics").await?;
        tally.drain(&mut heard);
        Ok(ModeOutcome {
            mode: self.mode,
            wakeups: self.mode.wakeups().to_owned(),
            scenario: self.mode.hog().describe(),
            runs,
            bystander_evictions: tally.bystander_evictions,
            bystander_phase: if state.reason.is_empty() {
                state.phase
            } else {
                format!("{} ({})", state.phase, state.reason)
            },
            bystander_restarts: state.restarts,
            stray_evictions: tally.stray,
            lost_events: tally.lost,
            wakeups_total: http::metric_by_label(
                &metrics,
                "swiftlet_eviction_wakeups_total",
                "source",
            )
            .into_iter()
            .collect(),
            woken_by: String::new(),
        })
    }

    /// One hog, from its manifest to its container's death (or the timeouts), then its removal.
    async fn one_run(
        &self,
        run: usize,
        delay: Duration,
        heard: &mut mpsc::UnboundedReceiver<Heard>,
        tally: &mut Tally,
    ) -> Result<RunOutcome> {
        let name = format!("hog-{}-{run:02}", self.mode.name());
        let full = format!("{name}-{NODE_NAME}");
        let file = format!("{name}.yaml");
        let hog = self.mode.hog();
        let mut sampler = Sampler::start(&self.files, bar())?;
        manifests::write_all(
            &[(file.clone(), pods::hog(&name, hog))],
            self.staging,
            self.manifest_dir,
        )?;
        let mut crossing: Option<Crossing> = None;
        let mut heard_in_run: Vec<Heard> = Vec::new();
        let started = Instant::now();
        let mut deadline = started + CROSS_STALL;
        let mut progress_mark = 0;
        let mut decided = false;
        let mut stopped: BTreeSet<String> = BTreeSet::new();
        // PSI totals every 100 ms, for the stall in the trigger's window before the wake-up.
        let mut psi: VecDeque<(u64, PsiTotals)> = VecDeque::new();
        let mut psi_tick = tokio::time::interval(PSI_SAMPLE);
        let mut stall = None;
        loop {
            tokio::select! {
                found = sampler.crossing(), if crossing.is_none() => {
                    crossing = Some(found.context("sampling the working set")?);
                    if !decided {
                        deadline = Instant::now() + DECISION_TIMEOUT;
                    }
                }
                _ = psi_tick.tick() => {
                    let now = swiftlet::kernel::monotonic_ns();
                    psi.push_back((now, PsiTotals::read(CGROUP_ROOT)));
                    while psi.front().is_some_and(|(at, _)| now - at > PSI_KEEP_NS) {
                        psi.pop_front();
                    }
                }
                h = heard.recv() => {
                    let Some(h) = h else { bail!("swiftlet's event stream ended") };
                    tally.note(&h);
                    match &h {
                        Heard::Decision(d) if d.pod_name == full && !decided => {
                            decided = true;
                            stall = stall_before(&psi, d.woke_ns);
                            deadline = Instant::now() + STOP_TIMEOUT;
                        }
                        Heard::Died(d) if d.pod_name == full => {
                            stopped.insert(d.container_name.clone());
                            if !decided {
                                deadline = deadline.min(Instant::now() + DIED_GRACE);
                            }
                        }
                        _ => {}
                    }
                    heard_in_run.push(h);
                    if decided && stopped.len() >= hog.container_count() && crossing.is_some() {
                        break;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    let highest = sampler.highest();
                    let waiting_for_crossing = crossing.is_none() && !decided && stopped.is_empty();
                    if waiting_for_crossing
                        && highest >= progress_mark + CROSS_PROGRESS_BYTES
                        && started.elapsed() < CROSS_LIMIT
                    {
                        progress_mark = highest;
                        deadline = (Instant::now() + CROSS_STALL).min(started + CROSS_LIMIT);
                        continue;
                    }
                    break;
                }
            }
        }
        let dips = sampler.finish();
        let mut outcome = judge(
            run,
            delay,
            &full,
            hog.container_count(),
            crossing,
            &heard_in_run,
        );
        outcome.note_dips(&dips);
        outcome.stall_before_decision = stall;
        manifests::remove_all(&[file], self.manifest_dir)?;
        self.wait_gone(&full).await?;
        Ok(outcome)
    }

    /// Until MemoryPressure is off and the working set is [`SETTLE_MARGIN_BYTES`] below the bar.
    async fn settle(&self) -> Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let metrics = http::get(self.agent.port, "/metrics").await?;
            let pressure = http::metric(
                &metrics,
                "swiftlet_node_pressure_condition{condition=\"MemoryPressure\"}",
            );
            let ws = self.files.working_set()?;
            if pressure == Some(0.0) && ws + SETTLE_MARGIN_BYTES < bar() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "MemoryPressure {pressure:?} and a working set of {} MiB (bar {} MiB) after \
                     {SETTLE_TIMEOUT:?}; the end of swiftlet's log:\n{}",
                    ws / MI,
                    bar() / MI,
                    self.agent.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_running(&self, name: &str) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let list = http::get(self.agent.port, "/pods").await?;
            if pods::pod_state(&list, name).is_some_and(|s| s.running) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{name} did not run within {START_TIMEOUT:?}; the end of swiftlet's log:\n{}",
                    self.agent.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_gone(&self, name: &str) -> Result<()> {
        let deadline = Instant::now() + REMOVE_TIMEOUT;
        loop {
            let list = http::get(self.agent.port, "/pods").await?;
            if pods::pod_state(&list, name).is_none() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{name} was still listed {REMOVE_TIMEOUT:?} after its manifest was deleted");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The stall from the last PSI reading at least a trigger window before `woke_ns` (or the
/// earliest kept) to a reading now.
fn stall_before(history: &VecDeque<(u64, PsiTotals)>, woke_ns: u64) -> Option<StallMs> {
    let since = woke_ns.saturating_sub(PSI_WINDOW_NS);
    let (then_ns, then) = history
        .iter()
        .rev()
        .find(|(at, _)| *at <= since)
        .or_else(|| history.front())?;
    let now_ns = swiftlet::kernel::monotonic_ns();
    let now = PsiTotals::read(CGROUP_ROOT);
    Some(now.since(then, Duration::from_nanos(now_ns.saturating_sub(*then_ns))))
}

impl Benchmark for Settings {
    const NAME: &'static str = "eviction";
    const NEEDS_ROOT: &'static str =
        "swiftlet loads eBPF programs and manages cgroups, which needs root";
    const RUNS_PODS: bool = true;
    type Outcome = Vec<ModeOutcome>;
    type Report = Vec<report::Entry>;

    fn announce(&self) -> Option<String> {
        Some(format!(
            "eviction: modes {:?}, {} runs each; the pods' cgroup ({}/kubepods) limited to {} \
             MiB, allocatableMemory.available<{}Mi; swiftlet logs in {}",
            self.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
            self.runs,
            CGROUP_ROOT,
            ALLOCATABLE_BYTES >> 20,
            THRESHOLD_MIB,
            self.log_dir.display()
        ))
    }

    async fn run(&self) -> Result<Vec<ModeOutcome>> {
        run(self).await
    }

    async fn clean_up(&self) -> Result<()> {
        clean_up(&self.runtime_endpoint).await.map(drop)
    }

    fn report(
        &self,
        outcomes: &Vec<ModeOutcome>,
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

    fn plot(&self, path: &Path, machine: &Machine, outcomes: &Vec<ModeOutcome>) -> Result<()> {
        let title = format!(
            "Memory pressure → eviction, kernel wake-ups vs the 10 s check (Linux {}, {} CPUs)",
            machine.kernel_release, machine.cpus
        );
        report::plot(path, &title, outcomes)
    }
}
