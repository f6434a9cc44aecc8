//! Container statuses: states, last states, waiting reasons, lost containers.

use super::{crash_looping, cs, generate, waiting_reason};
use crate::container::PodUid;
use crate::pod::fixtures::{UID, container, pod, runtime, sidecar, t};
use crate::status::{ReasonCache, StartFailure, StartFailureReason, api_time};

#[test]
fn container_status_details() {
    let (a, b, init) = (container("a"), container("b"), container("init0"));
    let p = pod("Always", vec![init.clone()], vec![b.clone(), a.clone()]);
    let rt = runtime()
        .ready_sandbox()
        .exited(&init, 0)
        .exited(&a, 137)
        .map_latest(|c| c.reason = "OOMKilled".into())
        .running(&a)
        .map_latest(|c| c.restart_count = 1)
        .exited(&b, 2)
        .build();
    let s = generate(&p, &rt, &ReasonCache::new());

    // Regular containers by name, init containers in spec order.
    let names: Vec<&str> = s
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);

    let a_status = cs(&s, "a");
    let running = a_status.state.as_ref().unwrap().running.as_ref().unwrap();
    assert_eq!(running.started_at, api_time(t(41)));
    assert_eq!(a_status.restart_count, 1);
    assert_eq!(
        a_status.container_id,
        Some(rt.latest("a").unwrap().id.to_string())
    );
    assert_eq!(a_status.image, "registry.example/a:1");
    assert_eq!(a_status.image_id, "sha256:a");
    assert!(a_status.ready);
    assert_eq!(a_status.started, Some(true));
    let last = a_status
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    assert_eq!(last.finished_at, api_time(t(35)));

    let b_status = cs(&s, "b");
    let term = b_status
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!((term.exit_code, term.reason.as_deref()), (2, Some("Error")));
    assert_eq!(term.started_at, api_time(t(51)));
    assert_eq!(term.finished_at, api_time(t(55)));
    assert_eq!(term.container_id, b_status.container_id);
    assert!(!b_status.ready);
    assert_eq!(b_status.started, Some(false));

    let init_status = cs(&s, "init0");
    let term = init_status
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(term.reason.as_deref(), Some("Completed"));
    assert!(init_status.ready, "a succeeded init container is ready");
}

#[test]
fn waiting_reasons() {
    let (a, init) = (container("a"), container("init0"));
    let uid = PodUid::from(UID);
    let plain = pod("Always", vec![], vec![a.clone()]);
    let with_init = pod("Always", vec![init.clone()], vec![a.clone()]);

    let s = generate(
        &plain,
        &runtime().ready_sandbox().build(),
        &ReasonCache::new(),
    );
    assert_eq!(
        waiting_reason(&s, "a").as_deref(),
        Some("ContainerCreating")
    );
    let s = generate(
        &with_init,
        &runtime().ready_sandbox().running(&init).build(),
        &ReasonCache::new(),
    );
    assert_eq!(waiting_reason(&s, "a").as_deref(), Some("PodInitializing"));

    for reason in [
        StartFailureReason::ErrImagePull,
        StartFailureReason::ImagePullBackOff,
        StartFailureReason::ErrImageNeverPull,
        StartFailureReason::CreateContainerConfigError,
    ] {
        let mut reasons = ReasonCache::new();
        reasons.add(&uid, "a", StartFailure::new(reason, "details"));
        let s = generate(&plain, &runtime().ready_sandbox().build(), &reasons);
        let waiting = cs(&s, "a").state.as_ref().unwrap().waiting.clone().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some(reason.as_str()));
        assert_eq!(waiting.message.as_deref(), Some("details"));
    }

    // A crash-looping container waits; its exit moves to lastState.
    let rt = runtime().ready_sandbox().exited(&a, 1).build();
    let s = generate(&plain, &rt, &crash_looping("a"));
    assert_eq!(waiting_reason(&s, "a").as_deref(), Some("CrashLoopBackOff"));
    let last = cs(&s, "a")
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(last.exit_code, 1);

    // A sidecar restarts even in a Never pod, so its start failure shows.
    let side = sidecar("side");
    let never_side = pod("Never", vec![side.clone()], vec![a.clone()]);
    let rt_side = runtime()
        .ready_sandbox()
        .running(&a)
        .exited(&side, 1)
        .build();
    let s = generate(&never_side, &rt_side, &crash_looping("side"));
    assert_eq!(
        waiting_reason(&s, "side").as_deref(),
        Some("CrashLoopBackOff")
    );

    // Not restarted (Never): the reason cache does not apply, it stays terminated.
    let never = pod("Never", vec![], vec![a.clone()]);
    let s = generate(&never, &rt, &crash_looping("a"));
    assert!(cs(&s, "a").state.as_ref().unwrap().terminated.is_some());
}

#[test]
fn vanished_and_unknown_containers_terminated() {
    let a = container("a");
    let p0 = pod("Always", vec![], vec![a.clone()]);
    let was_running = generate(
        &p0,
        &runtime().ready_sandbox().running(&a).build(),
        &ReasonCache::new(),
    );
    let mut p = p0.clone();
    p.status = Some(was_running);

    // The runtime lost the container entirely: waiting again, but it did terminate.
    let s = generate(&p, &runtime().ready_sandbox().build(), &ReasonCache::new());
    let status = cs(&s, "a");
    let last = status
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("ContainerStatusUnknown"))
    );
    assert_eq!(status.restart_count, 1);
    assert_eq!(s.phase.as_deref(), Some("Running"), "not back to Pending");

    // The runtime reports it in an unknown state.
    let s = generate(
        &p,
        &runtime().ready_sandbox().unknown(&a).build(),
        &ReasonCache::new(),
    );
    let term = cs(&s, "a")
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(term.reason.as_deref(), Some("ContainerStatusUnknown"));
}

#[test]
fn ephemeral_containers_have_their_own_statuses_and_move_neither_phase_nor_readiness() {
    use k8s_openapi::api::core::v1::EphemeralContainer;
    let main = container("main");
    let mut p = pod("Always", vec![], vec![main.clone()]);
    let as_ephemeral = |name: &str| EphemeralContainer {
        name: name.into(),
        image: Some("busybox".into()),
        target_container_name: Some("main".into()),
        ..Default::default()
    };
    if let Some(spec) = p.spec.as_mut() {
        spec.ephemeral_containers = Some(vec![as_ephemeral("dbg"), as_ephemeral("later")]);
    }
    let dbg = crate::pod::spec::ephemeral_as_container(&as_ephemeral("dbg"));
    let rt = runtime()
        .ready_sandbox()
        .running(&main)
        .exited(&dbg, 0)
        .build();
    let s = generate(&p, &rt, &ReasonCache::new());
    let ephemeral = s.ephemeral_container_statuses.clone().unwrap_or_default();
    let names: Vec<&str> = ephemeral.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["dbg", "later"]);
    let done = ephemeral[0]
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(done, Some(0));
    assert_eq!(ephemeral[0].restart_count, 0);
    assert!(!ephemeral[0].ready);
    assert_eq!(waiting_reason_of(&ephemeral[1]), Some("ContainerCreating"));
    // The pod runs and is ready on its regular container alone.
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert!(cs(&s, "main").ready);
    let names: Vec<&str> = s
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["main"]);
}

fn waiting_reason_of(c: &k8s_openapi::api::core::v1::ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}
