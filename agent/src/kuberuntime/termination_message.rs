//! A terminated container's message (upstream `getTerminationMessage` and
//! `readLastStringFromContainerLogs` in `kuberuntime_container.go`, as `getPodContainerStatuses`
//! uses them): the last [`MAX_CONTAINER_TERMINATION_MESSAGE_LENGTH`] bytes of the file the
//! container wrote at its `terminationMessagePath`, or — with `FallbackToLogsOnError`, a non-zero
//! exit and no message in the file — the end of its log (the last
//! [`MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LINES`] lines, at most
//! [`MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LENGTH`] bytes of them), joined to the runtime's own
//! message with `": "`.
//!
//! The file's content is the container's to choose, and so is its size: it is read from its end,
//! at most the bound, whatever the file holds, and taken as lossy UTF-8. Its name is not the
//! container's to choose: the host file is one `volume::container_mounts` created (a fresh name in
//! the pod's 0750 `containers/<name>` directory) and bound onto the container's path, so a process
//! in the container reaches the inode only through that bind. It can write, truncate or `chmod`
//! it, but not replace the host's directory entry with a link or a FIFO (a rename or unlink over a
//! bind-mount target fails with `EBUSY`, and the host's directory is in no mount the container
//! has). It is still opened as untrusted: the directory without following a link, the file below
//! it with `openat2` refusing links and mounts, `O_NONBLOCK` (a FIFO would not block the open) and
//! only a regular file read.
//!
//! Not here: when a message is read (once per exited container, by the runtime manager's
//! `pod_status`), and the per-pod budget (`status::manager`).

use std::{
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use tokio::sync::mpsc;

use crate::{
    container::{ANNOTATION_TERMINATION_MESSAGE_PATH, ANNOTATION_TERMINATION_MESSAGE_POLICY},
    cri::RuntimeService,
    hostfs::Dir,
    logs::{FollowTiming, LogOptions, read_logs},
};

/// Upstream `MaxContainerTerminationMessageLength`: the most of its file read back.
pub const MAX_CONTAINER_TERMINATION_MESSAGE_LENGTH: u64 = 4 * 1024;
/// Upstream `MaxContainerTerminationMessageLogLength`: the most of its log taken as a message.
pub const MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LENGTH: usize = 2 * 1024;
/// Upstream `MaxContainerTerminationMessageLogLines`.
pub const MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LINES: u64 = 80;
/// The policy value that lets the log stand in for an empty file.
pub const FALLBACK_TO_LOGS_ON_ERROR: &str = "FallbackToLogsOnError";
/// The runtime's reason for a container it could not start: it wrote no log worth reading.
const CONTAINER_CANNOT_RUN: &str = "ContainerCannotRun";

/// The message of an exited container: the runtime's, then what the container left (upstream
/// `getPodContainerStatuses`, the `CONTAINER_EXITED` branch). `runtime` serves the log read.
pub async fn termination_message(
    status: &cri::ContainerStatus,
    runtime: &dyn RuntimeService,
) -> String {
    let policy = status
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_POLICY)
        .map(String::as_str);
    let fallback = policy == Some(FALLBACK_TO_LOGS_ON_ERROR)
        && status.exit_code != 0
        && status.reason != CONTAINER_CANNOT_RUN;
    let path = status
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
        .map_or("", String::as_str);
    let (mut own, check_logs) = from_file(status, path, fallback);
    if check_logs {
        own = from_logs(Path::new(&status.log_path), runtime).await;
    }
    join(&status.message, &own)
}

/// The runtime's message and the container's, as upstream joins them.
fn join(runtime: &str, own: &str) -> String {
    match (runtime.is_empty(), own.is_empty()) {
        (_, true) => runtime.to_owned(),
        (true, false) => own.to_owned(),
        (false, false) => format!("{runtime}: {own}"),
    }
}

/// Upstream `getTerminationMessage`: the file's message, and whether the log should be read
/// instead (`fallback` and nothing in the file).
fn from_file(
    status: &cri::ContainerStatus,
    container_path: &str,
    fallback: bool,
) -> (String, bool) {
    if container_path.is_empty() {
        return (String::new(), fallback);
    }
    let Some(mount) = status
        .mounts
        .iter()
        .find(|m| m.container_path == container_path)
    else {
        return (String::new(), fallback);
    };
    let host_path = PathBuf::from(&mount.host_path);
    match read_at_most(&host_path, MAX_CONTAINER_TERMINATION_MESSAGE_LENGTH) {
        Ok(data) => {
            let empty = data.is_empty();
            (
                String::from_utf8_lossy(&data).into_owned(),
                fallback && empty,
            )
        }
        Err(ReadError::NotFound) => (String::new(), fallback),
        Err(ReadError::Other(error)) => (
            format!(
                "Error on reading termination log {}: {error}",
                host_path.display()
            ),
            false,
        ),
    }
}

enum ReadError {
    NotFound,
    Other(String),
}

/// The last `max` bytes of the regular file at `path` (upstream `tail.ReadAtMost`), its directory
/// opened without following a link and the file below it with no link or mount on the way.
fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ReadError::Other("not a file path".into()));
    };
    let hostfs = |e: crate::hostfs::Error| {
        if e.is_not_found() {
            ReadError::NotFound
        } else {
            ReadError::Other(e.to_string())
        }
    };
    let file = Dir::open(parent)
        .and_then(|dir| dir.open_file(Path::new(name)))
        .map_err(hostfs)?;
    let io = |e: io::Error| ReadError::Other(e.to_string());
    let len = file.metadata().map_err(io)?.len();
    let start = len.saturating_sub(max);
    let mut buf = vec![0u8; usize::try_from(len - start).unwrap_or(0)];
    let mut done = 0;
    // The container may still be truncating it: what is there to read is what is read.
    while done < buf.len() {
        match file.read_at(&mut buf[done..], start + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Upstream `readLastStringFromContainerLogs`: the last lines of the container's log, through
/// the log reader `/containerLogs` uses, keeping only the last
/// [`MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LENGTH`] bytes of what it gives (upstream's
/// `circbuf`), so a long line costs no more than that.
async fn from_logs(path: &Path, runtime: &dyn RuntimeService) -> String {
    if path.as_os_str().is_empty() {
        return String::new();
    }
    let options = LogOptions {
        tail_lines: Some(MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LINES),
        ..LogOptions::default()
    };
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    let read = read_logs(path, "", &options, runtime, tx, FollowTiming::default());
    let collect = async {
        let mut tail = LastBytes::new(MAX_CONTAINER_TERMINATION_MESSAGE_LOG_LENGTH);
        while let Some(chunk) = rx.recv().await {
            tail.push(&chunk);
        }
        tail.into_vec()
    };
    let (read, bytes) = tokio::join!(read, collect);
    match read {
        Ok(()) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(error) => format!("Error on reading termination message from logs: {error}"),
    }
}

/// The last `cap` bytes pushed (upstream's `circbuf.Buffer`).
struct LastBytes {
    cap: usize,
    buf: Vec<u8>,
}

impl LastBytes {
    fn new(cap: usize) -> Self {
        LastBytes {
            cap,
            buf: Vec::with_capacity(cap),
        }
    }

    fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend_from_slice(data);
    }

    fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests;
