//! `activeDeadlineSeconds` (upstream `activeDeadlineHandler` in `active_deadline.go`, and the
//! `ShouldSync` / `ShouldEvict` uses of it in `kubelet.go`'s `getPodsToSync` and
//! `generateAPIPodStatus`): a pod active on the node longer than its deadline, counted from
//! `status.startTime`, is failed with reason `DeadlineExceeded` and killed.
//!
//! Upstream finds such pods by looking at every pod on each sync tick. Here each pod with a
//! deadline has one timer at the exact instant ([`DeadlineTimers`]), set by its sync (which knows
//! its start time and spec, so an API update that shortens the deadline moves the timer),
//! cancelled when the pod's worker finishes; when it fires, the sync loop syncs the pod, and that
//! sync's status generation ([`past_active_deadline`]) fails it.
//!
//! Not here: the kill (the pod worker terminates a pod whose status is terminal).

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use tokio::{sync::mpsc, task::JoinHandle};

use crate::{container::PodUid, lock::MutexExt as _};

/// Upstream's reason for the pod's status and the event.
pub const REASON: &str = crate::events::reasons::DEADLINE_EXCEEDED;
/// Upstream's message.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// When the pod's deadline falls: its start time plus `activeDeadlineSeconds`; `None` without
/// either (upstream: no deadline, or not started).
pub fn deadline(pod: &Pod, start: Option<SystemTime>) -> Option<SystemTime> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    // The API accepts only positive values; a negative one from a static file is past at once.
    let allowed = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    Some(start? + allowed)
}

/// Upstream `pastActiveDeadline`: the pod has been active at least its deadline at `now`.
pub fn past_active_deadline(pod: &Pod, start: Option<SystemTime>, now: SystemTime) -> bool {
    deadline(pod, start).is_some_and(|at| now >= at)
}

/// One timer per pod that has a deadline; each sends the pod's UID once, at its deadline.
///
/// The channel is unbounded because what it holds is bounded otherwise: a timer sends once and
/// there is at most one timer per pod on the node.
pub struct DeadlineTimers {
    timers: Mutex<HashMap<PodUid, Timer>>,
    fired: mpsc::UnboundedSender<PodUid>,
}

struct Timer {
    at: SystemTime,
    task: JoinHandle<()>,
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DeadlineTimers {
    /// The timers, and where their pods come out when due.
    pub fn new() -> (DeadlineTimers, mpsc::UnboundedReceiver<PodUid>) {
        let (fired, rx) = mpsc::unbounded_channel();
        let timers = DeadlineTimers {
            timers: Mutex::new(HashMap::new()),
            fired,
        };
        (timers, rx)
    }

    /// Makes `at` the pod's deadline (`None`: it has none): a timer already set for that instant
    /// stays, any other is replaced. `now` is the clock the deadline is measured on.
    pub fn set(&self, uid: &PodUid, at: Option<SystemTime>, now: SystemTime) {
        let mut timers = self.timers.lock_unpoisoned();
        let Some(at) = at else {
            timers.remove(uid);
            return;
        };
        // A timer that fired for the same instant is set again: the sync it caused found the
        // pod not past it yet (the wall clock went back since).
        if timers
            .get(uid)
            .is_some_and(|t| t.at == at && !t.task.is_finished())
        {
            return;
        }
        let wait = at.duration_since(now).unwrap_or(Duration::ZERO);
        let fired = self.fired.clone();
        let pod = uid.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            // The receiver is gone only when the agent shuts down.
            let _ = fired.send(pod);
        });
        timers.insert(uid.clone(), Timer { at, task });
    }

    /// Forgets the pod's timer (its worker finished).
    pub fn cancel(&self, uid: &PodUid) {
        self.timers.lock_unpoisoned().remove(uid);
    }

    /// The deadline set for the pod.
    pub fn get(&self, uid: &PodUid) -> Option<SystemTime> {
        self.timers.lock_unpoisoned().get(uid).map(|t| t.at)
    }

    /// How many pods have a timer.
    pub fn count(&self) -> usize {
        self.timers.lock_unpoisoned().len()
    }
}

#[cfg(test)]
mod tests;
