//! Who waits for whom, table-driven, and the waits themselves under paused time.

use std::time::Duration;

use super::{TerminationOrdering, Turn, grace_after_wait};
use crate::pod::fixtures::{container, pod, sidecar};

/// `init1` is a plain init container between the sidecars: nobody waits for it.
fn two_sidecars_one_main() -> k8s_openapi::api::core::v1::Pod {
    pod(
        "Always",
        vec![sidecar("s1"), container("init1"), sidecar("s2")],
        vec![container("main"), container("other")],
    )
}

#[test]
fn who_waits_for_whom() {
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static [&'static str])],
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("everything running: mains, then later sidecars",
            &["s1", "s2", "main", "other"],
            &[("s2", &["main", "other"]), ("s1", &["main", "other", "s2"]), ("main", &[]), ("other", &[]), ("init1", &[])]),
        ("a sidecar not running is not waited for",
            &["s1", "main", "other"],
            &[("s2", &["main", "other"]), ("s1", &["main", "other"])]),
        ("no main container running: sidecars wait only for each other",
            &["s1", "s2"],
            &[("s2", &[]), ("s1", &["s2"])]),
        ("one main container left",
            &["s1", "s2", "other"],
            &[("s2", &["other"]), ("s1", &["other", "s2"])]),
        ("names unknown to the spec wait for nothing",
            &["s1", "s2", "main", "ghost"],
            &[("ghost", &[]), ("s1", &["main", "s2"])]),
    ];
    let p = two_sidecars_one_main();
    for (name, running, want) in cases {
        let ordering =
            TerminationOrdering::new(&p, running.iter().copied()).expect("the pod has sidecars");
        for (container, waits_for) in *want {
            assert_eq!(
                ordering.pending(container),
                *waits_for,
                "{name}: {container}"
            );
        }
    }
}

#[test]
fn a_pod_without_sidecars_has_no_ordering() {
    let p = pod("Always", vec![container("init")], vec![container("main")]);
    assert!(TerminationOrdering::new(&p, ["init", "main"]).is_none());
}

#[test]
fn terminations_release_the_sidecars_in_reverse_order() {
    let p = two_sidecars_one_main();
    let ordering = TerminationOrdering::new(&p, ["s1", "s2", "main", "other"]).expect("sidecars");
    ordering.container_terminated("main");
    assert_eq!(ordering.pending("s2"), ["other"]);
    ordering.container_terminated("other");
    assert!(ordering.pending("s2").is_empty());
    assert_eq!(ordering.pending("s1"), ["s2"]);
    // A repeat, or a name the spec does not have, changes nothing.
    ordering.container_terminated("other");
    ordering.container_terminated("ghost");
    assert_eq!(ordering.pending("s1"), ["s2"]);
    ordering.container_terminated("s2");
    assert!(ordering.pending("s1").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_sidecar_waits_for_the_main_containers_then_the_later_sidecar() {
    let p = two_sidecars_one_main();
    let ordering = TerminationOrdering::new(&p, ["s1", "s2", "main", "other"]).expect("sidecars");
    let grace = Duration::from_secs(30);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let wait = |name: &'static str| {
        let ordering = &ordering;
        let events_tx = events_tx.clone();
        async move {
            let (turn, _) = ordering.wait_for_turn(name, grace).await;
            let _ = events_tx.send(format!("turn {name}"));
            turn
        }
    };
    let terminate = async {
        for name in ["other", "main"] {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = events_tx.send(format!("stopped {name}"));
            ordering.container_terminated(name);
        }
        // s2 stops once its turn came (after both mains).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = events_tx.send("stopped s2".to_owned());
        ordering.container_terminated("s2");
    };
    let (s1, s2, main, ()) = tokio::join!(wait("s1"), wait("s2"), wait("main"), terminate);
    assert_eq!(
        (s1, s2, main),
        (Turn::Reached, Turn::Reached, Turn::Reached)
    );
    drop(events_tx);
    let mut order = Vec::new();
    while let Some(name) = events.recv().await {
        order.push(name);
    }
    // `main` waits for nothing; s2's turn comes after both mains, s1's after s2 stopped.
    assert_eq!(
        order,
        [
            "turn main",
            "stopped other",
            "stopped main",
            "turn s2",
            "stopped s2",
            "turn s1"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_with_the_grace_period() {
    let p = two_sidecars_one_main();
    let ordering = TerminationOrdering::new(&p, ["s1", "s2", "main", "other"]).expect("sidecars");
    let grace = Duration::from_secs(5);
    let (turn, waited) = ordering.wait_for_turn("s1", grace).await;
    assert_eq!(turn, Turn::GraceExpired);
    assert_eq!(grace_after_wait(grace, waited), Duration::ZERO);
    // Nothing still waited for, it is s1's turn at once, and a zero grace never waits.
    assert_eq!(
        ordering.wait_for_turn("s1", Duration::ZERO).await,
        (Turn::Reached, Duration::ZERO)
    );
}

#[test]
fn the_wait_comes_out_of_the_grace_period_in_whole_seconds() {
    let secs = Duration::from_secs;
    let ms = Duration::from_millis;
    assert_eq!(grace_after_wait(secs(20), ms(2_900)), secs(18));
    assert_eq!(grace_after_wait(secs(20), ms(900)), secs(20));
    assert_eq!(grace_after_wait(secs(3), secs(7)), Duration::ZERO);
    assert_eq!(grace_after_wait(ms(1_500), ms(1_200)), ms(500));
}
