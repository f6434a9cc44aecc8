//! The PLEG benchmark's results: a Markdown table (for people and the README), JSON (an array with
//! one object per PLEG and number of containers, raw latencies included), the verdict on the
//! issue's targets, and an SVG plot of the latency CDFs.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Result;
use serde::Serialize;

use super::ConfigOutcome;
use crate::bench::{
    machine::Machine,
    plot::{self, Axes, Curve},
    stats::{LatencyMs, ms},
};

/// The targets: the kernel-event PLEG's p99 at [`TARGET_CONTAINERS`] under this,
pub const TARGET_P99_MS: f64 = 5.0;
pub const TARGET_CONTAINERS: usize = 100;
/// ... at least this many times below the relist PLEG's p50 ...
pub const TARGET_LATENCY_RATIO: f64 = 100.0;
/// ... and its idle CPU at most this fraction (1/20) of the relist PLEG's.
pub const TARGET_CPU_RATIO: f64 = 20.0;
/// ... and its p99 at least this many times below the Evented PLEG's p50, when that ran.
pub const TARGET_EVENTED_RATIO: f64 = 10.0;

/// One PLEG with one number of containers, as the JSON carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub pleg: String,
    /// The container runtime, as CRI `Version` names it.
    pub runtime: String,
    pub containers: usize,
    /// `kill(2)` of a container's init → its `ContainerDied` on the gRPC stream.
    pub exit_latency_ms: LatencyMs,
    /// Kills whose event never came.
    pub missed: usize,
    /// Events whose status was not "exited, code 137".
    pub wrong_status: usize,
    /// Events that a kernel event caused (the rest came from a relist).
    pub kernel_caused: usize,
    /// Generations of pods it took to measure the exits.
    pub generations: usize,
    /// Idle: swiftlet's CPU time (the whole agent, not the PLEG alone).
    pub cpu_seconds_per_minute: f64,
    /// Idle: containerd's CPU time, the other half of what polling costs.
    pub runtime_cpu_seconds_per_minute: Option<f64>,
    /// Idle: CRI calls swiftlet made.
    pub cri_calls_per_minute: f64,
    pub cri_calls_per_minute_by_operation: BTreeMap<String, f64>,
    pub relists_per_minute: f64,
    /// swiftlet's resident set after the idle window.
    pub rss_bytes: u64,
    pub idle_seconds: f64,
    /// Where the exit latency comes from: kill → the kernel saw the exit, → the runtime reaped
    /// it (`finished_at`), → the status the event carries was observed (see the module doc of
    /// `pleg`); each over the exits whose event carried that instant.
    pub kernel_saw_ms: LatencyMs,
    pub runtime_reaped_ms: LatencyMs,
    pub status_observed_ms: LatencyMs,
    /// The runtime's container events streamed to the Evented PLEG, per minute, over the whole
    /// configuration (pods started, killed, removed) and over the idle window.
    pub stream_events_per_minute: f64,
    pub idle_stream_events_per_minute: f64,
    pub date: String,
    pub machine: Machine,
    /// Every sample, ascending.
    pub latencies_ms: Vec<f64>,
}

impl Entry {
    pub fn new(outcome: &ConfigOutcome, machine: &Machine, date: &str) -> Entry {
        let idle = &outcome.idle;
        Entry {
            pleg: outcome.pleg.clone(),
            runtime: outcome.runtime.clone(),
            containers: outcome.containers,
            exit_latency_ms: LatencyMs::of(&outcome.latencies_ns),
            missed: outcome.missed,
            wrong_status: outcome.wrong_status,
            kernel_caused: outcome.kernel_caused,
            generations: outcome.generations,
            cpu_seconds_per_minute: idle.agent_cpu_per_minute(),
            runtime_cpu_seconds_per_minute: idle.runtime_cpu_per_minute(),
            cri_calls_per_minute: idle.cri_calls_per_minute(),
            cri_calls_per_minute_by_operation: idle
                .cri_calls
                .iter()
                .map(|(op, calls)| (op.clone(), idle.per_minute(*calls)))
                .collect(),
            relists_per_minute: idle.per_minute(idle.relists),
            rss_bytes: idle.rss_bytes,
            idle_seconds: idle.seconds,
            kernel_saw_ms: LatencyMs::of(&outcome.phases.kernel_ns),
            runtime_reaped_ms: LatencyMs::of(&outcome.phases.reaped_ns),
            status_observed_ms: LatencyMs::of(&outcome.phases.observed_ns),
            stream_events_per_minute: if outcome.run_seconds > 0.0 {
                outcome.stream_events * 60.0 / outcome.run_seconds
            } else {
                0.0
            },
            idle_stream_events_per_minute: idle.per_minute(idle.stream_events),
            date: date.to_owned(),
            machine: machine.clone(),
            latencies_ms: outcome.latencies_ns.iter().map(|&ns| ms(ns)).collect(),
        }
    }
}

/// The machine line, one table row per PLEG and number of containers, and a second table of
/// where the latencies come from.
pub fn markdown(entries: &[Entry]) -> String {
    let mut out = String::new();
    if let Some(first) = entries.first() {
        let _ = writeln!(
            out,
            "{}; runtime {}\n",
            first.machine.line(&first.date),
            first.runtime
        );
    }
    out.push_str(
        "| PLEG | containers | exits | p50 ms | p99 ms | max ms | missed | agent CPU s/min | \
         containerd CPU s/min | CRI calls/min | RSS MiB |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for e in entries {
        let l = &e.exit_latency_ms;
        let runtime = e
            .runtime_cpu_seconds_per_minute
            .map_or_else(|| "n/a".to_owned(), |s| format!("{s:.3}"));
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {:.0} | {:.1} |",
            e.pleg,
            e.containers,
            l.n,
            latency_cell(l.p50),
            latency_cell(l.p99),
            latency_cell(l.max),
            e.missed,
            e.cpu_seconds_per_minute,
            runtime,
            e.cri_calls_per_minute,
            e.rss_bytes as f64 / (1024.0 * 1024.0),
        );
    }
    out.push_str(
        "\nWhere the latency comes from (p50 from the kill, ms; n/a: no event carried it):\n\n\
         | PLEG | containers | kernel saw the exit | status's `finished_at` | status observed | \
         event received | runtime events/min (run) | runtime events/min (idle) |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for e in entries {
        let p50 = |l: &LatencyMs| {
            if l.n == 0 {
                "n/a".to_owned()
            } else {
                latency_cell(l.p50)
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
            e.pleg,
            e.containers,
            p50(&e.kernel_saw_ms),
            p50(&e.runtime_reaped_ms),
            p50(&e.status_observed_ms),
            p50(&e.exit_latency_ms),
            e.stream_events_per_minute,
            e.idle_stream_events_per_minute,
        );
    }
    out
}

/// Sub-millisecond latencies keep three decimals, the relist's hundreds of ms none.
fn latency_cell(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.0}")
    }
}

/// One sentence per target: met or missed, with the numbers; a target whose configurations were
/// not run says so.
pub fn verdicts(entries: &[Entry]) -> Vec<String> {
    let find = |pleg: &str, n: usize| entries.iter().find(|e| e.pleg == pleg && e.containers == n);
    // The targets are stated at N = 100; a quick run judges its largest N instead, and says so.
    let n = if entries.iter().any(|e| e.containers == TARGET_CONTAINERS) {
        TARGET_CONTAINERS
    } else {
        match entries.iter().map(|e| e.containers).max() {
            Some(n) => n,
            None => return vec!["No configuration ran: no target judged.".into()],
        }
    };
    let at = if n == TARGET_CONTAINERS {
        format!("at N = {n}")
    } else {
        format!("at N = {n} (the targets are stated at N = {TARGET_CONTAINERS}, which did not run)")
    };
    let met = |ok: bool| if ok { "met" } else { "missed" };
    let (Some(ebpf), Some(relist)) = (find("ebpf", n), find("relist", n)) else {
        return vec![format!(
            "Targets {at}: both PLEGs must run to be compared; one did not."
        )];
    };
    let (e, r) = (&ebpf.exit_latency_ms, &relist.exit_latency_ms);
    let complete = ebpf.missed == 0 && e.n > 0;
    let mut out = vec![format!(
        "Target: kernel-event PLEG exit p99 ≤ {TARGET_P99_MS} ms {at}: {} (p99 {:.3} ms over {} \
         exits, {} missed).",
        met(complete && e.p99 <= TARGET_P99_MS),
        e.p99,
        e.n,
        ebpf.missed
    )];
    let ratio = if e.p99 > 0.0 {
        r.p50 / e.p99
    } else {
        f64::INFINITY
    };
    out.push(format!(
        "Target: its p99 at least {TARGET_LATENCY_RATIO:.0}× below the relist PLEG's p50 {at}: {} \
         (relist p50 {:.0} ms / kernel-event p99 {:.3} ms = {ratio:.0}×).",
        met(complete && ratio >= TARGET_LATENCY_RATIO),
        r.p50,
        e.p99
    ));
    let cpu_ratio = if ebpf.cpu_seconds_per_minute > 0.0 {
        relist.cpu_seconds_per_minute / ebpf.cpu_seconds_per_minute
    } else {
        f64::INFINITY
    };
    out.push(format!(
        "Target: idle CPU at most 1/{TARGET_CPU_RATIO:.0} of the relist PLEG's {at}: {} ({:.3} vs \
         {:.3} CPU s/min, 1/{cpu_ratio:.0}; whole agent measured, not the PLEG alone).",
        met(cpu_ratio >= TARGET_CPU_RATIO),
        ebpf.cpu_seconds_per_minute,
        relist.cpu_seconds_per_minute
    ));
    if let Some(evented) = find("evented", n) {
        let v = &evented.exit_latency_ms;
        let ratio = if e.p99 > 0.0 {
            v.p50 / e.p99
        } else {
            f64::INFINITY
        };
        out.push(format!(
            "Target: its p99 at least {TARGET_EVENTED_RATIO:.0}× below the Evented PLEG's p50 \
             {at}: {} (evented p50 {:.3} ms / kernel-event p99 {:.3} ms = {ratio:.1}×).",
            met(complete && ratio >= TARGET_EVENTED_RATIO),
            v.p50,
            e.p99
        ));
        out.push(format!(
            "Target: no missed exits in any PLEG {at}: {} (relist {}, evented {}, kernel-event {}).",
            met(relist.missed + evented.missed + ebpf.missed == 0),
            relist.missed,
            evented.missed,
            ebpf.missed
        ));
    }
    out
}

/// What went wrong besides the latencies: missed events, statuses that were not the SIGKILL exit,
/// kernel-event PLEG exits that only a relist reported.
pub fn warnings(entries: &[Entry]) -> Vec<String> {
    let mut found = Vec::new();
    for e in entries {
        let what = format!("--pleg {} with {} containers", e.pleg, e.containers);
        if e.missed > 0 {
            found.push(format!(
                "{what}: {} kills had no ContainerDied within the wait",
                e.missed
            ));
        }
        if e.wrong_status > 0 {
            found.push(format!(
                "{what}: {} ContainerDied events did not carry exit code 137",
                e.wrong_status
            ));
        }
        let relisted =
            e.exit_latency_ms.n as usize - e.kernel_caused.min(e.exit_latency_ms.n as usize);
        if e.pleg == "ebpf" && relisted > 0 {
            found.push(format!(
                "{what}: {relisted} deaths were reported by a relist, not by a kernel event"
            ));
        }
    }
    found
}

/// Writes the latency CDF of every configuration as an SVG to `path`.
pub fn plot(path: &Path, title: &str, outcomes: &[ConfigOutcome]) -> Result<()> {
    let names: Vec<String> = outcomes
        .iter()
        .map(|o| format!("--pleg {}, {} containers", o.pleg, o.containers))
        .collect();
    let curves: Vec<Curve<'_>> = outcomes
        .iter()
        .zip(&names)
        .map(|(o, name)| Curve {
            name,
            sorted_ns: &o.latencies_ns,
        })
        .collect();
    let axes = Axes {
        ns_per_unit: 1e6,
        x_desc: "kill of the container's init → ContainerDied on the gRPC stream (ms, log scale)",
        y_desc: "fraction of exits",
    };
    plot::latency_cdf(path, title, &axes, &curves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pleg::{IdleCost, Phases};

    fn machine() -> Machine {
        Machine {
            kernel_release: "6.8.0".into(),
            cpus: 2,
            cpu_model: "test".into(),
        }
    }

    fn outcome(pleg: &str, containers: usize, latencies_ms: &[u64], cpu: f64) -> ConfigOutcome {
        ConfigOutcome {
            pleg: pleg.into(),
            runtime: "containerd 2.1.9".into(),
            containers,
            latencies_ns: latencies_ms.iter().map(|ms| ms * 1_000_000).collect(),
            missed: 0,
            wrong_status: 0,
            kernel_caused: if pleg == "ebpf" {
                latencies_ms.len()
            } else {
                0
            },
            generations: 1,
            idle: IdleCost {
                seconds: 30.0,
                agent_cpu_seconds: cpu,
                runtime_cpu_seconds: None,
                cri_calls: BTreeMap::from([("list_containers".into(), 30.0)]),
                rss_bytes: 32 * 1024 * 1024,
                relists: 30.0,
                stream_events: 0.0,
            },
            phases: Phases::default(),
            stream_events: 0.0,
            run_seconds: 60.0,
        }
    }

    fn entries(outcomes: &[ConfigOutcome]) -> Vec<Entry> {
        outcomes
            .iter()
            .map(|o| Entry::new(o, &machine(), "2026-11-22T00:00:00Z"))
            .collect()
    }

    #[test]
    fn the_json_has_the_fields_the_issue_names() {
        let e = entries(&[outcome("ebpf", 10, &[1, 2, 3], 0.01)]);
        let json = serde_json::to_value(&e).expect("json");
        let first = &json[0];
        assert_eq!(first["pleg"], "ebpf");
        assert_eq!(first["containers"], 10);
        assert_eq!(first["exit_latency_ms"]["p50"], 2.0);
        assert_eq!(first["exit_latency_ms"]["max"], 3.0);
        assert_eq!(first["exit_latency_ms"]["n"], 3);
        assert_eq!(first["cri_calls_per_minute"], 60.0);
        assert_eq!(
            first["cri_calls_per_minute_by_operation"]["list_containers"],
            60.0
        );
        assert!((first["cpu_seconds_per_minute"].as_f64().unwrap_or(0.0) - 0.02).abs() < 1e-9);
        assert_eq!(first["rss_bytes"], 32 * 1024 * 1024);
    }

    #[test]
    fn targets_are_judged_at_100_containers() {
        let met = entries(&[
            outcome("relist", 100, &[400, 500, 900], 1.0),
            outcome("ebpf", 100, &[1, 2, 3], 0.01),
        ]);
        let verdicts = verdicts(&met);
        assert_eq!(verdicts.len(), 3);
        assert!(verdicts.iter().all(|v| v.contains(": met")), "{verdicts:?}");

        let missed = entries(&[
            outcome("relist", 100, &[400, 500, 900], 0.1),
            outcome("ebpf", 100, &[1, 2, 30], 0.01),
        ]);
        let verdicts = super::verdicts(&missed);
        assert!(verdicts[0].contains("missed"), "{verdicts:?}");
        assert!(verdicts[1].contains("missed"), "{verdicts:?}");
        assert!(verdicts[2].contains("missed"), "{verdicts:?}");
    }

    #[test]
    fn the_evented_pleg_is_judged_when_it_ran() {
        let mut evented = outcome("evented", 100, &[40, 50, 60], 0.02);
        evented.phases.reaped_ns = vec![1_000_000, 2_000_000];
        evented.phases.observed_ns = vec![30_000_000, 40_000_000];
        evented.stream_events = 300.0;
        let e = entries(&[
            outcome("relist", 100, &[400, 500, 900], 1.0),
            evented,
            outcome("ebpf", 100, &[1, 2, 3], 0.01),
        ]);
        let verdicts = verdicts(&e);
        assert_eq!(verdicts.len(), 5, "{verdicts:?}");
        assert!(
            verdicts[3].contains("Evented PLEG's p50") && verdicts[3].contains(": met"),
            "{verdicts:?}"
        );
        assert!(verdicts[4].contains("no missed exits") && verdicts[4].contains(": met"));
        let table = markdown(&e);
        assert!(table.contains("runtime containerd 2.1.9"), "{table}");
        assert!(
            table.contains("| evented | 100 | n/a | 1.000 | 30 | 50 | 300 | 0 |"),
            "{table}"
        );

        let slow_kernel = entries(&[
            outcome("relist", 100, &[500], 1.0),
            outcome("evented", 100, &[40, 50, 60], 0.02),
            outcome("ebpf", 100, &[1, 2, 8], 0.01),
        ]);
        assert!(super::verdicts(&slow_kernel)[3].contains("missed"));
    }

    #[test]
    fn a_quick_run_is_judged_at_its_largest_size_and_says_so() {
        let quick = entries(&[
            outcome("relist", 10, &[400, 500], 1.0),
            outcome("ebpf", 10, &[1, 2], 0.01),
        ]);
        let verdicts = verdicts(&quick);
        assert!(
            verdicts[0].contains("N = 10 (the targets are stated at N = 100"),
            "{verdicts:?}"
        );
        assert!(verdicts.iter().all(|v| v.contains(": met")), "{verdicts:?}");
    }

    #[test]
    fn a_missed_event_fails_the_latency_target_and_is_warned_about() {
        let mut ebpf = outcome("ebpf", 100, &[1, 2, 3], 0.01);
        ebpf.missed = 1;
        ebpf.kernel_caused = 2;
        let e = entries(&[outcome("relist", 100, &[500], 1.0), ebpf]);
        assert!(verdicts(&e)[0].contains("missed"));
        let warnings = warnings(&e);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("1 kills had no ContainerDied"));
        assert!(warnings[1].contains("1 deaths were reported by a relist"));
    }

    #[test]
    fn the_table_has_a_row_per_configuration() {
        let e = entries(&[
            outcome("relist", 10, &[400, 500], 1.0),
            outcome("ebpf", 10, &[1, 2], 0.01),
        ]);
        let table = markdown(&e);
        assert!(table.starts_with("Machine: Linux 6.8.0, 2 CPUs"), "{table}");
        assert!(
            table.contains("| relist | 10 | 2 | 400 | 500 | 500 | 0 | 2.000 | n/a | 60 | 32.0 |"),
            "{table}"
        );
        assert!(
            table.contains("| ebpf | 10 | 2 | 1.000 | 2.000 | 2.000 | 0 | 0.020 |"),
            "{table}"
        );
    }
}
