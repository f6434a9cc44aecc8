//! The CPU manager benchmark (`swiftlet-bench cpumanager`): with the static policy
//! (`--reserved-cpus 0`: CPU 0 for everyone, CPU 1 to give away), how soon after a Guaranteed
//! pod's container has started its CPU is its own, when the agent applies cpusets on events
//! (`--cpu-manager-apply events`: every other container's cpuset is updated as the pod is
//! admitted) and when only the periodic 10 s reconcile does (`reconcile`, the kubelet's model);
//! how long other pods' and the system's tasks ran on that CPU in the container's first 10 s, as
//! the scheduler audit counts it; and what the audit's programs cost a context-switch-heavy
//! workload (`overhead`).
//!
//! One mode has its own swiftlet, on the same containerd, in a cgroup root of its own
//! (`cgroupRoot: /swiftlet-bench-cpumanager`), with a BestEffort spinner (`while :; do :; done`)
//! that wants every CPU of the shared pool throughout. A run:
//! - waits until the spinner may run on CPU 1 again (the previous run's CPU returned to the
//!   shared pool), then a random 0–10 s, so that starts fall at every phase of the reconcile;
//! - starts a thread (`watch`) looking about every millisecond, writes the manifest of a
//!   Guaranteed pod (`cpu: 1`, 32Mi; a shell that sleeps 0.1 s in a loop), and takes from the
//!   thread the container's start (its first process in its cgroup) and the moment exclusivity is
//!   in place (its process may run on CPU 1 alone, the spinner no longer there); (a) is the
//!   difference, 0 when the spinner left CPU 1 before the container started (counted apart).
//!   Exclusivity not in place within 30 s of the start, or no start within 60 s of the manifest,
//!   is a failure, counted;
//! - at the start + 10 s, reads the container's `swiftlet_exclusive_cpu_foreign_seconds_total`
//!   on CPU 1 by intruder (another pod's container; anything else) from `/metrics`: (b), the
//!   foreign time of its first 10 s (the audit counts from the container's start);
//! - deletes the manifest and waits until `/pods` no longer lists the pod.
//!
//! After the modes, with no swiftlet running, `overhead` measures (c).
//!
//! Submodules: `watch` (the thread), `outcome` (what a run and a mode measured), `report`,
//! `overhead`.

mod outcome;
pub mod overhead;
pub mod report;
pub mod watch;

use std::{
    collections::BTreeSet,
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use swiftlet::{cm::CgroupLayout, kernel::monotonic_ns};
use tokio::time::Instant;

pub use self::outcome::{ModeOutcome, RunOutcome};
use self::{
    outcome::judge,
    overhead::OverheadResult,
    watch::{Seen, Target, Watch},
};
use super::harness::{
    self, NAMESPACE, NODE_NAME, WorkDir,
    agent::{Agent, AgentOptions},
    cri::Cri,
    http, manifests,
};
use super::{driver::Benchmark, machine::Machine, report::rfc3339};

/// The cgroup root of every mode's swiftlet.
pub const CGROUP_ROOT: &str = "/swiftlet-bench-cpumanager";

/// `--reserved-cpus`: the shared pool's own CPU.
pub const RESERVED_CPU: u32 = 0;

/// The CPU a Guaranteed pod with `cpu: 1` gets alone (the only one left on a 2-CPU machine).
pub const EXCLUSIVE_CPU: u32 = 1;

/// `--cpu-manager-reconcile-period` of a real run (the kubelet's default).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(10);

/// After the start, when a real run reads the foreign time: (b) is per this long.
pub const FOREIGN_WINDOW: Duration = Duration::from_secs(10);

/// From the manifest to the container's first process.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// From the start to exclusivity in place: beyond that, a failure.
const IN_PLACE_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on the wait for the previous run's CPU to return to the spinner (at most a reconcile
/// period in either mode, as the reconcile is both modes' safety net).
const RETURN_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds on the spinner's start, on a pod's listing with its container, and on its removal.
const RUNNING_TIMEOUT: Duration = Duration::from_secs(120);
const LISTED_TIMEOUT: Duration = Duration::from_secs(30);
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

const POLL: Duration = Duration::from_millis(100);

/// The seed of the random waits: runs are repeatable.
const SEED: u64 = 0x0C9D_5E75;

/// The container of the Guaranteed pod (and of the spinner).
const CONTAINER: &str = "main";

/// Everything of the shared pool, all the time.
const SPIN: &str = "while :; do :; done";

/// Wakes ten times a second; exits at once on SIGTERM (the trap runs when `sleep` returns), so
/// the pod goes without the 2 s grace of a shell that ignores it.
const TICK: &str = "trap 'exit 0' TERM; while :; do sleep 0.1; done";

/// The Guaranteed pod's resources: a whole CPU and 32Mi, requests = limits.
const GUARANTEED: &str = "      resources:\n        requests:\n          cpu: \"1\"\n          \
                          memory: 32Mi\n        limits:\n          cpu: \"1\"\n          memory: \
                          32Mi\n";

const WATCH_ENDED: &str = "the watch thread ended without a word";

/// The pods' `app` label.
const APP: &str = "swiftlet-bench-cpumanager";

/// When cpusets reach the containers (`--cpu-manager-apply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// As soon as an assignment changes them (the default).
    Events,
    /// On the periodic reconcile alone: the kubelet's model.
    Reconcile,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Events, Mode::Reconcile];

    /// Also the value of `--cpu-manager-apply`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Events => "events",
            Mode::Reconcile => "reconcile",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown mode {s:?}: expected events or reconcile"))
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
    /// The random wait before each pod is drawn from 0 to this ([`RECONCILE_PERIOD`]; zero for a
    /// smoke run).
    pub max_delay: Duration,
    /// The overhead's rounds (each a window without and one with the audit) and window.
    pub overhead_rounds: usize,
    pub overhead_window: Duration,
    /// `--cpu-manager-reconcile-period`, whole seconds ([`RECONCILE_PERIOD`]; shorter for a smoke
    /// run, which checks that the reconcile alone applies, not how long the kubelet's default
    /// takes).
    pub reconcile_period: Duration,
    /// When the foreign time is read after the start ([`FOREIGN_WINDOW`]; shorter for a smoke
    /// run, which checks that it is read).
    pub foreign_window: Duration,
    /// Where each mode's swiftlet log and `/metrics` snapshot go.
    pub log_dir: PathBuf,
}

/// Every mode, then the overhead.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub modes: Vec<ModeOutcome>,
    pub overhead: OverheadResult,
    /// The run's [`Settings::reconcile_period`] and [`Settings::foreign_window`], which the
    /// report states.
    #[serde(skip)]
    pub reconcile_period: Duration,
    #[serde(skip)]
    pub foreign_window: Duration,
}

/// Runs every mode, one after another, then measures the overhead.
pub async fn run(settings: &Settings) -> Result<Outcome> {
    if settings.modes.is_empty() || settings.runs == 0 {
        bail!("modes and runs must not be empty");
    }
    if crate::bench::machine::cpus() < 2 {
        bail!(
            "the benchmark needs 2 CPUs: CPU {RESERVED_CPU} reserved, CPU {EXCLUSIVE_CPU} exclusive"
        );
    }
    let _ = std::fs::remove_dir_all(&settings.log_dir);
    std::fs::create_dir_all(&settings.log_dir)
        .with_context(|| format!("creating {}", settings.log_dir.display()))?;
    let mut cri = Cri::connect(&settings.runtime_endpoint).await?;
    harness::clear_with_root(&mut cri, CGROUP_ROOT)
        .await
        .context("clearing an earlier run's pods")?;
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut modes = Vec::with_capacity(settings.modes.len());
    for &mode in &settings.modes {
        let outcome = run_mode(settings, mode, &mut cri, &mut rng)
            .await
            .with_context(|| format!("--cpu-manager-apply {}", mode.name()))?;
        eprintln!("{}", progress_line(&outcome, settings.foreign_window));
        modes.push(outcome);
    }
    let (rounds, window) = (settings.overhead_rounds, settings.overhead_window);
    eprintln!(
        "cpumanager: the scheduler audit's cost: {rounds} rounds of {window:?} without and with it"
    );
    let overhead = tokio::task::spawn_blocking(move || overhead::switch_overhead(rounds, window))
        .await
        .context("the overhead's thread")??;
    Ok(Outcome {
        modes,
        overhead,
        reconcile_period: settings.reconcile_period,
        foreign_window: settings.foreign_window,
    })
}

/// Clears every pod of the benchmark from the runtime at `endpoint` and the benchmark's cgroup
/// root, after an interrupted run.
pub async fn clean_up(endpoint: &str) -> Result<usize> {
    harness::clear_with_root(&mut Cri::connect(endpoint).await?, CGROUP_ROOT).await
}

fn progress_line(o: &ModeOutcome, foreign_window: Duration) -> String {
    let a = super::stats::LatencyMs::of(&o.latencies_ns());
    let pods = super::stats::LatencyMs::of(&o.foreign_pod_ns());
    format!(
        "--cpu-manager-apply {}: {} runs, {} failures; start → exclusive p50 {:.1} ms, p99 {:.1} \
         ms, max {:.1} ms, {} in place before the start; other pods on CPU {EXCLUSIVE_CPU} in the \
         first {} s p50 {:.2} ms, max {:.2} ms",
        o.mode.name(),
        o.runs.len(),
        o.failures(),
        a.p50,
        a.p99,
        a.max,
        o.in_place_before_start(),
        foreign_window.as_secs(),
        pods.p50,
        pods.max
    )
}

fn run_line(mode: Mode, r: &RunOutcome) -> String {
    let ms =
        |ns: Option<i64>| ns.map_or_else(|| "-".to_owned(), |ns| format!("{:.1}", ns as f64 / 1e6));
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    format!(
        "  {} run {} (after {} ms): started {} ms after the manifest; exclusive {} ms after the \
         start (pinned {}, spinner off {}); foreign pods {} ms, other {} ms at +{} ms{}",
        mode.name(),
        r.run,
        r.delay_ms,
        opt(r.start_after_manifest_ms),
        ms(r.in_place_after_ns),
        ms(r.pinned_after_ns),
        ms(r.spinner_off_after_ns),
        opt(r.foreign_pod_ms),
        opt(r.foreign_other_ms),
        r.foreign_read_after_ms
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}")),
        r.failure
            .as_ref()
            .map_or_else(String::new, |f| format!("; FAILED: {f}")),
    )
}

async fn run_mode(
    settings: &Settings,
    mode: Mode,
    cri: &mut Cri,
    rng: &mut fastrand::Rng,
) -> Result<ModeOutcome> {
    let work = WorkDir::with_manifests("cpumanager", mode.name())?;
    let (staging, manifest_dir) = (work.staging(), work.manifests());
    let config = work.cgroup_root_config(CGROUP_ROOT)?;
    let extra_args = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "--cpu-manager-policy".to_owned(),
        "static".to_owned(),
        "--reserved-cpus".to_owned(),
        RESERVED_CPU.to_string(),
        "--cpu-manager-apply".to_owned(),
        mode.name().to_owned(),
        "--cpu-manager-reconcile-period".to_owned(),
        format!("{}s", settings.reconcile_period.as_secs()),
    ];
    let options = AgentOptions {
        swiftlet: settings.swiftlet.clone(),
        runtime_endpoint: settings.runtime_endpoint.clone(),
        manifests: manifest_dir.clone(),
        work_dir: work.0.clone(),
        log: settings
            .log_dir
            .join(format!("swiftlet-{}.log", mode.name())),
        pleg: "ebpf".to_owned(),
        extra_args,
    };
    eprintln!(
        "cpumanager: --cpu-manager-apply {}, {} runs",
        mode.name(),
        settings.runs
    );
    let agent = Agent::start(&options).await?;
    let kubepods = CgroupLayout::detect()
        .context("detecting the cgroup layout")?
        .cgroup2_root()
        .context("the Guaranteed pods' cgroups are watched in cgroup v2")?
        .join(CGROUP_ROOT.trim_start_matches('/'))
        .join("kubepods");
    let mode_run = ModeRun {
        mode,
        settings,
        agent: &agent,
        staging: &staging,
        manifest_dir: &manifest_dir,
        kubepods,
    };
    let measured = mode_run.measure(rng).await;
    let stopped = agent
        .stop_after_snapshot(
            &settings
                .log_dir
                .join(format!("metrics-{}.txt", mode.name())),
        )
        .await;
    let cleared = harness::clear_with_root(cri, CGROUP_ROOT)
        .await
        .context("clearing the mode's pods");
    let outcome = measured?;
    stopped.context("stopping swiftlet")?;
    cleared?;
    Ok(outcome)
}

/// One mode's swiftlet and folders.
struct ModeRun<'a> {
    mode: Mode,
    settings: &'a Settings,
    agent: &'a Agent,
    staging: &'a Path,
    manifest_dir: &'a Path,
    /// `<cgroup2 mount>/<cgroupRoot>/kubepods`.
    kubepods: PathBuf,
}

impl ModeRun<'_> {
    async fn measure(&self, rng: &mut fastrand::Rng) -> Result<ModeOutcome> {
        let spinner = format!("spinner-{}", self.mode.name());
        let spinner_full = format!("{spinner}-{NODE_NAME}");
        manifests::write_all(
            &[(
                format!("{spinner}.yaml"),
                harness::shell_pod(&spinner, APP, "Always", "", SPIN),
            )],
            self.staging,
            self.manifest_dir,
        )?;
        let ids = harness::wait_running(
            self.agent,
            std::slice::from_ref(&spinner_full),
            RUNNING_TIMEOUT,
        )
        .await?;
        let listed = http::list(&http::get(self.agent.port, "/pods").await?)?;
        let uid = listed
            .get(&spinner_full)
            .map(|p| p.uid.clone())
            .unwrap_or_default();
        let id = ids.first().context("the spinner's container")?;
        let spinner_dir = self
            .kubepods
            .join("besteffort")
            .join(format!("pod{uid}"))
            .join(id);
        let spinner_pid = watch::first_process(&spinner_dir).with_context(|| {
            format!(
                "no process in the spinner's cgroup {}",
                spinner_dir.display()
            )
        })?;

        let mut runs = Vec::with_capacity(self.settings.runs);
        for run in 1..=self.settings.runs {
            self.wait_returned(spinner_pid)
                .await
                .with_context(|| format!("before run {run}"))?;
            let max_ms = u64::try_from(self.settings.max_delay.as_millis()).unwrap_or(u64::MAX);
            let delay_ms = rng.u64(0..=max_ms);
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let outcome = self
                .one_run(run, delay_ms, spinner_pid)
                .await
                .with_context(|| format!("run {run}"))?;
            eprintln!("{}", run_line(self.mode, &outcome));
            runs.push(outcome);
        }
        let metrics = http::get(self.agent.port, "/metrics").await?;
        let spinner_ran_throughout = watch::first_process(&spinner_dir) == Some(spinner_pid);
        Ok(ModeOutcome {
            mode: self.mode,
            runs,
            cpuset_updates: http::metric_by_label(
                &metrics,
                "swiftlet_cpu_manager_cpuset_updates_total",
                "trigger",
            )
            .into_iter()
            .collect(),
            violations: http::metric(
                &metrics,
                "swiftlet_cpu_manager_exclusivity_violations_total",
            ),
            spinner_ran_throughout,
        })
    }

    /// One Guaranteed pod, from its manifest to exclusivity in place and its first 10 s, then its
    /// removal.
    async fn one_run(&self, run: usize, delay_ms: u64, spinner_pid: u32) -> Result<RunOutcome> {
        let name = format!("exclusive-{}-{run:02}", self.mode.name());
        let full = format!("{name}-{NODE_NAME}");
        let file = format!("{name}.yaml");
        let target = Target {
            kubepods: self.kubepods.clone(),
            known_pods: pod_folders(&self.kubepods),
            spinner_pid,
            exclusive_cpu: EXCLUSIVE_CPU,
            reserved_cpu: RESERVED_CPU as usize,
            start_timeout: START_TIMEOUT,
            in_place_timeout: IN_PLACE_TIMEOUT,
        };
        let (watching, mut seen) = Watch::start(target).context("starting the watch thread")?;
        let written_ns = monotonic_ns();
        manifests::write_all(
            &[(
                file.clone(),
                harness::shell_pod(&name, APP, "Never", GUARANTEED, TICK),
            )],
            self.staging,
            self.manifest_dir,
        )?;
        // Once started, the foreign time is read at the start + the window while the watch goes on.
        let first = seen.recv().await.context(WATCH_ENDED)?;
        let (watched, foreign) = match first {
            Seen::Finished(w) => (w, None),
            Seen::Started { at_ns, .. } => {
                let finished = async {
                    loop {
                        if let Seen::Finished(w) = seen.recv().await.context(WATCH_ENDED)? {
                            return anyhow::Ok(w);
                        }
                    }
                };
                let (w, f) = tokio::join!(finished, self.foreign_at(&full, at_ns));
                (w?, Some(f))
            }
        };
        drop(watching);
        let mut outcome = judge(run, delay_ms, written_ns, &watched);
        if let Some(foreign) = foreign {
            match foreign {
                Ok(f) => {
                    outcome.foreign_pod_ms = f.pod_ms;
                    outcome.foreign_other_ms = f.other_ms;
                    outcome.foreign_read_after_ms = Some(f.after_ms);
                    if f.pod_ms.is_none() && outcome.failure.is_none() {
                        outcome.failure =
                            Some("the scheduler audit had no series of the container".to_owned());
                    }
                }
                Err(e) if outcome.failure.is_none() => {
                    outcome.failure = Some(format!("reading the foreign time: {e:#}"));
                }
                Err(_) => {}
            }
        }
        if outcome.failure.is_none() {
            self.check_container(&full, &mut outcome).await?;
        }
        manifests::remove_all(&[file], self.manifest_dir)?;
        if !harness::wait_unlisted(self.agent.port, std::slice::from_ref(&full), REMOVE_TIMEOUT)
            .await?
        {
            bail!("{full} was still listed {REMOVE_TIMEOUT:?} after its manifest was deleted");
        }
        Ok(outcome)
    }

    /// The container the watch took for the pod's must be the one `/pods` names.
    async fn check_container(&self, full: &str, outcome: &mut RunOutcome) -> Result<()> {
        let deadline = Instant::now() + LISTED_TIMEOUT;
        loop {
            let listed = http::list(&http::get(self.agent.port, "/pods").await?)?;
            if let Some(id) = listed.get(full).and_then(|p| p.container_ids.first()) {
                if outcome.container_id.as_ref() != Some(id) {
                    outcome.failure = Some(format!(
                        "the watch took container {:?} for the pod's, /pods names {id}",
                        outcome.container_id
                    ));
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                outcome.failure = Some(format!(
                    "/pods did not name {full}'s container within {LISTED_TIMEOUT:?}"
                ));
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The container's foreign time on the exclusive CPU, read at `start_ns` + the foreign window.
    async fn foreign_at(&self, full: &str, start_ns: u64) -> Result<Foreign> {
        let window = self.settings.foreign_window;
        let at = start_ns + u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        tokio::time::sleep(Duration::from_nanos(at.saturating_sub(monotonic_ns()))).await;
        let text = http::get(self.agent.port, "/metrics").await?;
        let after_ms = super::stats::ms(monotonic_ns().saturating_sub(start_ns));
        let series = |intruder: &str| {
            format!(
                "swiftlet_exclusive_cpu_foreign_seconds_total{{namespace=\"{NAMESPACE}\",\
                 pod=\"{full}\",container=\"{CONTAINER}\",cpu=\"{EXCLUSIVE_CPU}\",\
                 intruder=\"{intruder}\"}}"
            )
        };
        let (pod, other) = (
            http::metric(&text, &series("pod")),
            http::metric(&text, &series("other")),
        );
        // The audit keeps a series only for what it saw: one intruder's series without the
        // other's is no time of the other.
        let seen = pod.is_some() || other.is_some();
        let ms = |s: Option<f64>| seen.then(|| s.unwrap_or(0.0) * 1e3);
        Ok(Foreign {
            pod_ms: ms(pod),
            other_ms: ms(other),
            after_ms,
        })
    }

    /// Until the spinner may run on the exclusive CPU again.
    async fn wait_returned(&self, spinner_pid: u32) -> Result<()> {
        let deadline = Instant::now() + RETURN_TIMEOUT;
        loop {
            let Some(allowed) = watch::cpus_allowed(spinner_pid) else {
                bail!("the spinner's process {spinner_pid} is gone");
            };
            if allowed.contains(EXCLUSIVE_CPU) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the spinner still ran on CPUs {allowed} {RETURN_TIMEOUT:?} after the previous \
                     pod was gone; the end of swiftlet's log:\n{}",
                    self.agent.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The foreign time read from `/metrics`.
struct Foreign {
    pod_ms: Option<f64>,
    other_ms: Option<f64>,
    /// When, after the start.
    after_ms: f64,
}

/// The `pod*` folders below `kubepods` now.
fn pod_folders(kubepods: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(kubepods)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().starts_with("pod"))
                .collect()
        })
        .unwrap_or_default()
}

impl Benchmark for Settings {
    const NAME: &'static str = "cpumanager";
    const NEEDS_ROOT: &'static str =
        "swiftlet loads eBPF programs and manages cgroups, which needs root";
    const RUNS_PODS: bool = true;
    type Outcome = Outcome;
    type Report = report::Report;

    fn announce(&self) -> Option<String> {
        Some(format!(
            "cpumanager: modes {:?}, {} runs each; --cpu-manager-policy static --reserved-cpus \
             {}, a Guaranteed pod gets CPU {} beside a spinner in the shared pool; cgroup root \
             {}; swiftlet logs in {}",
            self.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
            self.runs,
            RESERVED_CPU,
            EXCLUSIVE_CPU,
            CGROUP_ROOT,
            self.log_dir.display()
        ))
    }

    async fn run(&self) -> Result<Outcome> {
        run(self).await
    }

    async fn clean_up(&self) -> Result<()> {
        clean_up(&self.runtime_endpoint).await.map(drop)
    }

    fn report(&self, outcome: &Outcome, machine: &Machine, now: SystemTime) -> report::Report {
        report::Report::new(outcome, machine.clone(), &rfc3339(now))
    }

    fn markdown(report: &report::Report) -> String {
        report.markdown()
    }

    fn verdicts(report: &report::Report) -> Vec<String> {
        report.verdicts()
    }

    fn warnings(report: &report::Report) -> Vec<String> {
        report.warnings()
    }

    fn plot(&self, path: &Path, machine: &Machine, outcome: &Outcome) -> Result<()> {
        let title = format!(
            "Guaranteed container started → its CPU its own, events vs the 10 s reconcile (Linux \
             {}, {} CPUs)",
            machine.kernel_release, machine.cpus
        );
        report::plot(path, &title, &outcome.modes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_named_as_the_flag_takes_them() {
        for mode in Mode::ALL {
            assert_eq!(mode.name().parse::<Mode>(), Ok(mode));
        }
        assert!("kernel".parse::<Mode>().is_err());
    }
}
