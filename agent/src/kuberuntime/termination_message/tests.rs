use std::{collections::HashMap, os::unix::fs::symlink, path::Path};

use super::*;
use crate::cri::fake::FakeRuntime;

const IN_CONTAINER: &str = "/dev/termination-log";

/// An exited container's CRI status whose message file is `dir/msg` and log `dir/0.log`.
fn exited(dir: &Path, exit_code: i32, policy: &str) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: "c1".into(),
        state: cri::ContainerState::ContainerExited.into(),
        exit_code,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        annotations: HashMap::from([
            (
                ANNOTATION_TERMINATION_MESSAGE_PATH.to_owned(),
                IN_CONTAINER.to_owned(),
            ),
            (
                ANNOTATION_TERMINATION_MESSAGE_POLICY.to_owned(),
                policy.to_owned(),
            ),
        ]),
        mounts: vec![cri::Mount {
            container_path: IN_CONTAINER.into(),
            host_path: dir.join("msg").display().to_string(),
            ..Default::default()
        }],
        log_path: dir.join("0.log").display().to_string(),
        ..Default::default()
    }
}

fn log_line(content: &str) -> String {
    format!("2024-05-01T10:00:00.5Z stderr F {content}\n")
}

async fn message(status: &cri::ContainerStatus) -> String {
    termination_message(status, &FakeRuntime::new()).await
}

#[tokio::test]
async fn the_file_is_the_message_joined_to_the_runtimes() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("msg"), "disk full").expect("write");
    let mut status = exited(dir.path(), 1, "File");
    assert_eq!(message(&status).await, "disk full");
    status.message = "runtime says".into();
    assert_eq!(message(&status).await, "runtime says: disk full");
    // No file at all: the runtime's message alone.
    std::fs::remove_file(dir.path().join("msg")).expect("rm");
    assert_eq!(message(&status).await, "runtime says");
}

#[tokio::test]
async fn a_custom_path_is_found_by_its_mount() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("msg"), "custom").expect("write");
    let mut status = exited(dir.path(), 0, "File");
    status.annotations.insert(
        ANNOTATION_TERMINATION_MESSAGE_PATH.to_owned(),
        "/tmp/my-message".into(),
    );
    // Not mounted where the annotation says: nothing read.
    assert_eq!(message(&status).await, "");
    status.mounts[0].container_path = "/tmp/my-message".into();
    assert_eq!(message(&status).await, "custom");
}

#[tokio::test]
async fn a_huge_file_gives_exactly_its_last_bytes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut data: Vec<u8> = (0..1024 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    data.extend_from_slice(b"THE END");
    std::fs::write(dir.path().join("msg"), &data).expect("write");
    let got = message(&exited(dir.path(), 1, "File")).await;
    assert_eq!(got.len(), 4096);
    assert_eq!(got.as_bytes(), &data[data.len() - 4096..]);
    assert!(got.ends_with("THE END"));
}

#[tokio::test]
async fn bytes_that_are_not_utf8_are_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("msg"), b"ok \xff\xfe end").expect("write");
    assert_eq!(
        message(&exited(dir.path(), 1, "File")).await,
        "ok \u{fffd}\u{fffd} end"
    );
}

#[tokio::test]
async fn a_link_or_a_fifo_in_place_of_the_file_is_not_followed_nor_waited_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "host secret").expect("write");
    symlink(&secret, dir.path().join("msg")).expect("symlink");
    let got = message(&exited(dir.path(), 1, "FallbackToLogsOnError")).await;
    assert!(!got.contains("host secret"), "{got}");
    assert!(got.starts_with("Error on reading termination log"), "{got}");

    std::fs::remove_file(dir.path().join("msg")).expect("rm");
    nix::unistd::mkfifo(&dir.path().join("msg"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
    // Opened without blocking, then refused as not a regular file.
    let got = message(&exited(dir.path(), 1, "File")).await;
    assert!(got.contains("not a regular file"), "{got}");
}

#[tokio::test]
async fn fallback_reads_the_log_end_on_error_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("msg"), "").expect("write");
    let mut log = String::new();
    for i in 0..100 {
        log.push_str(&log_line(&format!("line {i}")));
    }
    std::fs::write(dir.path().join("0.log"), &log).expect("write");
    let got = message(&exited(dir.path(), 2, FALLBACK_TO_LOGS_ON_ERROR)).await;
    // The last 80 lines, as the container wrote them.
    assert!(got.starts_with("line 20\n"), "{got}");
    assert!(got.ends_with("line 99\n"), "{got}");
    assert_eq!(got.lines().count(), 80);
    // A success, a policy of File, or a container that never ran: no log.
    assert_eq!(
        message(&exited(dir.path(), 0, FALLBACK_TO_LOGS_ON_ERROR)).await,
        ""
    );
    assert_eq!(message(&exited(dir.path(), 2, "File")).await, "");
    let mut cannot_run = exited(dir.path(), 128, FALLBACK_TO_LOGS_ON_ERROR);
    cannot_run.reason = CONTAINER_CANNOT_RUN.into();
    assert_eq!(message(&cannot_run).await, "");
    // A message in the file wins over the log.
    std::fs::write(dir.path().join("msg"), "mine").expect("write");
    assert_eq!(
        message(&exited(dir.path(), 2, FALLBACK_TO_LOGS_ON_ERROR)).await,
        "mine"
    );
}

#[tokio::test]
async fn fallback_keeps_the_last_2048_bytes_of_long_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let long = "x".repeat(5000);
    let log = format!("{}{}", log_line(&long), log_line("last words"));
    std::fs::write(dir.path().join("0.log"), log).expect("write");
    let got = message(&exited(dir.path(), 1, FALLBACK_TO_LOGS_ON_ERROR)).await;
    assert_eq!(got.len(), MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LENGTH);
    assert!(got.ends_with("x\nlast words\n"), "{got}");
}

#[tokio::test]
async fn an_unreadable_log_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let got = message(&exited(dir.path(), 1, FALLBACK_TO_LOGS_ON_ERROR)).await;
    assert!(
        got.starts_with("Error on reading termination message from logs:"),
        "{got}"
    );
}

#[test]
fn last_bytes_keeps_the_tail_of_everything_pushed() {
    let mut tail = LastBytes::new(4);
    tail.push(b"ab");
    tail.push(b"cde");
    assert_eq!(tail.buf, b"bcde");
    tail.push(b"0123456789");
    assert_eq!(tail.into_vec(), b"6789");
}
