//! The sync loop (upstream `syncLoop`/`syncLoopIteration`): it only dispatches. It selects over
//! source updates, PLEG events, probe result changes, pods whose active deadline came (each
//! at its instant, `active_deadline.rs`), a 1 s tick for pods whose resync is due, and housekeeping every
//! 2 s once the sources have sent their first state. It counts the source updates it receives,
//! so each addition knows whether the sources' first sets are complete at that update: admission
//! releases the CPUs of pods no longer wanted only then (the start-up order in ARCHITECTURE.md).

use std::{sync::Arc, time::Duration};

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

pub async fn run(
    kubelet: Arc<Kubelet>,
    mut updates: mpsc::Receiver<PodUpdate>,
    mut pleg: mpsc::Receiver<PodLifecycleEvent>,
    mut probes: mpsc::UnboundedReceiver<ProbeUpdate>,
    mut deadlines: mpsc::UnboundedReceiver<PodUid>,
    sources_ready: SourcesReady,
    shutdown: CancellationToken,
) {
    let mut sync_tick = tokio::time::interval(SYNC_TICK);
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
    sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // With no pod source configured the merge ends at once; the loop goes on for the rest
    // (orphans in the runtime are still cleaned up).
    let mut sources_open = true;
    let mut received: u64 = 0;
    loop {
        tokio::select! {
            update = updates.recv(), if sources_open => match update {
                Some(update) => {
                    received += 1;
                    kubelet.handle_update(update, sources_ready.complete_within(received));
                }
                None => sources_open = false,
            },
            Some(event) = pleg.recv() => kubelet.handle_pleg_event(&event),
            Some(update) = probes.recv() => kubelet.handle_probe_update(&update),
            Some(uid) = deadlines.recv() => kubelet.handle_active_deadline(&uid),
            _ = sync_tick.tick() => kubelet.handle_due(std::time::Instant::now()),
            _ = housekeeping.tick() => {
                // Until every source has spoken, a pod missing from them may just not be listed yet.
                if sources_ready.all_ready() {
                    kubelet.housekeeping().await;
                }
            }
            () = shutdown.cancelled() => return,
        }
    }
}
