//! `get_pod_status` against the fake.

use super::*;

#[tokio::test]
async fn a_sandbox_vanishing_between_list_and_status_is_skipped() {
    let fake = FakeRuntime::new();
    let (sandbox, _) = fake.start_pod("u9", "lone", "ns9", &["app"]).await.unwrap();
    fake.fail_next_for(Operation::PodSandboxStatus, &sandbox, Code::NotFound);
    let status = get_pod_status(&fake, &uid("u9"), "lone", "ns9")
        .await
        .unwrap();
    assert!(status.sandboxes.is_empty());
    assert!(status.ips().is_empty());
    assert_eq!(status.containers.len(), 1);
}

#[tokio::test]
async fn get_pod_status_reports_sandboxes_newest_first_with_ips_of_the_ready_one() {
    let fake = FakeRuntime::new();
    let old = fake
        .run_pod_sandbox(pod_sandbox_config("u1", "web", "prod", 0), "")
        .await
        .unwrap();
    fake.stop_pod_sandbox(&old).await.unwrap();
    let new = fake
        .run_pod_sandbox(pod_sandbox_config("u1", "web", "prod", 1), "")
        .await
        .unwrap();
    fake.start_pod("u2", "other", "prod", &["x"]).await.unwrap();

    let status = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap();
    let ids: Vec<_> = status.sandboxes.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, vec![new.as_str(), old.as_str()]);
    assert_eq!(status.sandboxes[0].attempt, 1);
    assert_eq!(status.sandboxes[0].state, SandboxState::Ready);
    assert_eq!(status.sandboxes[1].state, SandboxState::NotReady);
    assert!(
        status.sandboxes[1].ips.is_empty(),
        "no IPs from a sandbox that is not ready"
    );
    assert_eq!(status.ips(), ["10.88.0.3".to_owned()]);
    assert!(!status.sandboxes[0].host_network);
    assert_eq!(status.sandboxes[0].labels[LABEL_POD_UID], "u1");
    assert!(status.sandboxes[0].created_at > status.sandboxes[1].created_at);
    assert!(status.containers.is_empty());
}

#[tokio::test]
async fn host_network_sandboxes_report_so_and_no_ip() {
    let fake = FakeRuntime::new();
    let config = host_network(pod_sandbox_config("u1", "node-exporter", "mon", 0));
    fake.run_pod_sandbox(config, "").await.unwrap();
    let status = get_pod_status(&fake, &uid("u1"), "node-exporter", "mon")
        .await
        .unwrap();
    assert!(status.sandboxes[0].host_network);
    assert!(status.ips().is_empty());
}

#[tokio::test]
async fn containers_come_newest_first_with_labels_and_annotations_decoded() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = pod_with_restarts(&fake).await;
    let status = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap();
    let order: Vec<_> = status.containers.iter().map(|c| c.id.id.clone()).collect();
    assert_eq!(order, vec![ids[2].clone(), ids[1].clone(), ids[0].clone()]);

    let latest = status.latest("app").unwrap();
    assert_eq!(latest.id, ContainerId::new("containerd", &ids[1]));
    assert_eq!((latest.restart_count, latest.hash), (1, 0xabc));
    assert_eq!(latest.sandbox_id, sandbox);
    assert_eq!(latest.image, IMAGE);
    let image_id = fake
        .image_status(image_spec(IMAGE))
        .await
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(latest.image_ref, image_id);
    assert_eq!(status.instances("app").count(), 2);
    assert_eq!(status.latest("log").unwrap().hash, 0xdef);
    assert_eq!(
        status.latest("log").unwrap().labels[LABEL_CONTAINER_NAME],
        "log"
    );
}

#[tokio::test]
async fn states_decide_which_times_exit_code_and_reason_are_reported() {
    let fake = FakeRuntime::new();
    let (_, ids) = pod_with_restarts(&fake).await;
    let config = pod_sandbox_config("u1", "web", "prod", 0);
    let sandbox = fake.sandbox_ids().remove(0);
    let created_only = fake
        .create_container(
            &sandbox,
            container_config(&config, "init", IMAGE, 0, 0),
            config,
        )
        .await
        .unwrap();
    assert!(fake.oom_kill_container(&ids[2]));

    let status = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap();
    let by_id = |id: &str| status.containers.iter().find(|c| c.id.id == id).unwrap();

    let exited = by_id(&ids[0]);
    assert_eq!(exited.state, ContainerState::Exited);
    assert_eq!(
        (exited.exit_code, exited.reason.as_str()),
        (Some(1), "Error")
    );
    assert!(exited.finished_at.unwrap() > exited.started_at.unwrap());
    assert!(exited.started_at.unwrap() > exited.created_at.unwrap());

    let running = by_id(&ids[1]);
    assert_eq!(running.state, ContainerState::Running);
    assert!(running.started_at.is_some());
    assert_eq!((running.finished_at, running.exit_code), (None, None));
    assert_eq!(running.reason, "");

    let oom = by_id(&ids[2]);
    assert_eq!(
        (oom.exit_code, oom.reason.as_str()),
        (Some(137), "OOMKilled")
    );

    let created = by_id(&created_only);
    assert_eq!(created.state, ContainerState::Created);
    assert_eq!((created.started_at, created.finished_at), (None, None));
}

#[tokio::test]
async fn a_container_vanishing_between_list_and_status_is_skipped_other_errors_are_not() {
    let fake = FakeRuntime::new();
    let (_, ids) = pod_with_restarts(&fake).await;
    fake.fail_next_for(Operation::ContainerStatus, &ids[0], Code::NotFound);
    let status = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap();
    assert_eq!(status.containers.len(), 2);
    assert!(status.containers.iter().all(|c| c.id.id != ids[0]));

    fake.fail_next_for(Operation::ContainerStatus, &ids[1], Code::Internal);
    let err = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.operation()),
        (Code::Internal, Some(Operation::ContainerStatus))
    );

    fake.fail_next(Operation::ListContainers, Code::Unavailable);
    let err = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");

    fake.fail_next(Operation::PodSandboxStatus, Code::DeadlineExceeded);
    let err = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
}

#[tokio::test]
async fn get_pod_status_asks_by_pod_uid_label_in_upstream_order() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake.start_pod("u1", "web", "prod", &["app"]).await.unwrap();
    fake.take_calls();
    let before = SystemTime::now();
    let status = get_pod_status(&fake, &uid("u1"), "web", "prod")
        .await
        .unwrap();
    assert!(status.observed_at >= before);
    let selector = HashMap::from([(LABEL_POD_UID.to_owned(), "u1".to_owned())]);
    assert_eq!(
        fake.take_calls(),
        vec![
            Call::ListPodSandbox {
                filter: Some(cri::PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                })
            },
            Call::PodSandboxStatus { id: sandbox },
            Call::ListContainers {
                filter: Some(cri::ContainerFilter {
                    label_selector: selector,
                    ..Default::default()
                })
            },
            Call::ContainerStatus { id: ids[0].clone() },
        ]
    );
}

#[tokio::test]
async fn an_unknown_pod_has_an_empty_status_with_its_identity() {
    let fake = FakeRuntime::new();
    fake.start_pod("u1", "web", "prod", &["app"]).await.unwrap();
    let status = get_pod_status(&fake, &uid("nope"), "ghost", "prod")
        .await
        .unwrap();
    assert_eq!(
        (status.uid.0.as_str(), status.name.as_str()),
        ("nope", "ghost")
    );
    assert!(status.sandboxes.is_empty() && status.containers.is_empty());
    assert!(status.ips().is_empty());
}
