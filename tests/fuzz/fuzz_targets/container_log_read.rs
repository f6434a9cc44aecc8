//! A container's whole log file, as a client reads it through `/containerLogs`
//! (`swiftlet::logs::read_logs`, not following): the first bytes of the input choose the
//! options a client may send (`tailLines`, `limitBytes`, `sinceTime`, `timestamps`), the rest is
//! the file, which the container controls (any bytes, lines of any length, records that do not
//! parse, a last line without its newline). A panic, a hang or more than `limitBytes` served is a
//! finding.
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use swiftlet::{
    cri::fake::FakeRuntime,
    logs::{FollowTiming, LogOptions, read_logs},
};

/// Flags, tailLines (u16), limitBytes (u16), sinceTime's choice.
const HEADER: usize = 6;

const SINCE: [&str; 4] = [
    "1970-01-01T00:00:00Z",
    "2016-10-06T00:17:09.669794202Z",
    "2024-01-01T00:00:00Z",
    "9999-01-01T00:00:00Z",
];

struct Fixture {
    runtime: tokio::runtime::Runtime,
    fake: FakeRuntime,
    dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime"),
        fake: FakeRuntime::new(),
        dir: tempfile::tempdir().expect("a temporary directory"),
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((header, file)) = data.split_first_chunk::<HEADER>() else {
        return;
    };
    let [flags, tail_lo, tail_hi, limit_lo, limit_hi, since] = *header;
    let options = LogOptions {
        tail_lines: (flags & 1 != 0).then(|| u64::from(u16::from_le_bytes([tail_lo, tail_hi]))),
        limit_bytes: (flags & 2 != 0)
            .then(|| u64::from(u16::from_le_bytes([limit_lo, limit_hi])).max(1)),
        since: (flags & 4 != 0)
            .then(|| SINCE[usize::from(since) % SINCE.len()].parse())
            .transpose()
            .expect("fixed timestamps parse"),
        timestamps: flags & 8 != 0,
        follow: false,
    };
    let fixture = fixture();
    let path = fixture.dir.path().join("0.log");
    std::fs::write(&path, file).expect("writing the log file");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let served = fixture.runtime.block_on(async {
        let read = read_logs(
            &path,
            "c1",
            &options,
            &fixture.fake,
            tx,
            FollowTiming::default(),
        );
        let collect = async {
            let mut served = 0usize;
            while let Some(chunk) = rx.recv().await {
                assert!(!chunk.is_empty(), "an empty chunk was sent");
                served += chunk.len();
            }
            served
        };
        let (read, served) = tokio::join!(read, collect);
        if let Err(error) = read {
            panic!("reading a log file that exists: {error}");
        }
        served
    });
    if let Some(limit) = options.limit_bytes {
        assert!(
            served as u64 <= limit,
            "{served} bytes served, limitBytes {limit}"
        );
    }
});
