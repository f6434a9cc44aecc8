//! A whole-pod kill through `KubeRuntimeManager` against the CRI fake: sidecars stop after the
//! main containers, in reverse order, with what is left of the grace period (upstream
//! `killContainersWithSyncResult` with its `terminationOrdering`), whether the pod is deleted or
//! its main containers are done.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::{IMAGE, container, manager, pod, status_of, with_hook};
use crate::{
    cri::{
        Operation,
        fake::{Call, FakeRuntime},
    },
    kuberuntime::{NoProbes, manager::KubeRuntimeManager},
};

fn sidecar(name: &str) -> k8s_openapi::api::core::v1::Container {
    k8s_openapi::api::core::v1::Container {
        restart_policy: Some("Always".into()),
        ..container(name, "IfNotPresent")
    }
}

/// Sidecars `s1`, `s2` (in that order) and main container `main`, all running; `hooked` gets a
/// `preStop` hook (which hangs once the test calls `hang_execs`).
async fn running_pod(
    fake: &Arc<FakeRuntime>,
    restart: &str,
    hooked: Option<&str>,
) -> (KubeRuntimeManager, Pod) {
    fake.add_image(IMAGE);
    let (m, _) = manager(fake);
    let hook = |c: k8s_openapi::api::core::v1::Container| {
        if hooked == Some(c.name.as_str()) {
            with_hook(c, false)
        } else {
            c
        }
    };
    let p = pod(
        vec![hook(sidecar("s1")), hook(sidecar("s2"))],
        vec![hook(container("main", "IfNotPresent"))],
        restart,
    );
    // Init containers start one per sync.
    for _ in 0..4 {
        m.sync_pod(
            &p,
            &status_of(fake).await,
            "/p",
            &NoProbes,
            &CancellationToken::new(),
        )
        .await;
    }
    let status = status_of(fake).await;
    let running: Vec<&str> = status
        .containers
        .iter()
        .filter(|c| c.state == crate::container::ContainerState::Running)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(running.len(), 3, "not all running: {:?}", status.containers);
    fake.take_calls();
    (m, p)
}

/// The `StopContainer` calls, as (container name, grace) in call order.
async fn stops(fake: &FakeRuntime) -> Vec<(String, Duration)> {
    let status = status_of(fake).await;
    let name = |id: &str| {
        status
            .containers
            .iter()
            .find(|c| c.id.id == id)
            .map_or_else(|| format!("unknown {id}"), |c| c.name.clone())
    };
    fake.take_calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::StopContainer { id, grace } => Some((name(&id), grace)),
            _ => None,
        })
        .collect()
}

fn id_of(status: &crate::container::PodStatus, name: &str) -> String {
    status
        .containers
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.id.id.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_deleted_pod_stops_its_sidecars_after_main_in_reverse_order() {
    let fake = Arc::new(FakeRuntime::new());
    let (m, p) = running_pod(&fake, "Always", None).await;
    let grace = Duration::from_secs(20);
    m.kill_pod_status(Some(&p), &status_of(&fake).await, grace)
        .await
        .expect("killed");
    // Stops that come at once keep the whole grace period: the waits took no time.
    let secs = Duration::from_secs;
    assert_eq!(
        stops(&fake).await,
        [
            ("main".to_owned(), secs(20)),
            ("s2".to_owned(), secs(20)),
            ("s1".to_owned(), secs(20))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn sidecars_wait_for_a_main_container_whose_pre_stop_hook_takes_the_grace_period() {
    let fake = Arc::new(FakeRuntime::new());
    let (m, p) = running_pod(&fake, "Always", Some("main")).await;
    fake.hang_execs();
    m.kill_pod_status(Some(&p), &status_of(&fake).await, Duration::from_secs(20))
        .await
        .expect("killed");
    // Unordered, the sidecars would be stopped at once with 20 s, main after its hook. Ordered,
    // main's hook spends the grace period, so everyone is left the minimum; the sidecars' waits
    // end with main's stop or the grace period, whichever comes first at that instant.
    let min = super::super::MINIMUM_GRACE;
    let mut got = stops(&fake).await;
    assert_eq!(got.first(), Some(&("main".to_owned(), min)), "{got:?}");
    got.sort();
    assert_eq!(
        got,
        [
            ("main".to_owned(), min),
            ("s1".to_owned(), min),
            ("s2".to_owned(), min)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn sidecars_get_the_minimum_grace_when_main_does_not_stop_in_time() {
    let fake = Arc::new(FakeRuntime::new());
    let (m, p) = running_pod(&fake, "Always", None).await;
    let status = status_of(&fake).await;
    // The runtime cannot stop `main`: it is not known to have terminated, so the sidecars wait
    // out the grace period, then get the minimum.
    fake.fail_next_for(
        Operation::StopContainer,
        &id_of(&status, "main"),
        tonic::Code::DeadlineExceeded,
    );
    let killed = m
        .kill_pod_status(Some(&p), &status, Duration::from_secs(10))
        .await;
    assert!(killed.is_err(), "main's failed stop is reported");
    let mut got = stops(&fake).await;
    assert_eq!(
        got.first().map(|(n, _)| n.as_str()),
        Some("main"),
        "{got:?}"
    );
    // Both sidecars' waits end with the same grace period: their order is not defined then.
    got.sort();
    let secs = Duration::from_secs;
    assert_eq!(
        got,
        [
            ("main".to_owned(), secs(10)),
            ("s1".to_owned(), super::super::MINIMUM_GRACE),
            ("s2".to_owned(), super::super::MINIMUM_GRACE)
        ]
    );
    // No sidecar was left running.
    let after = status_of(&fake).await;
    for sidecar in ["s1", "s2"] {
        assert_eq!(
            fake.container_state(&id_of(&after, sidecar)),
            Some(k8s_cri::v1::ContainerState::ContainerExited),
            "{sidecar}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn when_main_is_done_the_sidecars_stop_in_reverse_order() {
    let secs = Duration::from_secs;
    let min = super::super::MINIMUM_GRACE;
    // With `s2`'s stop failing, s1 waits out the pod's grace period (30 s) for it; the main
    // container, exited, holds nobody back: s2 is stopped at once with all of it.
    for (restart, s2_fails, want) in [
        ("Never", false, [("s2", secs(30)), ("s1", secs(30))]),
        ("OnFailure", false, [("s2", secs(30)), ("s1", secs(30))]),
        ("Never", true, [("s2", secs(30)), ("s1", min)]),
    ] {
        let fake = Arc::new(FakeRuntime::new());
        let (m, p) = running_pod(&fake, restart, None).await;
        let status = status_of(&fake).await;
        assert!(fake.exit_container(&id_of(&status, "main"), 0));
        if s2_fails {
            fake.fail_next_for(
                Operation::StopContainer,
                &id_of(&status, "s2"),
                tonic::Code::DeadlineExceeded,
            );
        }
        fake.take_calls();
        let outcome = m
            .sync_pod(
                &p,
                &status_of(&fake).await,
                "/p",
                &NoProbes,
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(
            outcome.errors.len(),
            usize::from(s2_fails),
            "{restart}: {:?}",
            outcome.errors
        );
        let want: Vec<(String, Duration)> =
            want.iter().map(|(n, g)| ((*n).to_owned(), *g)).collect();
        assert_eq!(stops(&fake).await, want, "{restart}, s2 fails: {s2_fails}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_the_spec_nothing_waits() {
    let fake = Arc::new(FakeRuntime::new());
    let (m, _) = running_pod(&fake, "Always", None).await;
    let status = status_of(&fake).await;
    fake.fail_next_for(
        Operation::StopContainer,
        &id_of(&status, "main"),
        tonic::Code::DeadlineExceeded,
    );
    // An orphan's kill (no spec, so no sidecars known): main's failed stop holds nobody back.
    let killed = m
        .kill_pod_status(None, &status, Duration::from_secs(20))
        .await;
    assert!(killed.is_err());
    let mut got = stops(&fake).await;
    got.sort();
    let secs = Duration::from_secs;
    assert_eq!(
        got,
        [
            ("main".to_owned(), secs(20)),
            ("s1".to_owned(), secs(20)),
            ("s2".to_owned(), secs(20))
        ]
    );
}
