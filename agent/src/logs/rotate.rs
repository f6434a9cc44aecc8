//! Container log rotation (upstream `ContainerLogManager`, `pkg/kubelet/logs/
//! container_log_manager.go`): every monitor interval, each running container whose log file has
//! reached `containerLogMaxSize` gets its log rotated: leftovers of an interrupted rotation are
//! removed, the oldest rotated files go so that at most `containerLogMaxFiles` remain once the
//! new file exists, older rotated files are gzip-compressed, the current file is renamed to
//! `<log>.<YYYYmmdd-HHMMSS>` and the runtime is asked to reopen the log (CRI
//! `ReopenContainerLog`), which makes a fresh file at the same path. If the reopen fails the
//! rename is undone, so the next round tries again and no output is lost.
//!
//! Where a container's log is comes from the runtime's `ContainerStatus`, asked once per container:
//! the path is fixed at creation (the sandbox's log directory and the container's `log_path`), so
//! a round costs one `ListContainers`, not also one status per running container as upstream's
//! does (at 100 containers, 600 of an idle node's CRI calls a minute). The remembered paths are
//! those of the containers running at the last round, no more.
//!
//! Exited containers are left alone: they write nothing more. Removing a container's logs with
//! the container is the garbage collector's business (`kuberuntime::gc`).

use std::{
    collections::HashMap,
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;
use tokio_util::sync::CancellationToken;

use crate::{cri::RuntimeService, lock::MutexExt as _};

/// Suffix of a compressed rotated log.
const COMPRESS_SUFFIX: &str = ".gz";
/// Suffix of a compression in progress.
const TMP_SUFFIX: &str = ".tmp";
/// Go's `20060102-150405`.
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

/// When and how logs are rotated (`containerLogMaxSize`, `containerLogMaxFiles`,
/// `containerLogMonitorInterval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRotatePolicy {
    /// Bytes a log may reach before it is rotated; negative disables rotation.
    pub max_size: i64,
    /// Most files per container log, the current one included; at least 2.
    pub max_files: usize,
    pub monitor_interval: Duration,
}

impl Default for LogRotatePolicy {
    fn default() -> Self {
        LogRotatePolicy {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] crate::cri::Error),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RotateError + 'a {
    move |source| RotateError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

pub use crate::clock::Clock;

pub struct ContainerLogManager {
    runtime: Arc<dyn RuntimeService>,
    policy: LogRotatePolicy,
    clock: Clock,
    /// Counts rotations, when given.
    rotations: Option<prometheus::IntCounter>,
    /// Container id → its log file, for the containers running at the last round.
    log_paths: Mutex<HashMap<String, PathBuf>>,
}

impl ContainerLogManager {
    pub fn new(runtime: Arc<dyn RuntimeService>, policy: LogRotatePolicy) -> Self {
        ContainerLogManager {
            runtime,
            policy,
            clock: Arc::new(SystemTime::now),
            rotations: None,
            log_paths: Mutex::new(HashMap::new()),
        }
    }

    /// Counts every rotation in `counter`.
    pub fn with_rotations_counter(mut self, counter: prometheus::IntCounter) -> Self {
        self.rotations = Some(counter);
        self
    }

    /// Uses `clock` for the rotated files' names (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Rotates every `monitor_interval` until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if self.policy.max_size < 0 {
            tracing::info!("container log rotation is disabled (containerLogMaxSize < 0)");
            return shutdown.cancelled().await;
        }
        let mut tick = tokio::time::interval(self.policy.monitor_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(e) = self.rotate_logs().await {
                tracing::warn!(error = %e, "failed to rotate container logs");
            }
        }
    }

    /// One round over the running containers; returns how many logs were rotated.
    pub async fn rotate_logs(&self) -> Result<usize, crate::cri::Error> {
        let running: Vec<String> = self
            .runtime
            .list_containers(None)
            .await?
            .into_iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .map(|c| c.id)
            .collect();
        self.log_paths
            .lock_unpoisoned()
            .retain(|id, _| running.contains(id));
        let mut rotated = 0;
        for id in running {
            match self.process_container(&id).await {
                Ok(true) => {
                    rotated += 1;
                    if let Some(counter) = &self.rotations {
                        counter.inc();
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(container = id, error = %e, "failed to rotate a container's log");
                }
            }
        }
        Ok(rotated)
    }

    /// The container's log file: remembered, or asked of the runtime once.
    async fn log_path(&self, id: &str) -> Result<Option<PathBuf>, crate::cri::Error> {
        if let Some(path) = self.log_paths.lock_unpoisoned().get(id) {
            return Ok(Some(path.clone()));
        }
        let status = self.runtime.container_status(id).await?;
        if status.log_path.is_empty() {
            return Ok(None);
        }
        let path = PathBuf::from(&status.log_path);
        self.log_paths
            .lock_unpoisoned()
            .insert(id.to_owned(), path.clone());
        Ok(Some(path))
    }

    /// Rotates one container's log if it is too big; whether it did.
    async fn process_container(&self, id: &str) -> Result<bool, RotateError> {
        let Some(path) = self.log_path(id).await? else {
            return Ok(false);
        };
        let size = match fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Gone (removed by hand, or a reopen failed last time): have the runtime make it.
                self.runtime.reopen_container_log(id).await?;
                fs::metadata(&path).map_err(io_err("stat", &path))?.len()
            }
            Err(e) => return Err(io_err("stat", &path)(e)),
        };
        if i64::try_from(size).unwrap_or(i64::MAX) < self.policy.max_size {
            return Ok(false);
        }
        // Removal and compression are blocking file work (a compression reads up to
        // containerLogMaxSize bytes).
        let prepare = {
            let path = path.clone();
            let max_files = self.policy.max_files;
            tokio::task::spawn_blocking(move || prepare_rotation(&path, max_files))
        };
        match prepare.await {
            Ok(result) => drop(result?),
            Err(e) => {
                return Err(RotateError::Io {
                    op: "compress rotated logs of",
                    path,
                    source: io::Error::other(e.to_string()),
                });
            }
        }
        self.rotate_latest(id, &path).await?;
        tracing::debug!(container = id, path = %path.display(), size, "rotated a container log");
        Ok(true)
    }

    /// Renames the current log away and has the runtime reopen it; undoes the rename if the
    /// runtime cannot.
    async fn rotate_latest(&self, id: &str, path: &Path) -> Result<(), RotateError> {
        let stamp = k8s_openapi::jiff::Timestamp::try_from((self.clock)())
            .map(|t| t.strftime(TIMESTAMP_FORMAT).to_string())
            .unwrap_or_else(|_| "19700101-000000".to_owned());
        let rotated = PathBuf::from(format!("{}.{stamp}", path.display()));
        fs::rename(path, &rotated).map_err(io_err("rename", path))?;
        if let Err(e) = self.runtime.reopen_container_log(id).await {
            if let Err(undo) = fs::rename(&rotated, path) {
                tracing::error!(container = id, rotated = %rotated.display(), error = %undo, "cannot rename a rotated log back after a failed reopen: its output may be lost");
            }
            return Err(e.into());
        }
        Ok(())
    }
}

/// The rotated files of `log` (`<log>.*`), sorted oldest first (their suffixes are timestamps).
pub fn rotated_logs(log: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut found: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// Whether a rotated file is still wanted: not a temporary file, and not an uncompressed copy of
/// a file already compressed (upstream `isInUse`).
fn in_use(log: &Path, all: &[PathBuf]) -> bool {
    let name = log.to_string_lossy();
    if name.ends_with(TMP_SUFFIX) {
        return false;
    }
    if name.ends_with(COMPRESS_SUFFIX) {
        return true;
    }
    let compressed = format!("{name}{COMPRESS_SUFFIX}");
    !all.iter()
        .any(|other| other.to_string_lossy() == compressed)
}

/// Everything before the rename: leftovers removed, excess files removed oldest first, the rest
/// compressed. Returns the rotated files kept.
fn prepare_rotation(log: &Path, max_files: usize) -> Result<Vec<PathBuf>, RotateError> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let all = rotated_logs(log).map_err(io_err("list", dir))?;
    let (mut kept, unused): (Vec<PathBuf>, Vec<PathBuf>) =
        all.iter().cloned().partition(|l| in_use(l, &all));
    for l in unused {
        remove(&l)?;
    }
    // The current file and the one about to be rotated count too.
    let max_rotated = max_files.saturating_sub(2);
    let excess = kept.len().saturating_sub(max_rotated);
    for l in kept.drain(..excess) {
        remove(&l)?;
    }
    for l in &mut kept {
        if !l.to_string_lossy().ends_with(COMPRESS_SUFFIX) {
            *l = compress(l)?;
        }
    }
    Ok(kept)
}

fn remove(path: &Path) -> Result<(), RotateError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Compresses `log` to `log.gz` (through `log.gz.tmp`, so a crash leaves no half archive under
/// the final name) and removes `log`.
fn compress(log: &Path) -> Result<PathBuf, RotateError> {
    let tmp = PathBuf::from(format!("{}{COMPRESS_SUFFIX}{TMP_SUFFIX}", log.display()));
    let done = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", log.display()));
    let result = (|| {
        let mut input = fs::File::open(log).map_err(io_err("open", log))?;
        // Upstream creates the compressed log 0644; set explicitly, the umask does not decide.
        let output = {
            use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
            let file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o644)
                .open(&tmp)
                .map_err(io_err("create", &tmp))?;
            file.set_permissions(fs::Permissions::from_mode(0o644))
                .map_err(io_err("create", &tmp))?;
            file
        };
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        io::copy(&mut input, &mut encoder).map_err(io_err("compress", log))?;
        encoder
            .finish()
            .and_then(|mut f| f.flush())
            .map_err(io_err("compress", log))?;
        fs::rename(&tmp, &done).map_err(io_err("rename", &tmp))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    remove(log)?;
    Ok(done)
}

#[cfg(test)]
mod tests;
