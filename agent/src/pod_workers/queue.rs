//! The work queue of pods due for a sync: after a successful sync at the resync interval, after a
//! failure at the back-off period (upstream `pkg/kubelet/util/queue`). The sync loop's one-second
//! tick drains what is due.

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::container::PodUid;

#[derive(Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<PodUid, Instant>>,
}

impl WorkQueue {
    /// Queues `uid` for `after` from `now`; an earlier due time already queued wins.
    pub fn enqueue(&self, uid: &PodUid, now: Instant, after: Duration) {
        let at = now + after;
        let mut due = self.due.lock_unpoisoned();
        due.entry(uid.clone())
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }

    /// Removes and returns every pod due at `now`.
    pub fn take_due(&self, now: Instant) -> Vec<PodUid> {
        let mut due = self.due.lock_unpoisoned();
        let ready: Vec<PodUid> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &ready {
            due.remove(uid);
        }
        ready
    }

    pub fn forget(&self, uid: &PodUid) {
        self.due.lock_unpoisoned().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_due_pods_come_out_and_the_earliest_time_wins() {
        let q = WorkQueue::default();
        let t0 = Instant::now();
        q.enqueue(&PodUid::from("a"), t0, Duration::from_secs(60));
        q.enqueue(&PodUid::from("a"), t0, Duration::from_secs(10));
        q.enqueue(&PodUid::from("b"), t0, Duration::from_secs(30));
        assert!(q.take_due(t0).is_empty());
        assert_eq!(
            q.take_due(t0 + Duration::from_secs(10)),
            vec![PodUid::from("a")]
        );
        assert!(q.take_due(t0 + Duration::from_secs(20)).is_empty());
        assert_eq!(
            q.take_due(t0 + Duration::from_secs(30)),
            vec![PodUid::from("b")]
        );
    }
}
