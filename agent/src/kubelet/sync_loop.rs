//! The sync loop (upstream `syncLoop`/`syncLoopIteration`): it only dispatches. It selects over
//! source updates, PLEG events, probe result changes, pods whose active deadline came (each
//! at its instant, `active_deadline.rs`), a 1 s tick for pods whose resync is due, and housekeeping every
//! 2 s once the sources have sent their first state. It counts the source updates it receives,
//! so each addition knows whether the sources' first sets are complete at that update: admission
//! releases the CPUs of pods no longer wanted only then (the start-up order in ARCHITECTURE.md).
//!
//! Each iteration's handling runs between [`SyncLoopMonitor::begin`] and
//! [`SyncLoopMonitor::end`], so the `syncloop` health check can tell a wedged iteration from a
//! loop that is idle because nothing happened (the loop is event-driven; upstream's, woken every
//! second, never idles).

use crate::lock::MutexExt as _;
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Kubelet;
use crate::{
    container::PodUid,
    pleg::PodLifecycleEvent,
    prober::ProbeUpdate,
    sources::{PodUpdate, SourcesReady},
};

/// Upstream `housekeepingPeriod`.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// The sync tick.
pub const SYNC_TICK: Duration = Duration::from_secs(1);
/// The floor of the `syncloop` health check's threshold (upstream's `minDuration`).
pub const MIN_WEDGED_AFTER: Duration = Duration::from_secs(5 * 60);
/// The `syncloop` check's failure, as upstream words it.
pub const WEDGED_MESSAGE: &str = "sync Loop took longer than expected";

/// When the iteration in progress began, for the `syncloop` health check. Upstream's
/// `syncLoopMonitor` holds the time of the last entry and exit alike; here it is cleared at the
/// end of an iteration, because an idle event-driven loop is healthy however long it waits.
#[derive(Clone)]
pub struct SyncLoopMonitor {
    began: Arc<Mutex<Option<Instant>>>,
    now: Arc<dyn Fn() -> Instant + Send + Sync>,
}

impl Default for SyncLoopMonitor {
    fn default() -> Self {
        Self::with_clock(Arc::new(Instant::now))
    }
}

impl SyncLoopMonitor {
    /// A monitor reading the monotonic time from `now` (tests pin it).
    pub fn with_clock(now: Arc<dyn Fn() -> Instant + Send + Sync>) -> Self {
        Self {
            began: Arc::new(Mutex::new(None)),
            now,
        }
    }

    pub fn begin(&self) {
        *self.began.lock_unpoisoned() = Some((self.now)());
    }

    pub fn end(&self) {
        *self.began.lock_unpoisoned() = None;
    }

    /// Upstream `SyncLoopHealthCheck` (pkg/kubelet/kubelet.go): unhealthy once the iteration in
    /// progress has run past `threshold`; `None` when healthy.
    pub fn check(&self, threshold: Duration) -> Option<String> {
        let began = (*self.began.lock_unpoisoned())?;
        ((self.now)().saturating_duration_since(began) > threshold)
            .then(|| WEDGED_MESSAGE.to_owned())
    }
}

/// Upstream's threshold: twice the resync interval (`syncFrequency`), at least five minutes.
pub fn wedged_after(sync_frequency: Duration) -> Duration {
    sync_frequency.saturating_mul(2).max(MIN_WEDGED_AFTER)
}

/// What woke the loop: one iteration's work.
#[expect(
    clippy::large_enum_variant,
    reason = "one value per iteration, moved once from the select to its handler: boxing the \
              PLEG event would add an allocation per event for nothing"
)]
enum Work {
    Update(PodUpdate),
    SourcesClosed,
    Pleg(PodLifecycleEvent),
    Probe(ProbeUpdate),
    Deadline(PodUid),
    Due,
    Housekeeping,
}

/// Where the loop's work comes from, besides its own ticks.
pub struct Inputs {
    /// Pod additions, updates and removals from the sources.
    pub updates: mpsc::Receiver<PodUpdate>,
    pub pleg: mpsc::Receiver<PodLifecycleEvent>,
    pub probes: mpsc::UnboundedReceiver<ProbeUpdate>,
    /// Pods whose `activeDeadlineSeconds` has come.
    pub deadlines: mpsc::UnboundedReceiver<PodUid>,
}

pub async fn run(
    kubelet: Arc<Kubelet>,
    inputs: Inputs,
    sources_ready: SourcesReady,
    monitor: SyncLoopMonitor,
    shutdown: CancellationToken,
) {
    let Inputs {
        mut updates,
        mut pleg,
        mut probes,
        mut deadlines,
    } = inputs;
    let mut sync_tick = tokio::time::interval(SYNC_TICK);
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
    sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // With no pod source configured the merge ends at once; the loop goes on for the rest
    // (orphans in the runtime are still cleaned up).
    let mut sources_open = true;
    let mut received: u64 = 0;
    loop {
        let work = tokio::select! {
            update = updates.recv(), if sources_open => match update {
                Some(update) => Work::Update(update),
                None => Work::SourcesClosed,
            },
            Some(event) = pleg.recv() => Work::Pleg(event),
            Some(update) = probes.recv() => Work::Probe(update),
            Some(uid) = deadlines.recv() => Work::Deadline(uid),
            _ = sync_tick.tick() => Work::Due,
            _ = housekeeping.tick() => Work::Housekeeping,
            () = shutdown.cancelled() => return,
        };
        monitor.begin();
        match work {
            Work::Update(update) => {
                received += 1;
                kubelet.handle_update(update, sources_ready.complete_within(received));
            }
            Work::SourcesClosed => sources_open = false,
            Work::Pleg(event) => kubelet.handle_pleg_event(&event),
            Work::Probe(update) => kubelet.handle_probe_update(&update),
            Work::Deadline(uid) => kubelet.handle_active_deadline(&uid),
            Work::Due => kubelet.handle_due(Instant::now()),
            Work::Housekeeping => {
                // Until every source has spoken, a pod missing from them may just not be listed yet.
                if sources_ready.all_ready() {
                    kubelet.housekeeping().await;
                }
            }
        }
        monitor.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_twice_the_resync_and_at_least_five_minutes() {
        assert_eq!(wedged_after(Duration::from_secs(60)), MIN_WEDGED_AFTER);
        assert_eq!(wedged_after(Duration::ZERO), MIN_WEDGED_AFTER);
        assert_eq!(
            wedged_after(Duration::from_secs(200)),
            Duration::from_secs(400)
        );
        assert_eq!(wedged_after(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn only_an_iteration_running_past_the_threshold_is_wedged() {
        let start = Instant::now();
        let offset = Arc::new(Mutex::new(Duration::ZERO));
        let read = offset.clone();
        let monitor =
            SyncLoopMonitor::with_clock(Arc::new(move || start + *read.lock_unpoisoned()));
        let threshold = wedged_after(Duration::from_secs(60));
        let advance = |by: Duration| *offset.lock_unpoisoned() += by;

        // Idle for far longer than the threshold: healthy (nothing is in progress).
        advance(threshold * 3);
        assert_eq!(monitor.check(threshold), None);

        monitor.begin();
        advance(threshold);
        assert_eq!(
            monitor.check(threshold),
            None,
            "at the threshold, not past it"
        );
        advance(Duration::from_secs(1));
        assert_eq!(monitor.check(threshold).as_deref(), Some(WEDGED_MESSAGE));

        // The iteration ends: healthy again, and the next one starts its own count.
        monitor.end();
        assert_eq!(monitor.check(threshold), None);
        monitor.begin();
        advance(threshold / 2);
        assert_eq!(monitor.check(threshold), None);
    }
}
