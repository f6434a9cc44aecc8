//! The shutdown's priority groups and each pod's grace (upstream `nodeshutdown_manager.go`:
//! `migrateConfig`, `groupByPriority`, `periodRequested`, and the override in `killPods`). Pure.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;

/// Upstream `scheduling.DefaultPriorityWhenNoDefaultClassExists`: the regular pods' group.
pub const DEFAULT_PRIORITY: i32 = 0;
/// Upstream `scheduling.SystemCriticalPriority`: the critical pods' group.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One row of `shutdownGracePeriodByPodPriority`: pods of at least `priority` (below the next
/// row's) get `grace_seconds`, and the shutdown waits that long for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityGrace {
    pub priority: i32,
    pub grace_seconds: i64,
}

/// The graceful shutdown asked for, validated: the rows sorted from the lowest priority up.
/// No rows: the node shuts down without waiting for pods (upstream's `managerStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownConfig {
    pub by_priority: Vec<PriorityGrace>,
}

impl ShutdownConfig {
    /// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as two rows (upstream
    /// `migrateConfig`): the regular pods get the difference, the critical ones the rest.
    pub fn from_periods(total: Duration, critical: Duration) -> ShutdownConfig {
        if total.is_zero() || critical > total {
            return ShutdownConfig::default();
        }
        let regular = total - critical;
        ShutdownConfig::from_rows(vec![
            PriorityGrace {
                priority: DEFAULT_PRIORITY,
                grace_seconds: whole_seconds(regular),
            },
            PriorityGrace {
                priority: SYSTEM_CRITICAL_PRIORITY,
                grace_seconds: whole_seconds(critical),
            },
        ])
    }

    /// `shutdownGracePeriodByPodPriority`, sorted by priority.
    pub fn from_rows(mut rows: Vec<PriorityGrace>) -> ShutdownConfig {
        rows.sort_by_key(|r| r.priority);
        ShutdownConfig { by_priority: rows }
    }

    pub fn is_enabled(&self) -> bool {
        !self.by_priority.is_empty()
    }

    /// The whole shutdown's length: what logind's `InhibitDelayMaxSec` must allow (upstream
    /// `periodRequested`).
    pub fn period_requested(&self) -> Duration {
        let secs: i64 = self
            .by_priority
            .iter()
            .map(|r| r.grace_seconds.max(0))
            .sum();
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }
}

/// Go's `int64(d / time.Second)`: whole seconds, truncated.
fn whole_seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The pods of one row, killed together.
#[derive(Clone, Debug)]
pub struct ShutdownGroup {
    pub priority: i32,
    pub grace_seconds: i64,
    pub pods: Vec<Arc<Pod>>,
}

/// A pod's priority (upstream reads `spec.priority`, 0 when unset).
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pods by row, lowest priority first (upstream `groupByPriority`): a pod goes to the row
/// with the highest priority not above its own; below the lowest row, to the lowest; above the
/// highest, to the highest. Every row is returned, empty ones too.
pub fn group_by_priority(config: &ShutdownConfig, pods: Vec<Arc<Pod>>) -> Vec<ShutdownGroup> {
    let mut groups: Vec<ShutdownGroup> = config
        .by_priority
        .iter()
        .map(|r| ShutdownGroup {
            priority: r.priority,
            grace_seconds: r.grace_seconds,
            pods: Vec::new(),
        })
        .collect();
    if groups.is_empty() {
        return groups;
    }
    for pod in pods {
        let priority = pod_priority(&pod);
        // The first row at or above the pod's priority, then one down unless it is exactly it.
        let mut index = groups.partition_point(|g| g.priority < priority);
        if index == groups.len() {
            index = groups.len() - 1;
        } else if index > 0 && groups[index].priority > priority {
            index -= 1;
        }
        groups[index].pods.push(pod);
    }
    groups
}

/// The grace a pod is killed with in a group of `group_seconds`: its own
/// `terminationGracePeriodSeconds` when that is not longer (upstream `killPods`).
pub fn pod_grace(pod: &Pod, group_seconds: i64) -> i64 {
    match pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        Some(own) if own <= group_seconds => own,
        _ => group_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::nodeshutdown::tests::pod;

    fn row(priority: i32, grace_seconds: i64) -> PriorityGrace {
        PriorityGrace {
            priority,
            grace_seconds,
        }
    }

    #[test]
    fn the_pair_becomes_a_regular_and_a_critical_row() {
        let s = Duration::from_secs;
        let cases = [
            // (total, critical, rows)
            (
                s(30),
                s(10),
                vec![row(0, 20), row(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            (
                s(30),
                s(0),
                vec![row(0, 30), row(SYSTEM_CRITICAL_PRIORITY, 0)],
            ),
            (
                s(10),
                s(10),
                vec![row(0, 0), row(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            // Fractions are truncated as Go's integer division truncates.
            (
                Duration::from_millis(30_900),
                Duration::from_millis(10_500),
                vec![row(0, 20), row(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            (s(0), s(0), vec![]),
            (s(5), s(10), vec![]),
        ];
        for (total, critical, rows) in cases {
            let config = ShutdownConfig::from_periods(total, critical);
            assert_eq!(config.by_priority, rows, "{total:?} {critical:?}");
            assert_eq!(config.is_enabled(), !rows.is_empty());
        }
        assert_eq!(
            ShutdownConfig::from_periods(s(30), s(10)).period_requested(),
            s(30)
        );
    }

    #[test]
    fn rows_are_sorted_and_their_sum_is_the_period() {
        let config = ShutdownConfig::from_rows(vec![row(100_000, 10), row(0, 5), row(1000, 20)]);
        assert_eq!(
            config
                .by_priority
                .iter()
                .map(|r| r.priority)
                .collect::<Vec<_>>(),
            [0, 1000, 100_000]
        );
        assert_eq!(config.period_requested(), Duration::from_secs(35));
    }

    #[test]
    fn pods_go_to_the_highest_row_not_above_their_priority() {
        // Upstream's test table (TestGroupByPriority) in spirit: rows at 1, 10, 100.
        let config = ShutdownConfig::from_rows(vec![row(1, 10), row(10, 20), row(100, 30)]);
        let cases: [(Option<i32>, i32); 8] = [
            (None, 1),      // unset is 0: below the lowest row, so the lowest
            (Some(-5), 1),  // below the lowest
            (Some(1), 1),   // exactly a row
            (Some(5), 1),   // between rows: the lower
            (Some(10), 10), // exactly
            (Some(99), 10), // between
            (Some(100), 100),
            (Some(SYSTEM_CRITICAL_PRIORITY), 100), // above the highest: the highest
        ];
        for (priority, row_priority) in cases {
            let groups = group_by_priority(&config, vec![pod("p", priority, None)]);
            assert_eq!(groups.len(), 3, "every row is returned");
            let holding: Vec<i32> = groups
                .iter()
                .filter(|g| !g.pods.is_empty())
                .map(|g| g.priority)
                .collect();
            assert_eq!(holding, [row_priority], "priority {priority:?}");
        }
    }

    #[test]
    fn the_pair_puts_critical_pods_last() {
        let config = ShutdownConfig::from_periods(Duration::from_secs(30), Duration::from_secs(10));
        let pods = vec![
            pod("node-critical", Some(2_000_001_000), None),
            pod("web", None, None),
            pod("cluster-critical", Some(SYSTEM_CRITICAL_PRIORITY), None),
            pod("batch", Some(1000), None),
        ];
        let groups = group_by_priority(&config, pods);
        let names = |g: &ShutdownGroup| {
            g.pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(groups[0].grace_seconds, 20);
        assert_eq!(names(&groups[0]), ["web", "batch"]);
        assert_eq!(groups[1].grace_seconds, 10);
        assert_eq!(names(&groups[1]), ["node-critical", "cluster-critical"]);
    }

    #[test]
    fn no_rows_no_groups() {
        assert!(
            group_by_priority(&ShutdownConfig::default(), vec![pod("p", None, None)]).is_empty()
        );
    }

    #[test]
    fn a_pods_own_shorter_grace_wins() {
        let cases = [
            (None, 20, 20),
            (Some(5), 20, 5),
            (Some(20), 20, 20),
            (Some(30), 20, 20),
            (Some(0), 20, 0),
        ];
        for (own, group, expected) in cases {
            assert_eq!(
                pod_grace(&pod("p", None, own), group),
                expected,
                "{own:?} {group}"
            );
        }
    }
}
