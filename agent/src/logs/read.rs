//! Reading a container's CRI log file for a client (upstream `ReadLogs` in
//! `pkg/kubelet/kuberuntime/logs/logs.go`): the last `tailLines` lines, those since a time, with
//! or without timestamps, at most `limitBytes`, and with `follow` the lines written afterwards —
//! across rotations (the log manager renames the file and the runtime reopens a new one at the
//! same path) — until the container is no longer running.
//!
//! Memory is bounded whatever the lines' length or `tailLines`: the file is read a chunk at a
//! time and its records parsed as a stream (`records.rs`), `tailLines` finds where to start by
//! reading backwards a chunk at a time (`tail.rs`), and output goes to the client in chunks as
//! it comes. Lines are the joined records (a `tailLines` count is of whole lines, `sinceTime`
//! and `timestamps` go by a line's first record), but joining never buffers a line: each record
//! goes out once complete (a long line's partial records too, as upstream streams them), and
//! only a record still being written is held back, so it is served whole — up to [`LINE_HOLD`]
//! bytes, past which it streams as it is read. Records that do not parse are skipped (and
//! counted in one log line per read), as upstream skips them.
//!
//! Following polls the file (every [`FollowTiming::poll`]) rather than watching it with inotify:
//! a poll is one `read` at the end of a file, and it needs no watch descriptors per client.
//!
//! Deviation: upstream's `tailLines` counts the file's records (a long line split by the runtime
//! is several) and puts a timestamp on each; swiftlet counts lines as the container wrote them,
//! and stamps a line once.

use std::{
    io::SeekFrom,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;
use tokio::{
    io::{AsyncReadExt as _, AsyncSeekExt as _},
    sync::mpsc,
};

use super::{
    records::{Header, Piece, RecordParser},
    tail::tail_start,
};
use crate::cri::RuntimeService;

/// The most bytes of a record still being written held back before it streams out as it comes.
pub const LINE_HOLD: usize = 64 * 1024;
/// Output goes to the client in chunks of about this size.
const FLUSH_AT: usize = 64 * 1024;
/// Bytes read from the file at a time.
const READ_CHUNK: usize = 64 * 1024;

/// What to read (upstream `LogOptions`, from the request's `PodLogOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Only the last this many lines (before `since` filters them).
    pub tail_lines: Option<u64>,
    /// Only lines stamped at or after this.
    pub since: Option<Timestamp>,
    /// Prefix each line with its timestamp.
    pub timestamps: bool,
    /// Stop after this many bytes.
    pub limit_bytes: Option<u64>,
    /// Keep reading what the container writes until it stops running.
    pub follow: bool,
}

/// How often a follower looks for new lines and asks whether the container still runs.
#[derive(Clone, Copy, Debug)]
pub struct FollowTiming {
    pub poll: Duration,
    /// Upstream checks the container's state at least every second while waiting.
    pub state_check: Duration,
}

impl Default for FollowTiming {
    fn default() -> Self {
        FollowTiming {
            poll: Duration::from_millis(200),
            state_check: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("failed to open log file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to read log file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether to keep going.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// Where lines go: the bytes ready to send, the record still being written held back (at most
/// [`LINE_HOLD`]), and how many bytes may still go.
struct Output {
    tx: mpsc::Sender<Bytes>,
    timestamps: bool,
    since: Option<Timestamp>,
    remaining: Option<u64>,
    buf: Vec<u8>,
    /// `buf[..ready]` can be sent; the rest is a record still being written.
    ready: usize,
    /// Inside a line (its first record was seen, its full record not yet).
    in_line: bool,
    /// The current line passes `since`.
    keep_line: bool,
    /// The current line had a record held too long: it goes out as it comes.
    streaming: bool,
    /// The current record continues the line in the next one.
    record_partial: bool,
    /// `limitBytes` reached.
    limit_reached: bool,
}

impl Output {
    fn new(tx: mpsc::Sender<Bytes>, options: &LogOptions) -> Output {
        Output {
            tx,
            timestamps: options.timestamps,
            since: options.since,
            remaining: options.limit_bytes,
            buf: Vec::with_capacity(FLUSH_AT),
            ready: 0,
            in_line: false,
            keep_line: true,
            streaming: false,
            record_partial: false,
            limit_reached: false,
        }
    }

    fn piece(&mut self, piece: &Piece<'_>) {
        match piece {
            Piece::Start(header) => self.start(header),
            Piece::Content(bytes) => {
                if self.keep_line {
                    self.append(bytes);
                }
            }
            Piece::End => self.end(),
        }
    }

    fn start(&mut self, header: &Header) {
        self.record_partial = header.partial;
        if self.in_line {
            return;
        }
        self.in_line = true;
        self.streaming = false;
        self.keep_line = self.since.is_none_or(|since| header.timestamp >= since);
        if self.keep_line && self.timestamps {
            // RFC 3339 with nanoseconds, trailing zeros dropped (Go's `RFC3339Nano`).
            let prefix = format!("{} ", header.timestamp);
            self.append(prefix.as_bytes());
        }
    }

    fn end(&mut self) {
        if !self.record_partial {
            if self.keep_line {
                self.append(b"\n");
            }
            self.in_line = false;
        }
        // A complete record goes out (a line's partial records too, as upstream streams them);
        // only a record still being written is held back.
        self.ready = self.buf.len();
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.limit_reached {
            return;
        }
        let bytes = match &mut self.remaining {
            Some(remaining) => {
                let n = usize::try_from(*remaining)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                *remaining -= n as u64;
                self.limit_reached = *remaining == 0;
                &bytes[..n]
            }
            None => bytes,
        };
        self.buf.extend_from_slice(bytes);
        if self.streaming || self.buf.len() - self.ready > LINE_HOLD {
            self.streaming = true;
            self.ready = self.buf.len();
        }
    }

    fn wants_flush(&self) -> bool {
        self.ready >= FLUSH_AT || self.limit_reached
    }

    /// Sends what is ready (everything with `all`, or once the limit is reached). `Stop` when
    /// the client went away or the limit was reached.
    async fn flush(&mut self, all: bool) -> Flow {
        let n = if all || self.limit_reached {
            self.buf.len()
        } else {
            self.ready
        };
        if n > 0 {
            let chunk = Bytes::copy_from_slice(&self.buf[..n]);
            self.buf.drain(..n);
            self.ready = self.ready.saturating_sub(n);
            if self.tx.send(chunk).await.is_err() {
                return Flow::Stop;
            }
        }
        if self.limit_reached {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }
}

/// One open log file, read a chunk at a time from where reading began.
struct LogFile {
    path: PathBuf,
    file: tokio::fs::File,
    inode: u64,
    parser: RecordParser,
    chunk: Vec<u8>,
}

impl LogFile {
    /// Opens `path` at its start, or where its last `tail` lines start.
    async fn open(path: &Path, tail: Option<u64>) -> Result<LogFile, ReadError> {
        let open = |source| ReadError::Open {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(open)?;
        let meta = file.metadata().map_err(open)?;
        let (file, offset) = match tail {
            None => (file, 0),
            Some(lines) => {
                let len = meta.len();
                let (file, found) = tokio::task::spawn_blocking(move || {
                    let found = tail_start(&file, len, lines);
                    (file, found)
                })
                .await
                .map_err(|e| open(std::io::Error::other(e)))?;
                (
                    file,
                    found.map_err(|source| ReadError::Read {
                        path: path.to_owned(),
                        source,
                    })?,
                )
            }
        };
        let mut file = tokio::fs::File::from_std(file);
        file.seek(SeekFrom::Start(offset))
            .await
            .map_err(|source| ReadError::Read {
                path: path.to_owned(),
                source,
            })?;
        Ok(LogFile {
            path: path.to_owned(),
            file,
            inode: meta.ino(),
            parser: RecordParser::default(),
            chunk: vec![0; READ_CHUNK],
        })
    }

    /// Reads to the end of what is written so far into `out`.
    async fn drain(&mut self, out: &mut Output) -> Result<Flow, ReadError> {
        loop {
            let n = self
                .file
                .read(&mut self.chunk)
                .await
                .map_err(|source| ReadError::Read {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(Flow::Continue);
            }
            let mut pieces = Vec::new();
            self.parser.feed(&self.chunk[..n], &mut pieces);
            for piece in &pieces {
                out.piece(piece);
            }
            if out.wants_flush() && out.flush(false).await == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
    }

    /// Whether the path now names another file (the log was rotated) or none.
    async fn replaced(&self) -> bool {
        match tokio::fs::metadata(&self.path).await {
            Ok(meta) => meta.ino() != self.inode,
            Err(_) => true,
        }
    }

    /// Says once what was skipped.
    fn report_skipped(&self) {
        if self.parser.skipped > 0 {
            tracing::warn!(
                path = %self.path.display(),
                skipped = self.parser.skipped,
                first_error = ?self.parser.first_error.as_ref().map(ToString::to_string),
                "skipped lines of a container log that are not in the CRI format"
            );
        }
    }
}

/// Reads the log at `path` of container `container_id` into `out`, as `options` say.
pub async fn read_logs(
    path: &Path,
    container_id: &str,
    options: &LogOptions,
    runtime: &dyn RuntimeService,
    out: mpsc::Sender<Bytes>,
    timing: FollowTiming,
) -> Result<(), ReadError> {
    let mut file = LogFile::open(path, options.tail_lines).await?;
    let mut out = Output::new(out, options);
    let mut flow = file.drain(&mut out).await?;
    if flow == Flow::Continue && options.follow {
        flow = follow(&mut file, &mut out, container_id, runtime, timing).await?;
    }
    file.report_skipped();
    if flow == Flow::Stop {
        return Ok(());
    }
    // The file ends here: a full record cut short still ends its line; an unfinished line is
    // served as it is.
    if file.parser.in_full_record() {
        out.end();
    }
    out.flush(true).await;
    Ok(())
}

/// Waits for more lines, switching to the new file after a rotation, until the container stops
/// running (its last lines are read first) or the client goes away.
async fn follow(
    file: &mut LogFile,
    out: &mut Output,
    container_id: &str,
    runtime: &dyn RuntimeService,
    timing: FollowTiming,
) -> Result<Flow, ReadError> {
    let mut checked = Instant::now();
    loop {
        if file.drain(out).await? == Flow::Stop || out.flush(false).await == Flow::Stop {
            return Ok(Flow::Stop);
        }
        if file.replaced().await {
            // The old file is complete once renamed and reopened elsewhere: read its rest, then
            // go on with the new one (if the runtime has made it yet).
            if file.drain(out).await? == Flow::Stop || out.flush(false).await == Flow::Stop {
                return Ok(Flow::Stop);
            }
            if let Ok(next) = LogFile::open(&file.path, None).await {
                file.report_skipped();
                *file = next;
                continue;
            }
        }
        if checked.elapsed() >= timing.state_check {
            checked = Instant::now();
            if !is_running(runtime, container_id).await {
                // What it wrote before it stopped is in the file by now.
                return file.drain(out).await;
            }
        }
        if out.tx.is_closed() {
            return Ok(Flow::Stop);
        }
        tokio::time::sleep(timing.poll).await;
    }
}

/// Whether the runtime says the container runs; an unknown container does not.
async fn is_running(runtime: &dyn RuntimeService, container_id: &str) -> bool {
    match runtime.container_status(container_id).await {
        Ok(status) => status.state == cri::ContainerState::ContainerRunning as i32,
        Err(e) => {
            tracing::debug!(container = container_id, error = %e, "following a log: the container's state is unknown; stopping");
            false
        }
    }
}

#[cfg(test)]
mod tests;
