//! Memory cgroup notifications that wake the eviction manager the moment a memory threshold is
//! crossed, with no reclaim needed:
//! - cgroup v1 memory controller (hybrid and legacy layouts): a usage threshold on
//!   `memory.usage_in_bytes` registered through `cgroup.event_control` with an eventfd — the
//!   kubelet's own `kernelMemcgNotification`, one per memory threshold, on the root (for
//!   `memory.available`) and the pods' cgroup (for `allocatableMemory.available`). The kernel
//!   signals a crossing either way.
//! - cgroup v2: `memory.events` of the pods' cgroup changes (inotify) on `high`, `max`, `oom`
//!   and `oom_kill` (upstream has nothing here: its notifier is a no-op on v2, k/k#106331).
//! - cgroup v2, the v1 usage threshold's counterpart: the pods' `memory.current` reaching a level
//!   (`wakeups.rs` arms it), seen by the kernel programs (`kernel::MemcgTrigger`), or where they
//!   cannot run by [`CurrentReader`] polls.
//!
//! Not here: computing the usage level each threshold means (`manager.rs` re-arms them after
//! every decision, since inactive file moves). Upstream: `pkg/kubelet/eviction/
//! threshold_notifier_linux.go`, `memory_threshold_notifier.go`.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use futures::StreamExt;
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

#[derive(Debug, thiserror::Error)]
pub enum MemcgError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MemcgError + '_ {
    move |source| MemcgError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A v1 usage threshold on one memory cgroup.
pub struct UsageThreshold {
    event: AsyncFd<EventFd>,
    // Kept open: the registration lives as long as both fds.
    _usage: File,
    pub dir: PathBuf,
    pub bytes: u64,
}

impl UsageThreshold {
    /// Registers a notification when `memory.usage_in_bytes` of the v1 memory cgroup `dir`
    /// crosses `bytes`.
    pub fn arm(dir: &Path, bytes: u64) -> Result<UsageThreshold, MemcgError> {
        let usage_path = dir.join("memory.usage_in_bytes");
        let usage = File::open(&usage_path).map_err(io_err(&usage_path))?;
        let event = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| io_err(dir)(e.into()))?;
        let control = dir.join("cgroup.event_control");
        let line = format!("{} {} {bytes}", event.as_raw_fd(), usage.as_raw_fd());
        OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(io_err(&control))?;
        Ok(UsageThreshold {
            event: crate::sys::register_readable(event).map_err(io_err(dir))?,
            _usage: usage,
            dir: dir.to_owned(),
            bytes,
        })
    }

    /// Waits for the next crossing.
    pub async fn crossed(&self) -> Result<(), MemcgError> {
        loop {
            let mut guard = self.event.readable().await.map_err(io_err(&self.dir))?;
            match guard.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => return Err(io_err(&self.dir)(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// `memory.events` of a v2 cgroup, watched for changes.
pub struct MemoryEvents {
    stream: inotify::EventStream<Vec<u8>>,
    pub path: PathBuf,
}

impl MemoryEvents {
    pub fn watch(dir: &Path) -> Result<MemoryEvents, MemcgError> {
        let path = dir.join("memory.events");
        let inotify = inotify::Inotify::init().map_err(io_err(&path))?;
        inotify
            .watches()
            .add(&path, inotify::WatchMask::MODIFY)
            .map_err(io_err(&path))?;
        let stream = inotify
            .into_event_stream(vec![0; 1024])
            .map_err(io_err(&path))?;
        Ok(MemoryEvents { stream, path })
    }

    /// Waits for the next change; `None` when the watch ended (the cgroup was removed).
    pub async fn changed(&mut self) -> Option<()> {
        match self.stream.next().await {
            Some(Ok(_)) => Some(()),
            _ => None,
        }
    }
}

/// A v2 cgroup's `memory.current`, held open and read with `pread` (a poll costs one syscall).
pub struct CurrentReader {
    file: File,
    pub path: PathBuf,
}

impl CurrentReader {
    /// Opens `dir/memory.current` without following a symlink.
    pub fn open(dir: &Path) -> Result<CurrentReader, MemcgError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = dir.join("memory.current");
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(CurrentReader { file, path })
    }

    /// The usage now, in bytes.
    pub fn read(&self) -> Result<u64, MemcgError> {
        use std::os::unix::fs::FileExt as _;
        // "18446744073709551615\n" at most.
        let mut buf = [0u8; 32];
        let n = self.file.read_at(&mut buf, 0).map_err(io_err(&self.path))?;
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| {
                io_err(&self.path)(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a byte count",
                ))
            })
    }
}

/// Whether `dir` is a v1 memory cgroup that takes usage thresholds.
pub fn supports_usage_thresholds(dir: &Path) -> bool {
    dir.join("cgroup.event_control").exists() && dir.join("memory.usage_in_bytes").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_current_reader_reads_the_byte_count_each_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("memory.current");
        std::fs::write(&path, "4096\n").expect("write");
        let reader = CurrentReader::open(dir.path()).expect("open");
        assert_eq!(reader.read().expect("read"), 4096);
        std::fs::write(&path, "123456789\n").expect("write");
        assert_eq!(reader.read().expect("read again"), 123_456_789);
        std::fs::write(&path, "max\n").expect("write");
        let err = reader.read().expect_err("not a number");
        assert!(err.to_string().contains("memory.current"), "{err}");
        let link = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(&path, link.path().join("memory.current")).expect("symlink");
        assert!(
            CurrentReader::open(link.path()).is_err(),
            "a symlink is not followed"
        );
    }

    /// On a v1 memory controller, crossing a usage threshold signals the eventfd.
    #[tokio::test]
    async fn a_v1_usage_threshold_fires_when_crossed() {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !supports_usage_thresholds(root) {
            eprintln!(
                "skipped: no cgroup v1 memory controller at {}",
                root.display()
            );
            return;
        }
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs privileged tests as root"
            );
            eprintln!("skipped: needs root to make a memory cgroup");
            return;
        }
        let dir = root.join(format!("swiftlet-memcg-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir memcg");
        let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
            .expect("usage")
            .trim()
            .parse()
            .expect("number");
        let threshold = UsageThreshold::arm(&dir, usage + (8 << 20)).expect("armed");
        // A child that allocates 32 MiB of anonymous memory in the cgroup, then waits.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "echo $$ > cgroup.procs; v=$(head -c 33554432 /dev/zero | tr '\\0' x); sleep 30",
            ])
            .current_dir(&dir)
            .spawn()
            .expect("spawn");
        let fired =
            tokio::time::timeout(std::time::Duration::from_secs(20), threshold.crossed()).await;
        let _ = child.kill();
        let _ = child.wait();
        drop(threshold);
        for _ in 0..50 {
            if std::fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            matches!(fired, Ok(Ok(()))),
            "the threshold crossing was signalled: {fired:?}"
        );
    }
}
