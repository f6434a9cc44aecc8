//! Writing events to the API server as events.k8s.io/v1 Events, through kube-rs's `Recorder`
//! (`kube::runtime::events`): a new Event is created (named `<object>.<nanoseconds hex>`, with
//! `eventTime`, `reportingController: kubelet`, `reportingInstance: <node>`), and each repeat
//! patches it into a series (`series.count`, `series.lastObservedTime`), as client-go's
//! events.k8s.io broadcaster does.
//!
//! One `Recorder` per series: its cache keys an Event by object, reason and action — not by
//! note — and grows without a bound but time (6 minutes after each key's last use). Given only
//! one series each, a `Recorder` never mistakes another note for a repeat, and the writer's LRU
//! (4096, as the correlator's) bounds how many exist. Writes are rate limited by
//! `eventRecordQPS`/`eventBurst` (client-go's rate limiter on the kubelet's event client) and
//! time out after 10 s; a failed write is counted and logged, not retried (client-go tries 12
//! times, 10 s apart, which here would hold up every event behind it).

use std::time::Duration;

use kube::{
    Client,
    runtime::events::{Event as KubeEvent, Recorder, Reporter},
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    EventMetrics, Limits, REPORTING_CONTROLLER,
    correlator::{CACHE_ENTRIES, Correlated},
    limiter::TokenBucket,
    lru::Lru,
};

/// How long one write may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct ApiWriter {
    client: Client,
    reporter: Reporter,
    /// `None`: no limit (`eventRecordQPS: 0`).
    limiter: Option<TokenBucket>,
    recorders: Lru<u64, Recorder>,
    metrics: EventMetrics,
    /// The last write failed (logged once until one succeeds again).
    failing: bool,
}

impl ApiWriter {
    pub fn new(client: Client, instance: String, limits: Limits, metrics: EventMetrics) -> Self {
        ApiWriter {
            client,
            reporter: Reporter {
                controller: REPORTING_CONTROLLER.to_owned(),
                instance: Some(instance),
            },
            limiter: (limits.qps > 0)
                .then(|| TokenBucket::new(f64::from(limits.qps), limits.burst, Instant::now())),
            recorders: Lru::new(CACHE_ENTRIES),
            metrics,
            failing: false,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Correlated>, shutdown: CancellationToken) {
        loop {
            let next = tokio::select! {
                next = rx.recv() => next,
                () = shutdown.cancelled() => None,
            };
            let Some(correlated) = next else {
                return;
            };
            tokio::select! {
                () = self.write(correlated) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    async fn write(&mut self, correlated: Correlated) {
        if let Some(limiter) = &mut self.limiter {
            let wait = limiter.reserve(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let Correlated { event, key, count } = correlated;
        let existing = (count > 1)
            .then(|| self.recorders.get_mut(&key).cloned())
            .flatten();
        let new = existing.is_none();
        let recorder = existing.unwrap_or_else(|| {
            let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            self.recorders.insert(key, recorder.clone());
            recorder
        });
        let published = KubeEvent {
            type_: event.type_,
            reason: event.reason.clone(),
            note: Some(event.note.clone()),
            action: event.action.as_str().to_owned(),
            secondary: None,
        };
        let result = tokio::time::timeout(
            WRITE_TIMEOUT,
            recorder.publish(&published, &event.regarding),
        )
        .await;
        let error = match result {
            Ok(Ok(())) => {
                self.metrics
                    .written
                    .with_label_values(&[if new { "new" } else { "repeat" }])
                    .inc();
                if std::mem::take(&mut self.failing) {
                    tracing::info!("writing events to the API server works again");
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {WRITE_TIMEOUT:?}"),
        };
        self.metrics.drop("api_error");
        if !std::mem::replace(&mut self.failing, true) {
            tracing::warn!(
                reason = event.reason,
                error,
                "cannot write an event to the API server; events are dropped until it works \
                 again (counted in swiftlet_events_dropped_total{{cause=\"api_error\"}})"
            );
        } else {
            tracing::debug!(reason = event.reason, error, "event not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Action, Event, container_ref, correlator::Correlator, node_ref};
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;
    use tower_test::mock;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    /// The next request: method, path and JSON body, answered with the body itself (as the API
    /// server answers a create or patch with the object).
    async fn answer(handle: &mut Handle) -> (String, String, Value) {
        let (request, respond) = handle.next_request().await.expect("a request");
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("a body");
        let json: Value = serde_json::from_slice(&bytes).expect("JSON");
        let status = if parts.method == http::Method::POST {
            201
        } else {
            200
        };
        respond.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(bytes.to_vec()))
                .expect("a response"),
        );
        (parts.method.to_string(), parts.uri.path().to_owned(), json)
    }

    fn pod() -> k8s_openapi::api::core::v1::Pod {
        crate::testing::pod()
            .named("ns1", "web", "u1")
            .container(crate::testing::container("app"))
            .build()
    }

    #[tokio::test]
    async fn a_new_event_is_created_and_its_repeats_patch_its_series() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let metrics = EventMetrics::unregistered();
        let limits = Limits { qps: 0, burst: 0 };
        let writer = ApiWriter::new(client, "n1".into(), limits, metrics.clone());
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(writer.run(rx, CancellationToken::new()));
        let mut correlator = Correlator::default();
        let unhealthy = || {
            Event::warning(
                container_ref(&pod(), "app"),
                "Unhealthy",
                Action::ProbeContainer,
                "Liveness probe failed: ",
            )
        };
        for event in [unhealthy(), unhealthy()] {
            let c = correlator.correlate(event, Instant::now()).expect("passes");
            tx.send(c).await.expect("queued");
        }
        let (method, path, created) = answer(&mut handle).await;
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ns1/events")
        );
        assert_eq!(created["reason"], "Unhealthy");
        assert_eq!(created["type"], "Warning");
        assert_eq!(created["note"], "Liveness probe failed: ");
        assert_eq!(created["action"], "ProbeContainer");
        assert_eq!(created["reportingController"], "kubelet");
        assert_eq!(created["reportingInstance"], "n1");
        assert_eq!(created["regarding"]["kind"], "Pod");
        assert_eq!(created["regarding"]["uid"], "u1");
        assert_eq!(created["regarding"]["fieldPath"], "spec.containers{app}");
        let name = created["metadata"]["name"].as_str().expect("named");
        assert!(name.starts_with("web."), "{name}");
        let (method, path, patched) = answer(&mut handle).await;
        assert_eq!(method, "PATCH");
        assert_eq!(
            path,
            format!("/apis/events.k8s.io/v1/namespaces/ns1/events/{name}")
        );
        assert_eq!(patched["series"]["count"], 2);

        // A node's event: the Node has no namespace, its Events live in `default`.
        let starting = Event::normal(
            node_ref("n1"),
            "Starting",
            Action::StartKubelet,
            "Starting kubelet.",
        );
        let c = correlator
            .correlate(starting, Instant::now())
            .expect("passes");
        tx.send(c).await.expect("queued");
        let (method, path, created) = answer(&mut handle).await;
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
        );
        assert_eq!(created["regarding"]["uid"], "n1");
        // The queue's end ends the writer, once it is done with what it took.
        drop(tx);
        task.await.expect("the writer ends");
        assert_eq!(metrics.written.with_label_values(&["new"]).get(), 2);
        assert_eq!(metrics.written.with_label_values(&["repeat"]).get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_wait_for_the_rate_limit_and_failures_are_counted() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let metrics = EventMetrics::unregistered();
        let limits = Limits { qps: 1, burst: 1 };
        let writer = ApiWriter::new(client, "n1".into(), limits, metrics.clone());
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(writer.run(rx, CancellationToken::new()));
        let mut correlator = Correlator::default();
        let start = Instant::now();
        for note in ["a", "b"] {
            let event = Event::normal(node_ref("n1"), "R", Action::StartKubelet, note);
            let c = correlator.correlate(event, start).expect("passes");
            tx.send(c).await.expect("queued");
        }
        // The first is refused: counted, and the next still goes, a token later.
        let (request, respond) = handle.next_request().await.expect("a request");
        drop(request);
        respond.send_response(
            Response::builder()
                .status(500)
                .body(Body::from(
                    br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"boom","reason":"InternalError","code":500}"#
                        .to_vec(),
                ))
                .expect("a response"),
        );
        let (_, _, second) = answer(&mut handle).await;
        assert_eq!(second["note"], "b");
        assert!(Instant::now() - start >= Duration::from_secs(1));
        drop(tx);
        task.await.expect("the writer ends");
        assert_eq!(metrics.dropped.with_label_values(&["api_error"]).get(), 1);
        assert_eq!(metrics.written.with_label_values(&["new"]).get(), 1);
    }
}
