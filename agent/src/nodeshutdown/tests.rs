//! The manager against the fake logind and pods: the delay raised, the lock held, released
//! after the pods and taken again on a cancellation or a new connection; the groups killed in
//! order with their grace, a hung group given up after its seconds. Time is tokio's paused clock.

use std::{collections::HashSet, sync::Arc, time::Duration};

use prometheus::Registry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    NodeShutdownManager, ShutdownConfig, ShutdownMetrics, ShutdownState,
    fake::{FakeInhibitor, FakeTerminator, Kill},
    groups::SYSTEM_CRITICAL_PRIORITY,
};
use crate::events::fake::FakeRecorder;

struct Harness {
    inhibitor: Arc<FakeInhibitor>,
    terminator: Arc<FakeTerminator>,
    state: ShutdownState,
    node_status: Arc<Notify>,
    events: Arc<FakeRecorder>,
    metrics: ShutdownMetrics,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// A pod of `priority` with its own grace period (the groups' tests use it too).
pub(super) fn pod(
    name: &str,
    priority: Option<i32>,
    grace: Option<i64>,
) -> Arc<k8s_openapi::api::core::v1::Pod> {
    crate::testing::pod()
        .named("default", name, name)
        .spec(|s| {
            s.priority = priority;
            s.termination_grace_period_seconds = grace;
        })
        .arc()
}

fn start(inhibitor: Arc<FakeInhibitor>, terminator: FakeTerminator) -> Harness {
    let terminator = Arc::new(terminator);
    let state = ShutdownState::default();
    let node_status = Arc::new(Notify::new());
    let events = FakeRecorder::new();
    let metrics = ShutdownMetrics::register(&Registry::new(), None).expect("metrics");
    let stop = CancellationToken::new();
    let manager = NodeShutdownManager {
        config: ShutdownConfig::from_periods(Duration::from_secs(30), Duration::from_secs(10)),
        inhibitor: inhibitor.clone(),
        terminator: terminator.clone(),
        state: state.clone(),
        node_status: node_status.clone(),
        events: events.clone(),
        node_name: "node-a".into(),
        metrics: metrics.clone(),
    };
    let task = tokio::spawn(manager.run(stop.clone()));
    Harness {
        inhibitor,
        terminator,
        state,
        node_status,
        events,
        metrics,
        stop,
        task,
    }
}

/// Lets the manager run what is ready (the paused clock moves only when all tasks wait).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn two_pods() -> FakeTerminator {
    FakeTerminator {
        pods: std::sync::Mutex::new(vec![
            pod("critical", Some(SYSTEM_CRITICAL_PRIORITY + 1000), Some(3)),
            pod("regular", None, Some(60)),
        ]),
        ..FakeTerminator::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_short_delay_is_raised_then_the_lock_is_held() {
    let h = start(
        FakeInhibitor::with_delay(Duration::from_secs(5)),
        two_pods(),
    );
    settle().await;
    assert_eq!(
        h.inhibitor.calls(),
        [
            "connect",
            "current_inhibit_delay",
            "override_inhibit_delay",
            "reload_logind",
            "current_inhibit_delay",
            "monitor_shutdown",
            "inhibit_shutdown"
        ]
    );
    assert_eq!(h.inhibitor.held(), 1);
    assert!(h.state.admission().is_ok());
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn a_long_enough_delay_is_left_alone() {
    let h = start(
        FakeInhibitor::with_delay(Duration::from_secs(90)),
        two_pods(),
    );
    settle().await;
    assert!(!h.inhibitor.calls().contains(&"override_inhibit_delay"));
    assert_eq!(h.inhibitor.held(), 1);
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn a_delay_logind_does_not_raise_leaves_the_node_without_graceful_shutdown() {
    let inhibitor = Arc::new(FakeInhibitor {
        delay: std::sync::Mutex::new(Duration::from_secs(5)),
        ignore_drop_in: true,
        ..FakeInhibitor::default()
    });
    let h = start(inhibitor, two_pods());
    // Past the reload wait, and past several reconnect periods: the first failure is final.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.inhibitor.held(), 0);
    assert!(!h.inhibitor.watched());
    assert_eq!(
        h.inhibitor
            .calls()
            .iter()
            .filter(|c| **c == "connect")
            .count(),
        1
    );
    assert!(!h.task.is_finished(), "the task waits for the agent's end");
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_kills_regular_pods_then_critical_ones_then_releases_the_lock() {
    let h = start(
        FakeInhibitor::with_delay(Duration::from_secs(5)),
        two_pods(),
    );
    settle().await;
    let notified = h.node_status.notified();
    h.inhibitor.announce(true);
    settle().await;
    // A pod's own shorter grace wins; a longer one is cut to the group's share.
    assert_eq!(
        h.terminator.kills(),
        [
            Kill {
                pod: "regular".into(),
                grace_secs: 20
            },
            Kill {
                pod: "critical".into(),
                grace_secs: 3
            },
        ]
    );
    assert_eq!(h.inhibitor.held(), 0, "released once the pods are done");
    assert!(h.state.is_shutting_down());
    assert_eq!(
        h.state.admission(),
        Err((super::NOT_ADMITTED_REASON, super::NOT_ADMITTED_MESSAGE))
    );
    assert_eq!(h.state.not_ready(), Some("node is shutting down"));
    tokio::time::timeout(Duration::from_secs(1), notified)
        .await
        .expect("the node status was asked for at once");
    assert_eq!(h.events.reasons(), ["NodeShutdown"]);
    assert!(h.metrics.start_time.get() > 0.0);
    assert!(h.metrics.end_time.get() >= h.metrics.start_time.get());

    // Cancelled: the lock is taken again and pods are admitted again.
    h.inhibitor.announce(false);
    settle().await;
    assert_eq!(h.inhibitor.held(), 1);
    assert_eq!(h.inhibitor.taken(), 2);
    assert!(h.state.admission().is_ok());
    assert_eq!(h.events.reasons(), ["NodeShutdown", "NodeShutdown"]);
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn a_group_that_does_not_stop_is_given_its_seconds_only() {
    let mut terminator = two_pods();
    terminator.hang = HashSet::from(["regular".to_owned()]);
    let h = start(
        FakeInhibitor::with_delay(Duration::from_secs(60)),
        terminator,
    );
    settle().await;
    h.inhibitor.announce(true);
    settle().await;
    assert_eq!(h.terminator.kills().len(), 1, "the critical group waits");
    assert_eq!(h.inhibitor.held(), 1);
    // The regular group's 20 s pass: the critical pods go next, then the lock.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let order: Vec<String> = h.terminator.kills().into_iter().map(|k| k.pod).collect();
    assert_eq!(order, ["regular", "critical"]);
    assert_eq!(h.inhibitor.held(), 0);
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_is_made_again_with_a_new_lock() {
    let h = start(
        FakeInhibitor::with_delay(Duration::from_secs(60)),
        two_pods(),
    );
    settle().await;
    assert_eq!(h.inhibitor.taken(), 1);
    h.inhibitor.disconnect();
    tokio::time::sleep(super::manager::RECONNECT_PERIOD * 2).await;
    assert!(h.inhibitor.watched());
    assert_eq!(h.inhibitor.taken(), 2);
    assert_eq!(h.inhibitor.held(), 1, "the older lock was closed");
    // The new connection's signals are followed.
    h.inhibitor.announce(true);
    settle().await;
    assert_eq!(h.terminator.kills().len(), 2);
    assert_eq!(h.inhibitor.held(), 0);
    h.stop.cancel();
    h.task.await.expect("manager");
}

#[tokio::test(start_paused = true)]
async fn without_a_grace_period_nothing_talks_to_logind() {
    let inhibitor = FakeInhibitor::with_delay(Duration::from_secs(5));
    let stop = CancellationToken::new();
    let manager = NodeShutdownManager {
        config: ShutdownConfig::default(),
        inhibitor: inhibitor.clone(),
        terminator: Arc::new(FakeTerminator::default()),
        state: ShutdownState::default(),
        node_status: Arc::new(Notify::new()),
        events: FakeRecorder::new(),
        node_name: "node-a".into(),
        metrics: ShutdownMetrics::register(&Registry::new(), None).expect("metrics"),
    };
    let task = tokio::spawn(manager.run(stop.clone()));
    settle().await;
    assert!(inhibitor.calls().is_empty());
    stop.cancel();
    task.await.expect("manager");
}
