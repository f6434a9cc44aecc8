//! The startup benchmark's results: a Markdown table (for people and the README), JSON in the
//! style of `events.json` (for tools and comparisons, with every round's raw latencies), and an
//! SVG plot of the latency CDF per batch size.

use std::{fmt::Write as _, path::Path, time::SystemTime};

use anyhow::{Result, bail};
use plotters::prelude::*;
use serde::Serialize;

use super::{BatchOutcome, RoundOutcome, Settings};
use crate::bench::{
    machine::Machine,
    report::utc_rfc3339,
    stats::{Latency, cdf_points, nearest_rank},
};

/// The target: p99 of the batch of [`TARGET_BATCH`] under this (the Kubernetes SLO is
/// 5 s).
pub const TARGET_P99_MS: u64 = 1000;
pub const TARGET_BATCH: usize = 10;

/// Everything one `swiftlet-bench startup` run found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    /// UTC, RFC 3339.
    pub date: String,
    pub epoch_secs: u64,
    pub machine: Machine,
    /// `/proc/loadavg` when the run began: other work on a 2-CPU machine shows in the numbers.
    pub load_average: String,
    pub settings: SettingsReport,
    pub batches: Vec<BatchReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SettingsReport {
    pub rounds: usize,
    /// The `/pods` poll interval: the measurement's resolution.
    pub poll_interval_ms: f64,
    pub timeout_s: u64,
    pub pleg: &'static str,
    pub target_p99_ms: u64,
    pub target_batch: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct BatchReport {
    pub pods_per_batch: usize,
    pub rounds: usize,
    /// Pods seen running (every round pooled): what the percentiles are over.
    pub pods_measured: u64,
    /// Pods that did not run within the timeout.
    pub not_running: usize,
    /// Manifest written → seen running through `/pods`.
    pub latency_ns: Latency,
    /// Per round: first manifest written → last pod seen running (`null`: one never ran).
    pub batch_ns: Vec<Option<u64>>,
    /// Median and max of `batch_ns`; `null` when a round never completed.
    pub batch_median_ns: Option<u64>,
    pub batch_max_ns: Option<u64>,
    pub round_details: Vec<RoundOutcome>,
}

impl BatchReport {
    pub fn new(batch: &BatchOutcome) -> BatchReport {
        let latencies = batch.sorted_latencies_ns();
        let batch_ns: Vec<Option<u64>> = batch.rounds.iter().map(|r| r.batch_ns).collect();
        let complete: Option<Vec<u64>> = batch_ns.iter().copied().collect();
        let complete = complete.filter(|c| !c.is_empty()).map(|mut c| {
            c.sort_unstable();
            c
        });
        BatchReport {
            pods_per_batch: batch.size,
            rounds: batch.rounds.len(),
            pods_measured: latencies.len() as u64,
            not_running: batch.not_running(),
            latency_ns: Latency::of(&latencies),
            batch_ns,
            batch_median_ns: complete.as_deref().map(|c| nearest_rank(c, 1, 2)),
            batch_max_ns: complete.as_deref().and_then(|c| c.last().copied()),
            round_details: batch.rounds.clone(),
        }
    }
}

impl Report {
    pub fn new(
        machine: Machine,
        load_average: String,
        settings: &Settings,
        batches: &[BatchOutcome],
        now: SystemTime,
    ) -> Report {
        let epoch_secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Report {
            benchmark: "startup",
            date: utc_rfc3339(epoch_secs),
            epoch_secs,
            machine,
            load_average,
            settings: SettingsReport {
                rounds: settings.rounds,
                poll_interval_ms: settings.poll.as_secs_f64() * 1e3,
                timeout_s: settings.timeout.as_secs(),
                pleg: "relist",
                target_p99_ms: TARGET_P99_MS,
                target_batch: TARGET_BATCH,
            },
            batches: batches.iter().map(BatchReport::new).collect(),
        }
    }

    /// The machine line, one table row per batch size, and the verdict on the target.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "{} (load average {})\n\n",
            self.machine.line(&self.date),
            self.load_average
        );
        out.push_str(
            "| pods per batch | rounds | pods measured | p50 ms | p99 ms | max ms | batch ms \
             (median) | batch ms (max) | not running |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        let ms = |ns: u64| ns as f64 / 1e6;
        let batch_ms =
            |ns: Option<u64>| ns.map_or_else(|| "incomplete".into(), |ns| format!("{:.0}", ms(ns)));
        for b in &self.batches {
            let l = &b.latency_ns;
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
                b.pods_per_batch,
                b.rounds,
                b.pods_measured,
                ms(l.p50_ns),
                ms(l.p99_ns),
                ms(l.max_ns),
                batch_ms(b.batch_median_ns),
                batch_ms(b.batch_max_ns),
                b.not_running
            );
        }
        if let Some(verdict) = self.verdict() {
            let _ = write!(out, "\n{verdict}\n");
        }
        out
    }

    /// What did not go as it should besides the latencies: a teardown that took too long, pods
    /// the CRI clean-up had to remove, pod cgroups left behind. One sentence per batch size and
    /// kind.
    pub fn warnings(&self) -> Vec<String> {
        let mut found = Vec::new();
        for b in &self.batches {
            let rounds = &b.round_details;
            let size = b.pods_per_batch;
            let slow = rounds.iter().filter(|r| !r.removed_cleanly).count();
            if slow > 0 {
                found.push(format!(
                    "batch of {size}: in {slow} of {} rounds swiftlet did not remove the deleted \
                     pods (from /pods and the runtime) in time",
                    rounds.len()
                ));
            }
            let leftovers: usize = rounds.iter().map(|r| r.leftovers).sum();
            if leftovers > 0 {
                found.push(format!(
                    "batch of {size}: the CRI clean-up removed {leftovers} sandboxes and \
                     containers swiftlet left"
                ));
            }
            let cgroups: usize = rounds.iter().map(|r| r.pod_cgroups_left).sum();
            if cgroups > 0 {
                found.push(format!(
                    "batch of {size}: {cgroups} pod cgroup folders stayed after the pods were gone \
                     ({} pods; removed by the benchmark)",
                    b.pods_measured + b.not_running as u64
                ));
            }
        }
        found
    }

    /// Whether the batch of [`TARGET_BATCH`] met the target, in a sentence; `None` if that batch
    /// size was not run.
    pub fn verdict(&self) -> Option<String> {
        let b = self
            .batches
            .iter()
            .find(|b| b.pods_per_batch == TARGET_BATCH)?;
        let p99_ms = b.latency_ns.p99_ns as f64 / 1e6;
        let met = b.not_running == 0 && b.latency_ns.p99_ns < TARGET_P99_MS * 1_000_000;
        Some(format!(
            "Target: p99 under {TARGET_P99_MS} ms for the batch of {TARGET_BATCH}: {} (p99 {p99_ms:.0} \
             ms over {} pods{}).",
            if met { "met" } else { "missed" },
            b.pods_measured,
            if b.not_running > 0 {
                format!(", {} never running", b.not_running)
            } else {
                String::new()
            }
        ))
    }
}

/// Points per curve (a batch has at most a few hundred samples: all of them).
const POINTS: usize = 2000;

/// Writes the latency CDF of each batch size as an SVG to `path`, with the target marked.
pub fn plot(path: &Path, title: &str, batches: &[BatchOutcome]) -> Result<()> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = batches
        .iter()
        .map(|b| {
            let points = cdf_points(&b.sorted_latencies_ns(), POINTS)
                .into_iter()
                .map(|(us, fraction)| (us / 1e3, fraction))
                .collect();
            (format!("{} pods per batch", b.size), points)
        })
        .filter(|(_, points): &(String, Vec<(f64, f64)>)| !points.is_empty())
        .collect();
    let Some(slowest) = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.0))
        .reduce(f64::max)
    else {
        bail!("no latencies to plot");
    };
    let target = TARGET_P99_MS as f64;
    let hi = slowest.max(target) * 1.1;

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..hi, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("manifest written → pod Running in /pods (ms)")
        .x_label_formatter(&|ms| format!("{ms:.0}"))
        .y_desc("fraction of pods")
        .draw()?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        let style = Palette99::pick(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    let target_style = RED.mix(0.6).stroke_width(1);
    chart
        .draw_series(LineSeries::new(
            [(target, 0.0), (target, 1.0)],
            target_style,
        ))?
        .label(format!(
            "target: p99 < {TARGET_P99_MS} ms (batch of {TARGET_BATCH})"
        ))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], target_style));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings() -> Settings {
        Settings {
            swiftlet: "swiftlet".into(),
            runtime_endpoint: "unix:///x".into(),
            batches: vec![10, 30],
            rounds: 2,
            poll: Duration::from_millis(5),
            timeout: Duration::from_secs(60),
            log_dir: "logs".into(),
        }
    }

    fn round(number: usize, latencies_ms: &[u64], batch_ms: Option<u64>) -> RoundOutcome {
        RoundOutcome {
            round: number,
            latencies_ns: latencies_ms.iter().map(|ms| Some(ms * 1_000_000)).collect(),
            write_spread_ns: 10_000,
            batch_ns: batch_ms.map(|ms| ms * 1_000_000),
            polls: 100,
            removed_cleanly: true,
            leftovers: 0,
            pod_cgroups_left: 0,
            pod_uids: Vec::new(),
        }
    }

    fn machine() -> Machine {
        Machine {
            kernel_release: "6.1.0".into(),
            cpus: 2,
            cpu_model: "Test CPU".into(),
        }
    }

    #[test]
    fn table_and_verdict() {
        let batches = vec![
            BatchOutcome {
                size: 10,
                rounds: vec![
                    round(1, &[400, 500, 600], Some(610)),
                    round(2, &[450, 550, 900], Some(905)),
                ],
            },
            BatchOutcome {
                size: 30,
                rounds: vec![round(1, &[700, 1500], Some(1510))],
            },
        ];
        let report = Report::new(
            machine(),
            "0.10 0.20 0.30 1/100 42".into(),
            &settings(),
            &batches,
            SystemTime::UNIX_EPOCH,
        );
        let table = report.markdown();
        assert!(
            table.starts_with("Machine: Linux 6.1.0, 2 CPUs, Test CPU; 1970-01-01T00:00:00Z"),
            "{table}"
        );
        assert!(
            table.contains("| 10 | 2 | 6 | 500 | 900 | 900 | 610 | 905 | 0 |"),
            "{table}"
        );
        assert!(
            table.contains("| 30 | 1 | 2 | 700 | 1500 | 1500 | 1510 | 1510 | 0 |"),
            "{table}"
        );
        assert!(
            table.contains("Target: p99 under 1000 ms for the batch of 10: met (p99 900 ms"),
            "{table}"
        );
        assert!(report.warnings().is_empty());
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["benchmark"], "startup");
        assert_eq!(json["batches"][0]["latency_ns"]["p99_ns"], 900_000_000);
        assert_eq!(
            json["batches"][0]["round_details"][1]["latencies_ns"][2],
            900_000_000
        );
    }

    #[test]
    fn a_pod_that_never_ran_misses_the_target() {
        let mut slow = round(1, &[100, 200], Some(200));
        slow.latencies_ns.push(None);
        slow.batch_ns = None;
        let batches = vec![BatchOutcome {
            size: 10,
            rounds: vec![slow],
        }];
        let report = Report::new(
            machine(),
            String::new(),
            &settings(),
            &batches,
            SystemTime::UNIX_EPOCH,
        );
        let verdict = report.verdict().unwrap();
        assert!(
            verdict.contains(": missed (p99 200 ms over 2 pods, 1 never running)"),
            "{verdict}"
        );
        assert!(report.warnings().is_empty(), "{:?}", report.warnings());
        assert_eq!(report.batches[0].batch_max_ns, None);
        assert!(
            report
                .markdown()
                .contains("| incomplete | incomplete | 1 |")
        );
        assert_eq!(report.batches[0].batch_ns, vec![None]);
    }

    #[test]
    fn warnings_name_what_was_left() {
        let mut untidy = round(1, &[100, 200], Some(200));
        untidy.removed_cleanly = false;
        untidy.leftovers = 3;
        untidy.pod_cgroups_left = 12;
        let batches = vec![BatchOutcome {
            size: 2,
            rounds: vec![untidy, round(2, &[100, 150], Some(150))],
        }];
        let report = Report::new(
            machine(),
            String::new(),
            &settings(),
            &batches,
            SystemTime::UNIX_EPOCH,
        );
        let warnings = report.warnings();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("in 1 of 2 rounds"), "{warnings:?}");
        assert!(warnings[1].contains("removed 3 sandboxes"), "{warnings:?}");
        assert!(
            warnings[2].contains("12 pod cgroup folders stayed"),
            "{warnings:?}"
        );
        assert!(warnings[2].contains("(4 pods;"), "{warnings:?}");
        assert_eq!(report.verdict(), None, "no batch of 10");
    }
}
