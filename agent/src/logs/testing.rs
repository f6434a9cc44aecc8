//! A container of the fake runtime whose log directory is a temporary directory, for the tests
//! of rotation and reading.

use std::path::PathBuf;

use crate::cri::{
    RuntimeService as _,
    fake::{
        FakeRuntime,
        fixtures::{IMAGE, container_config, pod_sandbox_config},
    },
};

pub(crate) struct LoggingContainer {
    pub id: String,
    pub log: PathBuf,
    pub _dir: tempfile::TempDir,
}

/// Starts a pod with one container `app` in `fake`, its logs under a new temporary directory;
/// the log file exists (empty), as the runtime makes it at start.
pub(crate) async fn logging_container(fake: &FakeRuntime) -> LoggingContainer {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sandbox = pod_sandbox_config("u1", "web", "prod", 0);
    sandbox.log_directory = dir.path().display().to_string();
    let sandbox_id = fake
        .run_pod_sandbox(sandbox.clone(), "")
        .await
        .expect("sandbox");
    fake.add_image(IMAGE);
    let config = container_config(&sandbox, "app", IMAGE, 0, 0);
    let id = fake
        .create_container(&sandbox_id, config, sandbox)
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
    std::fs::create_dir_all(dir.path().join("app")).expect("mkdir");
    let log = dir.path().join("app/0.log");
    std::fs::write(&log, "").expect("log file");
    LoggingContainer { id, log, _dir: dir }
}

/// A CRI log record line.
pub(crate) fn record(second: u32, stream: &str, tag: &str, content: &str) -> String {
    format!("2024-05-01T10:00:{second:02}.5Z {stream} {tag} {content}\n")
}
