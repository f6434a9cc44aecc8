//! Tests of the fake: its state machines and call log here, its other services in
//! `services`.

mod services;

use std::{sync::Arc, time::Duration};

use k8s_cri::v1 as cri;
use tonic::Code;

use super::fixtures::{IMAGE, container_config, host_network, image_spec, pod_sandbox_config};
use super::{Call, FakeRuntime};
use crate::cri::{Error, ImageService, Operation, RuntimeService};

fn state_of(fake: &FakeRuntime, id: &str) -> cri::ContainerState {
    fake.container_state(id).expect("container exists")
}

async fn outcome(fake: &FakeRuntime, id: &str) -> (i32, String) {
    let s = fake.container_status(id).await.unwrap();
    (s.exit_code, s.reason)
}

#[tokio::test]
async fn a_pod_starts_with_the_exact_call_sequence_logged() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake
        .start_pod("u1", "web", "default", &["app"])
        .await
        .unwrap();
    assert_eq!(
        fake.take_calls(),
        vec![
            Call::RunPodSandbox {
                uid: "u1".into(),
                name: "web".into(),
                namespace: "default".into(),
                attempt: 0,
                runtime_handler: String::new(),
            },
            Call::ImageStatus {
                image: IMAGE.into()
            },
            Call::PullImage {
                image: IMAGE.into()
            },
            Call::CreateContainer {
                sandbox_id: sandbox.clone(),
                name: "app".into(),
                attempt: 0,
            },
            Call::StartContainer { id: ids[0].clone() },
        ]
    );
    assert!(fake.calls().is_empty());
    assert_eq!(
        state_of(&fake, &ids[0]),
        cri::ContainerState::ContainerRunning
    );
}

#[tokio::test]
async fn containers_go_created_running_exited_removed() {
    let fake = FakeRuntime::new();
    fake.add_image("img");
    let sandbox_config = pod_sandbox_config("u1", "p", "ns", 0);
    let sandbox = fake
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap();
    let config = container_config(&sandbox_config, "app", "img", 0, 7);
    let id = fake
        .create_container(&sandbox, config, sandbox_config)
        .await
        .unwrap();

    let created = fake.container_status(&id).await.unwrap();
    assert_eq!(created.state(), cri::ContainerState::ContainerCreated);
    assert_eq!(created.started_at, 0);
    assert!(created.image_ref.starts_with("sha256:"));
    assert_eq!(created.log_path, "/var/log/pods/ns_p_u1/app/0.log");

    fake.start_container(&id).await.unwrap();
    let err = fake.start_container(&id).await.unwrap_err();
    assert_eq!(err.code(), Code::Unknown, "{err}");
    let running = fake.container_status(&id).await.unwrap();
    assert!(running.started_at > running.created_at);

    assert!(fake.exit_container(&id, 3));
    assert!(
        !fake.exit_container(&id, 4),
        "only a running container exits"
    );
    let exited = fake.container_status(&id).await.unwrap();
    assert_eq!(exited.state(), cri::ContainerState::ContainerExited);
    assert_eq!((exited.exit_code, exited.reason.as_str()), (3, "Error"));
    assert!(exited.finished_at > exited.started_at);

    // Stopping an exited container changes nothing; removing is idempotent.
    fake.stop_container(&id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(fake.container_status(&id).await.unwrap().exit_code, 3);
    fake.remove_container(&id).await.unwrap();
    fake.remove_container(&id).await.unwrap();
    assert!(fake.container_status(&id).await.unwrap_err().is_not_found());
    assert!(
        fake.stop_container(&id, Duration::ZERO)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn stop_exits_143_with_grace_137_without_and_oom_says_so() {
    let fake = FakeRuntime::new();
    let (_, ids) = fake
        .start_pod("u1", "p", "ns", &["a", "b", "c", "d"])
        .await
        .unwrap();
    fake.stop_container(&ids[0], Duration::from_secs(30))
        .await
        .unwrap();
    fake.stop_container(&ids[1], Duration::ZERO).await.unwrap();
    assert!(fake.oom_kill_container(&ids[2]));
    assert!(fake.exit_container(&ids[3], 0));
    assert_eq!(outcome(&fake, &ids[0]).await, (143, "Error".into()));
    assert_eq!(outcome(&fake, &ids[1]).await, (137, "Error".into()));
    assert_eq!(outcome(&fake, &ids[2]).await, (137, "OOMKilled".into()));
    assert_eq!(outcome(&fake, &ids[3]).await, (0, "Completed".into()));
    assert!(fake.calls().contains(&Call::StopContainer {
        id: ids[0].clone(),
        grace: Duration::from_secs(30)
    }));
}

#[tokio::test]
async fn sandboxes_go_ready_notready_removed_and_take_their_containers() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake.start_pod("u1", "p", "ns", &["app"]).await.unwrap();
    let status = fake.pod_sandbox_status(&sandbox).await.unwrap();
    assert_eq!(status.state(), cri::PodSandboxState::SandboxReady);
    assert_eq!(status.network.unwrap().ip, "10.88.0.2");

    fake.stop_pod_sandbox(&sandbox).await.unwrap();
    fake.stop_pod_sandbox(&sandbox).await.unwrap();
    assert_eq!(
        fake.sandbox_state(&sandbox),
        Some(cri::PodSandboxState::SandboxNotready)
    );
    let killed = fake.container_status(&ids[0]).await.unwrap();
    assert_eq!(
        (killed.state(), killed.exit_code),
        (cri::ContainerState::ContainerExited, 137)
    );

    // No new containers in a stopped sandbox.
    let config = container_config(&pod_sandbox_config("u1", "p", "ns", 0), "x", IMAGE, 0, 0);
    let err = fake
        .create_container(&sandbox, config, Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let status = fake.pod_sandbox_status(&sandbox).await.unwrap();
    assert_eq!(
        status.network.unwrap().ip,
        "",
        "no IP once the network is torn down"
    );

    fake.remove_pod_sandbox(&sandbox).await.unwrap();
    fake.remove_pod_sandbox(&sandbox).await.unwrap();
    assert!(fake.container_ids().is_empty());
    assert!(fake.sandbox_ids().is_empty());
    assert!(
        fake.pod_sandbox_status(&sandbox)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        fake.stop_pod_sandbox(&sandbox)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn creation_is_refused_as_containerd_refuses_it() {
    let fake = FakeRuntime::new();
    let sandbox_config = pod_sandbox_config("u1", "p", "ns", 0);
    let sandbox = fake
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap();
    // The same sandbox name and attempt twice.
    let err = fake
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unknown);

    let config = container_config(&sandbox_config, "app", "missing", 0, 0);
    let err = fake
        .create_container(&sandbox, config, sandbox_config.clone())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "an absent image: {err}");

    fake.add_image("img");
    let config = container_config(&sandbox_config, "app", "img", 0, 0);
    let err = fake
        .create_container("nope", config.clone(), sandbox_config.clone())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "an unknown sandbox: {err}");
    fake.create_container(&sandbox, config.clone(), sandbox_config.clone())
        .await
        .unwrap();
    let err = fake
        .create_container(&sandbox, config, sandbox_config.clone())
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::Unknown,
        "the same name and attempt: {err}"
    );
    let next = container_config(&sandbox_config, "app", "img", 1, 0);
    fake.create_container(&sandbox, next, sandbox_config)
        .await
        .unwrap();
}

#[tokio::test]
async fn scripted_failures_hit_the_next_matching_call_and_are_logged() {
    let fake = FakeRuntime::new();
    fake.fail_next(Operation::PullImage, Code::NotFound);
    let err = fake
        .pull_image(image_spec("img"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::NotFound {
            operation: Operation::PullImage,
            ..
        }
    ));
    fake.pull_image(image_spec("img"), None, None)
        .await
        .unwrap();
    assert_eq!(fake.calls().len(), 2, "failed calls are logged too");

    let (_, ids) = fake.start_pod("u1", "p", "ns", &["a", "b"]).await.unwrap();
    fake.fail_next_for(Operation::ContainerStatus, &ids[1], Code::NotFound);
    fake.container_status(&ids[0]).await.unwrap();
    assert!(
        fake.container_status(&ids[1])
            .await
            .unwrap_err()
            .is_not_found()
    );
    fake.container_status(&ids[1]).await.unwrap();

    fake.fail_always(Operation::ListContainers, Code::Unavailable);
    for _ in 0..2 {
        let err = fake.list_containers(None).await.unwrap_err();
        assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    }
    fake.fail_next(Operation::ExecSync, Code::DeadlineExceeded);
    let err = fake
        .exec_sync(&ids[0], vec!["true".into()], Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
    fake.clear_failures();
    assert_eq!(fake.list_containers(None).await.unwrap().len(), 2);
}

#[tokio::test]
async fn lists_filter_by_id_state_sandbox_and_labels() {
    let fake = FakeRuntime::new();
    let (s1, a) = fake.start_pod("u1", "p1", "ns", &["x", "y"]).await.unwrap();
    let (s2, _) = fake.start_pod("u2", "p2", "ns", &["z"]).await.unwrap();
    fake.exit_container(&a[0], 0);
    fake.stop_pod_sandbox(&s2).await.unwrap();

    let ready = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady.into(),
        }),
        ..Default::default()
    };
    let ids = |v: Vec<cri::PodSandbox>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(fake.list_pod_sandbox(Some(ready)).await.unwrap()),
        vec![s1.clone()]
    );
    let by_uid = cri::PodSandboxFilter {
        label_selector: [("io.kubernetes.pod.uid".to_owned(), "u2".to_owned())].into(),
        ..Default::default()
    };
    assert_eq!(
        ids(fake.list_pod_sandbox(Some(by_uid)).await.unwrap()),
        vec![s2.clone()]
    );
    assert_eq!(fake.list_pod_sandbox(None).await.unwrap().len(), 2);

    let running = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning.into(),
        }),
        ..Default::default()
    };
    assert_eq!(
        fake.list_containers(Some(running)).await.unwrap().len(),
        1,
        "y only"
    );
    let in_s1 = cri::ContainerFilter {
        pod_sandbox_id: s1.clone(),
        ..Default::default()
    };
    assert_eq!(fake.list_containers(Some(in_s1)).await.unwrap().len(), 2);
    let by_id = cri::ContainerFilter {
        id: a[1].clone(),
        ..Default::default()
    };
    let listed = fake.list_containers(Some(by_id)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pod_sandbox_id, s1);
    assert_eq!(listed[0].labels["io.kubernetes.container.name"], "y");
}

#[tokio::test]
async fn vanished_objects_are_gone_without_a_call() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake.start_pod("u1", "p", "ns", &["a", "b"]).await.unwrap();
    fake.take_calls();
    assert!(fake.vanish_container(&ids[0]));
    assert!(!fake.vanish_container(&ids[0]));
    assert!(fake.calls().is_empty());
    assert!(
        fake.container_status(&ids[0])
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(fake.vanish_sandbox(&sandbox));
    assert!(
        fake.pod_sandbox_status(&sandbox)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_eq!(
        fake.container_ids(),
        vec![ids[1].clone()],
        "containers stay"
    );
}
