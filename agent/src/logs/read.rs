//! Reading a container's CRI log file for a client (upstream `ReadLogs` in
//! `pkg/kubelet/kuberuntime/logs/logs.go`): the last `tailLines` lines, those since a time, with
//! or without timestamps, at most `limitBytes`, and with `follow` the lines written afterwards —
//! across rotations (the log manager renames the file and the runtime reopens a new one at the
//! same path) — until the container is no longer running.
//!
//! Lines are the joined records of [`super::format`]: a `tailLines` count is of whole lines, not
//! of the runtime's fragments. Records that do not parse are skipped (and logged), as upstream.
//! Output goes to a channel of chunks; a closed channel (the client went away) ends the read.
//!
//! Following polls the file (every [`FollowTiming::poll`]) rather than watching it with inotify:
//! a poll is one `read` at the end of a file, and it needs no watch descriptors per client.

use std::{
    collections::VecDeque,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    sync::mpsc,
};

use super::format::{LineJoiner, LogLine, parse_record};
use crate::cri::RuntimeService;

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

/// Where lines go, and how many bytes may still go.
struct Output {
    tx: mpsc::Sender<Bytes>,
    timestamps: bool,
    since: Option<Timestamp>,
    remaining: Option<u64>,
}

/// Whether to keep going after a write.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Output {
    async fn write(&mut self, line: &LogLine) -> Flow {
        if self.since.is_some_and(|since| line.timestamp < since) {
            return Flow::Continue;
        }
        let mut bytes = line.render(self.timestamps);
        let mut flow = Flow::Continue;
        if let Some(remaining) = &mut self.remaining {
            let allowed = usize::try_from(*remaining).unwrap_or(usize::MAX);
            if bytes.len() >= allowed {
                bytes.truncate(allowed);
                flow = Flow::Stop;
            }
            *remaining -= bytes.len() as u64;
        }
        if !bytes.is_empty() && self.tx.send(Bytes::from(bytes)).await.is_err() {
            return Flow::Stop;
        }
        flow
    }
}

/// One open log file read line by line; a line still being written stays buffered until its
/// newline arrives.
struct LogFile {
    path: PathBuf,
    reader: BufReader<tokio::fs::File>,
    inode: u64,
    partial: Vec<u8>,
}

impl LogFile {
    async fn open(path: &Path) -> Result<LogFile, ReadError> {
        let open = |source| ReadError::Open {
            path: path.to_owned(),
            source,
        };
        let file = tokio::fs::File::open(path).await.map_err(open)?;
        let inode = file.metadata().await.map_err(open)?.ino();
        Ok(LogFile {
            path: path.to_owned(),
            reader: BufReader::new(file),
            inode,
            partial: Vec::new(),
        })
    }

    /// The next complete line, or `None` at the end of what is written so far.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        let n = self
            .reader
            .read_until(b'\n', &mut self.partial)
            .await
            .map_err(|source| ReadError::Read {
                path: self.path.clone(),
                source,
            })?;
        if n > 0 && self.partial.ends_with(b"\n") {
            return Ok(Some(std::mem::take(&mut self.partial)));
        }
        Ok(None)
    }

    /// What is left of an unterminated last line (a file that will not grow any more).
    fn take_unterminated(&mut self) -> Option<Vec<u8>> {
        (!self.partial.is_empty()).then(|| std::mem::take(&mut self.partial))
    }

    /// Whether the path now names another file (the log was rotated) or none.
    async fn replaced(&self) -> bool {
        match tokio::fs::metadata(&self.path).await {
            Ok(meta) => meta.ino() != self.inode,
            Err(_) => true,
        }
    }
}

/// Parses one raw line into the joiner; the line it completes, if any.
fn join(path: &Path, joiner: &mut LineJoiner, raw: &[u8]) -> Option<LogLine> {
    match parse_record(raw) {
        Ok(record) => joiner.push(&record),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "skipping a line of a container log that is not in the CRI format");
            None
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
    let mut file = LogFile::open(path).await?;
    let mut out = Output {
        tx: out,
        timestamps: options.timestamps,
        since: options.since,
        remaining: options.limit_bytes,
    };
    let mut joiner = LineJoiner::default();
    if let Some(tail) = options.tail_lines {
        // The whole file is read to find its last lines: files are bounded by the rotation
        // size, and counting whole lines needs the records joined from the start.
        let keep = usize::try_from(tail).unwrap_or(usize::MAX);
        let mut last: VecDeque<LogLine> = VecDeque::new();
        while let Some(raw) = file.next_line().await? {
            if let Some(line) = join(path, &mut joiner, &raw) {
                if keep == 0 {
                    continue;
                }
                if last.len() == keep {
                    last.pop_front();
                }
                last.push_back(line);
            }
        }
        for line in &last {
            if out.write(line).await == Flow::Stop {
                return Ok(());
            }
        }
    }
    if drain(&mut file, &mut joiner, &mut out).await? == Flow::Stop {
        return Ok(());
    }
    if options.follow {
        follow(
            &mut file,
            &mut joiner,
            &mut out,
            container_id,
            runtime,
            timing,
        )
        .await?;
    }
    // The file ends here: an unterminated line and a partial record are served as they are.
    if let Some(raw) = file.take_unterminated()
        && let Some(line) = join(path, &mut joiner, &raw)
        && out.write(&line).await == Flow::Stop
    {
        return Ok(());
    }
    if let Some(line) = joiner.take_pending() {
        out.write(&line).await;
    }
    Ok(())
}

/// Writes every complete line up to the end of what is written.
async fn drain(
    file: &mut LogFile,
    joiner: &mut LineJoiner,
    out: &mut Output,
) -> Result<Flow, ReadError> {
    while let Some(raw) = file.next_line().await? {
        if let Some(line) = join(&file.path, joiner, &raw)
            && out.write(&line).await == Flow::Stop
        {
            return Ok(Flow::Stop);
        }
    }
    Ok(Flow::Continue)
}

/// Waits for more lines, switching to the new file after a rotation, until the container stops
/// running (its last lines are read first) or the client goes away.
async fn follow(
    file: &mut LogFile,
    joiner: &mut LineJoiner,
    out: &mut Output,
    container_id: &str,
    runtime: &dyn RuntimeService,
    timing: FollowTiming,
) -> Result<(), ReadError> {
    let mut checked = Instant::now();
    loop {
        if drain(file, joiner, out).await? == Flow::Stop {
            return Ok(());
        }
        if file.replaced().await {
            // The old file is complete once renamed and reopened elsewhere: read its rest, then
            // go on with the new one (if the runtime has made it yet).
            if drain(file, joiner, out).await? == Flow::Stop {
                return Ok(());
            }
            if let Ok(next) = LogFile::open(&file.path).await {
                *file = next;
                continue;
            }
        }
        if checked.elapsed() >= timing.state_check {
            checked = Instant::now();
            if !is_running(runtime, container_id).await {
                // What it wrote before it stopped is in the file by now.
                drain(file, joiner, out).await?;
                return Ok(());
            }
        }
        if out.tx.is_closed() {
            return Ok(());
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
#[path = "read_tests.rs"]
mod tests;
