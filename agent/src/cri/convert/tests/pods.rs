//! `get_pods` against the fake.

use super::*;

#[tokio::test]
async fn get_pods_groups_sandboxes_and_containers_by_pod_uid() {
    let fake = FakeRuntime::new();
    let (s1, c1) = fake
        .start_pod("u1", "web", "prod", &["app", "log"])
        .await
        .unwrap();
    let (s2, c2) = fake.start_pod("u2", "db", "prod", &["pg"]).await.unwrap();

    let pods = get_pods(&fake, false).await.unwrap();
    assert_eq!(pods.len(), 2);
    // Newest sandbox first.
    assert_eq!(
        (pods[0].uid.0.as_str(), pods[0].name.as_str()),
        ("u2", "db")
    );
    assert_eq!(pods[0].sandboxes, vec![(s2, SandboxState::Ready)]);
    assert_eq!(
        pods[0].containers,
        vec![(
            ContainerId::new("containerd", &c2[0]),
            "pg".to_owned(),
            ContainerState::Running
        )]
    );
    assert_eq!(pods[1].uid, uid("u1"));
    assert_eq!(pods[1].namespace, "prod");
    assert_eq!(pods[1].sandboxes, vec![(s1, SandboxState::Ready)]);
    let names: Vec<_> = pods[1].containers.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(names, vec!["log", "app"], "newest container first");
    assert_eq!(
        pods[1].containers[1].0.to_string(),
        format!("containerd://{}", c1[0])
    );
}

#[tokio::test]
async fn get_pods_lists_only_ready_and_running_unless_all() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake
        .start_pod("u1", "web", "prod", &["app", "done"])
        .await
        .unwrap();
    fake.exit_container(&ids[1], 0);
    let (gone, _) = fake.start_pod("u2", "old", "prod", &["x"]).await.unwrap();
    fake.stop_pod_sandbox(&gone).await.unwrap();
    fake.take_calls();

    let live = get_pods(&fake, false).await.unwrap();
    assert_eq!(
        live.len(),
        1,
        "a pod with no ready sandbox and no running container is absent"
    );
    assert_eq!(
        live[0].sandboxes,
        vec![(sandbox.clone(), SandboxState::Ready)]
    );
    assert_eq!(live[0].containers.len(), 1);
    assert_eq!(
        fake.take_calls(),
        vec![
            Call::ListPodSandbox {
                filter: Some(cri::PodSandboxFilter {
                    state: Some(cri::PodSandboxStateValue {
                        state: cri::PodSandboxState::SandboxReady.into()
                    }),
                    ..Default::default()
                })
            },
            Call::ListContainers {
                filter: Some(cri::ContainerFilter {
                    state: Some(cri::ContainerStateValue {
                        state: cri::ContainerState::ContainerRunning.into()
                    }),
                    ..Default::default()
                })
            },
        ]
    );

    let all = get_pods(&fake, true).await.unwrap();
    assert_eq!(all.len(), 2);
    let old = all.iter().find(|p| p.uid == uid("u2")).unwrap();
    assert_eq!(old.sandboxes, vec![(gone, SandboxState::NotReady)]);
    assert_eq!(old.containers[0].2, ContainerState::Exited);
    let web = all.iter().find(|p| p.uid == uid("u1")).unwrap();
    assert_eq!(web.containers.len(), 2);
}

#[tokio::test]
async fn get_pods_skips_containers_without_a_pod_uid_label() {
    let fake = FakeRuntime::new();
    let (sandbox, _) = fake.start_pod("u1", "web", "prod", &["app"]).await.unwrap();
    let config = pod_sandbox_config("u1", "web", "prod", 0);
    let mut stray = container_config(&config, "stray", IMAGE, 0, 0);
    stray.labels.clear();
    let stray = fake
        .create_container(&sandbox, stray, config)
        .await
        .unwrap();
    fake.start_container(&stray).await.unwrap();

    let pods = get_pods(&fake, true).await.unwrap();
    assert_eq!(pods.len(), 1);
    let names: Vec<_> = pods[0].containers.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(names, vec!["app"]);
}

#[tokio::test]
async fn containers_listed_without_their_sandbox_form_a_pod_named_by_their_labels() {
    let fake = FakeRuntime::new();
    let (sandbox, ids) = fake.start_pod("u4", "api", "team", &["srv"]).await.unwrap();
    // As a list taken between the sandbox and container listings sees a new pod.
    assert!(fake.vanish_sandbox(&sandbox));
    let pods = get_pods(&fake, false).await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(
        (
            pods[0].uid.0.as_str(),
            pods[0].name.as_str(),
            pods[0].namespace.as_str()
        ),
        ("u4", "api", "team")
    );
    assert!(pods[0].sandboxes.is_empty());
    assert_eq!(pods[0].containers[0].0.id, ids[0]);
}

#[tokio::test]
async fn get_pods_fails_when_a_list_fails() {
    let fake = FakeRuntime::new();
    fake.start_pod("u1", "web", "prod", &["app"]).await.unwrap();
    fake.fail_next(Operation::ListPodSandbox, Code::Unavailable);
    assert!(matches!(
        get_pods(&fake, false).await,
        Err(Error::Unreachable { .. })
    ));
    fake.fail_next(Operation::ListContainers, Code::Internal);
    let err = get_pods(&fake, false).await.unwrap_err();
    assert_eq!(err.operation(), Some(Operation::ListContainers));
}
