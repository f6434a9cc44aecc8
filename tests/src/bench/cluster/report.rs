//! The cluster benchmark's results: a Markdown table (for people and the README), the JSON the
//! issue asks for (an array of `{"pleg", "measure", "p50_ms", "p99_ms", "max_ms", "n"}`, and
//! `{"pleg", "measure", "value"}` for the idle request rate), the verdicts on the targets, and an
//! SVG plot of the latency CDFs.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Result;
use serde::{Serialize, Serializer};

use super::Outcome;
use crate::bench::{
    machine::Machine,
    plot::{self, Axes, Curve},
    stats::LatencyMs,
};

/// The kernel-event PLEG's kill → API terminated p99 must be at most this ...
pub const TARGET_KILL_P99_MS: f64 = 20.0;
/// ... and at least this many times below the relist PLEG's p50.
pub const TARGET_KILL_RATIO: f64 = 25.0;
/// A batch of [`TARGET_BATCH`] pods: create → Running on the API server, p99 at most this.
pub const TARGET_BATCH_P99_MS: f64 = 1500.0;
pub const TARGET_BATCH: usize = 10;

pub const KILL_MEASURE: &str = "kill_to_api_terminated";
pub const IDLE_MEASURE: &str = "idle_api_requests_per_pod_minute";

/// `create_to_api_running_<size>`.
pub fn create_measure(size: usize) -> String {
    format!("create_to_api_running_{size}")
}

/// One line of the JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Entry {
    Latency {
        pleg: String,
        measure: String,
        p50_ms: f64,
        p99_ms: f64,
        max_ms: f64,
        n: u64,
    },
    Value {
        pleg: String,
        measure: String,
        value: f64,
    },
}

/// The entries, and what the table says above them; the JSON is the entries alone.
#[derive(Clone, Debug)]
pub struct Report {
    pub entries: Vec<Entry>,
    pub machine_line: String,
    /// (PLEG, kills missed, starts missed).
    pub missed: Vec<(String, usize, usize)>,
    /// (PLEG, the idle requests a minute by request).
    pub idle_by_request: Vec<(String, BTreeMap<String, f64>)>,
}

impl Serialize for Report {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(serializer)
    }
}

fn latency(pleg: &str, measure: String, sorted_ns: &[u64]) -> Entry {
    let l = LatencyMs::of(sorted_ns);
    Entry::Latency {
        pleg: pleg.to_owned(),
        measure,
        p50_ms: l.p50,
        p99_ms: l.p99,
        max_ms: l.max,
        n: l.n,
    }
}

impl Report {
    pub fn new(outcomes: &[Outcome], machine: &Machine, date: &str) -> Report {
        let mut entries = Vec::new();
        for o in outcomes {
            entries.push(latency(&o.pleg, KILL_MEASURE.to_owned(), &o.kill_ns));
            for (size, sorted) in &o.create_ns {
                entries.push(latency(&o.pleg, create_measure(*size), sorted));
            }
            entries.push(Entry::Value {
                pleg: o.pleg.clone(),
                measure: IDLE_MEASURE.to_owned(),
                value: o.idle_per_pod_minute(),
            });
        }
        Report {
            entries,
            machine_line: machine.line(date),
            missed: outcomes
                .iter()
                .map(|o| (o.pleg.clone(), o.missed_kills, o.missed_starts))
                .collect(),
            idle_by_request: outcomes
                .iter()
                .map(|o| {
                    let per_minute = |n: u64| {
                        if o.idle_seconds > 0.0 {
                            n as f64 * 60.0 / o.idle_seconds
                        } else {
                            0.0
                        }
                    };
                    let by = o
                        .idle_by_request
                        .iter()
                        .map(|(kind, n)| (kind.clone(), per_minute(*n)))
                        .collect();
                    (o.pleg.clone(), by)
                })
                .collect(),
        }
    }

    fn latency_of(&self, pleg: &str, measure: &str) -> Option<(f64, f64, u64)> {
        self.entries.iter().find_map(|e| match e {
            Entry::Latency {
                pleg: p,
                measure: m,
                p50_ms,
                p99_ms,
                n,
                ..
            } if p == pleg && m == measure => Some((*p50_ms, *p99_ms, *n)),
            _ => None,
        })
    }

    /// The machine line and one row per PLEG and measure.
    pub fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.machine_line);
        out.push_str(
            "| PLEG | measure | n | p50 ms | p99 ms | max ms |\n|---|---|--:|--:|--:|--:|\n",
        );
        let mut idle = String::new();
        for e in &self.entries {
            // Writing to a String cannot fail.
            match e {
                Entry::Latency {
                    pleg,
                    measure,
                    p50_ms,
                    p99_ms,
                    max_ms,
                    n,
                } => {
                    let _ = writeln!(
                        out,
                        "| {pleg} | {measure} | {n} | {} | {} | {} |",
                        cell(*p50_ms),
                        cell(*p99_ms),
                        cell(*max_ms)
                    );
                }
                Entry::Value { pleg, value, .. } => {
                    let _ = writeln!(idle, "| {pleg} | {value:.2} |");
                }
            }
        }
        let _ = write!(
            out,
            "\n| PLEG | idle API requests per pod-minute ({} pods) |\n|---|--:|\n{idle}",
            super::KILL_PODS
        );
        for (pleg, by) in &self.idle_by_request {
            let kinds: Vec<String> = by.iter().map(|(k, n)| format!("`{k}` {n:.1}")).collect();
            let _ = writeln!(
                out,
                "\n--pleg {pleg}, idle requests a minute: {}",
                kinds.join(", ")
            );
        }
        out
    }

    /// One sentence per target: met or missed, with the numbers.
    pub fn verdicts(&self) -> Vec<String> {
        let met = |ok: bool| if ok { "met" } else { "missed" };
        let missed_kills = |pleg: &str| {
            self.missed
                .iter()
                .find(|(p, ..)| p == pleg)
                .map_or(0, |(_, kills, _)| *kills)
        };
        let mut out = Vec::new();
        match (
            self.latency_of("ebpf", KILL_MEASURE),
            self.latency_of("relist", KILL_MEASURE),
        ) {
            (Some((_, e99, n)), Some((r50, ..))) => {
                let complete = n > 0 && missed_kills("ebpf") == 0;
                out.push(format!(
                    "Target: kernel-event PLEG kill → terminated status on the API server p99 ≤ \
                     {TARGET_KILL_P99_MS} ms: {} (p99 {e99:.2} ms over {n} kills, {} missed).",
                    met(complete && e99 <= TARGET_KILL_P99_MS),
                    missed_kills("ebpf")
                ));
                let ratio = if e99 > 0.0 { r50 / e99 } else { f64::INFINITY };
                out.push(format!(
                    "Target: its p99 at least {TARGET_KILL_RATIO:.0}× below the relist PLEG's \
                     p50: {} (relist p50 {r50:.0} ms / kernel-event p99 {e99:.2} ms = \
                     {ratio:.0}×).",
                    met(complete && ratio >= TARGET_KILL_RATIO)
                ));
            }
            _ => out.push("Kill targets: both PLEGs must run to be compared; one did not.".into()),
        }
        let batch = create_measure(TARGET_BATCH);
        for pleg in super::PLEGS {
            if let Some((_, p99, n)) = self.latency_of(pleg, &batch) {
                out.push(format!(
                    "Target: --pleg {pleg}, a batch of {TARGET_BATCH} created → Running on the \
                     API server p99 ≤ {:.1} s: {} (p99 {:.0} ms over {n} pods).",
                    TARGET_BATCH_P99_MS / 1000.0,
                    met(n > 0 && p99 <= TARGET_BATCH_P99_MS),
                    p99
                ));
            }
        }
        out
    }

    /// Kills whose status never reached the API server, pods that never ran.
    pub fn warnings(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (pleg, kills, starts) in &self.missed {
            if *kills > 0 {
                found.push(format!(
                    "--pleg {pleg}: {kills} kills never showed as terminated on the API server"
                ));
            }
            if *starts > 0 {
                found.push(format!(
                    "--pleg {pleg}: {starts} created pods were never Running on the API server"
                ));
            }
        }
        found
    }
}

/// Sub-10 ms latencies keep two decimals, longer ones none.
fn cell(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.0}")
    }
}

/// Writes the latency CDF of every PLEG and measure as an SVG to `path`.
pub fn plot(path: &Path, title: &str, outcomes: &[Outcome]) -> Result<()> {
    let mut names = Vec::new();
    let mut samples: Vec<&[u64]> = Vec::new();
    for o in outcomes {
        names.push(format!("--pleg {}: kill → API terminated", o.pleg));
        samples.push(&o.kill_ns);
        for (size, sorted) in &o.create_ns {
            names.push(format!(
                "--pleg {}: batch of {size} created → API Running",
                o.pleg
            ));
            samples.push(sorted);
        }
    }
    let curves: Vec<Curve<'_>> = names
        .iter()
        .zip(samples)
        .map(|(name, sorted_ns)| Curve { name, sorted_ns })
        .collect();
    let axes = Axes {
        ns_per_unit: 1e6,
        x_desc: "latency as the API server's watchers see it (ms, log scale)",
        y_desc: "fraction of samples",
    };
    plot::latency_cdf(path, title, &axes, &curves)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            kernel_release: "6.8.0".into(),
            cpus: 2,
            cpu_model: "test".into(),
        }
    }

    fn outcome(pleg: &str, kill_ms: &[u64], batch_ms: &[u64]) -> Outcome {
        let ns = |ms: &[u64]| ms.iter().map(|m| m * 1_000_000).collect::<Vec<_>>();
        Outcome {
            pleg: pleg.into(),
            kill_ns: ns(kill_ms),
            missed_kills: 0,
            create_ns: BTreeMap::from([(10, ns(batch_ms)), (30, ns(batch_ms))]),
            missed_starts: 0,
            idle_requests: 120,
            idle_seconds: 60.0,
            idle_by_request: BTreeMap::from([("PUT /lease".to_owned(), 120)]),
        }
    }

    #[test]
    fn the_json_is_the_array_the_issue_names() {
        let report = Report::new(
            &[
                outcome("relist", &[400, 600], &[900]),
                outcome("ebpf", &[3, 5], &[800]),
            ],
            &machine(),
            "2026-11-26T00:00:00Z",
        );
        let json = serde_json::to_value(&report).expect("json");
        let entries = json.as_array().expect("an array");
        assert_eq!(entries.len(), 8, "{json}");
        assert_eq!(
            entries[0],
            serde_json::json!({"pleg": "relist", "measure": "kill_to_api_terminated",
                "p50_ms": 400.0, "p99_ms": 600.0, "max_ms": 600.0, "n": 2})
        );
        assert_eq!(entries[1]["measure"], "create_to_api_running_10");
        assert_eq!(entries[2]["measure"], "create_to_api_running_30");
        // 120 requests over a minute, over ten pods: 12 each.
        assert_eq!(
            entries[3],
            serde_json::json!({"pleg": "relist", "measure": "idle_api_requests_per_pod_minute",
                "value": 12.0})
        );
        assert_eq!(entries[4]["pleg"], "ebpf");
    }

    #[test]
    fn the_targets_are_judged_with_their_numbers() {
        let met = Report::new(
            &[
                outcome("relist", &[400, 600], &[900]),
                outcome("ebpf", &[3, 5], &[800]),
            ],
            &machine(),
            "d",
        );
        let verdicts = met.verdicts();
        assert_eq!(verdicts.len(), 4, "{verdicts:?}");
        assert!(verdicts.iter().all(|v| v.contains(": met")), "{verdicts:?}");

        // p99 25 ms: over 20 ms, and 400/25 = 16× only.
        let mut slow = outcome("ebpf", &[3, 25], &[2000]);
        slow.missed_kills = 1;
        let missed = Report::new(
            &[outcome("relist", &[400, 600], &[900]), slow],
            &machine(),
            "d",
        );
        let verdicts = missed.verdicts();
        assert!(verdicts[0].contains("missed") && verdicts[0].contains("1 missed"));
        assert!(verdicts[1].contains("missed") && verdicts[1].contains("16×"));
        assert!(verdicts[3].contains("--pleg ebpf") && verdicts[3].contains("missed"));
        assert_eq!(missed.warnings().len(), 1, "{:?}", missed.warnings());
    }

    #[test]
    fn the_table_has_a_row_per_pleg_and_measure() {
        let report = Report::new(&[outcome("ebpf", &[3, 5], &[800])], &machine(), "d");
        let table = report.markdown();
        assert!(table.starts_with("Machine: Linux 6.8.0, 2 CPUs"), "{table}");
        assert!(
            table.contains("| ebpf | kill_to_api_terminated | 2 | 3.00 | 5.00 | 5.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| ebpf | create_to_api_running_10 | 1 | 800 | 800 | 800 |"),
            "{table}"
        );
        assert!(table.contains("| ebpf | 12.00 |"), "{table}");
        assert!(table.contains("`PUT /lease` 120.0"), "{table}");
    }
}
