use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use super::*;
use crate::{
    cri::{Operation, fake::FakeRuntime},
    logs::testing::logging_container,
};

/// A clock one second further at each reading, so every rotation gets its own name.
fn ticking_clock() -> Clock {
    let seconds = Arc::new(AtomicU64::new(1_714_557_600));
    Arc::new(move || {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds.fetch_add(1, Ordering::SeqCst))
    })
}

fn policy(max_size: i64, max_files: usize) -> LogRotatePolicy {
    LogRotatePolicy {
        max_size,
        max_files,
        monitor_interval: Duration::from_secs(10),
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_small_log_is_left_alone() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    fs::write(&c.log, "x".repeat(99)).expect("write");
    let manager = ContainerLogManager::new(fake.clone(), policy(100, 3));
    assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    assert_eq!(names(c.log.parent().expect("dir")), ["0.log"]);
}

#[tokio::test]
async fn rotation_keeps_at_most_max_files_and_compresses_all_but_the_newest_rotated() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    let dir = c.log.parent().expect("dir").to_owned();
    let manager = ContainerLogManager::new(fake.clone(), policy(10, 3)).with_clock(ticking_clock());
    for round in 0..4 {
        fs::write(&c.log, format!("round {round} of output\n")).expect("write");
        assert_eq!(
            manager.rotate_logs().await.expect("round"),
            1,
            "round {round}"
        );
        // The runtime reopened the log: a fresh, empty current file.
        assert_eq!(fs::metadata(&c.log).expect("current").len(), 0);
    }
    let files = names(&dir);
    // max_files = 3: the current file, the newest rotated one (uncompressed, a reader may still
    // be on it) and one compressed.
    assert_eq!(files.len(), 3, "{files:?}");
    assert_eq!(files[0], "0.log");
    assert!(files[1].ends_with(".gz"), "{files:?}");
    assert!(!files[2].ends_with(".gz"), "{files:?}");
    // Rotated names carry the rotation time, oldest sorting first.
    assert_eq!(files[2].len(), "0.log.20240501-100000".len(), "{files:?}");
    assert!(files[1] < files[2]);
    assert_eq!(
        fs::read_to_string(dir.join(&files[2])).expect("newest rotated"),
        "round 3 of output\n"
    );
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(fs::File::open(dir.join(&files[1])).expect("gz")),
        &mut text,
    )
    .expect("gunzip");
    assert_eq!(text, "round 2 of output\n");
}

#[tokio::test]
async fn leftovers_of_an_interrupted_rotation_are_removed() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    let dir = c.log.parent().expect("dir").to_owned();
    fs::write(dir.join("0.log.20240101-000000"), "old").expect("write");
    fs::write(dir.join("0.log.20240101-000000.gz"), "old gz").expect("write");
    fs::write(dir.join("0.log.20240101-000001.gz.tmp"), "half").expect("write");
    fs::write(&c.log, "x".repeat(20)).expect("write");
    let manager = ContainerLogManager::new(fake.clone(), policy(10, 5)).with_clock(ticking_clock());
    assert_eq!(manager.rotate_logs().await.expect("round"), 1);
    let files = names(&dir);
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files.contains(&"0.log.20240101-000000.gz".to_owned()));
    assert!(!files.iter().any(|f| f.ends_with(".tmp")));
}

#[tokio::test]
async fn a_failed_reopen_puts_the_log_back() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    fs::write(&c.log, "x".repeat(20)).expect("write");
    fake.fail_next(Operation::ReopenContainerLog, tonic::Code::Unavailable);
    let manager = ContainerLogManager::new(fake.clone(), policy(10, 5));
    assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    assert_eq!(names(c.log.parent().expect("dir")), ["0.log"]);
    assert_eq!(fs::read_to_string(&c.log).expect("log"), "x".repeat(20));
}

#[tokio::test]
async fn exited_containers_and_a_missing_log_are_handled() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    // A missing log of a running container is reopened, not rotated.
    fs::remove_file(&c.log).expect("remove");
    let manager = ContainerLogManager::new(fake.clone(), policy(10, 5));
    assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    assert!(c.log.exists());
    // An exited container's big log stays as it is.
    fs::write(&c.log, "x".repeat(20)).expect("write");
    fake.exit_container(&c.id, 0);
    assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    assert_eq!(names(c.log.parent().expect("dir")), ["0.log"]);
}

/// A container's log path is asked of the runtime once, not at every round; a new container's
/// is asked when it first runs, and a container gone is forgotten.
#[tokio::test]
async fn the_runtime_is_asked_each_log_path_once() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    let manager = ContainerLogManager::new(fake.clone(), policy(100, 3));
    let statuses = |calls: Vec<crate::cri::fake::Call>| {
        calls
            .iter()
            .filter(|c| matches!(c, crate::cri::fake::Call::ContainerStatus { .. }))
            .count()
    };
    fake.take_calls();
    for _ in 0..3 {
        assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    }
    assert_eq!(statuses(fake.take_calls()), 1);
    // Still rotated once it grows: the remembered path is the log's.
    fs::write(&c.log, "x".repeat(200)).expect("write");
    assert_eq!(manager.rotate_logs().await.expect("round"), 1);
    assert_eq!(statuses(fake.take_calls()), 0);
    fake.exit_container(&c.id, 0);
    assert_eq!(manager.rotate_logs().await.expect("round"), 0);
    assert!(manager.log_paths.lock_unpoisoned().is_empty());
}
