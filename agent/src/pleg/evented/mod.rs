//! The Evented PLEG (`--pleg evented`): the runtime's own container events, streamed over CRI
//! `GetContainerEvents` (containerd 1.7 and later), become the pods' statuses and lifecycle
//! events, with the relist PLEG underneath as the safety net — upstream's
//! `pkg/kubelet/pleg/evented.go` over `generic.go`, which it calls through plain methods here as
//! there (and as the kernel-event PLEG, [`super::ebpf`], does).
//!
//! What upstream does and this keeps: each event carries the status of its pod's sandbox and of
//! every container in that sandbox; it is the pod's status, cached with the event's own
//! timestamp (`cache.Set(…, time.Unix(0, event.CreatedAt))`: an older one never overwrites a
//! newer one) through [`PodRecords`], which every observation goes through. The relist runs at
//! upstream's `eventedPlegRelistPeriod` (300 s), healthy within `eventedPlegRelistThreshold`
//! (10 min), and the PLEG is also unhealthy while the event channel is full (upstream
//! `EventedPLEG.Healthy`). A failed subscription or a broken stream is counted, followed by a
//! relist and a new subscription at once; at the fifth failure the relist takes over at its own
//! period and threshold (1 s, 3 min) for good ([`stream`] has the rules and upstream's
//! reasons). Metrics are upstream's: `kubelet_evented_pleg_connection_success_count`,
//! `…_error_count` and `…_latency_seconds` (the age of each event when it arrives).
//!
//! Where this differs from upstream, and why:
//! - Upstream needs the `EventedPLEG` feature gate; here `--pleg evented` is the explicit choice
//!   (the gate is accepted in `featureGates` and warned about as having no effect). A runtime
//!   that answers Unimplemented (containerd 1.6) is refused at start ([`check_runtime`]) rather
//!   than tried five times and silently relisted.
//! - The event's status replaces the pod's cached status for the event's sandbox only: upstream
//!   caches it whole, which forgets the pod's other (older) sandboxes and their containers until
//!   the next relist; the pod workers here decide on every sandbox of a pod.
//! - Lifecycle events are what changed since the pod's last record (as the other PLEGs send
//!   them) rather than one per event type; that gives the same `ContainerStarted`,
//!   `ContainerDied` and `ContainerRemoved` for started, stopped and deleted containers, and
//!   none for a change already seen.
//! - An event without a sandbox status (containerd sends the removal of a sandbox so, the
//!   sandbox being gone) is ignored upstream until a relist; here it is traced to the pod whose
//!   record holds the id, and that pod is relisted at once.
//! - On a runtime that hands each event to one subscriber only (containerd 1.7, see
//!   [`serves_each_event_once`]), a subscription whose caller went away — the start's refusal
//!   check, a broken connection, an agent that restarted — is still served there and takes the
//!   next event with it. Upstream loses that event until its 300 s relist; here, on such a
//!   runtime, the relist runs at its own 1 s period from each subscription until the stream's
//!   first event, which comes only after every such subscription took its one, and once more
//!   then ([`EventedPleg::run`]).
//! - Upstream also stamps the whole cache fresh every 2 s (`updateGlobalCache`) so pod workers
//!   waiting in `GetNewerThan` cannot stay stuck; here each worker asks for a relist of its pod
//!   after acting ([`Pleg::request_relist`]) and its wait is bounded, so no status is passed off
//!   as newer than any observation of it.
//!
//! Not here: what the events mean for a pod (the sync loop and pod workers decide).

pub mod stream;

use std::{
    cmp::Reverse,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use futures::StreamExt as _;
use k8s_cri::v1 as cri;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::{
    Health, Pleg, PlegConfig, PodCache,
    records::{Observation, PodRecords},
    relist::RelistPleg,
};
use crate::{
    container::{ContainerState, PodStatus, PodUid},
    cri::{ContainerEventStream, RuntimeService, convert},
    lock::MutexExt as _,
};
use stream::{StreamAction, StreamSignal, StreamState};

/// The safety-net relist period while events arrive (upstream `eventedPlegRelistPeriod`,
/// `pkg/kubelet/kubelet.go`).
pub const RELIST_PERIOD: Duration = Duration::from_secs(300);
/// Unhealthy past this without a relist while events arrive (upstream
/// `eventedPlegRelistThreshold`).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(600);

/// The relist's period and threshold once it takes over (upstream `genericPlegRelistPeriod`,
/// 1 s, and `genericPlegRelistThreshold`, 3 min, which the Evented PLEG restores on fallback).
pub fn fallback_config() -> PlegConfig {
    PlegConfig::default()
}

/// Whether the runtime hands each container event to one of its subscribers rather than to
/// all: containerd 1.7 (the only 1.x release with container events), whose `GetContainerEvents`
/// has every caller read one shared channel until an event fails to send (containerd issue
/// 7318; 2.0 broadcasts, containerd PR 9661). `version` as CRI `Version` gives it, with or
/// without a leading `v`.
pub fn serves_each_event_once(runtime: &str, version: &str) -> bool {
    let mut numbers = version.trim_start_matches('v').split(['.', '-', '~', '+']);
    runtime == "containerd" && numbers.next() == Some("1") && numbers.next() == Some("7")
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "--pleg evented needs the runtime's container events (CRI GetContainerEvents), which \
         {runtime} {version} does not implement ({message}); it needs containerd >= 1.7, or \
         choose --pleg ebpf or --pleg relist"
    )]
    Unsupported {
        runtime: String,
        version: String,
        message: String,
    },
}

/// Checks at start that the runtime streams container events: on one that answers
/// Unimplemented, `--pleg evented` is refused with what it needs. Any other failure is the
/// stream's ordinary trouble, counted and retried by the PLEG.
pub async fn check_runtime(runtime: &dyn RuntimeService) -> Result<(), Error> {
    match runtime.get_container_events().await {
        Ok(_probe) => Ok(()),
        Err(e) if e.code() == tonic::Code::Unimplemented => {
            let version = match runtime.version().await {
                Ok(v) => v.runtime_version,
                Err(_) => "(version unknown)".to_owned(),
            };
            Err(Error::Unsupported {
                runtime: runtime.runtime_name().to_owned(),
                version,
                message: e.to_string(),
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "Evented PLEG: the runtime's container events are not available yet; retrying");
            Ok(())
        }
    }
}

#[derive(Clone)]
pub struct EventedPlegMetrics {
    /// Streams the runtime opened (upstream `EventedPLEGConn`).
    pub connections: IntCounter,
    /// Failed subscriptions and broken streams (upstream `EventedPLEGConnErr`).
    pub connection_errors: IntCounter,
    /// The age of each event when it arrives (upstream `EventedPLEGConnLatency`).
    pub latency: Histogram,
    /// Events received, by type.
    pub events: IntCounterVec,
    /// 1 once the relist took over.
    pub fell_back: IntGauge,
}

impl EventedPlegMetrics {
    /// Upstream's metrics (`pkg/kubelet/metrics/metrics.go`: names, help texts, default
    /// buckets) and swiftlet's two, registered in `registry`.
    pub fn register(registry: &Registry) -> Result<EventedPlegMetrics, prometheus::Error> {
        let metrics = EventedPlegMetrics::unregistered()?;
        registry.register(Box::new(metrics.connections.clone()))?;
        registry.register(Box::new(metrics.connection_errors.clone()))?;
        registry.register(Box::new(metrics.latency.clone()))?;
        registry.register(Box::new(metrics.events.clone()))?;
        registry.register(Box::new(metrics.fell_back.clone()))?;
        Ok(metrics)
    }

    pub fn unregistered() -> Result<EventedPlegMetrics, prometheus::Error> {
        Ok(EventedPlegMetrics {
            connections: IntCounter::new(
                "kubelet_evented_pleg_connection_success_count",
                "The number of times a streaming client was obtained to receive CRI Events.",
            )?,
            connection_errors: IntCounter::new(
                "kubelet_evented_pleg_connection_error_count",
                "The number of errors encountered during the establishment of streaming \
                 connection with the CRI runtime.",
            )?,
            latency: Histogram::with_opts(HistogramOpts::new(
                "kubelet_evented_pleg_connection_latency_seconds",
                "The latency of streaming connection with the CRI runtime, measured in seconds.",
            ))?,
            events: IntCounterVec::new(
                Opts::new(
                    "swiftlet_evented_pleg_events_total",
                    "Container events received from the runtime's stream, by type.",
                ),
                &["type"],
            )?,
            fell_back: IntGauge::new(
                "swiftlet_evented_pleg_fell_back",
                "1 once the Evented PLEG gave up the runtime's event stream and the relist took \
                 over at its own period.",
            )?,
        })
    }
}

/// The Evented PLEG. It reads the runtime's event stream; what the events say goes into the pod
/// records ([`PodRecords`]), and it asks the relist for what they cannot say.
pub struct EventedPleg {
    runtime: Arc<dyn RuntimeService>,
    relist: Arc<RelistPleg>,
    records: Arc<PodRecords>,
    metrics: EventedPlegMetrics,
    state: Mutex<StreamState>,
    /// The relist's configuration while events arrive (the one it was made with).
    streaming: PlegConfig,
}

impl EventedPleg {
    /// Wraps `relist` (which should run at [`RELIST_PERIOD`] with [`RELIST_THRESHOLD`] and
    /// record into `records`).
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        relist: Arc<RelistPleg>,
        records: Arc<PodRecords>,
        metrics: EventedPlegMetrics,
    ) -> Arc<Self> {
        let streaming = relist.config();
        Arc::new(EventedPleg {
            runtime,
            relist,
            records,
            metrics,
            state: Mutex::new(StreamState::START),
            streaming,
        })
    }

    /// Where the subscription is.
    pub fn stream_state(&self) -> StreamState {
        *self.state.lock_unpoisoned()
    }

    /// Subscribes and consumes events until shut down; after the fall back, only waits for the
    /// shutdown (the relist goes on alone). On a runtime that serves each event once
    /// ([`serves_each_event_once`]; a runtime whose version cannot be read is taken for one),
    /// each subscription starts with the relist at its own period, until the stream's first
    /// event.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let version = tokio::select! {
            version = self.runtime.version() => version,
            () = shutdown.cancelled() => return,
        };
        let catch_up = match version {
            Ok(v) => serves_each_event_once(&v.runtime_name, &v.runtime_version),
            Err(error) => {
                tracing::warn!(%error, "Evented PLEG: the runtime's version is unknown; each new subscription relists at the relist's own period until its first event");
                true
            }
        };
        if catch_up {
            tracing::info!(
                "Evented PLEG: the runtime hands each container event to one subscriber only \
                 (containerd 1.7), also to one whose caller went away; each new subscription \
                 relists at the relist's own period until its first event"
            );
        }
        loop {
            if self.stream_state() == StreamState::FellBack {
                shutdown.cancelled().await;
                return;
            }
            let subscribed = tokio::select! {
                subscribed = self.runtime.get_container_events() => subscribed,
                () = shutdown.cancelled() => return,
            };
            match subscribed {
                Ok(stream) => {
                    self.metrics.connections.inc();
                    self.transition(StreamSignal::Subscribed);
                    tracing::info!("Evented PLEG: receiving the runtime's container events");
                    if catch_up {
                        self.relist.update(fallback_config());
                    }
                    let ended = tokio::select! {
                        ended = self.consume(stream, catch_up) => ended,
                        () = shutdown.cancelled() => return,
                    };
                    match ended {
                        Some(error) => {
                            tracing::warn!(%error, "Evented PLEG: the container event stream broke");
                        }
                        None => tracing::warn!(
                            "Evented PLEG: the runtime ended the container event stream"
                        ),
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "Evented PLEG: cannot subscribe to the runtime's container events");
                }
            }
            self.metrics.connection_errors.inc();
            self.transition(StreamSignal::Failed);
        }
    }

    /// Applies `signal` to the subscription's state and acts on it.
    fn transition(&self, signal: StreamSignal) {
        let action = {
            let mut state = self.state.lock_unpoisoned();
            let (next, action) = state.next(signal);
            *state = next;
            action
        };
        match action {
            StreamAction::Nothing => {}
            StreamAction::RelistAndRetry => self.relist.request_full_relist(),
            StreamAction::FallBack => {
                let config = fallback_config();
                tracing::error!(
                    failures = stream::MAX_STREAM_RETRIES,
                    period = ?config.relist_period,
                    "Evented PLEG: the runtime's container events failed too often; falling back \
                     to the relist PLEG for good"
                );
                self.metrics.fell_back.set(1);
                self.relist.update(config);
            }
        }
    }

    /// Handles events until the stream breaks (the error) or ends (`None`). `catching_up`: the
    /// relist runs at its own period until the first event, then back at the streaming one,
    /// relisting at once for what the subscriptions served before this one took.
    async fn consume(
        &self,
        mut stream: ContainerEventStream,
        mut catching_up: bool,
    ) -> Option<crate::cri::Error> {
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if std::mem::take(&mut catching_up) {
                        tracing::debug!(
                            "Evented PLEG: the stream's first event; relisting once, then at the evented period"
                        );
                        self.relist.update(self.streaming.clone());
                    }
                    self.handle(&event);
                }
                Err(error) => return Some(error),
            }
        }
        None
    }

    /// One event from the runtime (upstream `processCRIEvents`).
    fn handle(&self, event: &cri::ContainerEventResponse) {
        self.metrics
            .events
            .with_label_values(&[event_type_label(event.container_event_type)])
            .inc();
        let now_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let age_ns = now_ns.saturating_sub(event.created_at).max(0);
        self.metrics.latency.observe(age_ns as f64 / 1e9);
        let Some(status) = convert::pod_status_of_event(event, self.runtime.runtime_name()) else {
            match self.records.pod_of(&event.container_id) {
                Some(uid) => {
                    tracing::debug!(pod = %uid, id = %event.container_id, "Evented PLEG: an event without its sandbox's status; relisting the pod");
                    self.relist.request_relist(&uid);
                }
                None => {
                    tracing::debug!(id = %event.container_id, "Evented PLEG: an event without its sandbox's status, of no pod seen; ignored");
                }
            }
            return;
        };
        let uid = status.uid.clone();
        let at = status.observed_at;
        let merged = merge(self.records.cache().get(&uid).status, status);
        tracing::debug!(pod = %uid, id = %event.container_id, kind = event_type_label(event.container_event_type), "Evented PLEG: a container event");
        self.records.record(
            &uid,
            None,
            Observation::Runtime {
                status: merged,
                at,
                kernel_ts_ns: None,
            },
        );
    }
}

/// The label of a CRI container event type; a type this client does not know is "unknown".
fn event_type_label(kind: i32) -> &'static str {
    match cri::ContainerEventType::try_from(kind) {
        Ok(cri::ContainerEventType::ContainerCreatedEvent) => "created",
        Ok(cri::ContainerEventType::ContainerStartedEvent) => "started",
        Ok(cri::ContainerEventType::ContainerStoppedEvent) => "stopped",
        Ok(cri::ContainerEventType::ContainerDeletedEvent) => "deleted",
        Err(_) => "unknown",
    }
}

/// The pod's status after an event: the event's sandbox and its containers, over what the
/// cache holds of the pod's other sandboxes and their containers (see the module doc).
pub fn merge(cached: Option<PodStatus>, event: PodStatus) -> PodStatus {
    let Some(mut status) = cached else {
        return event;
    };
    let mut event = event;
    // An exited container's termination message is read by the runtime manager's refresh, not
    // carried by the runtime's event: one read stays.
    for c in event
        .containers
        .iter_mut()
        .filter(|c| c.state == ContainerState::Exited)
    {
        if let Some(read) = status.containers.iter().find(|o| {
            o.id == c.id && o.state == ContainerState::Exited && o.message.starts_with(&c.message)
        }) {
            c.message.clone_from(&read.message);
        }
    }
    let replaced = |id: &str| event.sandboxes.iter().any(|s| s.id == id);
    status.sandboxes.retain(|s| !replaced(s.id.as_str()));
    status
        .containers
        .retain(|c| !replaced(c.sandbox_id.as_str()));
    status.sandboxes.extend(event.sandboxes);
    status.containers.extend(event.containers);
    status.sandboxes.sort_by_key(|s| Reverse(s.created_at));
    status.containers.sort_by_key(|c| Reverse(c.created_at));
    status.name = event.name;
    status.namespace = event.namespace;
    status.observed_at = event.observed_at;
    status
}

impl Pleg for EventedPleg {
    fn health(&self) -> Health {
        if self.records.channel_full() {
            return Health::Unhealthy(format!(
                "EventedPLEG: pleg event channel capacity is full with {} events",
                super::CHANNEL_CAPACITY
            ));
        }
        self.relist.health()
    }

    fn cache(&self) -> Arc<PodCache> {
        self.records.cache()
    }

    fn request_relist(&self, pod: &PodUid) {
        self.relist.request_relist(pod);
    }
}

#[cfg(test)]
mod tests;
