//! The CPU manager's seam to the scheduler audit (the `sched_switch` program of
//! `kernel::sched`): who owns each exclusive CPU, how long other cgroups ran on it, and run-queue
//! latency per cgroup. The kernel keeps cumulative sums; [`Exclusivity`] turns them into what
//! changed since the last look.
//!
//! Not here: the programs and their maps (`kernel::sched`), what counts as a violation (the
//! manager decides, it knows the containers).

use std::collections::{BTreeMap, HashMap};

use crate::kernel::{ForeignRun, RunqHistogram, SchedAudit};

#[derive(Debug, thiserror::Error)]
#[error("scheduler audit: {0}")]
pub struct AuditError(pub String);

/// The maps the CPU manager reads and writes; a fake stands in for unit tests.
pub trait AuditMaps: Send + Sync {
    /// Marks `cpu` as owned by the cgroup `cgroup_id` (0: no owner).
    fn set_owner(&self, cpu: u32, cgroup_id: u64) -> Result<(), AuditError>;
    /// Cumulative ns other cgroups ran on owned CPUs, by CPU, owner and intruder.
    fn foreign(&self) -> Result<Vec<ForeignRun>, AuditError>;
    /// Run-queue latency histograms by cgroup id, summed over CPUs.
    fn runqueue(&self) -> Result<HashMap<u64, RunqHistogram>, AuditError>;
    /// Forgets a cgroup that is gone: its foreign time as owner or intruder, its histogram.
    fn remove_cgroup(&self, cgroup_id: u64) -> Result<(), AuditError>;
}

impl AuditMaps for SchedAudit {
    fn set_owner(&self, cpu: u32, cgroup_id: u64) -> Result<(), AuditError> {
        SchedAudit::set_owner(self, cpu, cgroup_id).map_err(|e| AuditError(e.to_string()))
    }

    fn foreign(&self) -> Result<Vec<ForeignRun>, AuditError> {
        SchedAudit::foreign(self).map_err(|e| AuditError(e.to_string()))
    }

    fn runqueue(&self) -> Result<HashMap<u64, RunqHistogram>, AuditError> {
        SchedAudit::runqueue(self).map_err(|e| AuditError(e.to_string()))
    }

    fn remove_cgroup(&self, cgroup_id: u64) -> Result<(), AuditError> {
        SchedAudit::remove_cgroup(self, cgroup_id).map_err(|e| AuditError(e.to_string()))
    }
}

/// Foreign time that appeared since the previous look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignDelta {
    pub cpu: u32,
    pub owner: u64,
    pub intruder: u64,
    pub delta_ns: u64,
}

/// Remembers the cumulative sums last seen, and whether the assignments were settled then.
#[derive(Debug, Default)]
pub struct Exclusivity {
    last: HashMap<(u32, u64, u64), u64>,
    /// At the previous look: the assignments' generation, if every container had its cpuset.
    settled: Option<u64>,
}

impl Exclusivity {
    /// Whether the window since the previous look is one where foreign pod work breaks a promise:
    /// every container had its current cpuset at both ends (`settled` now and then) and no
    /// assignment changed in between (`generation`). Growth in any other window may be the
    /// apply's own delay: the spinner that ran on a CPU until its cpuset was updated.
    pub fn window_settled(&mut self, settled: bool, generation: u64) -> bool {
        let now = settled.then_some(generation);
        let before = std::mem::replace(&mut self.settled, now);
        now.is_some() && before == now
    }

    /// The growth of every sum whose owner still owns its CPU (`owners`: CPU → owner). Sums of
    /// past owners are forgotten, so a CPU handed to a new container starts from its own zero.
    pub fn update(
        &mut self,
        runs: &[ForeignRun],
        owners: &BTreeMap<u32, u64>,
    ) -> Vec<ForeignDelta> {
        let mut out = Vec::new();
        let mut seen = HashMap::new();
        for run in runs {
            if owners.get(&run.cpu) != Some(&run.owner) {
                continue;
            }
            let key = (run.cpu, run.owner, run.intruder);
            let before = self.last.get(&key).copied().unwrap_or(0);
            if run.ns > before {
                out.push(ForeignDelta {
                    cpu: run.cpu,
                    owner: run.owner,
                    intruder: run.intruder,
                    delta_ns: run.ns - before,
                });
            }
            seen.insert(key, run.ns.max(before));
        }
        self.last = seen;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cpu: u32, owner: u64, intruder: u64, ns: u64) -> ForeignRun {
        ForeignRun {
            cpu,
            owner,
            intruder,
            ns,
        }
    }

    #[test]
    fn reports_growth_of_current_owners_only() {
        let mut e = Exclusivity::default();
        let owners = BTreeMap::from([(1, 100)]);
        let first = e.update(&[run(1, 100, 7, 50), run(1, 99, 7, 1000)], &owners);
        assert_eq!(
            first,
            vec![ForeignDelta {
                cpu: 1,
                owner: 100,
                intruder: 7,
                delta_ns: 50
            }]
        );
        assert!(e.update(&[run(1, 100, 7, 50)], &owners).is_empty());
        let grown = e.update(&[run(1, 100, 7, 80), run(1, 100, 8, 5)], &owners);
        assert_eq!(
            grown
                .iter()
                .map(|d| (d.intruder, d.delta_ns))
                .collect::<Vec<_>>(),
            vec![(7, 30), (8, 5)]
        );
        // A new owner of CPU 1 starts from its own zero.
        let owners = BTreeMap::from([(1, 200)]);
        assert!(e.update(&[run(1, 100, 7, 500)], &owners).is_empty());
    }

    #[test]
    fn only_a_window_settled_at_both_ends_counts() {
        let mut e = Exclusivity::default();
        assert!(
            !e.window_settled(true, 1),
            "nothing known of the window's start"
        );
        assert!(e.window_settled(true, 1));
        assert!(
            !e.window_settled(true, 2),
            "an assignment changed in between"
        );
        assert!(!e.window_settled(false, 2));
        assert!(!e.window_settled(true, 2), "not settled at the start");
        assert!(e.window_settled(true, 2));
    }
}
