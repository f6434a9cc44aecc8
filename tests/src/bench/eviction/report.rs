//! The eviction benchmark's results: a Markdown table (for people and the README), JSON (an array
//! with one object per mode, every run included), the verdict on the targets, and an SVG plot of
//! the latency CDFs.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Result;
use serde::Serialize;

use super::{Mode, ModeOutcome, RunOutcome};
use crate::bench::{
    machine::Machine,
    plot::{self, Axes, Curve},
    report::ms_cell,
    stats::{LatencyMs, ms, sorted_ns},
};

/// The targets, crossing → decision at p99: kernel wake-ups (memory cgroup, OOM, reclaim) ...
pub const KERNEL_P99_MS: f64 = 100.0;
/// ... PSI triggers ...
pub const PSI_P99_MS: f64 = 2500.0;
/// ... and the periodic check, at most its period.
pub const PERIODIC_MAX_MS: f64 = 10_000.0;

/// One mode, as the JSON carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub mode: Mode,
    /// `--eviction-wakeups`.
    pub wakeups: String,
    /// What the hog does.
    pub scenario: String,
    pub runs: usize,
    /// Runs in which the hog was evicted.
    pub evictions: usize,
    /// Runs that failed (no eviction within 30 s of the crossing, another pod evicted, ...).
    pub failures: usize,
    /// Working set past the bar (sampled) → the decision naming the hog.
    pub decision_ms: LatencyMs,
    /// Working set past the bar → the hog's containers exited (the kernel's time of
    /// the last).
    pub stopped_ms: LatencyMs,
    /// Runs whose working set went back below the bar between the crossing and the decision,
    /// and the decision's latency from the end of the last such dip instead.
    pub runs_with_dips: usize,
    pub decision_after_last_dip_ms: LatencyMs,
    /// The wake-up source of each deciding decision, with counts.
    pub decided_by: BTreeMap<String, usize>,
    pub bystander_evictions: usize,
    pub bystander_phase: String,
    pub bystander_restarts: i64,
    pub stray_evictions: Vec<String>,
    pub lost_events: u64,
    /// `swiftlet_eviction_wakeups_total` at the end of the mode, by source.
    pub wakeups_total: BTreeMap<String, f64>,
    pub woken_by: String,
    /// Of the runs evicted, those whose stall in the 2 s before the deciding wake-up reached a PSI
    /// trigger's 100 ms, per PSI file ("pods memory", "pods io", "node memory", "node io"): which
    /// triggers could have fired.
    pub stall_over_trigger: BTreeMap<String, usize>,
    /// The longest interval between the sample that saw a crossing and the one before it.
    pub max_sample_interval_ms: f64,
    pub date: String,
    pub machine: Machine,
    pub run_details: Vec<RunOutcome>,
}

impl Entry {
    pub fn new(o: &ModeOutcome, machine: &Machine, date: &str) -> Entry {
        Entry {
            mode: o.mode,
            wakeups: o.wakeups.clone(),
            scenario: o.scenario.clone(),
            runs: o.runs.len(),
            evictions: o.evictions(),
            failures: o.failures(),
            decision_ms: LatencyMs::of(&o.decision_latencies_ns()),
            stopped_ms: LatencyMs::of(&o.stopped_latencies_ns()),
            runs_with_dips: o.runs.iter().filter(|r| r.dips_before_decision > 0).count(),
            decision_after_last_dip_ms: LatencyMs::of(&sorted_ns(
                o.runs.iter().filter_map(|r| r.decision_after_last_dip_ns),
            )),
            decided_by: o.decided_by(),
            bystander_evictions: o.bystander_evictions,
            bystander_phase: o.bystander_phase.clone(),
            bystander_restarts: o.bystander_restarts,
            stray_evictions: o.stray_evictions.clone(),
            lost_events: o.lost_events,
            wakeups_total: o.wakeups_total.clone(),
            woken_by: o.woken_by.clone(),
            stall_over_trigger: stall_over_trigger(&o.runs),
            max_sample_interval_ms: o
                .runs
                .iter()
                .filter_map(|r| r.crossing.map(|c| ms(c.interval_ns)))
                .fold(0.0, f64::max),
            date: date.to_owned(),
            machine: machine.clone(),
            run_details: o.runs.clone(),
        }
    }

    fn decided_by_text(&self) -> String {
        if self.decided_by.is_empty() {
            return "—".to_owned();
        }
        self.decided_by
            .iter()
            .map(|(source, n)| format!("{source} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A PSI trigger's stall threshold (`some` 100 ms in a 2 s window).
const TRIGGER_STALL_MS: f64 = 100.0;

fn stall_over_trigger(runs: &[RunOutcome]) -> BTreeMap<String, usize> {
    let mut over = BTreeMap::new();
    for s in runs.iter().filter_map(|r| r.stall_before_decision) {
        for (name, ms) in [
            ("pods memory", s.pods_memory),
            ("pods io", s.pods_io),
            ("node memory", s.node_memory),
            ("node io", s.node_io),
        ] {
            let n = over.entry(name.to_owned()).or_insert(0);
            if ms.is_some_and(|ms| ms >= TRIGGER_STALL_MS) {
                *n += 1;
            }
        }
    }
    over
}

/// The machine line and one table row per mode.
pub fn markdown(entries: &[Entry]) -> String {
    let mut out = String::new();
    if let Some(first) = entries.first() {
        let _ = writeln!(out, "{}\n", first.machine.line(&first.date));
    }
    out.push_str(
        "| mode | `--eviction-wakeups` | runs | evicted | failures | decision p50 ms | p99 ms | \
         max ms | stopped p50 ms | p99 ms | max ms | decided by | bystander evicted |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|\n",
    );
    for e in entries {
        let (d, s) = (&e.decision_ms, &e.stopped_ms);
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            e.mode.name(),
            e.wakeups,
            e.runs,
            e.evictions,
            e.failures,
            ms_cell(d.p50, d.n),
            ms_cell(d.p99, d.n),
            ms_cell(d.max, d.n),
            ms_cell(s.p50, s.n),
            ms_cell(s.p99, s.n),
            ms_cell(s.max, s.n),
            e.decided_by_text(),
            e.bystander_evictions,
        );
    }
    out
}

/// One sentence per mode that ran: its target met or missed, with the numbers.
pub fn verdicts(entries: &[Entry]) -> Vec<String> {
    let met = |ok: bool| if ok { "met" } else { "missed" };
    entries
        .iter()
        .map(|e| {
            let d = &e.decision_ms;
            let complete = e.failures == 0 && d.n > 0;
            let own = e
                .decided_by
                .iter()
                .filter(|(s, _)| e.mode.expected_sources().contains(&s.as_str()))
                .map(|(_, n)| n)
                .sum::<usize>();
            // Whichever wake-up comes first decides: a periodic check that happens to fall
            // between the crossing and the kernel's wake-up decides sooner, not later, so the
            // latency is judged whatever the source, and the sources are told.
            let by = format!(
                "{own} of {} evictions decided by {} (all: {})",
                e.evictions,
                e.mode.expected_sources().join("/"),
                e.decided_by_text()
            );
            match e.mode {
                Mode::Kernel => format!(
                    "Target: kernel wake-ups decide within {KERNEL_P99_MS} ms of the crossing at \
                     p99: {} (p99 {:.2} ms, max {:.2} ms over {} runs, {} failed; {by}).",
                    met(complete && d.p99 <= KERNEL_P99_MS),
                    d.p99,
                    d.max,
                    e.runs,
                    e.failures
                ),
                Mode::Psi => format!(
                    "Target: PSI triggers decide within {PSI_P99_MS} ms of the crossing at p99: \
                     {} (p99 {:.0} ms, max {:.0} ms over {} runs, {} failed; {by}; stall of at \
                     least {TRIGGER_STALL_MS} ms in the 2 s before the deciding wake-up, in how \
                     many runs: {}).",
                    met(complete && d.p99 <= PSI_P99_MS),
                    d.p99,
                    d.max,
                    e.runs,
                    e.failures,
                    e.stall_over_trigger
                        .iter()
                        .map(|(file, n)| format!("{file} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Mode::Periodic => format!(
                    "Expectation: the periodic check alone decides 0–{:.0} s after the crossing: \
                     {} (p50 {:.0} ms, max {:.0} ms over {} runs, {} failed; {by}).",
                    PERIODIC_MAX_MS / 1000.0,
                    met(complete && d.max <= PERIODIC_MAX_MS),
                    d.p50,
                    d.max,
                    e.runs,
                    e.failures
                ),
            }
        })
        .collect()
}

/// What went wrong besides the latencies: failed runs, the bystander, evictions between runs,
/// missed events.
pub fn warnings(entries: &[Entry]) -> Vec<String> {
    let mut found = Vec::new();
    for e in entries {
        let what = format!("--eviction-wakeups {}", e.wakeups);
        for r in &e.run_details {
            if let Some(f) = &r.failure {
                found.push(format!("{what}, run {}: {f}", r.run));
            }
        }
        if e.bystander_evictions > 0 {
            found.push(format!(
                "{what}: the bystander was evicted {} times",
                e.bystander_evictions
            ));
        }
        if e.bystander_phase != "Running" || e.bystander_restarts > 0 {
            found.push(format!(
                "{what}: the bystander ended {} with {} restarts",
                e.bystander_phase, e.bystander_restarts
            ));
        }
        if !e.stray_evictions.is_empty() {
            found.push(format!(
                "{what}: evictions between runs: {}",
                e.stray_evictions.join(", ")
            ));
        }
        if e.lost_events > 0 {
            found.push(format!(
                "{what}: the benchmark's watch missed {} events",
                e.lost_events
            ));
        }
    }
    found
}

/// Latencies below this are drawn at it: decisions that came before the sample showing the
/// crossing count as 0, which a log axis cannot show.
const PLOT_FLOOR_NS: u64 = 10_000;

/// Writes the CDFs of crossing → decision and crossing → stopped of every mode to `path`.
pub fn plot(path: &Path, title: &str, outcomes: &[ModeOutcome]) -> Result<()> {
    let floored = |sorted: Vec<u64>| -> Vec<u64> {
        sorted.into_iter().map(|ns| ns.max(PLOT_FLOOR_NS)).collect()
    };
    let series: Vec<(String, Vec<u64>)> = outcomes
        .iter()
        .flat_map(|o| {
            [
                (
                    format!("{}: decision", o.mode.name()),
                    floored(o.decision_latencies_ns()),
                ),
                (
                    format!("{}: containers stopped", o.mode.name()),
                    floored(o.stopped_latencies_ns()),
                ),
            ]
        })
        .collect();
    let curves: Vec<Curve<'_>> = series
        .iter()
        .map(|(name, sorted_ns)| Curve { name, sorted_ns })
        .collect();
    let axes = Axes {
        ns_per_unit: 1e6,
        x_desc: "working set past the threshold → eviction decided / containers stopped (ms, log \
                 scale; under 0.01 ms drawn at 0.01)",
        y_desc: "fraction of runs",
    };
    plot::latency_cdf(path, title, &axes, &curves)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::eviction::{
        bar,
        outcome::judge,
        sampler::Crossing,
        stream::{Decision, Died, Heard},
    };

    fn machine() -> Machine {
        Machine {
            kernel_release: "6.8.0".into(),
            cpus: 2,
            cpu_model: "test".into(),
        }
    }

    /// A mode whose runs decided `decided_ms` after the crossing, by `source`, and stopped 50 ms
    /// later.
    fn outcome(mode: Mode, source: &str, decided_ms: &[u64]) -> ModeOutcome {
        let crossing_ns = 1_000_000_000;
        let runs = decided_ms
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let decided_ns = crossing_ns + d * 1_000_000;
                let heard = [
                    Heard::Decision(Decision {
                        source: source.into(),
                        woke_ns: decided_ns,
                        decided_ns,
                        signal: "allocatableMemory.available".into(),
                        pod_uid: "u".into(),
                        pod_name: "hog".into(),
                    }),
                    Heard::Died(Died {
                        pod_uid: "u".into(),
                        pod_name: "hog".into(),
                        container_name: "main".into(),
                        kernel_ts_ns: decided_ns + 50_000_000,
                        sent_ns: 0,
                        reason: String::new(),
                        exit_code: Some(143),
                    }),
                ];
                let crossing = Crossing {
                    at_ns: crossing_ns,
                    interval_ns: 1_100_000,
                    working_set_bytes: bar() + 1,
                    samples: 100,
                };
                judge(i + 1, Duration::ZERO, "hog", 1, Some(crossing), &heard)
            })
            .collect();
        ModeOutcome {
            mode,
            wakeups: mode.wakeups().into(),
            scenario: mode.hog().describe(),
            runs,
            bystander_evictions: 0,
            bystander_phase: "Running".into(),
            bystander_restarts: 0,
            stray_evictions: vec![],
            lost_events: 0,
            wakeups_total: BTreeMap::from([("memcg".into(), 3.0)]),
            woken_by: String::new(),
        }
    }

    fn entries(outcomes: &[ModeOutcome]) -> Vec<Entry> {
        outcomes
            .iter()
            .map(|o| Entry::new(o, &machine(), "2026-11-22T00:00:00Z"))
            .collect()
    }

    #[test]
    fn the_table_has_a_row_per_mode() {
        let e = entries(&[
            outcome(Mode::Kernel, "memcg", &[1, 2, 3]),
            outcome(Mode::Periodic, "periodic", &[4000, 9000]),
        ]);
        let table = markdown(&e);
        assert!(table.starts_with("Machine: Linux 6.8.0, 2 CPUs"), "{table}");
        assert!(
            table.contains(
                "| kernel | psi,kernel,memcg,level | 3 | 3 | 0 | 2.00 | 3.00 | 3.00 | 52 | 53 | 53 | \
                 memcg 3 | 0 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| periodic | none | 2 | 2 | 0 | 4000 | 9000 | 9000 | 4050 |"),
            "{table}"
        );
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(json[0]["mode"], "kernel");
        assert_eq!(json[0]["decision_ms"]["p50"], 2.0);
        assert_eq!(json[0]["decided_by"]["memcg"], 3);
        assert_eq!(json[0]["run_details"][0]["decision"]["source"], "memcg");
        assert!((json[0]["max_sample_interval_ms"].as_f64().unwrap_or(0.0) - 1.1).abs() < 1e-9);
    }

    #[test]
    fn targets_are_judged_per_mode() {
        let good = entries(&[
            outcome(Mode::Kernel, "memcg", &[1, 2, 3]),
            outcome(Mode::Periodic, "periodic", &[100, 9999]),
            outcome(Mode::Psi, "psi", &[1500, 2000]),
        ]);
        let verdicts = verdicts(&good);
        assert_eq!(verdicts.len(), 3);
        assert!(verdicts.iter().all(|v| v.contains(": met")), "{verdicts:?}");
        assert!(warnings(&good).is_empty());

        let bad = entries(&[
            outcome(Mode::Kernel, "periodic", &[1, 2, 3]),
            outcome(Mode::Psi, "psi", &[1500, 4000]),
        ]);
        let verdicts = super::verdicts(&bad);
        assert!(
            verdicts[0].contains(
                "0 of 3 evictions decided by memcg/memcg_level/memcg_poll/oom/reclaim/psi"
            ),
            "the sources are told: {verdicts:?}"
        );
        assert!(verdicts[1].contains("missed"), "too slow: {verdicts:?}");
    }

    #[test]
    fn failures_and_the_bystander_are_warned_about() {
        let mut o = outcome(Mode::Kernel, "memcg", &[1]);
        o.runs.push(judge(2, Duration::ZERO, "hog", 1, None, &[]));
        o.bystander_evictions = 1;
        o.bystander_phase = "Failed (Evicted)".into();
        let e = entries(&[o]);
        let warnings = warnings(&e);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("run 2: the working set never crossed"));
        assert!(verdicts(&e)[0].contains("missed"));
    }
}
