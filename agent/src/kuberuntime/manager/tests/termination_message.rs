//! Termination messages through the manager's `pod_status`: read once per exited container,
//! forgotten with it.

use std::sync::Arc;

use k8s_cri::v1 as cri;

use crate::lock::MutexExt as _;

use super::{IMAGE, manager};
use crate::{
    container::{
        ANNOTATION_TERMINATION_MESSAGE_PATH, ANNOTATION_TERMINATION_MESSAGE_POLICY, ContainerState,
        PodUid,
    },
    cri::{
        RuntimeService as _,
        fake::{
            FakeRuntime,
            fixtures::{container_config, pod_sandbox_config},
        },
    },
};

#[tokio::test]
async fn a_message_is_read_once_when_the_container_is_first_seen_exited() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("message");
    std::fs::write(&file, "first words").expect("write");

    let sandbox = pod_sandbox_config("uid-1", "web", "default", 0);
    let sandbox_id = fake
        .run_pod_sandbox(sandbox.clone(), "")
        .await
        .expect("sandbox");
    let mut config = container_config(&sandbox, "app", IMAGE, 0, 0);
    config.annotations.extend([
        (
            ANNOTATION_TERMINATION_MESSAGE_PATH.to_owned(),
            "/dev/termination-log".to_owned(),
        ),
        (
            ANNOTATION_TERMINATION_MESSAGE_POLICY.to_owned(),
            "File".to_owned(),
        ),
    ]);
    config.mounts.push(cri::Mount {
        container_path: "/dev/termination-log".into(),
        host_path: file.display().to_string(),
        ..Default::default()
    });
    let id = fake
        .create_container(&sandbox_id, config, sandbox)
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
    let uid = PodUid::from("uid-1");
    // Running: nothing read yet.
    let running = m.pod_status(&uid, "web", "default").await.expect("status");
    assert_eq!(running.containers[0].state, ContainerState::Running);
    assert_eq!(running.containers[0].message, "");
    std::fs::write(&file, "last words").expect("write");

    assert!(fake.exit_container(&id, 1));
    let exited = m.pod_status(&uid, "web", "default").await.expect("status");
    assert_eq!(exited.containers[0].message, "last words");
    // The file changes after the exit was seen: the message does not.
    std::fs::write(&file, "rewritten").expect("write");
    assert_eq!(
        m.pod_status(&uid, "web", "default")
            .await
            .expect("status")
            .containers[0]
            .message,
        "last words"
    );

    // Removed, and a container of the same id seen exited again would be read afresh.
    fake.remove_container(&id).await.expect("remove");
    assert!(
        m.pod_status(&uid, "web", "default")
            .await
            .expect("status")
            .containers
            .is_empty()
    );
    assert!(m.termination_messages.lock_unpoisoned().is_empty());
}
