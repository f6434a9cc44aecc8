//! The results: a Markdown table for people (and the README), JSON for tools and comparisons.

use std::{fmt::Write as _, time::SystemTime};

use serde::Serialize;

use super::{events::Outcome, machine::Machine, stats::Latency};

/// Everything one `swiftlet-bench events` run found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    /// UTC, RFC 3339.
    pub date: String,
    pub epoch_secs: u64,
    pub machine: Machine,
    pub scenarios: Vec<ScenarioReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    /// `swiftlet-testproc`'s arguments.
    pub command: Vec<String>,
    /// Processes that exited (every one should make one exit event).
    pub exits: u64,
    /// Exit events the stream delivered.
    pub delivered: u64,
    /// Exit events the kernel put into the ring buffer.
    pub submitted: u64,
    /// Exit events that did not fit into the ring buffer.
    pub lost: u64,
    /// Losses the stream reported (`StreamItem::Lost`, every kind).
    pub lost_reported: u64,
    pub kernel_errors: u64,
    pub foreign_events: u64,
    pub timed_out: bool,
    pub wall_ns: u64,
    pub rate_per_s: f64,
    pub latency_ns: Latency,
    pub ring_bytes: u32,
    /// What did not add up (empty when all is well).
    pub inconsistencies: Vec<String>,
}

impl ScenarioReport {
    pub fn new(outcome: &Outcome, ring_bytes: u32) -> ScenarioReport {
        ScenarioReport {
            name: outcome.scenario.name.clone(),
            command: outcome.scenario.args.clone(),
            exits: outcome.produced,
            delivered: outcome.delivered,
            submitted: outcome.kernel.submitted,
            lost: outcome.kernel.lost,
            lost_reported: outcome.lost_reported,
            kernel_errors: outcome.kernel.errors,
            foreign_events: outcome.foreign,
            timed_out: outcome.timed_out,
            wall_ns: outcome.wall_ns,
            rate_per_s: outcome.rate_per_s(),
            latency_ns: Latency::of(&outcome.latencies_ns),
            ring_bytes,
            inconsistencies: outcome.inconsistencies(),
        }
    }
}

impl Report {
    pub fn new(machine: Machine, scenarios: Vec<ScenarioReport>, now: SystemTime) -> Report {
        let epoch_secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Report {
            benchmark: "events",
            date: utc_rfc3339(epoch_secs),
            epoch_secs,
            machine,
            scenarios,
        }
    }

    /// The machine line and one table row per scenario.
    pub fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.machine.line(&self.date));
        out.push_str(
            "| scenario | exits | rate/s | p50 µs | p99 µs | p99.9 µs | max µs | mean µs | lost | \
             ring bytes |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for s in &self.scenarios {
            let l = &s.latency_ns;
            let us = |ns: u64| ns as f64 / 1000.0;
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
                s.name,
                s.exits,
                s.rate_per_s,
                us(l.p50_ns),
                us(l.p99_ns),
                us(l.p999_ns),
                us(l.max_ns),
                l.mean_ns / 1000.0,
                s.lost,
                s.ring_bytes
            );
        }
        out
    }
}

/// A table cell of milliseconds from `n` samples: two decimals below 10 ms, none above; a dash
/// without samples.
pub fn ms_cell(ms: f64, n: u64) -> String {
    if n == 0 {
        "—".to_owned()
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.0}")
    }
}

/// The current time as [`utc_rfc3339`] prints it: a report's date.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// `at` as [`utc_rfc3339`] prints it.
pub fn rfc3339(at: SystemTime) -> String {
    let epoch_secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_rfc3339(epoch_secs)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (what `date -u +%FT%TZ` prints), without a
/// date library or a child process.
pub fn utc_rfc3339(epoch_secs: u64) -> String {
    let (days, secs) = (epoch_secs / 86_400, epoch_secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`,
/// for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(utc_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn markdown_has_a_row_per_scenario() {
        let machine = Machine {
            kernel_release: "6.1.0".into(),
            cpus: 4,
            cpu_model: "Test CPU".into(),
        };
        let row = |name: &str| ScenarioReport {
            name: name.into(),
            command: vec![],
            exits: 10_001,
            delivered: 10_001,
            submitted: 10_001,
            lost: 0,
            lost_reported: 0,
            kernel_errors: 0,
            foreign_events: 0,
            timed_out: false,
            wall_ns: 1_000_000_000,
            rate_per_s: 10_001.0,
            latency_ns: Latency::of(&[1_500, 2_500, 40_000]),
            ring_bytes: 1 << 20,
            inconsistencies: vec![],
        };
        let report = Report::new(
            machine,
            vec![row("paced"), row("storm")],
            SystemTime::UNIX_EPOCH,
        );
        let table = report.markdown();
        assert!(table.starts_with("Machine: Linux 6.1.0, 4 CPUs, Test CPU; 1970-01-01T00:00:00Z"));
        assert!(table.contains("| paced | 10001 | 10001 | 2.5 | 40.0 | 40.0 | 40.0 | 14.7 | 0 |"));
        assert_eq!(
            table.lines().filter(|l| l.starts_with("| storm")).count(),
            1
        );
    }
}
