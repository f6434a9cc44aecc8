//! The life of one pod worker as an explicit state machine (upstream `pod_workers.go`'s timeline:
//! syncing → terminating → terminated → finished, never backwards). [`next`] is the only place
//! that moves a worker between phases.

/// Where a pod worker is in the pod's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerPhase {
    /// SyncPod runs: the pod's containers are driven towards its spec.
    Syncing,
    /// SyncTerminatingPod runs: every container is stopped within the grace period.
    Terminating,
    /// SyncTerminatedPod runs: what the pod left behind is cleaned up.
    Terminated,
    /// Nothing left to do; the worker is forgotten once the pod is no longer desired.
    Finished,
}

/// What can move a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Deleted, evicted, orphaned, killed, or found in a terminal phase.
    TerminationRequested,
    /// SyncPod reported that the pod reached a terminal phase (every container done).
    SyncedToTerminal,
    /// SyncTerminatingPod finished: no container runs any more.
    TerminatingDone,
    /// SyncTerminatedPod finished: cleanup is done.
    TerminatedDone,
}

/// The transition function. Phases only move forward; a transition that does not apply to the
/// current phase leaves it unchanged.
pub fn next(phase: WorkerPhase, transition: Transition) -> WorkerPhase {
    use Transition::*;
    use WorkerPhase::*;
    match (phase, transition) {
        (Syncing, TerminationRequested | SyncedToTerminal) => Terminating,
        (Terminating, TerminatingDone) => Terminated,
        (Terminated, TerminatedDone) => Finished,
        (phase, _) => phase,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Transition::*;
    use WorkerPhase::*;

    #[test]
    fn phases_only_move_forward() {
        let cases = [
            (Syncing, TerminationRequested, Terminating),
            (Syncing, SyncedToTerminal, Terminating),
            (Syncing, TerminatingDone, Syncing),
            (Terminating, TerminationRequested, Terminating),
            (Terminating, TerminatingDone, Terminated),
            (Terminated, TerminatedDone, Finished),
            (Terminated, TerminationRequested, Terminated),
            (Finished, TerminationRequested, Finished),
            (Finished, SyncedToTerminal, Finished),
        ];
        for (from, transition, to) in cases {
            assert_eq!(next(from, transition), to, "{from:?} --{transition:?}-->");
        }
    }
}
