use std::{io::Write as _, sync::Arc};

use super::*;
use crate::{
    cri::fake::FakeRuntime,
    logs::testing::{logging_container, record},
};

const FAST: FollowTiming = FollowTiming {
    poll: Duration::from_millis(5),
    state_check: Duration::from_millis(20),
};

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open");
    f.write_all(text.as_bytes()).expect("append");
}

/// Reads with `options` to the end and returns what the client got.
async fn read(fake: &FakeRuntime, path: &Path, id: &str, options: LogOptions) -> String {
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let collect = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend_from_slice(&chunk);
        }
        String::from_utf8(out).expect("utf-8")
    });
    read_logs(path, id, &options, fake, tx, FAST)
        .await
        .expect("read");
    collect.await.expect("collector")
}

/// Five lines at seconds 1..=5 of stdout, one of them split in two partial records and one on
/// stderr, and a line that is not a record.
fn sample() -> String {
    [
        record(1, "stdout", "F", "one"),
        record(2, "stdout", "P", "tw"),
        record(2, "stdout", "F", "o"),
        "garbage\n".to_owned(),
        record(3, "stderr", "F", "three"),
        record(4, "stdout", "F", "four"),
        record(5, "stdout", "F", "five"),
    ]
    .concat()
}

#[tokio::test]
async fn reads_whole_lines_with_and_without_timestamps() {
    let fake = FakeRuntime::new();
    let c = logging_container(&fake).await;
    append(&c.log, &sample());
    let all = read(&fake, &c.log, &c.id, LogOptions::default()).await;
    assert_eq!(all, "one\ntwo\nthree\nfour\nfive\n");
    let stamped = LogOptions {
        timestamps: true,
        tail_lines: Some(2),
        ..Default::default()
    };
    assert_eq!(
        read(&fake, &c.log, &c.id, stamped).await,
        "2024-05-01T10:00:04.5Z four\n2024-05-01T10:00:05.5Z five\n"
    );
}

#[tokio::test]
async fn tail_counts_joined_lines_and_since_filters_after_it() {
    let fake = FakeRuntime::new();
    let c = logging_container(&fake).await;
    append(&c.log, &sample());
    let tail = |n| LogOptions {
        tail_lines: Some(n),
        ..Default::default()
    };
    assert_eq!(read(&fake, &c.log, &c.id, tail(0)).await, "");
    assert_eq!(
        read(&fake, &c.log, &c.id, tail(4)).await,
        "two\nthree\nfour\nfive\n"
    );
    assert_eq!(
        read(&fake, &c.log, &c.id, tail(100)).await.lines().count(),
        5
    );
    let since: Timestamp = "2024-05-01T10:00:03.5Z".parse().expect("time");
    let since_only = LogOptions {
        since: Some(since),
        ..Default::default()
    };
    assert_eq!(
        read(&fake, &c.log, &c.id, since_only).await,
        "three\nfour\nfive\n"
    );
    let both = LogOptions {
        since: Some(since),
        tail_lines: Some(4),
        ..Default::default()
    };
    assert_eq!(
        read(&fake, &c.log, &c.id, both).await,
        "three\nfour\nfive\n"
    );
}

#[tokio::test]
async fn limit_bytes_cuts_the_output() {
    let fake = FakeRuntime::new();
    let c = logging_container(&fake).await;
    append(&c.log, &sample());
    let limited = |n| LogOptions {
        limit_bytes: Some(n),
        ..Default::default()
    };
    assert_eq!(read(&fake, &c.log, &c.id, limited(6)).await, "one\ntw");
    assert_eq!(read(&fake, &c.log, &c.id, limited(8)).await, "one\ntwo\n");
}

#[tokio::test]
async fn a_missing_file_is_an_error_naming_it() {
    let fake = FakeRuntime::new();
    let (tx, _rx) = mpsc::channel::<Bytes>(1);
    let err = read_logs(
        Path::new("/nonexistent/0.log"),
        "c1",
        &LogOptions::default(),
        &fake,
        tx,
        FAST,
    )
    .await
    .expect_err("no file");
    assert!(err.to_string().contains("/nonexistent/0.log"), "{err}");
}

#[tokio::test]
async fn follow_reads_new_lines_across_a_rotation_until_the_container_exits() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    append(&c.log, &record(1, "stdout", "F", "before"));
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let follower = {
        let fake = fake.clone();
        let (log, id) = (c.log.clone(), c.id.clone());
        tokio::spawn(async move {
            let options = LogOptions {
                follow: true,
                ..Default::default()
            };
            read_logs(&log, &id, &options, fake.as_ref(), tx, FAST).await
        })
    };
    assert_eq!(rx.recv().await.as_deref(), Some(b"before\n".as_slice()));
    // A line written in two steps is served once whole.
    append(&c.log, "2024-05-01T10:00:02.5Z stdout F aft");
    append(&c.log, "er\n");
    assert_eq!(rx.recv().await.as_deref(), Some(b"after\n".as_slice()));
    // Rotation: the last line of the old file, then the new file from its start.
    append(&c.log, &record(3, "stdout", "F", "last of old"));
    let rotated = c.log.with_extension("log.20240501-100003");
    std::fs::rename(&c.log, &rotated).expect("rotate");
    append(&c.log, &record(4, "stdout", "F", "first of new"));
    assert_eq!(
        rx.recv().await.as_deref(),
        Some(b"last of old\n".as_slice())
    );
    assert_eq!(
        rx.recv().await.as_deref(),
        Some(b"first of new\n".as_slice())
    );
    append(&c.log, &record(5, "stdout", "F", "goodbye"));
    fake.exit_container(&c.id, 0);
    assert_eq!(rx.recv().await.as_deref(), Some(b"goodbye\n".as_slice()));
    // The container exited: the follower ends and closes the stream.
    assert_eq!(rx.recv().await, None);
    follower.await.expect("task").expect("read");
}
