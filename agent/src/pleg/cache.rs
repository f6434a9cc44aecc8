//! The pod status cache (upstream `kubecontainer.Cache`): the newest runtime status of every pod,
//! each stamped with when it was observed, and a way for a pod worker to wait until the cache holds
//! a status newer than its last action — so a worker never decides on a status older than what it
//! did itself.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use tokio::sync::watch;

use crate::container::{PodStatus, PodUid};
use crate::lock::MutexExt as _;

#[derive(Clone, Debug)]
struct Entry {
    status: Option<PodStatus>,
    error: Option<String>,
    modified: SystemTime,
}

pub struct PodCache {
    entries: Mutex<HashMap<PodUid, Entry>>,
    /// Every status in the cache is at least this fresh (set after each full relist).
    global: Mutex<SystemTime>,
    /// Bumped on every change, so waiters re-check.
    changed: watch::Sender<u64>,
}

impl Default for PodCache {
    fn default() -> Self {
        PodCache {
            entries: Mutex::new(HashMap::new()),
            global: Mutex::new(SystemTime::UNIX_EPOCH),
            changed: watch::Sender::new(0),
        }
    }
}

/// What `get` returns: a status (or the error that prevented one) and when it was observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Cached {
    pub status: Option<PodStatus>,
    pub error: Option<String>,
    pub timestamp: SystemTime,
}

impl PodCache {
    pub fn set(&self, uid: &PodUid, status: PodStatus, observed: SystemTime) {
        self.put(uid, Some(status), None, observed);
    }

    pub fn set_error(&self, uid: &PodUid, error: String, observed: SystemTime) {
        self.put(uid, None, Some(error), observed);
    }

    fn put(&self, uid: &PodUid, status: Option<PodStatus>, error: Option<String>, at: SystemTime) {
        let mut entries = lock(&self.entries);
        // Never let an older observation overwrite a newer one.
        if entries.get(uid).is_some_and(|e| e.modified > at) {
            return;
        }
        entries.insert(
            uid.clone(),
            Entry {
                status,
                error,
                modified: at,
            },
        );
        drop(entries);
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn delete(&self, uid: &PodUid) {
        lock(&self.entries).remove(uid);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Marks every entry as at least as fresh as `at` (the time a full relist started).
    pub fn update_time(&self, at: SystemTime) {
        let mut global = lock(&self.global);
        if at > *global {
            *global = at;
        }
        drop(global);
        self.changed.send_modify(|n| *n += 1);
    }

    /// The cached status, or an empty one (timestamped with the global time) if the runtime has
    /// nothing for this pod.
    /// When the pod's own entry (status or error) was observed, if it has one.
    pub fn observed_at(&self, uid: &PodUid) -> Option<SystemTime> {
        lock(&self.entries).get(uid).map(|e| e.modified)
    }

    pub fn get(&self, uid: &PodUid) -> Cached {
        let global = *lock(&self.global);
        match lock(&self.entries).get(uid) {
            Some(e) => Cached {
                status: e.status.clone(),
                error: e.error.clone(),
                timestamp: e.modified.max(global),
            },
            None => Cached {
                status: None,
                error: None,
                timestamp: global,
            },
        }
    }

    /// Waits until the cache holds a status of `uid` observed after `min`, or `limit` passes (then
    /// returns what it has, so a stuck runtime cannot stop a worker forever).
    pub async fn get_newer_than(&self, uid: &PodUid, min: SystemTime, limit: Duration) -> Cached {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let cached = self.get(uid);
            if cached.timestamp > min {
                return cached;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return cached,
            }
        }
    }

    pub fn pods(&self) -> Vec<PodUid> {
        lock(&self.entries).keys().cloned().collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_unpoisoned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn status(uid: &str) -> PodStatus {
        PodStatus::empty(PodUid::from(uid), "p", "default")
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn older_observations_never_overwrite_newer_ones() {
        let cache = PodCache::default();
        let uid = PodUid::from("a");
        cache.set(&uid, status("a"), at(10));
        cache.set_error(&uid, "late".into(), at(5));
        let got = cache.get(&uid);
        assert_eq!(got.timestamp, at(10));
        assert!(got.error.is_none());
    }

    #[test]
    fn the_global_time_freshens_unknown_and_known_pods() {
        let cache = PodCache::default();
        cache.set(&PodUid::from("a"), status("a"), at(10));
        cache.update_time(at(20));
        assert_eq!(cache.get(&PodUid::from("a")).timestamp, at(20));
        let unknown = cache.get(&PodUid::from("zzz"));
        assert_eq!((unknown.status, unknown.timestamp), (None, at(20)));
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_a_newer_status_arrives() {
        let cache = Arc::new(PodCache::default());
        let uid = PodUid::from("a");
        cache.set(&uid, status("a"), at(10));
        let waiter = {
            let cache = cache.clone();
            let uid = uid.clone();
            tokio::spawn(async move {
                cache
                    .get_newer_than(&uid, at(10), Duration::from_secs(60))
                    .await
            })
        };
        tokio::task::yield_now().await;
        cache.set(&uid, status("a"), at(11));
        let got = waiter.await.expect("joined");
        assert_eq!(got.timestamp, at(11));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_at_its_limit_with_what_there_is() {
        let cache = PodCache::default();
        let uid = PodUid::from("a");
        cache.set(&uid, status("a"), at(10));
        let got = cache
            .get_newer_than(&uid, at(10), Duration::from_secs(5))
            .await;
        assert_eq!(got.timestamp, at(10));
    }
}
