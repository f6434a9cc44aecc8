//! The shutdown manager's states and its one transition function: what holding the inhibitor
//! lock, admitting pods and killing them follow from. Upstream keeps the same facts as
//! `nodeShuttingDownNow` and `inhibitLock` in `nodeshutdown_manager_linux.go`'s event loop:
//!
//! ```text
//!  Disconnected{false} ──Connected──▶ Armed ──Prepare(true)──▶ ShuttingDown ──PodsKilled──▶ Released
//!        ▲                             ▲  │ Prepare(false): lock taken again    Prepare(false) │
//!        └──────────Lost───────────────┘  └◀────────────────────────────────────────────────────┘
//!  Released ──Lost──▶ Disconnected{true} ──Connected──▶ Released (no new lock: the shutdown is on)
//! ```

/// Where the manager is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No connection to logind (starting, or the bus went away and a new connection is being
    /// made); `shutting_down` remembers whether the node was past a `PrepareForShutdown(true)`.
    Disconnected { shutting_down: bool },
    /// The delay lock is held, `PrepareForShutdown` is watched, pods are admitted.
    Armed,
    /// The shutdown was announced: pods are killed group by group, none is admitted.
    ShuttingDown,
    /// The pods are done and the lock released: the node may power off. None is admitted.
    Released,
}

impl Phase {
    pub const START: Phase = Phase::Disconnected {
        shutting_down: false,
    };

    /// Whether the node is shutting down (admission and the Ready condition read this).
    pub fn shutting_down(self) -> bool {
        match self {
            Phase::Disconnected { shutting_down } => shutting_down,
            Phase::Armed => false,
            Phase::ShuttingDown | Phase::Released => true,
        }
    }
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// logind answers and its delay allows the grace period; `PrepareForShutdown` is watched.
    Connected,
    /// logind's `PrepareForShutdown(start)`.
    PrepareForShutdown(bool),
    /// Every group was killed or ran out of its time.
    PodsKilled,
    /// The connection to the bus ended.
    Lost,
}

/// What the manager does, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Takes a new delay lock; an older one is released once the new one is held.
    TakeLock,
    /// Closes the lock's fd: logind goes on with the shutdown.
    ReleaseLock,
    /// Publishes [`Phase::shutting_down`] to admission and the Ready condition.
    PublishState,
    /// Reports the node's status at once (upstream `syncNodeStatus`).
    SyncNodeStatus,
    /// A Node event: the shutdown (`true`) or its cancellation (`false`) was seen.
    RecordEvent(bool),
    /// Kills the active pods by priority group; [`Input::PodsKilled`] follows.
    KillPods,
}

/// The one transition function.
pub fn transition(phase: Phase, input: Input) -> (Phase, Vec<Action>) {
    use Action::*;
    match (phase, input) {
        (Phase::Disconnected { shutting_down }, Input::Connected) => {
            if shutting_down {
                // A shutdown already processed: a new lock would only hold it back again.
                (Phase::Released, vec![])
            } else {
                (Phase::Armed, vec![TakeLock])
            }
        }
        (Phase::Armed | Phase::Released, Input::PrepareForShutdown(true)) => (
            Phase::ShuttingDown,
            vec![RecordEvent(true), PublishState, SyncNodeStatus, KillPods],
        ),
        (Phase::Armed | Phase::Released, Input::PrepareForShutdown(false)) => (
            Phase::Armed,
            vec![RecordEvent(false), PublishState, SyncNodeStatus, TakeLock],
        ),
        (Phase::ShuttingDown, Input::PodsKilled) => (Phase::Released, vec![ReleaseLock]),
        // The lock is a pipe to logind, not part of the connection: it stays held (or released)
        // until the next connection takes a new one.
        (phase, Input::Lost) => (
            Phase::Disconnected {
                shutting_down: phase.shutting_down(),
            },
            vec![],
        ),
        // Killing runs inside the loop, so nothing else arrives meanwhile; signals without a
        // connection cannot arrive. Anything else changes nothing.
        (phase, _) => (phase, vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::{Action::*, *};

    #[test]
    fn the_transition_table() {
        let cases: &[(Phase, Input, Phase, &[Action])] = &[
            (Phase::START, Input::Connected, Phase::Armed, &[TakeLock]),
            (
                Phase::Armed,
                Input::PrepareForShutdown(true),
                Phase::ShuttingDown,
                &[RecordEvent(true), PublishState, SyncNodeStatus, KillPods],
            ),
            (
                Phase::ShuttingDown,
                Input::PodsKilled,
                Phase::Released,
                &[ReleaseLock],
            ),
            (
                Phase::Released,
                Input::PrepareForShutdown(false),
                Phase::Armed,
                &[RecordEvent(false), PublishState, SyncNodeStatus, TakeLock],
            ),
            // Upstream takes the lock again on any cancellation.
            (
                Phase::Armed,
                Input::PrepareForShutdown(false),
                Phase::Armed,
                &[RecordEvent(false), PublishState, SyncNodeStatus, TakeLock],
            ),
            // A second shutdown after a cancelled one's kill: the active pods are killed again.
            (
                Phase::Released,
                Input::PrepareForShutdown(true),
                Phase::ShuttingDown,
                &[RecordEvent(true), PublishState, SyncNodeStatus, KillPods],
            ),
            (
                Phase::Armed,
                Input::Lost,
                Phase::Disconnected {
                    shutting_down: false,
                },
                &[],
            ),
            (
                Phase::Released,
                Input::Lost,
                Phase::Disconnected {
                    shutting_down: true,
                },
                &[],
            ),
            (
                Phase::Disconnected {
                    shutting_down: true,
                },
                Input::Connected,
                Phase::Released,
                &[],
            ),
            (Phase::Armed, Input::PodsKilled, Phase::Armed, &[]),
            (
                Phase::START,
                Input::PrepareForShutdown(true),
                Phase::START,
                &[],
            ),
        ];
        for (from, input, to, actions) in cases {
            let (next, done) = transition(*from, *input);
            assert_eq!(
                (next, done.as_slice()),
                (*to, *actions),
                "{from:?} + {input:?}"
            );
        }
    }

    #[test]
    fn only_the_shutdown_phases_refuse_pods() {
        assert!(!Phase::START.shutting_down());
        assert!(!Phase::Armed.shutting_down());
        assert!(Phase::ShuttingDown.shutting_down());
        assert!(Phase::Released.shutting_down());
        assert!(
            Phase::Disconnected {
                shutting_down: true
            }
            .shutting_down()
        );
    }
}
