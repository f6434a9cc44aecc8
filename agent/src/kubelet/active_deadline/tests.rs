use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn pod(seconds: Option<i64>) -> Pod {
    Pod {
        spec: Some(PodSpec {
            active_deadline_seconds: seconds,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn the_deadline_counts_from_the_start_time() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    assert_eq!(deadline(&pod(Some(3)), Some(start)), Some(at(1003)));
    assert_eq!(deadline(&pod(None), Some(start)), None, "no deadline");
    assert_eq!(deadline(&pod(Some(3)), None), None, "not started");
    assert_eq!(deadline(&pod(Some(-5)), Some(start)), Some(start));
    // Upstream: `duration >= allowedDuration`.
    assert!(!past_active_deadline(&pod(Some(3)), Some(start), at(1002)));
    assert!(past_active_deadline(&pod(Some(3)), Some(start), at(1003)));
    assert!(past_active_deadline(&pod(Some(3)), Some(start), at(5000)));
    assert!(!past_active_deadline(&pod(None), Some(start), at(5000)));
}

#[tokio::test]
async fn a_timer_fires_once_at_its_deadline_and_not_before() {
    let (timers, mut fired) = DeadlineTimers::new();
    let now = SystemTime::now();
    let (a, b) = (PodUid::from("a"), PodUid::from("b"));
    timers.set(&a, Some(now + HOUR), now);
    timers.set(&b, Some(now), now);
    assert_eq!(fired.recv().await, Some(b.clone()));
    assert!(fired.try_recv().is_err(), "a's deadline is an hour away");
    assert_eq!(timers.count(), 2);
    // Setting the same deadline again does not make a second timer fire.
    timers.set(&a, Some(now + HOUR), now);
    assert_eq!(timers.get(&a), Some(now + HOUR));
}

#[tokio::test]
async fn a_shortened_deadline_replaces_the_timer() {
    let (timers, mut fired) = DeadlineTimers::new();
    let now = SystemTime::now();
    let a = PodUid::from("a");
    timers.set(&a, Some(now + HOUR), now);
    // The API shortened it to what has already passed.
    timers.set(&a, Some(now - Duration::from_secs(1)), now);
    assert_eq!(fired.recv().await, Some(a.clone()));
    assert_eq!(timers.get(&a), Some(now - Duration::from_secs(1)));
    // Fired, and the sync found the pod not past it (the clock went back): set again, it fires
    // again.
    timers.set(&a, Some(now - Duration::from_secs(1)), now);
    assert_eq!(fired.recv().await, Some(a));
}

#[tokio::test]
async fn cancelled_and_removed_timers_never_fire() {
    let (timers, mut fired) = DeadlineTimers::new();
    let now = SystemTime::now();
    let (gone, dropped, last) = (
        PodUid::from("gone"),
        PodUid::from("dropped"),
        PodUid::from("last"),
    );
    // The current-thread runtime runs no timer task before this test awaits.
    timers.set(&gone, Some(now), now);
    timers.cancel(&gone);
    timers.set(&dropped, Some(now), now);
    timers.set(&dropped, None, now);
    timers.set(&last, Some(now), now);
    assert_eq!(fired.recv().await, Some(last));
    assert!(fired.try_recv().is_err());
    assert_eq!(timers.count(), 1);
    assert_eq!(timers.get(&gone), None);
}
