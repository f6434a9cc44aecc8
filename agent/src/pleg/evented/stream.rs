//! The life of the Evented PLEG's subscription to the runtime's container events, as one state
//! and one transition function (upstream: the retry loop of `EventedPLEG.watchEventsChannel`).
//!
//! Upstream counts every failed `GetContainerEvents` — a subscription the runtime refused, or a
//! stream that broke or ended after it was open — and never resets the count: each failure is
//! followed by a relist (`e.Relist()`) and a new subscription at once, and once
//! `eventedPlegMaxStreamRetries` (5) failures are reached the Evented PLEG stops for good, and
//! the generic relist goes back to its own period and threshold (1 s, 3 min). Nothing turns the
//! Evented PLEG back on but a restart of the kubelet; the same holds here.

/// Failed subscriptions (or broken streams) before the relist takes over for good (upstream
/// `eventedPlegMaxStreamRetries`, `pkg/kubelet/kubelet.go`).
pub const MAX_STREAM_RETRIES: u32 = 5;

/// Where the subscription is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamState {
    /// Asking the runtime for the stream; `failures` so far.
    Subscribing { failures: u32 },
    /// Events arrive; `failures` so far.
    Streaming { failures: u32 },
    /// The relist took over at its own period, for good.
    FellBack,
}

/// What happened to the subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamSignal {
    /// The runtime opened the stream.
    Subscribed,
    /// The runtime refused the subscription, or the stream broke or ended.
    Failed,
}

/// What the PLEG does on a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamAction {
    Nothing,
    /// A full relist (what the lost stream may have carried), then subscribe again.
    RelistAndRetry,
    /// Give up the stream: the relist runs at its own period and threshold from now on.
    FallBack,
}

impl StreamState {
    pub const START: StreamState = StreamState::Subscribing { failures: 0 };

    /// The one transition function.
    pub fn next(self, signal: StreamSignal) -> (StreamState, StreamAction) {
        match (self, signal) {
            (StreamState::FellBack, _) => (StreamState::FellBack, StreamAction::Nothing),
            (
                StreamState::Subscribing { failures } | StreamState::Streaming { failures },
                StreamSignal::Subscribed,
            ) => (StreamState::Streaming { failures }, StreamAction::Nothing),
            (
                StreamState::Subscribing { failures } | StreamState::Streaming { failures },
                StreamSignal::Failed,
            ) => {
                let failures = failures.saturating_add(1);
                if failures >= MAX_STREAM_RETRIES {
                    (StreamState::FellBack, StreamAction::FallBack)
                } else {
                    (
                        StreamState::Subscribing { failures },
                        StreamAction::RelistAndRetry,
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_add_up_across_open_streams_until_the_fall_back() {
        use StreamAction::*;
        use StreamSignal::*;
        let table: &[(StreamState, StreamSignal, StreamState, StreamAction)] = &[
            (
                StreamState::START,
                Subscribed,
                StreamState::Streaming { failures: 0 },
                Nothing,
            ),
            (
                StreamState::START,
                Failed,
                StreamState::Subscribing { failures: 1 },
                RelistAndRetry,
            ),
            // An open stream that breaks counts as upstream counts it, and a success does not
            // reset the count.
            (
                StreamState::Streaming { failures: 3 },
                Failed,
                StreamState::Subscribing { failures: 4 },
                RelistAndRetry,
            ),
            (
                StreamState::Subscribing { failures: 4 },
                Subscribed,
                StreamState::Streaming { failures: 4 },
                Nothing,
            ),
            (
                StreamState::Streaming { failures: 4 },
                Failed,
                StreamState::FellBack,
                FallBack,
            ),
            (
                StreamState::FellBack,
                Subscribed,
                StreamState::FellBack,
                Nothing,
            ),
            (
                StreamState::FellBack,
                Failed,
                StreamState::FellBack,
                Nothing,
            ),
        ];
        for (from, signal, to, action) in table {
            assert_eq!(from.next(*signal), (*to, *action), "{from:?} on {signal:?}");
        }
    }

    #[test]
    fn the_fifth_failure_falls_back() {
        let mut state = StreamState::START;
        let mut actions = Vec::new();
        for _ in 0..MAX_STREAM_RETRIES {
            let (next, action) = state.next(StreamSignal::Failed);
            state = next;
            actions.push(action);
        }
        assert_eq!(state, StreamState::FellBack);
        assert_eq!(
            actions,
            [
                StreamAction::RelistAndRetry,
                StreamAction::RelistAndRetry,
                StreamAction::RelistAndRetry,
                StreamAction::RelistAndRetry,
                StreamAction::FallBack
            ]
        );
    }
}
