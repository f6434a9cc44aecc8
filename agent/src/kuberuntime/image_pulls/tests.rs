use std::time::Duration;

use futures::FutureExt as _;

use super::*;

fn limits(serialize: bool, max_parallel: Option<u32>, qps: u32, burst: u32) -> PullLimits {
    PullLimits {
        serialize,
        max_parallel: max_parallel.and_then(NonZeroU32::new),
        qps,
        burst,
    }
}

fn gate(limits: PullLimits) -> (PullGate, ImagePullMetrics) {
    let metrics = ImagePullMetrics::unregistered().expect("static metric definitions");
    (PullGate::new(limits).with_metrics(metrics.clone()), metrics)
}

/// The largest `swiftlet_image_pull_concurrency` bucket bound that holds every observation.
fn most_at_once(metrics: &ImagePullMetrics) -> Option<f64> {
    use prometheus::core::Collector as _;
    let families = metrics.concurrency.collect();
    let histogram = families[0].get_metric()[0].get_histogram();
    let total = histogram.get_sample_count();
    histogram
        .get_bucket()
        .iter()
        .find(|b| b.cumulative_count() == total)
        .map(|b| b.upper_bound())
}

#[test]
fn serial_pulls_have_one_slot_and_parallel_ones_their_limit() {
    assert_eq!(PullLimits::default().slots(), Some(1));
    assert_eq!(limits(true, Some(1), 5, 10).slots(), Some(1));
    assert_eq!(limits(false, None, 5, 10).slots(), None);
    assert_eq!(limits(false, Some(3), 5, 10).slots(), Some(3));
}

#[tokio::test]
async fn serial_pulls_run_one_at_a_time_in_arrival_order() {
    let (gate, metrics) = gate(limits(true, None, 0, 0));
    let mut first = Box::pin(gate.admit());
    let mut second = Box::pin(gate.admit());
    let mut third = Box::pin(gate.admit());
    let running = (&mut first)
        .now_or_never()
        .expect("the first pull starts at once")
        .expect("no rate limit");
    assert!((&mut second).now_or_never().is_none());
    assert!((&mut third).now_or_never().is_none());
    assert_eq!(metrics.waiting.get(), 2);
    assert_eq!(metrics.in_flight.get(), 1);

    drop(running);
    // The slot went to the second, which came first: the third still waits.
    assert!((&mut third).now_or_never().is_none());
    let running = (&mut second)
        .now_or_never()
        .expect("the second pull starts next")
        .expect("no rate limit");
    assert_eq!(metrics.waiting.get(), 1);
    drop(running);
    let running = (&mut third)
        .now_or_never()
        .expect("then the third")
        .expect("no rate limit");
    drop(running);
    assert_eq!((metrics.waiting.get(), metrics.in_flight.get()), (0, 0));
    assert_eq!(metrics.concurrency.get_sample_count(), 3);
    assert_eq!(most_at_once(&metrics), Some(1.0));
}

#[tokio::test]
async fn parallel_pulls_stop_at_their_limit() {
    let (gate, metrics) = gate(limits(false, Some(2), 0, 0));
    let a = gate
        .admit()
        .now_or_never()
        .expect("free slot")
        .expect("no rate limit");
    let b = gate
        .admit()
        .now_or_never()
        .expect("free slot")
        .expect("no rate limit");
    let mut c = Box::pin(gate.admit());
    assert!((&mut c).now_or_never().is_none());
    assert_eq!((metrics.in_flight.get(), metrics.waiting.get()), (2, 1));
    drop(a);
    let c = (&mut c)
        .now_or_never()
        .expect("a slot is free")
        .expect("no rate limit");
    drop((b, c));
    assert_eq!(most_at_once(&metrics), Some(2.0));
}

#[tokio::test]
async fn without_a_limit_every_pull_starts_at_once() {
    let (gate, metrics) = gate(limits(false, None, 0, 0));
    let slots: Vec<_> = (0..20)
        .map(|_| {
            gate.admit()
                .now_or_never()
                .expect("no slot limit")
                .expect("no rate limit")
        })
        .collect();
    assert_eq!(metrics.in_flight.get(), 20);
    drop(slots);
    assert_eq!(metrics.in_flight.get(), 0);
}

#[tokio::test]
async fn a_waiting_pull_that_is_dropped_leaves_the_queue() {
    let (gate, metrics) = gate(limits(true, None, 0, 0));
    let running = gate
        .admit()
        .now_or_never()
        .expect("free")
        .expect("no limit");
    let mut waiting = Box::pin(gate.admit());
    let mut next = Box::pin(gate.admit());
    assert!((&mut waiting).now_or_never().is_none());
    assert!((&mut next).now_or_never().is_none());
    drop(waiting);
    assert_eq!(metrics.waiting.get(), 1);
    drop(running);
    assert!((&mut next).now_or_never().is_some());
}

#[tokio::test(start_paused = true)]
async fn the_token_bucket_starts_full_and_refills_at_qps() {
    let start = Instant::now();
    let mut bucket = TokenBucket::new(5, 10, start);
    let accepted = (0..12).filter(|_| bucket.try_accept(start)).count();
    assert_eq!(accepted, 10);
    // 5 a second: one token every 200 ms.
    assert!(!bucket.try_accept(start + Duration::from_millis(100)));
    assert!(bucket.try_accept(start + Duration::from_millis(200)));
    assert!(!bucket.try_accept(start + Duration::from_millis(200)));
    // Never more than the burst, however long it rested.
    let later = start + Duration::from_secs(3600);
    assert_eq!((0..20).filter(|_| bucket.try_accept(later)).count(), 10);
}

#[tokio::test(start_paused = true)]
async fn without_a_token_a_pull_fails_and_gives_its_slot_back() {
    let (gate, metrics) = gate(limits(true, None, 1, 1));
    let first = gate.admit().await.expect("the burst's one token");
    drop(first);
    let second = gate.admit().await;
    assert_eq!(second.err(), Some(PullGateError::QpsExceeded));
    assert_eq!(PullGateError::QpsExceeded.to_string(), PULL_QPS_EXCEEDED);
    assert_eq!((metrics.in_flight.get(), metrics.waiting.get()), (0, 0));
    // The slot is free again, and a second later so is a token.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(gate.admit().await.is_ok());
}

#[test]
fn image_sizes_fall_in_upstreams_buckets() {
    const MIB: u64 = 1024 * 1024;
    let cases = [
        (0, "N/A"),
        (1, "0-10MB"),
        (10 * MIB, "0-10MB"),
        (10 * MIB + 1, "10MB-100MB"),
        (300 * MIB, "100MB-500MB"),
        (2048 * MIB, "1GB-5GB"),
        (200 * 1024 * MIB, "GT100GB"),
    ];
    for (size, want) in cases {
        assert_eq!(image_size_bucket(size), want, "{size}");
    }
}

#[test]
fn the_histogram_has_upstreams_name_buckets_and_label() {
    let registry = Registry::new();
    let metrics = ImagePullMetrics::register(&registry).expect("registers once");
    let gate = PullGate::unlimited().with_metrics(metrics);
    gate.observe(Duration::from_millis(1500), 5 * 1024 * 1024);
    let text = {
        use prometheus::Encoder as _;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8")
    };
    assert!(
        text.contains(
            "kubelet_image_pull_duration_seconds_bucket{image_size_in_bytes=\"0-10MB\",le=\"5\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains(
        "kubelet_image_pull_duration_seconds_bucket{image_size_in_bytes=\"0-10MB\",le=\"1\"} 0"
    ));
    assert!(text.contains("le=\"3600\""));
}
