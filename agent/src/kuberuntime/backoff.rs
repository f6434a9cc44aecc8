//! Exponential back-off for container restarts (CrashLoopBackOff) and image pulls
//! (ImagePullBackOff), with the semantics of client-go's `flowcontrol.Backoff` as the kubelet uses
//! it (`doBackOff` in `kuberuntime_manager.go`, `image_manager.go`). Time is always passed in.
//!
//! The rules, as upstream:
//! - an entry starts at `initial` (10 s for both uses) and doubles on every recorded failure, up
//!   to `max` (300 s);
//! - an entry is reset to `initial` when the failure being recorded happened more than `2 * max`
//!   (10 min) after the entry was last updated: a container that ran for 10 minutes since its last
//!   restart starts over at 10 s;
//! - a container restart is held back while `now - last_finished_at < window`, where
//!   `last_finished_at` is when its newest exited instance finished (`IsInBackOffSince`); an image
//!   pull is held back while `now - last_update < window` (`IsInBackOffSinceUpdate`);
//! - entries not updated for `2 * max` are dropped by [`Backoff::gc`] (the kubelet runs it from
//!   housekeeping).
//!
//! Containers are keyed by pod UID, name and spec hash (upstream `GetStableKey` adds the pod's
//! name and namespace, which the UID already determines), so a new spec starts fresh.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Container;

use crate::container::{ContainerState, PodStatus, PodUid, container_hash};

/// The kubelet's initial container restart back-off (`initialCrashLoopBackOff`).
pub const CRASH_LOOP_INITIAL: Duration = Duration::from_secs(10);
/// The kubelet's maximum container restart back-off (`MaxCrashLoopBackOff`).
pub const CRASH_LOOP_MAX: Duration = Duration::from_secs(300);
/// The kubelet's initial image pull back-off (`imageBackOffPeriod`).
pub const IMAGE_PULL_INITIAL: Duration = Duration::from_secs(10);
/// The kubelet's maximum image pull back-off (`MaxImageBackOff`).
pub const IMAGE_PULL_MAX: Duration = Duration::from_secs(300);

/// Identifies one spec container of one pod for the crash-loop back-off.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerBackoffKey {
    pub pod_uid: PodUid,
    pub container: String,
    /// [`container_hash`] of the spec: a changed spec gets a fresh back-off.
    pub hash: u64,
}

impl ContainerBackoffKey {
    pub fn new(pod_uid: &PodUid, spec: &Container) -> Self {
        ContainerBackoffKey {
            pod_uid: pod_uid.clone(),
            container: spec.name.clone(),
            hash: container_hash(spec),
        }
    }
}

/// Identifies one image of one pod for the image pull back-off (upstream `<uid>_<image>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageBackoffKey {
    pub pod_uid: PodUid,
    pub image: String,
}

/// A start that has to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InBackoff {
    /// The current back-off period (what the kubelet prints: "back-off 20s restarting ...").
    pub window: Duration,
    /// How long until the start is allowed: when to sync the pod again.
    pub remaining: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    window: Duration,
    last_update: SystemTime,
}

/// Per-key exponential back-off.
#[derive(Clone, Debug)]
pub struct Backoff<K> {
    initial: Duration,
    max: Duration,
    entries: HashMap<K, Entry>,
}

/// The kubelet's container restart back-off.
pub type CrashLoopBackoff = Backoff<ContainerBackoffKey>;
/// The kubelet's image pull back-off.
pub type ImagePullBackoff = Backoff<ImageBackoffKey>;

impl CrashLoopBackoff {
    /// 10 s doubling up to 300 s.
    pub fn crash_loop() -> Self {
        Backoff::new(CRASH_LOOP_INITIAL, CRASH_LOOP_MAX)
    }
}

impl ImagePullBackoff {
    /// 10 s doubling up to 300 s.
    pub fn image_pull() -> Self {
        Backoff::new(IMAGE_PULL_INITIAL, IMAGE_PULL_MAX)
    }
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// A back-off starting at `initial`, doubling up to `max` (`initial` is capped at `max`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial: initial.min(max),
            max,
            entries: HashMap::new(),
        }
    }

    /// The current period for `key`, if it has one.
    pub fn window(&self, key: &K) -> Option<Duration> {
        self.entries.get(key).map(|e| e.window)
    }

    /// Whether something that failed at `since` must still wait at `now` (upstream
    /// `IsInBackOffSince`); for container restarts `since` is when the newest instance finished.
    pub fn in_backoff(&self, key: &K, since: SystemTime, now: SystemTime) -> Option<InBackoff> {
        let entry = self.live_entry(key, since)?;
        Self::waiting(entry.window, elapsed(since, now))
    }

    /// Whether `key` must still wait at `now`, counting from its last recorded failure (upstream
    /// `IsInBackOffSinceUpdate`, used for image pulls).
    pub fn in_backoff_since_update(&self, key: &K, now: SystemTime) -> Option<InBackoff> {
        let entry = self.live_entry(key, now)?;
        Self::waiting(entry.window, elapsed(entry.last_update, now))
    }

    /// Records a failure that happened at `failed_at`, observed at `now` (upstream `Next`): the
    /// first failure, or one more than `2 * max` after the last update, starts at `initial`;
    /// any other doubles the period up to `max`. Returns the new period.
    pub fn record_failure(&mut self, key: &K, failed_at: SystemTime, now: SystemTime) -> Duration {
        let (initial, max) = (self.initial, self.max);
        let expired = |e: &Entry| elapsed(e.last_update, failed_at) > max.saturating_mul(2);
        let window = match self.entries.get(key) {
            Some(entry) if !expired(entry) => entry.window.saturating_mul(2).min(max),
            _ => initial,
        };
        self.entries.insert(
            key.clone(),
            Entry {
                window,
                last_update: now,
            },
        );
        window
    }

    /// The kubelet's `doBackOff` before (re)starting a container: with no exited instance
    /// (`last_finished_at` is `None`) the start goes ahead untouched; otherwise it waits while in
    /// back-off, and else goes ahead and counts as one more failure.
    pub fn check_restart(
        &mut self,
        key: &K,
        last_finished_at: Option<SystemTime>,
        now: SystemTime,
    ) -> Result<(), InBackoff> {
        let Some(finished) = last_finished_at else {
            return Ok(());
        };
        if let Some(wait) = self.in_backoff(key, finished, now) {
            return Err(wait);
        }
        self.record_failure(key, finished, now);
        Ok(())
    }

    /// Forgets `key` (upstream `Reset`/`DeleteEntry`).
    pub fn reset(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Keeps only the keys `keep` accepts, e.g. to drop a deleted pod's entries at once.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }

    /// Drops entries not updated for more than `2 * max` (upstream `GC`).
    pub fn gc(&mut self, now: SystemTime) {
        let horizon = self.max.saturating_mul(2);
        self.entries
            .retain(|_, e| elapsed(e.last_update, now) <= horizon);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `key` unless `event` is more than `2 * max` past its last update.
    fn live_entry(&self, key: &K, event: SystemTime) -> Option<&Entry> {
        self.entries
            .get(key)
            .filter(|e| elapsed(e.last_update, event) <= self.max.saturating_mul(2))
    }

    fn waiting(window: Duration, elapsed: Duration) -> Option<InBackoff> {
        (elapsed < window).then(|| InBackoff {
            window,
            remaining: window - elapsed,
        })
    }
}

/// When the newest exited instance of `container` finished: the `since` of a restart back-off
/// (upstream `doBackOff` looks for the first exited status, newest first).
pub fn last_finished_at(status: &PodStatus, container: &str) -> Option<SystemTime> {
    status
        .instances(container)
        .find(|c| c.state == ContainerState::Exited)
        .and_then(|c| c.finished_at.or(c.started_at).or(c.created_at))
}

/// `later - earlier`, zero when `later` is not later (clocks can step).
fn elapsed(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::{container, runtime, t};

    fn key() -> ContainerBackoffKey {
        ContainerBackoffKey::new(&PodUid::from("uid-1"), &container("app"))
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn windows_double_up_to_the_maximum() {
        let mut b = CrashLoopBackoff::crash_loop();
        let k = key();
        let mut windows = Vec::new();
        // Each failure comes 5 s after the previous restart: well within 2 * max.
        for i in 0..8 {
            windows.push(b.record_failure(&k, t(i * 5), t(i * 5)).as_secs());
        }
        assert_eq!(windows, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn in_backoff_counts_from_the_exit() {
        let mut b = CrashLoopBackoff::crash_loop();
        let k = key();
        // Table: (exit time, now) -> wait, with a 10 s window recorded at t(0).
        b.record_failure(&k, t(0), t(0));
        let cases = [
            (t(0), t(0), Some(secs(10))),
            (t(0), t(9), Some(secs(1))),
            (t(0), t(10), None),
            (t(100), t(105), Some(secs(5))),
            // Exit more than 2 * max after the last update: the entry no longer applies.
            (t(601), t(602), None),
        ];
        for (since, now, want) in cases {
            assert_eq!(
                b.in_backoff(&k, since, now).map(|w| w.remaining),
                want,
                "{since:?} {now:?}"
            );
        }
        assert_eq!(b.in_backoff(&key(), t(0), t(1)).unwrap().window, secs(10));
        let other = ContainerBackoffKey::new(&PodUid::from("uid-2"), &container("app"));
        assert_eq!(b.in_backoff(&other, t(0), t(1)), None);
    }

    #[test]
    fn a_container_that_ran_for_ten_minutes_starts_over() {
        let mut b = CrashLoopBackoff::crash_loop();
        let k = key();
        for i in 0..5 {
            b.record_failure(&k, t(i), t(i));
        }
        assert_eq!(b.window(&k), Some(secs(160)));
        // Restarted at t(4); fails at t(4 + 600): exactly 2 * max, not more: keeps doubling.
        assert_eq!(b.record_failure(&k, t(604), t(604)), secs(300));
        // Restarted at t(604); fails 601 s later: reset.
        assert_eq!(b.record_failure(&k, t(1205), t(1205)), secs(10));
    }

    #[test]
    fn check_restart_is_do_backoff() {
        let mut b = CrashLoopBackoff::crash_loop();
        let k = key();
        // Never exited: start, no entry.
        assert_eq!(b.check_restart(&k, None, t(0)), Ok(()));
        assert!(b.is_empty());
        // First exit: restart at once, window 10 s from now on.
        assert_eq!(b.check_restart(&k, Some(t(1)), t(2)), Ok(()));
        assert_eq!(b.window(&k), Some(secs(10)));
        // It exits again at t(3): held back until t(13).
        let held = b.check_restart(&k, Some(t(3)), t(4)).unwrap_err();
        assert_eq!(
            held,
            InBackoff {
                window: secs(10),
                remaining: secs(9)
            }
        );
        // At t(13) it may go; the window doubles.
        assert_eq!(b.check_restart(&k, Some(t(3)), t(13)), Ok(()));
        assert_eq!(b.window(&k), Some(secs(20)));
        // A new spec hash is a new key.
        let mut v2 = container("app");
        v2.args = Some(vec!["x".into()]);
        let k2 = ContainerBackoffKey::new(&PodUid::from("uid-1"), &v2);
        assert_eq!(b.check_restart(&k2, Some(t(14)), t(14)), Ok(()));
        assert_eq!(b.window(&k2), Some(secs(10)));
    }

    #[test]
    fn image_pulls_count_from_the_last_failure() {
        let mut b = ImagePullBackoff::image_pull();
        let k = ImageBackoffKey {
            pod_uid: PodUid::from("uid-1"),
            image: "busybox".into(),
        };
        assert_eq!(b.in_backoff_since_update(&k, t(0)), None);
        b.record_failure(&k, t(0), t(0));
        assert_eq!(
            b.in_backoff_since_update(&k, t(4)).unwrap().remaining,
            secs(6)
        );
        assert_eq!(b.in_backoff_since_update(&k, t(10)), None);
        b.record_failure(&k, t(10), t(10));
        assert_eq!(
            b.in_backoff_since_update(&k, t(29)).unwrap().window,
            secs(20)
        );
    }

    #[test]
    fn gc_and_retain_drop_entries() {
        let mut b = CrashLoopBackoff::crash_loop();
        let old = key();
        let young = ContainerBackoffKey::new(&PodUid::from("uid-2"), &container("app"));
        b.record_failure(&old, t(0), t(0));
        b.record_failure(&young, t(500), t(500));
        b.gc(t(600));
        assert_eq!(b.len(), 2);
        b.gc(t(601));
        assert_eq!(b.window(&old), None);
        assert!(b.window(&young).is_some());
        b.retain(|k| k.pod_uid.0 != "uid-2");
        assert!(b.is_empty());
    }

    #[test]
    fn last_finished_at_is_the_newest_exit() {
        let app = container("app");
        let st = runtime()
            .ready_sandbox()
            .exited(&app, 1)
            .exited(&app, 2)
            .running(&app)
            .build();
        // The newest exited instance is the second one (created at t(30), finished 5 s later).
        assert_eq!(last_finished_at(&st, "app"), Some(t(35)));
        assert_eq!(last_finished_at(&st, "other"), None);
    }
}
