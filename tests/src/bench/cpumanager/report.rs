//! The CPU manager benchmark's results: a Markdown table per measurement (for people and the
//! README), JSON (the modes with every run, and the overhead's windows), the verdicts on the
//! targets, and an SVG plot of the start → exclusive CDFs.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Result;
use serde::Serialize;

use super::{EXCLUSIVE_CPU, Mode, ModeOutcome, Outcome, RunOutcome, overhead::OverheadResult};
use crate::bench::{
    machine::Machine,
    plot::{self, Axes, Curve},
    report::ms_cell,
    stats::LatencyMs,
};

/// The targets: with cpusets applied on events, a Guaranteed container's CPU is its own within
/// this long of its start at p99 ...
pub const EVENTS_P99_MS: f64 = 50.0;
/// ... other pods' containers run on it for less than this per 10 s ...
pub const FOREIGN_PODS_MS: f64 = 1.0;
/// ... and the scheduler audit's programs cost less than this share of context switches.
pub const OVERHEAD_PERCENT: f64 = 5.0;

/// One mode, as the JSON carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// `--cpu-manager-apply`.
    pub mode: Mode,
    pub runs: usize,
    /// Runs without exclusivity within 30 s of the start (or without a start, or the audit's
    /// series).
    pub failures: usize,
    /// (a) The container's first process → its CPU its own (0 when in place before the start).
    pub in_place_ms: LatencyMs,
    pub in_place_before_start: usize,
    /// (b) Foreign time on the container's CPU in its first 10 s: other pods' containers, and
    /// everything else (system daemons, kernel threads, swiftlet).
    pub foreign_pods_ms: LatencyMs,
    pub foreign_other_ms: LatencyMs,
    /// `swiftlet_cpu_manager_cpuset_updates_total` by trigger, at the end of the mode.
    pub cpuset_updates: BTreeMap<String, f64>,
    pub violations: Option<f64>,
    pub spinner_ran_throughout: bool,
    /// The longest interval between two samples of the watch.
    pub max_sample_interval_ms: f64,
    pub run_details: Vec<RunOutcome>,
}

impl Entry {
    pub fn new(o: &ModeOutcome) -> Entry {
        Entry {
            mode: o.mode,
            runs: o.runs.len(),
            failures: o.failures(),
            in_place_ms: LatencyMs::of(&o.latencies_ns()),
            in_place_before_start: o.in_place_before_start(),
            foreign_pods_ms: LatencyMs::of(&o.foreign_pod_ns()),
            foreign_other_ms: LatencyMs::of(&o.foreign_other_ns()),
            cpuset_updates: o.cpuset_updates.clone(),
            violations: o.violations,
            spinner_ran_throughout: o.spinner_ran_throughout,
            max_sample_interval_ms: o
                .runs
                .iter()
                .map(|r| r.max_sample_interval_ms)
                .fold(0.0, f64::max),
            run_details: o.runs.clone(),
        }
    }
}

/// Everything one `swiftlet-bench cpumanager` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    /// UTC, RFC 3339.
    pub date: String,
    pub machine: Machine,
    pub exclusive_cpu: u32,
    pub reconcile_period_s: u64,
    pub foreign_window_s: u64,
    pub modes: Vec<Entry>,
    /// (c) Context-switch round trips per second without and with the scheduler audit.
    pub overhead: OverheadResult,
}

impl Report {
    pub fn new(outcome: &Outcome, machine: Machine, date: &str) -> Report {
        Report {
            benchmark: "cpumanager",
            date: date.to_owned(),
            machine,
            exclusive_cpu: EXCLUSIVE_CPU,
            reconcile_period_s: outcome.reconcile_period.as_secs(),
            foreign_window_s: outcome.foreign_window.as_secs(),
            modes: outcome.modes.iter().map(Entry::new).collect(),
            overhead: outcome.overhead.clone(),
        }
    }

    /// The machine line, a row per mode, and the overhead's row.
    pub fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.machine.line(&self.date));
        out.push_str(
            "| `--cpu-manager-apply` | runs | failures | start → exclusive p50 ms | p99 ms | max ms \
             | in place before start | other pods on the CPU, ms per 10 s, p50 | max | system, ms \
             per 10 s, p50 |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for e in &self.modes {
            let (a, pods, other) = (&e.in_place_ms, &e.foreign_pods_ms, &e.foreign_other_ms);
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                e.mode.name(),
                e.runs,
                e.failures,
                ms_cell(a.p50, a.n),
                ms_cell(a.p99, a.n),
                ms_cell(a.max, a.n),
                e.in_place_before_start,
                ms_cell(pods.p50, pods.n),
                ms_cell(pods.max, pods.n),
                ms_cell(other.p50, other.n),
            );
        }
        let o = &self.overhead;
        let _ = write!(
            out,
            "\n| scheduler audit (CPU {} owned) | windows | round trips/s without (median) | with \
             | overhead | added per switch ns |\n\
             |---|--:|--:|--:|--:|--:|\n\
             | `sched_switch` (tp_btf) | {} × {:.0} ms | {} | {} | {:.1} % | {:.0} |\n",
            o.cpu,
            o.without.len().min(o.with.len()),
            o.window_ms,
            o.median_without,
            o.median_with,
            o.overhead * 100.0,
            o.added_ns_per_switch
        );
        out
    }

    /// One sentence per target: met or missed, with the numbers; and what the kubelet's model
    /// gives for comparison.
    pub fn verdicts(&self) -> Vec<String> {
        let met = |ok: bool| if ok { "met" } else { "missed" };
        let mut out = Vec::new();
        for e in &self.modes {
            let a = &e.in_place_ms;
            let complete = e.failures == 0 && a.n > 0;
            match e.mode {
                Mode::Events => {
                    out.push(format!(
                        "Target (a): with cpusets applied on events, a Guaranteed container's CPU \
                         is its own within {EVENTS_P99_MS} ms of its start at p99: {} (p99 {:.2} \
                         ms, max {:.2} ms over {} runs, {} failed; in place before the start in \
                         {}).",
                        met(complete && a.p99 <= EVENTS_P99_MS),
                        a.p99,
                        a.max,
                        e.runs,
                        e.failures,
                        e.in_place_before_start
                    ));
                    let pods = &e.foreign_pods_ms;
                    out.push(format!(
                        "Target (b): other pods' containers run on the exclusive CPU less than \
                         {FOREIGN_PODS_MS} ms in the container's first {} s: {} (max {:.3} ms, \
                         p50 {:.3} ms over {} runs; the system's time there p50 {:.2} ms, max \
                         {:.2} ms).",
                        self.foreign_window_s,
                        met(complete && pods.n as usize == e.runs && pods.max < FOREIGN_PODS_MS),
                        pods.max,
                        pods.p50,
                        pods.n,
                        e.foreign_other_ms.p50,
                        e.foreign_other_ms.max
                    ));
                }
                Mode::Reconcile => out.push(format!(
                    "For comparison, the reconcile alone (the kubelet's model, every {} s): start \
                     → exclusive p50 {:.0} ms, max {:.0} ms; other pods on the CPU in the first \
                     {} s p50 {:.0} ms, max {:.0} ms ({} runs, {} failed).",
                    self.reconcile_period_s,
                    a.p50,
                    a.max,
                    self.foreign_window_s,
                    e.foreign_pods_ms.p50,
                    e.foreign_pods_ms.max,
                    e.runs,
                    e.failures
                )),
            }
        }
        let o = &self.overhead;
        out.push(format!(
            "Target (c): the scheduler audit's programs cost less than {OVERHEAD_PERCENT} % of \
             context-switch throughput: {} ({:.1} %: {} round trips/s without, {} with, medians \
             of {} windows of {:.0} ms each; {:.0} ns added per switch).",
            met(o.median_without > 0 && o.overhead * 100.0 < OVERHEAD_PERCENT),
            o.overhead * 100.0,
            o.median_without,
            o.median_with,
            o.without.len(),
            o.window_ms,
            o.added_ns_per_switch
        ));
        out
    }

    /// What went wrong besides the numbers: failed runs, the spinner, violations counted.
    pub fn warnings(&self) -> Vec<String> {
        let mut found = Vec::new();
        for e in &self.modes {
            let what = format!("--cpu-manager-apply {}", e.mode.name());
            for r in &e.run_details {
                if let Some(f) = &r.failure {
                    found.push(format!("{what}, run {}: {f}", r.run));
                }
            }
            if !e.spinner_ran_throughout {
                found.push(format!(
                    "{what}: the spinner's process did not run throughout"
                ));
            }
            if e.mode == Mode::Events && e.violations.is_some_and(|v| v > 0.0) {
                found.push(format!(
                    "{what}: swiftlet counted {} exclusivity violations",
                    e.violations.unwrap_or_default()
                ));
            }
        }
        found
    }
}

/// Latencies below this are drawn at it: exclusivity in place before the start counts as 0,
/// which a log axis cannot show.
const PLOT_FLOOR_NS: u64 = 10_000;

/// Writes the CDFs of start → exclusive of every mode to `path`.
pub fn plot(path: &Path, title: &str, modes: &[ModeOutcome]) -> Result<()> {
    let series: Vec<(String, Vec<u64>)> = modes
        .iter()
        .map(|o| {
            let floored = o
                .latencies_ns()
                .iter()
                .map(|&ns| ns.max(PLOT_FLOOR_NS))
                .collect();
            (format!("--cpu-manager-apply {}", o.mode.name()), floored)
        })
        .collect();
    let curves: Vec<Curve<'_>> = series
        .iter()
        .map(|(name, sorted_ns)| Curve { name, sorted_ns })
        .collect();
    let axes = Axes {
        ns_per_unit: 1e6,
        x_desc: "container started → its CPU its own (ms, log scale; in place before the start \
                 drawn at 0.01)",
        y_desc: "fraction of runs",
    };
    plot::latency_cdf(path, title, &axes, &curves)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::cpumanager::{FOREIGN_WINDOW, RECONCILE_PERIOD};

    fn run(n: usize, in_place_ms: i64, pods_ms: f64) -> RunOutcome {
        RunOutcome {
            run: n,
            delay_ms: 0,
            container_id: Some("c".into()),
            start_after_manifest_ms: Some(300.0),
            in_place_after_ns: Some(in_place_ms * 1_000_000),
            pinned_after_ns: Some(0),
            spinner_off_after_ns: Some(in_place_ms * 1_000_000),
            foreign_pod_ms: Some(pods_ms),
            foreign_other_ms: Some(0.5),
            foreign_read_after_ms: Some(10_001.0),
            samples: 100,
            max_sample_interval_ms: 1.3,
            failure: None,
        }
    }

    fn mode(mode: Mode, runs: Vec<RunOutcome>) -> ModeOutcome {
        ModeOutcome {
            mode,
            runs,
            cpuset_updates: BTreeMap::from([("event".into(), 4.0)]),
            violations: Some(0.0),
            spinner_ran_throughout: true,
        }
    }

    fn report(modes: Vec<ModeOutcome>, without: u64, with: u64) -> Report {
        let overhead = OverheadResult::of(
            1,
            Duration::from_millis(500),
            vec![without; 3],
            vec![with; 3],
        );
        let machine = Machine {
            kernel_release: "6.8.0".into(),
            cpus: 2,
            cpu_model: "test".into(),
        };
        Report::new(
            &Outcome {
                modes,
                overhead,
                reconcile_period: RECONCILE_PERIOD,
                foreign_window: FOREIGN_WINDOW,
            },
            machine,
            "2026-11-22T00:00:00Z",
        )
    }

    #[test]
    fn the_tables_have_a_row_per_mode_and_the_overhead() {
        let r = report(
            vec![
                mode(Mode::Events, vec![run(1, -3, 0.0), run(2, 2, 0.0)]),
                mode(
                    Mode::Reconcile,
                    vec![run(1, 4000, 3000.0), run(2, 9000, 8000.0)],
                ),
            ],
            100_000,
            97_000,
        );
        let table = r.markdown();
        assert!(table.starts_with("Machine: Linux 6.8.0, 2 CPUs"), "{table}");
        assert!(
            table.contains("| events | 2 | 0 | 0.00 | 2.00 | 2.00 | 1 | 0.00 | 0.00 | 0.50 |"),
            "{table}"
        );
        assert!(
            table.contains("| reconcile | 2 | 0 | 4000 | 9000 | 9000 | 0 | 3000 | 8000 | 0.50 |"),
            "{table}"
        );
        assert!(
            table.contains("| 3 × 500 ms | 100000 | 97000 | 3.0 % |"),
            "{table}"
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["modes"][0]["mode"], "events");
        assert_eq!(json["modes"][1]["in_place_ms"]["p50"], 4000.0);
        assert_eq!(
            json["modes"][0]["run_details"][0]["in_place_after_ns"],
            -3_000_000
        );
        assert_eq!(json["overhead"]["median_with"], 97_000);
        let verdicts = r.verdicts();
        assert_eq!(verdicts.len(), 4, "{verdicts:?}");
        assert!(verdicts[0].starts_with("Target (a)") && verdicts[0].contains(": met"));
        assert!(verdicts[1].starts_with("Target (b)") && verdicts[1].contains(": met"));
        assert!(verdicts[3].starts_with("Target (c)") && verdicts[3].contains(": met"));
        assert!(r.warnings().is_empty());
    }

    #[test]
    fn misses_and_failures_are_told() {
        let mut failed = run(2, 0, 0.0);
        failed.failure = Some("exclusivity never in place".into());
        let mut events = mode(Mode::Events, vec![run(1, 80, 2.0), failed]);
        events.spinner_ran_throughout = false;
        let r = report(vec![events], 100_000, 90_000);
        let verdicts = r.verdicts();
        assert!(
            verdicts.iter().all(|v| v.contains("missed")),
            "{verdicts:?}"
        );
        let warnings = r.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("run 2: exclusivity never in place"));
    }
}
