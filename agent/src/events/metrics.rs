//! The event pipeline's metrics: events taken, events not written and why, Events written. The
//! labels are fixed sets (no reason or object: those are the pods' to choose).

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct EventMetrics {
    /// Events the components recorded into the queue.
    pub recorded: IntCounter,
    /// Events dropped, by `cause`: `queue_full` (the queue of 1000 was full: the broadcaster is
    /// behind), `spam_filter` (over the object's budget), `api_queue_full` (the API writer is
    /// behind: the API server is slow or the rate limit holds it), `api_error` (the API server
    /// refused or did not answer), `shut_down`.
    pub dropped: IntCounterVec,
    /// Events written to the API server, `series`: `new` (created) or `repeat` (patched into
    /// its series).
    pub written: IntCounterVec,
}

/// The `cause` label values of [`EventMetrics::dropped`].
pub const DROP_CAUSES: [&str; 5] = [
    "queue_full",
    "spam_filter",
    "api_queue_full",
    "api_error",
    "shut_down",
];

impl EventMetrics {
    /// Metrics no registry exports (unit tests).
    #[cfg(test)]
    pub fn unregistered() -> EventMetrics {
        Self::make().expect("the metrics' names and labels are valid")
    }

    fn make() -> Result<EventMetrics, prometheus::Error> {
        let recorded = IntCounter::new(
            "swiftlet_events_recorded_total",
            "Kubernetes events the node's components recorded.",
        )?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "swiftlet_events_dropped_total",
                "Kubernetes events not written, by cause (queue_full, spam_filter, \
                 api_queue_full, api_error, shut_down).",
            ),
            &["cause"],
        )?;
        let written = IntCounterVec::new(
            Opts::new(
                "swiftlet_events_written_total",
                "Kubernetes events written to the API server: new Events and repeats patched \
                 into their series.",
            ),
            &["series"],
        )?;
        for cause in DROP_CAUSES {
            dropped.with_label_values(&[cause]);
        }
        for series in ["new", "repeat"] {
            written.with_label_values(&[series]);
        }
        Ok(EventMetrics {
            recorded,
            dropped,
            written,
        })
    }

    pub fn register(registry: &Registry) -> Result<EventMetrics, prometheus::Error> {
        let metrics = Self::make()?;
        registry.register(Box::new(metrics.recorded.clone()))?;
        registry.register(Box::new(metrics.dropped.clone()))?;
        registry.register(Box::new(metrics.written.clone()))?;
        Ok(metrics)
    }

    pub fn drop(&self, cause: &str) {
        self.dropped.with_label_values(&[cause]).inc();
    }
}
