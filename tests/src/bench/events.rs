//! One events scenario against the real kernel: the programs loaded watching a fresh cgroup,
//! `swiftlet-testproc` run inside it, and its exit events read while it runs, so that the
//! latencies measured are those of a reader keeping up with the load, not of a backlog drained
//! afterwards.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use swiftlet::kernel::{
    CounterReader, EventBody, KernelEvents, LoadOptions, StreamItem, monotonic_ns,
};
use swiftlet_common::{EventKind, KindCounters};

use super::{
    driver::Benchmark,
    machine::{self, Machine},
    plot::{self, Axes, Curve},
    report::{Report, ScenarioReport},
};
use crate::TestCgroup;

/// Bound on one scenario, so that a broken run ends with what it has instead of hanging. Far
/// above what any machine needs for 10^5 exits.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the counters are read again once the load has ended: the kernel may bump a counter
/// after the reader has already taken the record it counts, and then no further record would wake
/// the reader to look again.
const RECHECK: Duration = Duration::from_millis(20);

/// What to run: a name for the report and `swiftlet-testproc`'s arguments.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub args: Vec<String>,
}

impl Scenario {
    /// `exits` children forked one after another: one exit in flight at a time.
    pub fn paced(exits: u64) -> Scenario {
        Scenario {
            name: "paced".into(),
            args: vec!["paced".into(), exits.to_string()],
        }
    }

    /// `exits` children forked by `parallel` workers at once: the highest exit rate the machine
    /// produces.
    pub fn storm(exits: u64, parallel: usize) -> Scenario {
        Scenario {
            name: "storm".into(),
            args: vec!["storm".into(), exits.to_string(), parallel.to_string()],
        }
    }
}

/// What a scenario measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub scenario: Scenario,
    /// Processes that exited in the cgroup: the children testproc forked, and testproc itself.
    pub produced: u64,
    /// From just before testproc was spawned to its reaping.
    pub wall_ns: u64,
    /// `received_ns - ts_ns` of every exit event delivered, ascending.
    pub latencies_ns: Vec<u64>,
    /// The kernel's exit counters (submitted, lost, errors) once everything was accounted for.
    pub kernel: KindCounters,
    /// Exit events the stream delivered.
    pub delivered: u64,
    /// Sum of the stream's `Lost` items (every kind; only exits are lost in practice here).
    pub lost_reported: u64,
    /// Exit events for another cgroup (the filter let them through: must be 0).
    pub foreign: u64,
    /// The timeout ended the reading before every exit was accounted for.
    pub timed_out: bool,
}

impl Outcome {
    /// Exits per second over the wall time.
    pub fn rate_per_s(&self) -> f64 {
        if self.wall_ns == 0 {
            return 0.0;
        }
        self.produced as f64 * 1e9 / self.wall_ns as f64
    }

    /// Everything that does not add up, one sentence each.
    pub fn inconsistencies(&self) -> Vec<String> {
        let name = &self.scenario.name;
        let k = &self.kernel;
        let mut found = Vec::new();
        if self.delivered + k.lost != self.produced {
            found.push(format!(
                "{name}: delivered {} + lost {} = {} exit events, but {} processes exited",
                self.delivered,
                k.lost,
                self.delivered + k.lost,
                self.produced
            ));
        }
        if k.submitted != self.delivered {
            found.push(format!(
                "{name}: the kernel submitted {} exit events, the stream delivered {}",
                k.submitted, self.delivered
            ));
        }
        if k.errors != 0 {
            found.push(format!(
                "{name}: {} exit events given up on after failed kernel reads",
                k.errors
            ));
        }
        if self.foreign != 0 {
            found.push(format!(
                "{name}: {} exit events from outside the watched cgroup",
                self.foreign
            ));
        }
        if self.timed_out {
            found.push(format!(
                "{name}: gave up waiting for events after {SCENARIO_TIMEOUT:?}"
            ));
        }
        found
    }
}

/// Runs `scenario` with `testproc` in a fresh cgroup, the programs loaded with a ring buffer of
/// `ring_bytes`. Loaded afresh per scenario so that the kernel counters count this one only.
pub async fn run(scenario: &Scenario, testproc: &Path, ring_bytes: u32) -> Result<Outcome> {
    // Declared first, dropped last: the programs detach before the cgroup goes.
    let cgroup = TestCgroup::new(&format!("bench-{}", scenario.name));
    let mut events = load(&cgroup, ring_bytes)?;
    let counters = events.counters();
    let cgroup_id = cgroup.id();

    let started_ns = monotonic_ns();
    let child = cgroup.spawn(
        Command::new(testproc)
            .args(&scenario.args)
            .stdout(Stdio::piped()),
    );
    // Waiting blocks, so it gets a thread of its own; this task reads events meanwhile.
    let mut load_done = tokio::task::spawn_blocking(move || wait_for_load(child));

    let mut tally = Tally::default();
    let mut finished: Option<Finished> = None;
    let deadline = tokio::time::sleep(SCENARIO_TIMEOUT);
    tokio::pin!(deadline);
    let mut recheck = tokio::time::interval(RECHECK);
    let timed_out = loop {
        let check = tokio::select! {
            item = events.next() => {
                tally.record(item.context("reading the event stream")?, cgroup_id);
                finished.as_ref().is_some_and(|f| tally.delivered >= f.produced())
            }
            done = &mut load_done, if finished.is_none() => {
                finished = Some(done.context("waiting for swiftlet-testproc")??);
                true
            }
            _ = recheck.tick(), if finished.is_some() => true,
            () = &mut deadline => break true,
        };
        if let Some(done) = &finished
            && check
            && accounted(&exit_counters(&counters)?, done.produced(), tally.delivered)
        {
            break false;
        }
    };
    let Some(finished) = finished else {
        bail!(
            "swiftlet-testproc {} did not finish within {SCENARIO_TIMEOUT:?}",
            scenario.args.join(" ")
        );
    };
    let kernel = exit_counters(&counters)?;
    tally.latencies_ns.sort_unstable();
    Ok(Outcome {
        scenario: scenario.clone(),
        produced: finished.produced(),
        wall_ns: finished.ended_ns.saturating_sub(started_ns),
        latencies_ns: tally.latencies_ns,
        kernel,
        delivered: tally.delivered,
        lost_reported: tally.lost_reported,
        foreign: tally.foreign,
        timed_out,
    })
}

fn load(cgroup: &TestCgroup, ring_bytes: u32) -> Result<KernelEvents> {
    let options = LoadOptions {
        ring_bytes,
        watch: vec![cgroup.dir.clone()],
        ..LoadOptions::default()
    };
    KernelEvents::load(&options).map_err(|error| match error.hint() {
        Some(hint) => anyhow::anyhow!("loading the eBPF programs: {error} (hint: {hint})"),
        None => anyhow::anyhow!("loading the eBPF programs: {error}"),
    })
}

fn exit_counters(counters: &CounterReader) -> Result<KindCounters> {
    Ok(counters
        .read()
        .context("reading the kernel counters")?
        .get(EventKind::Exit))
}

/// Whether every exit has been seen by the kernel (submitted or lost) and every submitted one
/// delivered: then nothing more can come.
fn accounted(exit: &KindCounters, produced: u64, delivered: u64) -> bool {
    exit.submitted + exit.lost >= produced && delivered >= exit.submitted
}

/// What the reader saw so far.
#[derive(Debug, Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    delivered: u64,
    lost_reported: u64,
    foreign: u64,
}

impl Tally {
    fn record(&mut self, item: StreamItem, cgroup_id: u64) {
        match item {
            StreamItem::Event(event) => {
                let EventBody::Exit(exit) = &event.body else {
                    // testproc's exec: not what is measured.
                    return;
                };
                if exit.cgroup_id != cgroup_id {
                    self.foreign += 1;
                    return;
                }
                self.delivered += 1;
                // Both CLOCK_MONOTONIC; saturating only guards against a decoding bug.
                self.latencies_ns
                    .push(event.received_ns.saturating_sub(event.ts_ns));
            }
            StreamItem::Lost { count } => self.lost_reported += count,
        }
    }
}

/// testproc's end.
#[derive(Debug)]
struct Finished {
    /// Children it reports having forked.
    forked: u64,
    /// Worker processes it forked them from (0: it forked them itself).
    workers: u64,
    /// When it was reaped (CLOCK_MONOTONIC ns).
    ended_ns: u64,
}

impl Finished {
    /// The children, the workers and testproc itself.
    fn produced(&self) -> u64 {
        self.forked + self.workers + 1
    }
}

/// Waits for testproc, which prints `forked N workers W` when it has reaped all its children.
fn wait_for_load(child: Child) -> Result<Finished> {
    let output = child
        .wait_with_output()
        .context("waiting for swiftlet-testproc")?;
    let ended_ns = monotonic_ns();
    if !output.status.success() {
        bail!("swiftlet-testproc failed: {}", output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (forked, workers) = stdout
        .lines()
        .find_map(|line| {
            let (forked, workers) = line.strip_prefix("forked ")?.split_once(" workers ")?;
            Some((forked.trim().parse().ok()?, workers.trim().parse().ok()?))
        })
        .with_context(|| {
            format!("swiftlet-testproc printed no `forked N workers W`: {stdout:?}")
        })?;
    Ok(Finished {
        forked,
        workers,
        ended_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(submitted: u64, lost: u64) -> KindCounters {
        KindCounters {
            submitted,
            lost,
            errors: 0,
        }
    }

    #[test]
    fn accounted_once_the_kernel_saw_all_and_the_reader_got_all() {
        assert!(accounted(&counters(10, 0), 10, 10));
        assert!(accounted(&counters(7, 3), 10, 7));
        assert!(
            !accounted(&counters(7, 3), 10, 6),
            "records still in the ring"
        );
        assert!(
            !accounted(&counters(9, 0), 10, 9),
            "the kernel has not seen one"
        );
    }

    fn outcome(produced: u64, delivered: u64, kernel: KindCounters) -> Outcome {
        Outcome {
            scenario: Scenario::paced(produced - 1),
            produced,
            wall_ns: 2_000_000_000,
            latencies_ns: Vec::new(),
            kernel,
            delivered,
            lost_reported: kernel.lost,
            foreign: 0,
            timed_out: false,
        }
    }

    #[test]
    fn consistency_checks() {
        let ok = outcome(10, 8, counters(8, 2));
        assert!(ok.inconsistencies().is_empty());
        assert!((ok.rate_per_s() - 5.0).abs() < 1e-9);
        let missing = outcome(10, 7, counters(8, 2));
        assert_eq!(
            missing.inconsistencies().len(),
            2,
            "{:?}",
            missing.inconsistencies()
        );
    }
}

/// Below this, p99.9 rests on fewer than ten samples.
pub const MEANINGFUL_EXITS: u64 = 10_000;

/// The events benchmark as `swiftlet-bench events` runs it: [`Scenario::paced`], then
/// [`Scenario::storm`] with one worker per CPU.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Exits per scenario.
    pub exits: u64,
    pub ring_buffer_bytes: u32,
    /// The `swiftlet-testproc` binary.
    pub testproc: PathBuf,
}

impl Benchmark for Settings {
    const NAME: &'static str = "events";
    const NEEDS_ROOT: &'static str = "loading eBPF programs and creating cgroups needs root";
    const RUNS_PODS: bool = false;
    type Outcome = Vec<Outcome>;
    type Report = Report;

    fn announce(&self) -> Option<String> {
        (self.exits < MEANINGFUL_EXITS).then(|| {
            format!(
                "note: {} exits per scenario; use at least {MEANINGFUL_EXITS} for a meaningful \
                 p99.9",
                self.exits
            )
        })
    }

    async fn run(&self) -> Result<Vec<Outcome>> {
        let scenarios = [
            Scenario::paced(self.exits),
            Scenario::storm(self.exits, machine::cpus()),
        ];
        let mut outcomes = Vec::with_capacity(scenarios.len());
        for scenario in &scenarios {
            eprintln!(
                "running {}: swiftlet-testproc {} (ring buffer {} bytes)",
                scenario.name,
                scenario.args.join(" "),
                self.ring_buffer_bytes
            );
            let outcome = run(scenario, &self.testproc, self.ring_buffer_bytes)
                .await
                .with_context(|| format!("scenario {}", scenario.name))?;
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Nothing to clear: the scenarios run no pods, and an interrupt simply ends the process.
    async fn clean_up(&self) -> Result<()> {
        Ok(())
    }

    fn report(&self, outcomes: &Vec<Outcome>, machine: &Machine, now: SystemTime) -> Report {
        let reports = outcomes
            .iter()
            .map(|o| ScenarioReport::new(o, self.ring_buffer_bytes))
            .collect();
        Report::new(machine.clone(), reports, now)
    }

    fn markdown(report: &Report) -> String {
        report.markdown()
    }

    fn verdicts(_: &Report) -> Vec<String> {
        Vec::new()
    }

    fn warnings(report: &Report) -> Vec<String> {
        report
            .scenarios
            .iter()
            .flat_map(|s| s.inconsistencies.iter().cloned())
            .collect()
    }

    fn plot(&self, path: &Path, machine: &Machine, outcomes: &Vec<Outcome>) -> Result<()> {
        let curves: Vec<Curve<'_>> = outcomes
            .iter()
            .map(|o| Curve {
                name: &o.scenario.name,
                sorted_ns: &o.latencies_ns,
            })
            .collect();
        let title = format!(
            "Exit event latency, kernel to swiftlet (Linux {}, {} CPUs)",
            machine.kernel_release, machine.cpus
        );
        let axes = Axes {
            ns_per_unit: 1e3,
            x_desc: "latency, kernel to userspace (µs, log scale)",
            y_desc: "fraction of exit events",
        };
        plot::latency_cdf(path, &title, &axes, &curves)
    }
}
