//! What one run and one mode measured: the crossing, the decision naming the hog, its containers'
//! deaths, the other decisions heard meanwhile, and why a run failed ([`judge`], a pure function
//! of what was heard); and per mode, the latencies, counts and deciding sources the report shows.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use serde::Serialize;

use super::{
    CROSS_LIMIT, CROSS_STALL, DECISION_TIMEOUT, Mode, STOP_TIMEOUT,
    sampler::{Crossing, Dip, StallMs},
    stream::{Decision, Died, Heard},
};
use crate::bench::stats::sorted_ns;

/// One run of the hog.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    pub run: usize,
    /// The random wait before the hog's manifest was written.
    pub delay_ms: u64,
    pub crossing: Option<Crossing>,
    /// The first decision naming the hog.
    pub decision: Option<Decision>,
    /// The hog's container's death.
    pub died: Option<Died>,
    /// Crossing → decision and crossing → stopped, in ns (negative: before the sample that saw
    /// the crossing).
    pub decision_after_ns: Option<i64>,
    pub stopped_after_ns: Option<i64>,
    /// The other decisions of the run: their source, ms from the crossing, and the pod evicted.
    pub other_decisions: Vec<String>,
    /// Pods other than the hog evicted during the run.
    pub others_evicted: Vec<String>,
    /// Between the crossing and the decision, the working set went back below the bar this many
    /// times (busybox holds each chunk twice for a moment, and page cache comes and goes), for
    /// this long in all; a check that fell in a dip rightly found no pressure.
    pub dips_before_decision: usize,
    pub below_bar_before_decision_ms: f64,
    /// From the end of the last dip (the working set past the bar for good) to the decision.
    pub decision_after_last_dip_ns: Option<i64>,
    /// The stall (PSI `some`) of the pods' cgroup and of the node in the trigger window (2 s)
    /// before the wake-up that evicted the hog: which PSI triggers (100 ms in 2 s) could have
    /// fired.
    pub stall_before_decision: Option<StallMs>,
    /// Why the run failed, if it did.
    pub failure: Option<String>,
}

impl RunOutcome {
    pub fn evicted(&self) -> bool {
        self.decision.is_some()
    }

    /// Takes in the sampler's dips back below the bar between the crossing and the decision.
    pub(super) fn note_dips(&mut self, dips: &[Dip]) {
        let Some(decided_ns) = self.decision.as_ref().map(|d| d.decided_ns) else {
            return;
        };
        let before: Vec<&Dip> = dips.iter().filter(|d| d.from_ns < decided_ns).collect();
        self.dips_before_decision = before.len();
        self.below_bar_before_decision_ms = before
            .iter()
            .map(|d| d.to_ns.min(decided_ns).saturating_sub(d.from_ns) as f64 / 1e6)
            .sum();
        self.decision_after_last_dip_ns = match before.last() {
            None => self.decision_after_ns,
            // The working set was below the bar (as sampled) when the decision came.
            Some(d) if d.to_ns > decided_ns => Some(0),
            Some(d) => Some(decided_ns as i64 - d.to_ns as i64),
        };
    }
}

/// Every run of one mode.
#[derive(Clone, Debug, Serialize)]
pub struct ModeOutcome {
    pub mode: Mode,
    pub wakeups: String,
    pub scenario: String,
    pub runs: Vec<RunOutcome>,
    /// Decisions that evicted the bystander (in runs or between them).
    pub bystander_evictions: usize,
    /// The bystander's state at the end (phase, restarts).
    pub bystander_phase: String,
    pub bystander_restarts: i64,
    /// Evictions between runs (none expected).
    pub stray_evictions: Vec<String>,
    /// Events the benchmark's watch missed.
    pub lost_events: u64,
    /// `swiftlet_eviction_wakeups_total` at the end, by source.
    pub wakeups_total: BTreeMap<String, f64>,
    /// What the agent logged it is woken by.
    pub woken_by: String,
}

impl ModeOutcome {
    /// Crossing → decision of every run that evicted the hog, ascending (one that came before the
    /// crossing's sample counts as 0).
    pub fn decision_latencies_ns(&self) -> Vec<u64> {
        sorted_ns(self.runs.iter().filter_map(|r| r.decision_after_ns))
    }

    /// Crossing → the hog's container stopped, ascending.
    pub fn stopped_latencies_ns(&self) -> Vec<u64> {
        sorted_ns(
            self.runs
                .iter()
                .filter(|r| r.decision.is_some())
                .filter_map(|r| r.stopped_after_ns),
        )
    }

    pub fn evictions(&self) -> usize {
        self.runs.iter().filter(|r| r.evicted()).count()
    }

    pub fn failures(&self) -> usize {
        self.runs.iter().filter(|r| r.failure.is_some()).count()
    }

    /// The sources of the decisions that evicted the hog, with their counts.
    pub fn decided_by(&self) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for d in self.runs.iter().filter_map(|r| r.decision.as_ref()) {
            *by.entry(d.source.clone()).or_default() += 1;
        }
        by
    }

    pub fn bystander_ok(&self) -> bool {
        self.bystander_evictions == 0 && self.bystander_phase == "Running"
    }
}

/// What one run measured, from the crossing and what was heard during it: the hog pod `hog` has
/// `containers` containers, and has stopped when the last of them died.
pub(super) fn judge(
    run: usize,
    delay: Duration,
    hog: &str,
    containers: usize,
    crossing: Option<Crossing>,
    heard: &[Heard],
) -> RunOutcome {
    let decisions = heard.iter().filter_map(|h| match h {
        Heard::Decision(d) => Some(d),
        _ => None,
    });
    let decision = decisions.clone().find(|d| d.pod_name == hog).cloned();
    let deaths: Vec<&Died> = heard
        .iter()
        .filter_map(|h| match h {
            Heard::Died(d) => Some(d),
            _ => None,
        })
        .filter(|d| d.pod_name == hog || decision.as_ref().is_some_and(|e| e.pod_uid == d.pod_uid))
        .collect();
    let all_stopped = deaths
        .iter()
        .map(|d| d.container_name.as_str())
        .collect::<BTreeSet<_>>()
        .len()
        >= containers;
    // The last container's death is when the pod stopped.
    let died = deaths
        .iter()
        .max_by_key(|d| d.stopped_ns())
        .map(|d| (*d).clone());
    let after = |ns: u64| crossing.map(|c| ns as i64 - c.at_ns as i64);
    let others_evicted: Vec<String> = decisions
        .clone()
        .filter(|d| !d.pod_name.is_empty() && d.pod_name != hog)
        .map(|d| d.pod_name.clone())
        .collect();
    let other_decisions = decisions
        .filter(|d| d.pod_name != hog)
        .map(|d| {
            let at = after(d.decided_ns).map_or_else(
                || "before any crossing".to_owned(),
                |ns| format!("{:+.0} ms", ns as f64 / 1e6),
            );
            let evicted = if d.pod_name.is_empty() {
                "nothing evicted".to_owned()
            } else {
                format!("evicted {}", d.pod_name)
            };
            format!("{} {at} ({evicted})", d.source)
        })
        .collect();
    let failure = match (&crossing, &decision, &died) {
        (None, _, _) => Some(format!(
            "the working set never crossed the bar: it stopped growing for {CROSS_STALL:?} or \
             took longer than {CROSS_LIMIT:?}"
        )),
        (Some(_), None, Some(d)) => Some(format!(
            "the hog's container died without an eviction (reason {:?}, exit code {:?})",
            d.reason, d.exit_code
        )),
        (Some(_), None, None) => Some(format!(
            "nothing evicted the hog within {DECISION_TIMEOUT:?} of the crossing"
        )),
        (Some(_), Some(_), _) if !all_stopped => Some(format!(
            "evicted, but not all its {containers} containers stopped within {STOP_TIMEOUT:?}"
        )),
        (Some(_), Some(_), Some(_)) if !others_evicted.is_empty() => Some(format!(
            "another pod was evicted: {}",
            others_evicted.join(", ")
        )),
        _ => None,
    };
    RunOutcome {
        run,
        delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        decision_after_ns: decision.as_ref().and_then(|d| after(d.decided_ns)),
        stopped_after_ns: died
            .as_ref()
            .filter(|_| all_stopped)
            .and_then(|d| after(d.stopped_ns())),
        crossing,
        decision,
        died,
        other_decisions,
        others_evicted,
        dips_before_decision: 0,
        below_bar_before_decision_ms: 0.0,
        decision_after_last_dip_ns: None,
        stall_before_decision: None,
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::eviction::bar;

    fn decision(source: &str, pod: &str, decided_ns: u64) -> Heard {
        Heard::Decision(Decision {
            source: source.into(),
            woke_ns: decided_ns.saturating_sub(10),
            decided_ns,
            signal: if pod.is_empty() {
                String::new()
            } else {
                "allocatableMemory.available".into()
            },
            pod_uid: format!("uid-{pod}"),
            pod_name: pod.into(),
        })
    }

    fn died(pod: &str, kernel_ts_ns: u64) -> Heard {
        Heard::Died(Died {
            pod_uid: format!("uid-{pod}"),
            pod_name: pod.into(),
            container_name: "main".into(),
            kernel_ts_ns,
            sent_ns: kernel_ts_ns + 5,
            reason: "Error".into(),
            exit_code: Some(143),
        })
    }

    fn crossing(at_ns: u64) -> Option<Crossing> {
        Some(Crossing {
            at_ns,
            interval_ns: 1_000_000,
            working_set_bytes: bar() + 1,
            samples: 10,
        })
    }

    #[test]
    fn a_run_is_measured_from_the_crossing() {
        let heard = [
            decision("psi", "", 500),
            decision("memcg", "hog", 3_000_000),
            died("hog", 9_000_000),
        ];
        let r = judge(1, Duration::ZERO, "hog", 1, crossing(1_000_000), &heard);
        assert_eq!(r.failure, None);
        assert_eq!(r.decision_after_ns, Some(2_000_000));
        assert_eq!(r.stopped_after_ns, Some(8_000_000));
        assert_eq!(
            r.decision.as_ref().map(|d| d.source.as_str()),
            Some("memcg")
        );
        assert_eq!(r.other_decisions, ["psi -1 ms (nothing evicted)"]);
    }

    #[test]
    fn failures_are_named() {
        let none = judge(1, Duration::ZERO, "hog", 1, crossing(1), &[]);
        assert!(none.failure.unwrap().starts_with("nothing evicted the hog"));
        let oom = judge(1, Duration::ZERO, "hog", 1, crossing(1), &[died("hog", 5)]);
        assert!(oom.failure.unwrap().contains("died without an eviction"));
        let never = judge(1, Duration::ZERO, "hog", 1, None, &[]);
        assert!(never.failure.unwrap().contains("never crossed"));
        let wrong = judge(
            1,
            Duration::ZERO,
            "hog",
            1,
            crossing(1),
            &[
                decision("memcg", "bystander", 5),
                decision("retry", "hog", 9),
                died("hog", 12),
            ],
        );
        assert_eq!(wrong.others_evicted, ["bystander"]);
        assert!(wrong.failure.unwrap().contains("another pod was evicted"));
    }

    #[test]
    fn dips_before_the_decision_are_counted() {
        let heard = [
            decision("periodic", "hog", 10_000_000),
            died("hog", 11_000_000),
        ];
        let mut r = judge(1, Duration::ZERO, "hog", 1, crossing(1_000_000), &heard);
        r.note_dips(&[
            Dip {
                from_ns: 2_000_000,
                to_ns: 3_000_000,
            },
            Dip {
                from_ns: 4_000_000,
                to_ns: 6_000_000,
            },
            // After the decision: the eviction freed the memory.
            Dip {
                from_ns: 12_000_000,
                to_ns: 13_000_000,
            },
        ]);
        assert_eq!(r.dips_before_decision, 2);
        assert!((r.below_bar_before_decision_ms - 3.0).abs() < 1e-9);
        assert_eq!(r.decision_after_last_dip_ns, Some(4_000_000));
        assert_eq!(r.decision_after_ns, Some(9_000_000));
        let mut during = judge(1, Duration::ZERO, "hog", 1, crossing(1_000_000), &heard);
        during.note_dips(&[Dip {
            from_ns: 9_000_000,
            to_ns: 10_500_000,
        }]);
        assert_eq!(during.decision_after_last_dip_ns, Some(0));
    }

    #[test]
    fn a_pod_stops_with_its_last_container() {
        let thrash = |ts: u64| {
            let Heard::Died(mut d) = died("hog", ts) else {
                unreachable!()
            };
            d.container_name = "thrash".into();
            Heard::Died(d)
        };
        let both = judge(
            1,
            Duration::ZERO,
            "hog",
            2,
            crossing(100),
            &[decision("psi", "hog", 200), thrash(900), died("hog", 400)],
        );
        assert_eq!(both.failure, None);
        assert_eq!(both.stopped_after_ns, Some(800));
        let one = judge(
            1,
            Duration::ZERO,
            "hog",
            2,
            crossing(100),
            &[decision("psi", "hog", 200), died("hog", 400)],
        );
        assert!(
            one.failure
                .unwrap()
                .contains("not all its 2 containers stopped")
        );
        assert_eq!(one.stopped_after_ns, None);
    }

    #[test]
    fn mode_outcomes_count_and_sort() {
        let runs = vec![
            judge(
                1,
                Duration::ZERO,
                "hog",
                1,
                crossing(100),
                &[decision("memcg", "hog", 90), died("hog", 300)],
            ),
            judge(
                2,
                Duration::ZERO,
                "hog",
                1,
                crossing(100),
                &[decision("periodic", "hog", 150), died("hog", 400)],
            ),
            judge(3, Duration::ZERO, "hog", 1, crossing(100), &[]),
        ];
        let outcome = ModeOutcome {
            mode: Mode::Kernel,
            wakeups: Mode::Kernel.wakeups().into(),
            scenario: String::new(),
            runs,
            bystander_evictions: 0,
            bystander_phase: "Running".into(),
            bystander_restarts: 0,
            stray_evictions: vec![],
            lost_events: 0,
            wakeups_total: BTreeMap::new(),
            woken_by: String::new(),
        };
        // A decision before the crossing's sample counts as 0.
        assert_eq!(outcome.decision_latencies_ns(), [0, 50]);
        assert_eq!(outcome.stopped_latencies_ns(), [200, 300]);
        assert_eq!((outcome.evictions(), outcome.failures()), (2, 1));
        assert_eq!(
            outcome.decided_by(),
            BTreeMap::from([("memcg".to_owned(), 1), ("periodic".to_owned(), 1)])
        );
        assert!(outcome.bystander_ok());
        assert_eq!("psi".parse::<Mode>(), Ok(Mode::Psi));
        assert!("x".parse::<Mode>().is_err());
    }
}
