//! The pod startup benchmark (`swiftlet-bench startup`): batches of static pods written at once
//! into the manifest directory of a fresh `swiftlet run`, and the time from each manifest's
//! appearance to the first `GET /pods` that shows the pod Running with its container running —
//! what a user of the node sees, end to end: inotify, the pod workers, CRI (sandbox, network,
//! container), the PLEG and the status. The upstream counterpart is the pod startup latency SLO
//! (schedule to Running observed through a watch, 5 s at p99).
//!
//! Each round has its own swiftlet (a fresh state: no warm worker, cache or back-off) and its own
//! pod names, and leaves nothing behind: its pods are deleted through their manifests, swiftlet
//! is stopped, and whatever remains in the runtime is cleared over CRI.
//!
//! Submodules: `manifest` (the pods and how they are written) and `report` (table, JSON,
//! plot); swiftlet itself, `/pods` and the runtime's clean-up are the shared `harness`.

mod manifest;
pub mod report;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use self::manifest::BenchPod;
use super::harness::{
    self,
    agent::{Agent, AgentOptions},
    cgroups,
    cri::Cri,
    http as pods,
};
use super::{driver::Benchmark, machine::Machine};

/// Bound on the teardown (pods gone from `/pods`, sandboxes gone from the runtime). A teardown
/// that takes longer is reported, and the CRI clean-up does the rest.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// After an interruption: how long the runtime must stay free of the benchmark's pods before the
/// clean-up trusts it (calls swiftlet made before it died may still be completing), and how many
/// passes it makes at most.
const SETTLE: Duration = Duration::from_secs(2);
const CLEAN_UP_PASSES: usize = 10;

/// The UIDs of every pod the run has seen listed, shared with whoever cleans up after an
/// interrupted run (the round in flight is dropped with its own list).
#[derive(Clone, Debug, Default)]
pub struct SeenUids(Arc<Mutex<BTreeSet<String>>>);

impl SeenUids {
    fn insert(&self, uid: &str) {
        if !uid.is_empty() {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uid.to_owned());
        }
    }

    fn all(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// What to run, and against what.
#[derive(Clone, Debug)]
pub struct Settings {
    pub swiftlet: PathBuf,
    pub runtime_endpoint: String,
    /// Pods per batch, run in this order.
    pub batches: Vec<usize>,
    pub rounds: usize,
    /// Interval of the `/pods` poll: the resolution of the measurement.
    pub poll: Duration,
    /// How long a round waits for its pods to run before it gives up on those that do not.
    pub timeout: Duration,
    /// Where each round's swiftlet log and `/metrics` snapshot go.
    pub log_dir: PathBuf,
}

/// One round: one swiftlet, one batch written at once.
#[derive(Clone, Debug, Serialize)]
pub struct RoundOutcome {
    pub round: usize,
    /// Per pod, in the order written: from its manifest's rename to the first `/pods` answer
    /// showing it running; `None` when that did not happen within the timeout.
    pub latencies_ns: Vec<Option<u64>>,
    /// From the first rename to the last one.
    pub write_spread_ns: u64,
    /// From the first rename to the last pod seen running; `None` if one never was.
    pub batch_ns: Option<u64>,
    /// `/pods` answers read while waiting.
    pub polls: u64,
    /// Whether, once the manifests were deleted, swiftlet removed every pod from `/pods` and
    /// every sandbox from the runtime in time.
    pub removed_cleanly: bool,
    /// Sandboxes and containers the CRI clean-up found after swiftlet stopped.
    pub leftovers: usize,
    /// Pod cgroup folders left once the pods were gone (removed by the benchmark; see
    /// `cgroups.rs`).
    pub pod_cgroups_left: usize,
    /// The pods' UIDs as `/pods` listed them (in the order written; empty if never listed), to
    /// find them in swiftlet's log.
    pub pod_uids: Vec<String>,
}

/// Every round of one batch size.
#[derive(Clone, Debug)]
pub struct BatchOutcome {
    pub size: usize,
    pub rounds: Vec<RoundOutcome>,
}

impl BatchOutcome {
    /// The latencies of every pod that ran, ascending.
    pub fn sorted_latencies_ns(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self
            .rounds
            .iter()
            .flat_map(|r| r.latencies_ns.iter().flatten().copied())
            .collect();
        all.sort_unstable();
        all
    }

    /// Pods that did not run within the timeout.
    pub fn not_running(&self) -> usize {
        self.rounds
            .iter()
            .map(|r| r.latencies_ns.iter().filter(|l| l.is_none()).count())
            .sum()
    }
}

/// Runs every round of every batch size, one after another, noting each pod's UID in `seen`.
pub async fn run(settings: &Settings, seen: &SeenUids) -> Result<Vec<BatchOutcome>> {
    if settings.batches.contains(&0) || settings.rounds == 0 {
        bail!("batches and rounds must not be empty");
    }
    // Afresh: an earlier run with more rounds would leave logs that look like this run's.
    let _ = std::fs::remove_dir_all(&settings.log_dir);
    std::fs::create_dir_all(&settings.log_dir)
        .with_context(|| format!("creating {}", settings.log_dir.display()))?;
    let mut cri = Cri::connect(&settings.runtime_endpoint).await?;
    let before = clear(&mut cri)
        .await
        .context("clearing an earlier run's pods")?;
    if before > 0 {
        eprintln!("cleared {before} sandboxes and containers an earlier run left");
    }
    let mut outcomes = Vec::with_capacity(settings.batches.len());
    for &size in &settings.batches {
        let mut rounds = Vec::with_capacity(settings.rounds);
        for round in 1..=settings.rounds {
            let outcome = run_round(settings, &mut cri, seen, size, round)
                .await
                .with_context(|| format!("batch of {size}, round {round}"))?;
            eprintln!("{}", round_line(size, &outcome));
            rounds.push(outcome);
        }
        outcomes.push(BatchOutcome { size, rounds });
    }
    Ok(outcomes)
}

/// Clears every pod of the benchmark from the runtime at `endpoint`, and the pod cgroups of those
/// and of the pods in `seen`, for a run that was interrupted: its round was dropped midway (its
/// swiftlet killed) without deleting them. Calls swiftlet made before it died may still be
/// completing in the runtime (a sandbox half created, its cgroups appearing afterwards), so
/// passes are repeated, [`SETTLE`] apart, until one finds nothing. Returns how many sandboxes and
/// containers there were.
pub async fn clean_up(endpoint: &str, seen: &SeenUids) -> Result<usize> {
    let mut cri = Cri::connect(endpoint).await?;
    let mut uids: BTreeSet<String> = seen.all().into_iter().collect();
    let mut total = 0;
    for pass in 0..CLEAN_UP_PASSES {
        if pass > 0 {
            tokio::time::sleep(SETTLE).await;
        }
        let cleared = cri.clear().await?;
        uids.extend(cleared.pod_uids);
        let dirs = cgroups::remove_pod_dirs(&uids.iter().cloned().collect::<Vec<_>>());
        total += cleared.found;
        if pass > 0 && cleared.found == 0 && dirs == 0 {
            break;
        }
    }
    Ok(total)
}

/// [`Cri::clear`], and the pod cgroups of the sandboxes it removed.
async fn clear(cri: &mut Cri) -> Result<usize> {
    let cleared = cri.clear().await?;
    cgroups::remove_pod_dirs(&cleared.pod_uids);
    Ok(cleared.found)
}

/// A progress line for the terminal.
fn round_line(size: usize, outcome: &RoundOutcome) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut ran: Vec<u64> = outcome.latencies_ns.iter().flatten().copied().collect();
    ran.sort_unstable();
    let (fastest, slowest) = (
        ran.first().copied().unwrap_or_default(),
        ran.last().copied().unwrap_or_default(),
    );
    let mut line = format!(
        "batch of {size}, round {}: {}/{size} running, {:.0}–{:.0} ms, batch {}, {} polls",
        outcome.round,
        ran.len(),
        ms(fastest),
        ms(slowest),
        outcome
            .batch_ns
            .map_or_else(|| "incomplete".to_owned(), |ns| format!("{:.0} ms", ms(ns))),
        outcome.polls
    );
    if !outcome.removed_cleanly {
        line.push_str("; swiftlet did not remove every pod in time");
    }
    if outcome.leftovers > 0 {
        line.push_str(&format!("; cleared {} leftovers", outcome.leftovers));
    }
    if outcome.pod_cgroups_left > 0 {
        line.push_str(&format!(
            "; removed {} pod cgroup folders left behind",
            outcome.pod_cgroups_left
        ));
    }
    line
}

/// A round's private directories, removed when dropped.
struct WorkDir {
    dir: PathBuf,
    staging: PathBuf,
    manifests: PathBuf,
}

impl WorkDir {
    fn new(size: usize, round: usize) -> Result<WorkDir> {
        let dir = std::env::temp_dir().join(format!(
            "swiftlet-bench-startup-{}-{size}-r{round}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let (staging, manifests) = (dir.join("staging"), dir.join("manifests"));
        for d in [&staging, &manifests] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(WorkDir {
            dir,
            staging,
            manifests,
        })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn run_round(
    settings: &Settings,
    cri: &mut Cri,
    seen: &SeenUids,
    size: usize,
    round: usize,
) -> Result<RoundOutcome> {
    let work = WorkDir::new(size, round)?;
    let mut agent = Agent::start(&AgentOptions {
        swiftlet: settings.swiftlet.clone(),
        runtime_endpoint: settings.runtime_endpoint.clone(),
        manifests: work.manifests.clone(),
        work_dir: work.dir.clone(),
        log: settings
            .log_dir
            .join(format!("swiftlet-{size}-r{round}.log")),
        // The numbers in the README were taken with the relist PLEG; kept for comparability.
        pleg: "relist".to_owned(),
        extra_args: Vec::new(),
    })
    .await?;
    let pods: Vec<BenchPod> = (0..size).map(|i| BenchPod::new(size, round, i)).collect();

    let measured = measure(settings, &mut agent, &work, &pods, round, seen).await;
    if measured.is_ok() {
        // What swiftlet's own metrics say about this round (runtime operation durations, PLEG).
        let snapshot = settings
            .log_dir
            .join(format!("metrics-{size}-r{round}.txt"));
        match pods::get(agent.port, "/metrics").await {
            Ok(text) => std::fs::write(&snapshot, text)
                .with_context(|| format!("writing {}", snapshot.display()))?,
            Err(e) => eprintln!("no /metrics snapshot: {e:#}"),
        }
    }
    let removed = match &measured {
        Ok(_) => remove_pods(&agent, cri, &pods, &work.manifests).await,
        // The clean-up below clears them.
        Err(_) => Ok(false),
    };
    let stopped = agent.stop().await;
    let leftovers = cri.clear().await.context("clearing the round's pods");
    let mut outcome = measured?;
    outcome.removed_cleanly = removed?;
    stopped.context("stopping swiftlet")?;
    let leftovers = leftovers?;
    outcome.leftovers = leftovers.found;
    // Those of the leftovers too (already among the round's pods, unless /pods never listed one).
    let mut uids = outcome.pod_uids.clone();
    uids.extend(leftovers.pod_uids);
    uids.sort_unstable();
    uids.dedup();
    outcome.pod_cgroups_left = cgroups::remove_pod_dirs(&uids);
    Ok(outcome)
}

/// Writes the batch and polls `/pods` until every pod runs (or the timeout).
async fn measure(
    settings: &Settings,
    agent: &mut Agent,
    work: &WorkDir,
    pods: &[BenchPod],
    round: usize,
    seen_uids: &SeenUids,
) -> Result<RoundOutcome> {
    let names: Vec<String> = pods.iter().map(BenchPod::node_name).collect();
    let written = manifest::write_batch(pods, &work.staging, &work.manifests)?;
    let (Some(&first), Some(&last)) = (written.first(), written.last()) else {
        bail!("an empty batch");
    };
    let deadline = first + settings.timeout;
    let mut running: Vec<Option<Instant>> = vec![None; pods.len()];
    let mut uids = vec![String::new(); pods.len()];
    let mut polls = 0;
    loop {
        let sent = Instant::now();
        let body = match pods::get(agent.port, "/pods").await {
            Ok(body) => body,
            Err(e) => bail!("{e:#}; the end of swiftlet's log:\n{}", agent.log_tail()),
        };
        // The moment the answer is in: a pod that became running during the request counts
        // from here, so the latency is never under-reported.
        let seen = Instant::now();
        polls += 1;
        let listed = pods::list(&body)?;
        for ((at, uid), name) in running.iter_mut().zip(&mut uids).zip(&names) {
            let Some(pod) = listed.get(name) else {
                continue;
            };
            if at.is_none() && pod.running {
                *at = Some(seen);
            }
            if uid.is_empty() {
                uid.clone_from(&pod.uid);
                seen_uids.insert(uid);
            }
        }
        if running.iter().all(Option::is_some) || seen >= deadline {
            break;
        }
        if let Some(status) = agent.exited() {
            bail!(
                "swiftlet exited ({status}) while pods were starting; the end of its log:\n{}",
                agent.log_tail()
            );
        }
        tokio::time::sleep_until((sent + settings.poll).into()).await;
    }
    let latencies_ns: Vec<Option<u64>> = running
        .iter()
        .zip(&written)
        .map(|(at, w)| at.map(|at| nanos(at.duration_since(*w))))
        .collect();
    let batch_ns = running
        .iter()
        .copied()
        .collect::<Option<Vec<Instant>>>()
        .and_then(|all| all.into_iter().max())
        .map(|at| nanos(at.duration_since(first)));
    Ok(RoundOutcome {
        round,
        latencies_ns,
        write_spread_ns: nanos(last.duration_since(first)),
        batch_ns,
        polls,
        removed_cleanly: false,
        leftovers: 0,
        pod_cgroups_left: 0,
        pod_uids: uids,
    })
}

/// Deletes the manifests and waits until swiftlet has dropped the pods from `/pods` and removed
/// their sandboxes. Whether it did so in time.
async fn remove_pods(
    agent: &Agent,
    cri: &mut Cri,
    pods: &[BenchPod],
    manifests: &Path,
) -> Result<bool> {
    manifest::delete_batch(pods, manifests)?;
    let names: Vec<String> = pods.iter().map(BenchPod::node_name).collect();
    harness::wait_removed(agent.port, cri, &names, TEARDOWN_TIMEOUT).await
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(latencies_ms: &[Option<u64>]) -> RoundOutcome {
        RoundOutcome {
            round: 1,
            latencies_ns: latencies_ms
                .iter()
                .map(|l| l.map(|ms| ms * 1_000_000))
                .collect(),
            write_spread_ns: 0,
            batch_ns: None,
            polls: 1,
            removed_cleanly: true,
            leftovers: 0,
            pod_cgroups_left: 0,
            pod_uids: Vec::new(),
        }
    }

    #[test]
    fn a_batch_pools_its_rounds_and_counts_pods_that_never_ran() {
        let batch = BatchOutcome {
            size: 3,
            rounds: vec![
                round(&[Some(300), Some(100), None]),
                round(&[Some(200), Some(50), Some(400)]),
            ],
        };
        assert_eq!(
            batch.sorted_latencies_ns(),
            [50, 100, 200, 300, 400].map(|ms| ms * 1_000_000)
        );
        assert_eq!(batch.not_running(), 1);
    }

    #[test]
    fn the_progress_line_says_what_ran() {
        let mut r = round(&[Some(300), Some(100), None]);
        r.leftovers = 2;
        r.pod_cgroups_left = 12;
        let line = round_line(3, &r);
        assert!(line.starts_with("batch of 3, round 1: 2/3 running, 100–300 ms, batch incomplete"));
        assert!(
            line.ends_with("; cleared 2 leftovers; removed 12 pod cgroup folders left behind"),
            "{line}"
        );
    }
}

/// The startup benchmark as `swiftlet-bench startup` runs it: its settings, the UIDs the run has
/// seen (for the clean-up after an interrupt) and the load when it began.
#[derive(Debug)]
pub struct Bench {
    pub settings: Settings,
    seen: SeenUids,
    load_average: String,
}

impl Bench {
    /// Reads `/proc/loadavg` at once: what else the machine was doing when the run began.
    pub fn new(settings: Settings) -> Bench {
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.trim().to_owned())
            .unwrap_or_default();
        Bench {
            settings,
            seen: SeenUids::default(),
            load_average,
        }
    }
}

impl Benchmark for Bench {
    const NAME: &'static str = "startup";
    const NEEDS_ROOT: &'static str =
        "swiftlet loads eBPF programs and manages cgroups, which needs root";
    const RUNS_PODS: bool = true;
    type Outcome = Vec<BatchOutcome>;
    type Report = report::Report;

    fn announce(&self) -> Option<String> {
        let settings = &self.settings;
        Some(format!(
            "startup: batches of {:?} pods, {} rounds each, /pods polled every {} ms; swiftlet \
             logs in {}",
            settings.batches,
            settings.rounds,
            settings.poll.as_millis(),
            settings.log_dir.display()
        ))
    }

    async fn run(&self) -> Result<Vec<BatchOutcome>> {
        run(&self.settings, &self.seen).await
    }

    async fn clean_up(&self) -> Result<()> {
        clean_up(&self.settings.runtime_endpoint, &self.seen)
            .await
            .map(drop)
    }

    fn report(
        &self,
        batches: &Vec<BatchOutcome>,
        machine: &Machine,
        now: SystemTime,
    ) -> report::Report {
        report::Report::new(
            machine.clone(),
            self.load_average.clone(),
            &self.settings,
            batches,
            now,
        )
    }

    fn markdown(report: &report::Report) -> String {
        report.markdown()
    }

    /// The verdict on the target is part of the table ([`report::Report::markdown`]).
    fn verdicts(_: &report::Report) -> Vec<String> {
        Vec::new()
    }

    fn warnings(report: &report::Report) -> Vec<String> {
        report.warnings()
    }

    fn plot(&self, path: &Path, machine: &Machine, batches: &Vec<BatchOutcome>) -> Result<()> {
        let title = format!(
            "Static pod startup, manifest to Running (Linux {}, {} CPUs)",
            machine.kernel_release, machine.cpus
        );
        report::plot(path, &title, batches)
    }
}
