//! What one run and one mode measured: the times the watch saw, relative to the container's start
//! ([`judge`], a pure function of them), the foreign time read, why a run failed; and per mode,
//! the latencies and counts the report shows.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Mode, watch::Watched};
use crate::bench::stats::{ms, sorted_ns};

/// One run: a Guaranteed pod from its manifest to its removal.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    pub run: usize,
    /// The random wait before the manifest.
    pub delay_ms: u64,
    pub container_id: Option<String>,
    /// The manifest written → the container's first process.
    pub start_after_manifest_ms: Option<f64>,
    /// Start → exclusivity in place, ns: negative when the spinner left the CPU before the
    /// container started.
    pub in_place_after_ns: Option<i64>,
    /// Start → the container's process on the exclusive CPU alone, and → the spinner off it.
    pub pinned_after_ns: Option<i64>,
    pub spinner_off_after_ns: Option<i64>,
    /// Foreign time on the exclusive CPU from the start until the read, by intruder (`pod`,
    /// `other`), in ms; `None` when the audit had no series of the container at all.
    pub foreign_pod_ms: Option<f64>,
    pub foreign_other_ms: Option<f64>,
    /// When the foreign time was read, after the start.
    pub foreign_read_after_ms: Option<f64>,
    pub samples: u64,
    pub max_sample_interval_ms: f64,
    pub failure: Option<String>,
}

impl RunOutcome {
    /// Exclusivity was in place when the container started.
    pub fn in_place_before_start(&self) -> bool {
        self.failure.is_none() && self.in_place_after_ns.is_some_and(|ns| ns <= 0)
    }
}

/// One mode's runs and what its swiftlet counted.
#[derive(Clone, Debug, Serialize)]
pub struct ModeOutcome {
    pub mode: Mode,
    pub runs: Vec<RunOutcome>,
    /// `swiftlet_cpu_manager_cpuset_updates_total` at the end, by trigger.
    pub cpuset_updates: BTreeMap<String, f64>,
    /// `swiftlet_cpu_manager_exclusivity_violations_total` at the end.
    pub violations: Option<f64>,
    /// The spinner's process ran from the first run to the last (it must).
    pub spinner_ran_throughout: bool,
}

impl ModeOutcome {
    pub fn failures(&self) -> usize {
        self.runs.iter().filter(|r| r.failure.is_some()).count()
    }

    /// (a) of the runs that succeeded, ascending.
    pub fn latencies_ns(&self) -> Vec<u64> {
        sorted_ns(
            self.runs
                .iter()
                .filter(|r| r.failure.is_none())
                .filter_map(|r| r.in_place_after_ns),
        )
    }

    pub fn in_place_before_start(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.in_place_before_start())
            .count()
    }

    /// (b) by intruder, in ns, ascending (the runs whose foreign time was read).
    pub fn foreign_pod_ns(&self) -> Vec<u64> {
        sorted_ns(
            self.runs
                .iter()
                .filter_map(|r| r.foreign_pod_ms.map(ms_to_ns)),
        )
    }

    pub fn foreign_other_ns(&self) -> Vec<u64> {
        sorted_ns(
            self.runs
                .iter()
                .filter_map(|r| r.foreign_other_ms.map(ms_to_ns)),
        )
    }
}

/// ms as ns (i64: what [`sorted_ns`] takes).
fn ms_to_ns(ms: f64) -> i64 {
    (ms * 1e6).round() as i64
}

/// What one watch comes to: times relative to the start, the failure if any.
pub(super) fn judge(run: usize, delay_ms: u64, written_ns: u64, w: &Watched) -> RunOutcome {
    let after_start = |ns: Option<u64>| {
        let start = w.start_ns?;
        let ns = ns?;
        Some(i64::try_from(ns).ok()? - i64::try_from(start).ok()?)
    };
    let failure = w.failure.clone().or_else(|| {
        w.in_place_ns
            .is_none()
            .then(|| "exclusivity never in place".to_owned())
    });
    RunOutcome {
        run,
        delay_ms,
        container_id: w.container_id.clone(),
        start_after_manifest_ms: w.start_ns.map(|s| ms(s.saturating_sub(written_ns))),
        in_place_after_ns: after_start(w.in_place_ns),
        pinned_after_ns: after_start(w.pinned_ns),
        spinner_off_after_ns: after_start(w.spinner_off_ns),
        foreign_pod_ms: None,
        foreign_other_ms: None,
        foreign_read_after_ms: None,
        samples: w.samples,
        max_sample_interval_ms: ms(w.max_interval_ns),
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(start: u64, pinned: u64, off: u64) -> Watched {
        Watched {
            container_id: Some("c".into()),
            start_ns: Some(start),
            pinned_ns: Some(pinned),
            spinner_off_ns: Some(off),
            in_place_ns: Some(pinned.max(off)),
            samples: 10,
            max_interval_ns: 1_200_000,
            failure: None,
        }
    }

    #[test]
    fn a_spinner_moved_before_the_start_is_in_place_at_zero() {
        let r = judge(1, 0, 1_000, &watched(5_000, 5_000, 2_000));
        assert_eq!(r.in_place_after_ns, Some(0));
        assert_eq!(r.spinner_off_after_ns, Some(-3_000));
        assert!(r.in_place_before_start());
        assert!((r.start_after_manifest_ms.unwrap_or(0.0) - 0.004).abs() < 1e-12);

        let late = judge(2, 0, 0, &watched(5_000, 5_000, 9_000_000));
        assert_eq!(late.in_place_after_ns, Some(8_995_000));
        assert!(!late.in_place_before_start());
    }

    #[test]
    fn a_watch_without_exclusivity_fails() {
        let mut w = watched(5_000, 5_000, 6_000);
        w.in_place_ns = None;
        let r = judge(1, 0, 0, &w);
        assert_eq!(r.failure.as_deref(), Some("exclusivity never in place"));
        w.failure = Some("timed out".into());
        assert_eq!(judge(1, 0, 0, &w).failure.as_deref(), Some("timed out"));
        let nothing = judge(1, 0, 0, &Watched::default());
        assert!(nothing.failure.is_some());
        assert_eq!(nothing.in_place_after_ns, None);
    }
}
