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

/// Reads with `options` to the end; every chunk's size and the total.
async fn chunk_sizes(fake: &FakeRuntime, path: &Path, id: &str, options: LogOptions) -> Vec<usize> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    let collect = tokio::spawn(async move {
        let mut sizes = Vec::new();
        while let Some(chunk) = rx.recv().await {
            sizes.push(chunk.len());
        }
        sizes
    });
    read_logs(path, id, &options, fake, tx, FAST)
        .await
        .expect("read");
    collect.await.expect("collector")
}

/// A line of `records` partial records of `size` bytes each, never ended.
fn unended_line(records: usize, size: usize) -> String {
    let content = "x".repeat(size);
    (0..records)
        .map(|_| record(1, "stdout", "P", &content))
        .collect()
}

#[tokio::test]
async fn a_huge_unended_line_streams_in_bounded_chunks_whatever_tail_lines_says() {
    let fake = FakeRuntime::new();
    let c = logging_container(&fake).await;
    // 8 MiB in 16 KiB records (as containerd splits), then one record of 4 MiB (a runtime that
    // does not split), all one line that never ends.
    append(&c.log, &unended_line(512, 16 * 1024));
    append(&c.log, &unended_line(1, 4 << 20));
    let total = 8 * 1024 * 1024 + (4 << 20);
    // What was ready, a record held back, and one chunk read: the most a reader holds.
    let bound = FLUSH_AT + LINE_HOLD + READ_CHUNK;
    for tail_lines in [None, Some(0), Some(1), Some(u64::MAX)] {
        let options = LogOptions {
            tail_lines,
            ..Default::default()
        };
        let sizes = chunk_sizes(&fake, &c.log, &c.id, options).await;
        assert_eq!(sizes.iter().sum::<usize>(), total, "tail {tail_lines:?}");
        let largest = sizes.iter().copied().max().unwrap_or(0);
        assert!(
            largest <= bound,
            "a chunk of {largest} bytes (tail {tail_lines:?})"
        );
    }
    // With timestamps: one prefix for the one line.
    let stamped = LogOptions {
        timestamps: true,
        limit_bytes: Some(64),
        ..Default::default()
    };
    assert_eq!(
        read(&fake, &c.log, &c.id, stamped).await,
        format!("2024-05-01T10:00:01.5Z {}", "x".repeat(64 - 23))
    );
}

#[tokio::test]
async fn many_lines_and_a_huge_tail_read_backwards_in_bounded_chunks() {
    let fake = FakeRuntime::new();
    let c = logging_container(&fake).await;
    let lines: String = (0..50_000)
        .map(|i| record(i % 60, "stdout", "F", &format!("line {i}")))
        .collect();
    append(&c.log, &lines);
    let tail = |n| LogOptions {
        tail_lines: Some(n),
        ..Default::default()
    };
    let last = read(&fake, &c.log, &c.id, tail(3)).await;
    assert_eq!(last, "line 49997\nline 49998\nline 49999\n");
    let sizes = chunk_sizes(&fake, &c.log, &c.id, tail(u64::MAX)).await;
    assert_eq!(
        sizes.iter().sum::<usize>(),
        (0..50_000)
            .map(|i| format!("line {i}\n").len())
            .sum::<usize>()
    );
    assert!(
        sizes
            .iter()
            .all(|s| *s <= FLUSH_AT + LINE_HOLD + READ_CHUNK)
    );
}

#[tokio::test]
async fn following_a_long_line_streams_its_records_before_it_ends() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
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
    // A line's partial records go out as they are written, before the line ends ...
    append(&c.log, &unended_line(2, 10));
    append(&c.log, &unended_line(8, 16 * 1024));
    // ... and a record still being written is held back only up to the hold.
    append(&c.log, "2024-05-01T10:00:01.5Z stdout P ");
    append(&c.log, &"y".repeat(LINE_HOLD + 1));
    let mut got = 0usize;
    while got <= 20 + 8 * 16 * 1024 + LINE_HOLD {
        let chunk = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("the long line came out before it ended")
            .expect("open");
        got += chunk.len();
    }
    append(&c.log, "\n");
    append(&c.log, &record(2, "stdout", "F", "end"));
    fake.exit_container(&c.id, 0);
    while let Some(chunk) = rx.recv().await {
        got += chunk.len();
    }
    assert_eq!(got, 20 + 8 * 16 * 1024 + LINE_HOLD + 1 + "end\n".len());
    follower.await.expect("task").expect("read");
}
