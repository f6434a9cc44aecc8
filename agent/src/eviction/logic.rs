//! The eviction manager's decisions as pure functions of thresholds, observations and time: which
//! thresholds are met (with minimum reclaim once met), since when, whether their grace period has
//! passed, which node conditions follow and how long they stay (the transition period), and which
//! threshold to act on first.
//!
//! Not here: reading the observations (`observe.rs`), ranking pods (`rank.rs`), acting
//! (`manager.rs`). Upstream: `pkg/kubelet/eviction/helpers.go` (`thresholdsMet`,
//! `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`,
//! `nodeConditionsLastObservedAt`, `nodeConditionsObservedSince`, `getReclaimableThreshold`).

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    time::{Duration, Instant},
};

use super::thresholds::{Operator, PsiSignalResource, Signal, Threshold, ThresholdValue};

/// One signal's value at one moment: how much is left of how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Bytes, inodes or pids left; for PSI, the average in hundredths of a percent.
    pub available: i64,
    pub capacity: i64,
}

/// PSI observations are stored in hundredths of a percent: capacity 100 % = 10 000.
pub const PSI_CAPACITY: i64 = 10_000;

pub type Observations = HashMap<Signal, Observation>;

/// The node conditions eviction reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl NodeCondition {
    pub const ALL: [NodeCondition; 3] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ];

    /// The API's condition type.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resource a signal is about, which decides how pods are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Memory,
    Pids,
    Disk,
    Inodes,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Pids => "pids",
            Resource::Disk => "ephemeral-storage",
            Resource::Inodes => "inodes",
        }
    }
}

pub fn condition_of(signal: Signal) -> NodeCondition {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => {
            NodeCondition::MemoryPressure
        }
        Signal::NodeFsAvailable
        | Signal::NodeFsInodesFree
        | Signal::ImageFsAvailable
        | Signal::ImageFsInodesFree => NodeCondition::DiskPressure,
        Signal::PidAvailable => NodeCondition::PidPressure,
        Signal::Pressure(p) => match p.resource {
            PsiSignalResource::Memory => NodeCondition::MemoryPressure,
            PsiSignalResource::Io => NodeCondition::DiskPressure,
        },
    }
}

pub fn resource_of(signal: Signal) -> Resource {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => Resource::Disk,
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => Resource::Inodes,
        Signal::PidAvailable => Resource::Pids,
        Signal::Pressure(p) => match p.resource {
            PsiSignalResource::Memory => Resource::Memory,
            PsiSignalResource::Io => Resource::Disk,
        },
    }
}

/// A threshold's identity across synchronisations: a signal has at most one hard and one soft.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThresholdKey {
    pub signal: Signal,
    pub hard: bool,
}

impl ThresholdKey {
    pub fn of(t: &Threshold) -> ThresholdKey {
        ThresholdKey {
            signal: t.signal,
            hard: t.is_hard(),
        }
    }
}

/// A value relative to a capacity (upstream `GetThresholdQuantity`: percentages truncate).
pub fn quantity(value: ThresholdValue, capacity: i64) -> i64 {
    match value {
        ThresholdValue::Quantity(q) => q,
        ThresholdValue::Percentage(p) => (capacity as f64 * p) as i64,
    }
}

/// Whether `t` is met by `observed`; with `enforce_min_reclaim`, the bar is raised by the
/// threshold's minimum reclaim (lowered, for `>` thresholds).
pub fn is_met(t: &Threshold, observed: &Observation, enforce_min_reclaim: bool) -> bool {
    let mut bar = quantity(t.value, observed.capacity);
    let reclaim = match (enforce_min_reclaim, t.min_reclaim) {
        (true, Some(r)) => quantity(r, observed.capacity),
        _ => 0,
    };
    match t.operator {
        Operator::LessThan => {
            bar = bar.saturating_add(reclaim);
            bar > observed.available
        }
        Operator::GreaterThan => {
            bar = bar.saturating_sub(reclaim);
            observed.available > bar
        }
    }
}

/// The thresholds met by the observations (upstream `thresholdsMet`). A signal without an
/// observation is not met.
pub fn thresholds_met<'a>(
    thresholds: impl IntoIterator<Item = &'a Threshold>,
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .into_iter()
        .filter(|t| {
            observations
                .get(&t.signal)
                .is_some_and(|o| is_met(t, o, enforce_min_reclaim))
        })
        .cloned()
        .collect()
}

/// `a` plus the thresholds of `b` not already in it.
pub fn merge_thresholds(mut a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    for t in b {
        if !a
            .iter()
            .any(|x| ThresholdKey::of(x) == ThresholdKey::of(&t))
        {
            a.push(t);
        }
    }
    a
}

/// When each met threshold was first seen met: kept from `last` while it stays met, `now` for
/// new ones; thresholds no longer met are forgotten.
pub fn thresholds_first_observed_at(
    met: &[Threshold],
    last: &HashMap<ThresholdKey, Instant>,
    now: Instant,
) -> HashMap<ThresholdKey, Instant> {
    met.iter()
        .map(|t| {
            let key = ThresholdKey::of(t);
            (key, last.get(&key).copied().unwrap_or(now))
        })
        .collect()
}

/// The met thresholds whose grace period has passed (hard ones at once).
pub fn thresholds_met_grace_period(
    met: &[Threshold],
    first_observed: &HashMap<ThresholdKey, Instant>,
    now: Instant,
) -> Vec<Threshold> {
    met.iter()
        .filter(|t| {
            first_observed
                .get(&ThresholdKey::of(t))
                .is_some_and(|at| now.saturating_duration_since(*at) >= t.grace_period)
        })
        .cloned()
        .collect()
}

pub fn node_conditions(met: &[Threshold]) -> BTreeSet<NodeCondition> {
    met.iter().map(|t| condition_of(t.signal)).collect()
}

/// Stamps the conditions seen now; remembers the others' last time.
pub fn node_conditions_last_observed_at(
    conditions: &BTreeSet<NodeCondition>,
    last: &HashMap<NodeCondition, Instant>,
    now: Instant,
) -> HashMap<NodeCondition, Instant> {
    let mut out = last.clone();
    for c in conditions {
        out.insert(*c, now);
    }
    out
}

/// The conditions seen within the transition period: a condition stays that long after its
/// threshold stops being met, so it does not flap.
pub fn node_conditions_observed_since(
    observed: &HashMap<NodeCondition, Instant>,
    period: Duration,
    now: Instant,
) -> BTreeSet<NodeCondition> {
    observed
        .iter()
        .filter(|(_, at)| now.saturating_duration_since(**at) < period)
        .map(|(c, _)| *c)
        .collect()
}

/// Order of handling when several thresholds are met: memory first (upstream
/// `byEvictionPriority`), then hard before soft, then the signal's order.
fn priority(t: &Threshold) -> (u8, bool, Signal) {
    let resource = match resource_of(t.signal) {
        Resource::Memory => 0,
        Resource::Pids => 1,
        Resource::Disk | Resource::Inodes => 2,
    };
    (resource, !t.is_hard(), t.signal)
}

/// The threshold to reclaim for (upstream `getReclaimableThreshold`).
pub fn reclaimable_threshold(met: &[Threshold]) -> Option<&Threshold> {
    met.iter().min_by_key(|t| priority(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::thresholds::{PsiSignal, PsiWindow};

    fn threshold(signal: Signal, value: ThresholdValue, grace: u64) -> Threshold {
        Threshold {
            signal,
            operator: Operator::LessThan,
            value,
            grace_period: Duration::from_secs(grace),
            min_reclaim: None,
            text: String::new(),
        }
    }

    const MI: i64 = 1 << 20;

    fn obs(signal: Signal, available: i64, capacity: i64) -> Observations {
        HashMap::from([(
            signal,
            Observation {
                available,
                capacity,
            },
        )])
    }

    #[test]
    fn quantities_and_percentages_are_met_below_the_bar() {
        let t = threshold(
            Signal::MemoryAvailable,
            ThresholdValue::Quantity(100 * MI),
            0,
        );
        assert!(is_met(
            &t,
            &Observation {
                available: 99 * MI,
                capacity: 1000 * MI
            },
            false
        ));
        assert!(!is_met(
            &t,
            &Observation {
                available: 100 * MI,
                capacity: 1000 * MI
            },
            false
        ));
        let p = threshold(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1), 0);
        assert!(is_met(
            &p,
            &Observation {
                available: 99,
                capacity: 1000
            },
            false
        ));
        assert!(!is_met(
            &p,
            &Observation {
                available: 100,
                capacity: 1000
            },
            false
        ));
    }

    #[test]
    fn minimum_reclaim_raises_the_bar_once_met() {
        let mut t = threshold(
            Signal::MemoryAvailable,
            ThresholdValue::Quantity(100 * MI),
            0,
        );
        t.min_reclaim = Some(ThresholdValue::Quantity(50 * MI));
        let o = obs(Signal::MemoryAvailable, 120 * MI, 1000 * MI);
        assert!(thresholds_met([&t], &o, false).is_empty());
        assert_eq!(thresholds_met([&t], &o, true).len(), 1);
        let o = obs(Signal::MemoryAvailable, 150 * MI, 1000 * MI);
        assert!(thresholds_met([&t], &o, true).is_empty());
    }

    #[test]
    fn psi_thresholds_are_met_above_the_bar() {
        let signal = Signal::Pressure(PsiSignal {
            resource: PsiSignalResource::Memory,
            full: false,
            window: PsiWindow::Avg10,
        });
        let t = Threshold {
            operator: Operator::GreaterThan,
            ..threshold(signal, ThresholdValue::Percentage(0.4), 0)
        };
        assert!(is_met(
            &t,
            &Observation {
                available: 4001,
                capacity: PSI_CAPACITY
            },
            false
        ));
        assert!(!is_met(
            &t,
            &Observation {
                available: 4000,
                capacity: PSI_CAPACITY
            },
            false
        ));
        assert_eq!(condition_of(signal), NodeCondition::MemoryPressure);
    }

    #[test]
    fn grace_periods_count_from_the_first_observation() {
        let t0 = Instant::now();
        let soft = threshold(
            Signal::MemoryAvailable,
            ThresholdValue::Quantity(200 * MI),
            90,
        );
        let met = vec![soft.clone()];
        let first = thresholds_first_observed_at(&met, &HashMap::new(), t0);
        assert!(thresholds_met_grace_period(&met, &first, t0 + Duration::from_secs(89)).is_empty());
        // Seen again later: the first time is kept.
        let again = thresholds_first_observed_at(&met, &first, t0 + Duration::from_secs(60));
        assert_eq!(
            again.get(&ThresholdKey::of(&soft)),
            Some(&t0),
            "first observation kept"
        );
        assert_eq!(
            thresholds_met_grace_period(&met, &again, t0 + Duration::from_secs(90)).len(),
            1
        );
        // Not met any more: forgotten, so a new episode starts its grace period afresh.
        assert!(thresholds_first_observed_at(&[], &again, t0 + Duration::from_secs(91)).is_empty());
    }

    #[test]
    fn conditions_stay_for_the_transition_period() {
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let met = vec![threshold(
            Signal::PidAvailable,
            ThresholdValue::Quantity(10),
            0,
        )];
        let seen = node_conditions_last_observed_at(&node_conditions(&met), &HashMap::new(), t0);
        let later = node_conditions_last_observed_at(
            &BTreeSet::new(),
            &seen,
            t0 + Duration::from_secs(200),
        );
        assert_eq!(
            node_conditions_observed_since(&later, period, t0 + Duration::from_secs(200)),
            BTreeSet::from([NodeCondition::PidPressure])
        );
        assert!(
            node_conditions_observed_since(&later, period, t0 + Duration::from_secs(300))
                .is_empty()
        );
    }

    #[test]
    fn memory_is_reclaimed_first_and_hard_before_soft() {
        let disk = threshold(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1), 0);
        let soft_mem = threshold(Signal::MemoryAvailable, ThresholdValue::Quantity(1), 30);
        let hard_mem = threshold(
            Signal::AllocatableMemoryAvailable,
            ThresholdValue::Quantity(0),
            0,
        );
        let met = vec![disk, soft_mem, hard_mem.clone()];
        assert_eq!(reclaimable_threshold(&met), Some(&hard_mem));
        assert_eq!(reclaimable_threshold(&[]), None);
    }

    #[test]
    fn merging_keeps_one_per_signal_and_kind() {
        let a = threshold(Signal::MemoryAvailable, ThresholdValue::Quantity(1), 0);
        let b = threshold(Signal::MemoryAvailable, ThresholdValue::Quantity(1), 10);
        let merged = merge_thresholds(vec![a.clone()], vec![a, b]);
        assert_eq!(merged.len(), 2);
    }
}
