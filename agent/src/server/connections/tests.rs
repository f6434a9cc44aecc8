//! The connection policy: who is evicted at the limit and in which order, who never is, and the
//! deadlines of a tracked connection (paused time).

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::{metrics::Metrics, server::track_requests::TrackRequests};

fn tracker(max: usize) -> (Arc<Tracker>, ServerMetrics) {
    let metrics = Metrics::new().expect("metrics").server;
    (Tracker::new("test", max, metrics.clone()), metrics)
}

fn count(counter: &prometheus::IntCounterVec) -> u64 {
    counter.with_label_values(&["test"]).get()
}

fn killed(slot: &Slot) -> bool {
    slot.conn().kill.is_cancelled()
}

#[test]
fn at_the_limit_the_oldest_that_never_asked_goes_first_then_the_oldest_idle() {
    let (tracker, metrics) = tracker(3);
    let a = tracker.admit().expect("a");
    let b = tracker.admit().expect("b");
    let c = tracker.admit().expect("c");
    // b asks something and is still answering it.
    let busy = b.conn().request_started();
    let d = tracker.admit().expect("d evicts a");
    assert!(killed(&a) && !killed(&b) && !killed(&c));
    let e = tracker.admit().expect("e evicts c");
    assert!(killed(&c) && !killed(&b) && !killed(&d));
    // b's request is done: it has asked before, so d (never asked) still goes first.
    drop(busy);
    let f = tracker.admit().expect("f evicts d");
    assert!(killed(&d) && !killed(&b));
    // Only connections that asked before are left idle besides the newcomers: e and f never
    // asked, b did; e is the oldest that never asked.
    let _g = tracker.admit().expect("g evicts e");
    assert!(killed(&e) && !killed(&b) && !killed(&f));
    assert_eq!(count(&metrics.evicted), 4);
    assert_eq!(count(&metrics.accepted), 7);
    assert_eq!(tracker.open(), 3);
    assert_eq!(metrics.open.with_label_values(&["test"]).get(), 3);
}

#[test]
fn an_idle_connection_that_asked_before_goes_when_none_never_asked() {
    let (tracker, _) = tracker(2);
    let a = tracker.admit().expect("a");
    let b = tracker.admit().expect("b");
    drop(a.conn().request_started());
    let _busy = b.conn().request_started();
    let _c = tracker.admit().expect("c evicts a, idle");
    assert!(killed(&a) && !killed(&b));
}

#[test]
fn busy_and_upgraded_connections_stay_and_a_newcomer_is_refused() {
    let (tracker, metrics) = tracker(2);
    let a = tracker.admit().expect("a");
    let b = tracker.admit().expect("b");
    let _busy = a.conn().request_started();
    // b was upgraded (an exec session): its request ended, the session goes on.
    let upgrade = b.conn().request_started();
    upgrade.pin();
    drop(upgrade);
    assert!(tracker.admit().is_none());
    assert!(!killed(&a) && !killed(&b));
    assert_eq!(count(&metrics.refused), 1);
    // A slot dropped (its connection closed) makes room again.
    drop(a);
    assert_eq!(tracker.open(), 1);
    assert!(tracker.admit().is_some());
    assert_eq!(count(&metrics.evicted), 0);
}

#[tokio::test]
async fn an_evicted_connection_fails_its_pending_read_at_once() {
    let (tracker, _) = tracker(1);
    let (server, _client) = tokio::io::duplex(64);
    let slot = tracker.admit().expect("slot");
    let mut io = TrackedIo::new(
        server,
        slot,
        IoTimeouts {
            idle: None,
            write_stall: Duration::from_secs(60),
        },
    );
    let read = tokio::spawn(async move {
        let mut buf = [0u8; 8];
        io.read(&mut buf).await
    });
    tokio::task::yield_now().await;
    let _newcomer = tracker.admit().expect("evicts the first");
    let result = read.await.expect("joined");
    assert_eq!(
        result.map_err(|e| e.kind()),
        Err(io::ErrorKind::ConnectionAborted)
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_but_not_while_a_request_is_in_flight() {
    let (tracker, metrics) = tracker(4);
    let (server, mut client) = tokio::io::duplex(64);
    let slot = tracker.admit().expect("slot");
    let conn = slot.conn().clone();
    let mut io = TrackedIo::new(
        server,
        slot,
        IoTimeouts {
            idle: Some(Duration::from_secs(30)),
            write_stall: Duration::from_secs(60),
        },
    );
    // A request in flight: two minutes go by and the connection stays.
    let request = conn.request_started();
    let mut buf = [0u8; 8];
    let waited = tokio::time::timeout(Duration::from_secs(120), io.read(&mut buf)).await;
    assert!(waited.is_err(), "closed while busy: {waited:?}");
    // Data keeps it open too (the read answers).
    client.write_all(b"ping").await.expect("write");
    assert_eq!(io.read(&mut buf).await.expect("read"), 4);
    // The request ends; with nothing in flight the connection is closed after the idle time.
    drop(request);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let read = io.read(&mut buf);
    tokio::pin!(read);
    let mut ticks = 0u32;
    let closed = loop {
        tokio::select! {
            r = &mut read => break r,
            _ = tick.tick() => ticks += 1,
        }
        assert!(ticks < 120, "an idle connection was never closed");
    };
    assert_eq!(closed.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
    assert!(
        ticks >= 30,
        "closed after {ticks} ticks, before the idle time"
    );
    assert_eq!(count(&metrics.timed_out), 1);
}

#[tokio::test(start_paused = true)]
async fn a_write_the_client_never_reads_is_cut_at_the_stall_timeout() {
    let (tracker, metrics) = tracker(4);
    let (server, _client) = tokio::io::duplex(64);
    let slot = tracker.admit().expect("slot");
    let mut io = TrackedIo::new(
        server,
        slot,
        IoTimeouts {
            idle: None,
            write_stall: Duration::from_secs(60),
        },
    );
    let big = vec![b'x'; 4096];
    let written = tokio::time::timeout(Duration::from_secs(600), io.write_all(&big)).await;
    let Ok(written) = written else {
        panic!("a stalled write was never cut");
    };
    assert_eq!(written.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
    assert_eq!(count(&metrics.timed_out), 1);
}

#[tokio::test]
async fn a_request_counts_until_its_response_body_ends() {
    use http_body_util::BodyExt as _;
    use tower::{Layer as _, Service as _, ServiceExt as _};

    let (tracker, _) = tracker(4);
    let slot = tracker.admit().expect("slot");
    let conn = slot.conn().clone();
    let mut service = TrackRequests.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"body"),
        )))
    }));
    let mut request = http::Request::new(());
    request.extensions_mut().insert(ConnHandle(conn.clone()));
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("response");
    assert!(!conn.is_idle(), "the body is not read yet");
    assert!(!conn.never_asked());
    let body = response.into_body().collect().await.expect("body");
    assert_eq!(body.to_bytes(), bytes::Bytes::from_static(b"body"));
    assert!(conn.is_idle());
}
