//! The HTTP accept loop on a real loopback socket: a flood of idle connections past the limit
//! leaves a real request answered (the flood is what gets evicted), and a connection that sends
//! nothing is closed at the header deadline.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use super::*;
use crate::{metrics::Metrics, server::Health, server::http::healthz_router};

#[test]
fn each_listener_gets_a_share_of_the_descriptors_within_bounds() {
    // 20,000 descriptors: a quarter kept back, the rest shared by four listeners.
    assert_eq!(connections_per_listener(20_000, 4), 3_750);
    assert_eq!(connections_per_listener(1 << 20, 4), MAX_CONNECTIONS);
    assert_eq!(connections_per_listener(1024, 4), MIN_CONNECTIONS);
    assert_eq!(connections_per_listener(0, 0), MIN_CONNECTIONS);
}

/// Serves `/healthz` on a loopback port within `max` connections; returns the port.
async fn healthz_server(
    max: usize,
    timeouts: HttpTimeouts,
) -> (u16, Arc<Tracker>, crate::metrics::ServerMetrics) {
    let metrics = Metrics::new().expect("metrics").server;
    let tracker = Tracker::new("test", max, metrics.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let router = healthz_router(Health::default());
    let serving = tracker.clone();
    tokio::spawn(async move {
        let _ = serve(
            listener,
            router,
            None,
            serving,
            timeouts,
            CancellationToken::new(),
        )
        .await;
    });
    (port, tracker, metrics)
}

fn get_healthz(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_past_the_limit_does_not_deny_a_request() {
    let (port, tracker, metrics) = healthz_server(32, HttpTimeouts::LOCAL).await;
    let answers = tokio::task::spawn_blocking(move || {
        let flood: Vec<TcpStream> = (0..200)
            .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
            .collect();
        assert_eq!(flood.len(), 200, "the flood could not connect");
        let answers: Vec<String> = (0..3).map(|_| get_healthz(port)).collect();
        drop(flood);
        answers
    })
    .await
    .expect("client");
    for answer in answers {
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok\n"), "{answer}");
    }
    assert!(tracker.open() <= 32);
    // At least the flood beyond the limit was evicted (the accept loop may not have seen every
    // flood connection before the requests, so no exact count).
    assert!(
        metrics.evicted.with_label_values(&["test"]).get() >= 1,
        "nothing evicted"
    );
    assert_eq!(metrics.refused.with_label_values(&["test"]).get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_deadline() {
    let timeouts = HttpTimeouts {
        header: Duration::from_millis(300),
        ..HttpTimeouts::LOCAL
    };
    let (port, _tracker, metrics) = healthz_server(8, timeouts).await;
    let closed = tokio::task::spawn_blocking(move || {
        let mut idle = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        // Generous: the deadline is 300 ms; this only bounds a failing test.
        idle.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let read = idle.read(&mut buf);
        (read.map_err(|e| e.kind()), started.elapsed())
    })
    .await
    .expect("client");
    // Closed by the server (end of stream, or a reset), not by the client's own timeout.
    match closed.0 {
        Ok(0) | Err(std::io::ErrorKind::ConnectionReset) => {}
        other => panic!("expected the server to close the idle connection, got {other:?}"),
    }
    assert!(closed.1 < Duration::from_secs(20));
    assert_eq!(metrics.timed_out.with_label_values(&["test"]).get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_past_the_bound_are_refused() {
    let (port, _tracker, _metrics) = healthz_server(8, HttpTimeouts::LOCAL).await;
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let big = "a".repeat(HttpTimeouts::LOCAL.max_header_bytes);
        let _ = write!(
            stream,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n"
        );
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    })
    .await
    .expect("client");
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}
