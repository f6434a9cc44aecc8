//! Exec, runtime status, resources and images of the fake.

use super::*;

#[tokio::test]
async fn exec_answers_what_was_set_and_only_in_running_containers() {
    let fake = FakeRuntime::new();
    let (_, ids) = fake.start_pod("u1", "p", "ns", &["a"]).await.unwrap();
    let cmd = vec!["cat".to_owned(), "/ready".to_owned()];
    let ok = fake
        .exec_sync(&ids[0], cmd.clone(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(ok.exit_code, 0);
    fake.set_exec_result(
        &ids[0],
        cri::ExecSyncResponse {
            stdout: b"no".to_vec(),
            stderr: Vec::new(),
            exit_code: 1,
        },
    );
    let failed = fake
        .exec_sync(&ids[0], cmd.clone(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        (failed.exit_code, failed.stdout.as_slice()),
        (1, b"no".as_slice())
    );
    assert_eq!(
        fake.calls().last(),
        Some(&Call::ExecSync {
            id: ids[0].clone(),
            cmd: cmd.clone(),
            timeout: Duration::from_secs(1)
        })
    );
    fake.exit_container(&ids[0], 0);
    assert!(fake.exec_sync(&ids[0], cmd, Duration::ZERO).await.is_err());
}

#[tokio::test]
async fn host_network_sandboxes_have_no_ip_and_say_node() {
    let fake = FakeRuntime::new();
    let config = host_network(pod_sandbox_config("u1", "p", "ns", 0));
    let id = fake.run_pod_sandbox(config, "").await.unwrap();
    let status = fake.pod_sandbox_status(&id).await.unwrap();
    assert_eq!(status.network.unwrap().ip, "");
    let mode = status
        .linux
        .unwrap()
        .namespaces
        .unwrap()
        .options
        .unwrap()
        .network();
    assert_eq!(mode, cri::NamespaceMode::Node);
}

#[tokio::test]
async fn runtime_version_status_and_resources() {
    let fake = FakeRuntime::with_runtime_name("cri-o");
    assert_eq!(fake.runtime_name(), "cri-o");
    assert_eq!(fake.version().await.unwrap().runtime_name, "cri-o");
    fake.set_conditions(true, false);
    let conditions = fake.status().await.unwrap().status.unwrap().conditions;
    assert_eq!(conditions.len(), 2);
    assert!(conditions[0].status && !conditions[1].status);
    assert_eq!(conditions[1].r#type, "NetworkReady");

    let (_, ids) = fake.start_pod("u1", "p", "ns", &["a"]).await.unwrap();
    let resources = cri::LinuxContainerResources {
        cpu_quota: 50_000,
        ..Default::default()
    };
    fake.update_container_resources(&ids[0], resources.clone())
        .await
        .unwrap();
    assert_eq!(fake.container_resources(&ids[0]), Some(resources));
    let status = fake.container_status(&ids[0]).await.unwrap();
    assert_eq!(status.resources.unwrap().linux.unwrap().cpu_quota, 50_000);
}

#[tokio::test]
async fn images_are_pulled_listed_inspected_and_removed() {
    let fake = FakeRuntime::new();
    assert_eq!(fake.image_status(image_spec("a")).await.unwrap(), None);
    let id = fake.pull_image(image_spec("a"), None, None).await.unwrap();
    assert_eq!(fake.add_image("a"), id, "stable ids");
    fake.add_image("b");
    let status = fake.image_status(image_spec("a")).await.unwrap().unwrap();
    assert_eq!((status.id.as_str(), status.size > 0), (id.as_str(), true));
    assert_eq!(fake.list_images(None).await.unwrap().len(), 2);
    let only_b = cri::ImageFilter {
        image: Some(image_spec("b")),
    };
    assert_eq!(fake.list_images(Some(only_b)).await.unwrap().len(), 1);
    let fs = fake.image_fs_info().await.unwrap();
    assert_eq!(
        fs.image_filesystems[0].used_bytes.unwrap().value,
        2 * 1024 * 1024
    );
    fake.remove_image(image_spec("a")).await.unwrap();
    fake.remove_image(image_spec("a")).await.unwrap();
    assert_eq!(fake.list_images(None).await.unwrap().len(), 1);
}

#[test]
fn the_fake_serves_as_shared_trait_objects() {
    let fake = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn RuntimeService> = fake.clone();
    let images: Arc<dyn ImageService> = fake;
    assert_eq!(runtime.runtime_name(), "containerd");
    drop(images);
}
