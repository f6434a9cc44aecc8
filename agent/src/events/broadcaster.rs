//! The queue components record into ([`EventQueue`]) and the task that drains it
//! ([`EventBroadcaster`], upstream's `eventBroadcasterImpl`): each event is correlated, logged,
//! published on the gRPC stream and handed to the API writer. The queue is client-go's
//! `maxQueuedEvents` long and drops when full (`watch.DropIfChannelFull`); the API writer has a
//! queue of its own, as each of client-go's sinks has, so a slow API server never holds up the
//! stream, and a full one drops for the API alone.

use std::{sync::Arc, time::SystemTime};

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{
    Event, EventMetrics, EventRecorder, REPORTING_CONTROLLER, REPORTING_INSTANCE_MAX_BYTES,
    api::ApiWriter, bounded, correlator::Correlator,
};

/// Upstream `maxQueuedEvents`.
pub const QUEUE_CAPACITY: usize = 1000;
/// The API writer's queue.
pub const API_QUEUE_CAPACITY: usize = 1000;

/// Where components record: a bounded queue in front of the broadcaster.
pub struct EventQueue {
    tx: mpsc::Sender<Event>,
    metrics: EventMetrics,
}

impl EventRecorder for EventQueue {
    fn record(&self, event: Event) {
        match self.tx.try_send(event) {
            Ok(()) => self.metrics.recorded.inc(),
            Err(mpsc::error::TrySendError::Full(event)) => {
                self.metrics.drop("queue_full");
                tracing::debug!(reason = event.reason, "event queue full: event dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.metrics.drop("shut_down"),
        }
    }
}

/// `eventRecordQPS` and `eventBurst`: Events written to the API server per second, and the
/// burst above it (used only when `qps` > 0; 0 means no limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub qps: u32,
    pub burst: u32,
}

#[derive(Clone, Debug)]
pub struct BroadcasterConfig {
    /// The `reportingInstance` (cut to 128 bytes, the API's bound).
    pub node_name: String,
    pub limits: Limits,
}

/// Where the correlated events go.
pub struct Sinks {
    /// The gRPC stream's bus (`swiftlet.v1.Events/Watch`, kind `kube_event`).
    pub stream: Option<broadcast::Sender<Arc<Published>>>,
    /// The API server, with `--kubeconfig`.
    pub api: Option<kube::Client>,
}

/// One event as the stream shows it: as the API writer writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    pub event: Event,
    /// Occurrences of its series so far (1: a new Event).
    pub count: u32,
    pub reporting_controller: &'static str,
    pub reporting_instance: String,
    /// When it was published (the Event's `eventTime`, or its series' `lastObservedTime`).
    pub event_time: SystemTime,
    /// The same instant on CLOCK_MONOTONIC, as the stream's other events are stamped.
    pub monotonic_ns: u64,
}

pub struct EventBroadcaster {
    rx: mpsc::Receiver<Event>,
    config: BroadcasterConfig,
    metrics: EventMetrics,
}

impl EventBroadcaster {
    /// The queue to hand to components, and the broadcaster that drains it once run.
    pub fn new(config: BroadcasterConfig, metrics: EventMetrics) -> (Arc<EventQueue>, Self) {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let queue = Arc::new(EventQueue {
            tx,
            metrics: metrics.clone(),
        });
        (
            queue,
            EventBroadcaster {
                rx,
                config,
                metrics,
            },
        )
    }

    /// Drains the queue into `sinks` until `shutdown`.
    pub async fn run(self, sinks: Sinks, shutdown: CancellationToken) {
        let EventBroadcaster {
            mut rx,
            config,
            metrics,
        } = self;
        let instance = bounded(config.node_name.clone(), REPORTING_INSTANCE_MAX_BYTES);
        let (api_tx, writer) = match sinks.api {
            Some(client) => {
                let (tx, rx) = mpsc::channel(API_QUEUE_CAPACITY);
                let writer =
                    ApiWriter::new(client, instance.clone(), config.limits, metrics.clone());
                (Some(tx), Some(writer.run(rx, shutdown.clone())))
            }
            None => (None, None),
        };
        let pump = async {
            let mut correlator = Correlator::default();
            loop {
                let event = tokio::select! {
                    event = rx.recv() => event,
                    () = shutdown.cancelled() => None,
                };
                let Some(event) = event else {
                    break;
                };
                let Some(correlated) = correlator.correlate(event, tokio::time::Instant::now())
                else {
                    metrics.drop("spam_filter");
                    continue;
                };
                let e = &correlated.event;
                // Upstream logs every event at V(3) (`StartStructuredLogging`).
                tracing::debug!(
                    kind = e.regarding.kind.as_deref().unwrap_or_default(),
                    object = e.regarding.name.as_deref().unwrap_or_default(),
                    namespace = e.regarding.namespace.as_deref().unwrap_or_default(),
                    field_path = e.regarding.field_path.as_deref().unwrap_or_default(),
                    reason = e.reason,
                    count = correlated.count,
                    "event: {}",
                    e.note
                );
                if let Some(stream) = &sinks.stream {
                    // No watcher is not an error.
                    let _ = stream.send(Arc::new(Published {
                        event: correlated.event.clone(),
                        count: correlated.count,
                        reporting_controller: REPORTING_CONTROLLER,
                        reporting_instance: instance.clone(),
                        event_time: SystemTime::now(),
                        monotonic_ns: crate::kernel::monotonic_ns(),
                    }));
                }
                if let Some(api) = &api_tx
                    && api.try_send(correlated).is_err()
                {
                    metrics.drop("api_queue_full");
                }
            }
            // Whatever is still queued goes nowhere: say how much.
            rx.close();
            while rx.try_recv().is_ok() {
                metrics.drop("shut_down");
            }
        };
        let write = async {
            if let Some(writer) = writer {
                writer.await;
            }
        };
        tokio::join!(pump, write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Action, node_ref};

    fn config() -> BroadcasterConfig {
        BroadcasterConfig {
            node_name: "n1".into(),
            limits: Limits {
                qps: 50,
                burst: 100,
            },
        }
    }

    #[tokio::test]
    async fn events_reach_the_stream_correlated_and_stamped() {
        let metrics = EventMetrics::unregistered();
        let (queue, broadcaster) = EventBroadcaster::new(config(), metrics.clone());
        let (stream, mut watcher) = broadcast::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(broadcaster.run(
            Sinks {
                stream: Some(stream),
                api: None,
            },
            shutdown.clone(),
        ));
        for _ in 0..2 {
            queue.record(Event::normal(
                node_ref("n1"),
                "Starting",
                Action::StartKubelet,
                "Starting kubelet.",
            ));
        }
        let first = watcher.recv().await.expect("published");
        let second = watcher.recv().await.expect("published");
        assert_eq!(first.event.reason, "Starting");
        assert_eq!((first.count, second.count), (1, 2));
        assert_eq!(first.reporting_controller, "kubelet");
        assert_eq!(first.reporting_instance, "n1");
        assert!(second.monotonic_ns >= first.monotonic_ns);
        assert_eq!(metrics.recorded.get(), 2);
        shutdown.cancel();
        task.await.expect("the broadcaster ends");
        // Recording after the end is counted, not an error.
        queue.record(Event::normal(
            node_ref("n1"),
            "x",
            Action::StartKubelet,
            "y",
        ));
        assert_eq!(metrics.dropped.with_label_values(&["shut_down"]).get(), 1);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = EventMetrics::unregistered();
        // Never run: nothing drains the queue.
        let (queue, _broadcaster) = EventBroadcaster::new(config(), metrics.clone());
        let over = 25;
        for i in 0..(QUEUE_CAPACITY + over) {
            queue.record(Event::normal(
                node_ref("n1"),
                "Starting",
                Action::StartKubelet,
                format!("{i}"),
            ));
        }
        assert_eq!(metrics.recorded.get(), QUEUE_CAPACITY as u64);
        assert_eq!(
            metrics.dropped.with_label_values(&["queue_full"]).get(),
            over as u64
        );
    }

    #[tokio::test]
    async fn the_spam_filter_drops_are_counted() {
        let metrics = EventMetrics::unregistered();
        let (queue, broadcaster) = EventBroadcaster::new(config(), metrics.clone());
        let (stream, mut watcher) = broadcast::channel(64);
        let task = tokio::spawn(broadcaster.run(
            Sinks {
                stream: Some(stream),
                api: None,
            },
            CancellationToken::new(),
        ));
        for i in 0..30 {
            queue.record(Event::normal(
                node_ref("n1"),
                "Starting",
                Action::StartKubelet,
                format!("{}", i % 3),
            ));
        }
        // Without a recorder the queue ends once drained, and so does the broadcaster.
        drop(queue);
        task.await.expect("the broadcaster ends");
        let mut published = 0;
        while watcher.try_recv().is_ok() {
            published += 1;
        }
        let burst = crate::events::correlator::SPAM_BURST;
        assert_eq!(published, burst);
        assert_eq!(
            metrics.dropped.with_label_values(&["spam_filter"]).get(),
            30 - u64::from(burst)
        );
    }
}
