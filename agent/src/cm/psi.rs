//! Pressure Stall Information (the kernel's `Documentation/accounting/psi.rst`): the node's
//! `/proc/pressure/{cpu,memory,io}` and every cgroup2 directory's `{cpu,memory,io}.pressure`,
//! read as numbers, and triggers registered on them that the kernel signals when a task group
//! stalled for longer than a threshold within a window.
//!
//! A file holds a `some` line (some task stalled) and, except `cpu` on older kernels, a `full`
//! line (every non-idle task stalled at once):
//!
//! ```text
//! some avg10=0.12 avg60=0.05 avg300=0.01 total=123456
//! full avg10=0.00 avg60=0.00 avg300=0.00 total=4567
//! ```
//!
//! Not here: deciding what a pressure means (the eviction manager) or exposing it (metrics).

use std::{
    fs::{self, File},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

/// The kernel's bounds on a trigger's window (`WINDOW_MIN_US`, `WINDOW_MAX_US`).
const WINDOW_MIN: Duration = Duration::from_millis(500);
const WINDOW_MAX: Duration = Duration::from_secs(10);
/// Without CAP_SYS_RESOURCE the kernel accepts only windows that are multiples of this
/// (unprivileged triggers ride on the 2 s averaging work instead of their own poll thread).
const UNPRIVILEGED_WINDOW_UNIT_US: u64 = 2_000_000;
/// CAP_SYS_RESOURCE.
const CAP_SYS_RESOURCE: u32 = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PsiResource {
    Cpu,
    Memory,
    Io,
}

impl PsiResource {
    pub const ALL: [PsiResource; 3] = [PsiResource::Cpu, PsiResource::Memory, PsiResource::Io];

    pub fn as_str(self) -> &'static str {
        match self {
            PsiResource::Cpu => "cpu",
            PsiResource::Memory => "memory",
            PsiResource::Io => "io",
        }
    }

    /// The file in a cgroup2 directory, e.g. `memory.pressure`.
    pub fn file_name(self) -> &'static str {
        match self {
            PsiResource::Cpu => "cpu.pressure",
            PsiResource::Memory => "memory.pressure",
            PsiResource::Io => "io.pressure",
        }
    }

    /// The node-wide file, e.g. `/proc/pressure/memory`.
    pub fn proc_path(self) -> &'static Path {
        Path::new(match self {
            PsiResource::Cpu => "/proc/pressure/cpu",
            PsiResource::Memory => "/proc/pressure/memory",
            PsiResource::Io => "/proc/pressure/io",
        })
    }
}

/// One line of a pressure file: the share of time stalled (in percent) over the last 10, 60 and
/// 300 seconds, and the total stall time since boot (or since the cgroup was made).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub some: PsiLine,
    /// Absent for `cpu` on kernels before 5.13 (and all zeros at the root on later ones).
    pub full: Option<PsiLine>,
}

#[derive(Debug, thiserror::Error)]
pub enum PsiError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}line {line} {text:?}: {reason}", file_prefix(file.as_deref()))]
    Parse {
        /// The file the text came from (`None` for text handed to [`Psi::parse`]).
        file: Option<PathBuf>,
        /// 1-based; 0 when the whole text is at fault (no `some` line).
        line: usize,
        text: String,
        reason: &'static str,
    },
    #[error("registering the PSI trigger {trigger:?} on {}: {source}", path.display())]
    Register {
        path: PathBuf,
        trigger: String,
        #[source]
        source: io::Error,
    },
    #[error("waiting for the PSI trigger on {}: {source}", path.display())]
    Wait {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the PSI trigger on {} ended (POLLERR): its cgroup was removed", path.display())]
    Ended { path: PathBuf },
}

impl PsiError {
    /// Whether the file was not there (a cgroup removed between listing and reading it).
    pub fn is_not_found(&self) -> bool {
        matches!(self, PsiError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

fn file_prefix(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display()))
        .unwrap_or_default()
}

impl Psi {
    /// Parses the text of a pressure file.
    pub fn parse(text: &str) -> Result<Psi, PsiError> {
        parse(text, None)
    }

    /// Reads and parses one pressure file.
    pub fn read(path: &Path) -> Result<Psi, PsiError> {
        let text = fs::read_to_string(path).map_err(|source| PsiError::Read {
            path: path.to_owned(),
            source,
        })?;
        parse(&text, Some(path))
    }

    /// The pressure of the cgroup2 directory `dir`.
    pub fn read_cgroup(dir: &Path, r: PsiResource) -> Result<Psi, PsiError> {
        Self::read(&dir.join(r.file_name()))
    }

    /// The node's pressure (`/proc/pressure/<r>`).
    pub fn read_node(r: PsiResource) -> Result<Psi, PsiError> {
        Self::read(r.proc_path())
    }
}

fn parse(text: &str, file: Option<&Path>) -> Result<Psi, PsiError> {
    let error = |line: usize, text: &str, reason: &'static str| PsiError::Parse {
        file: file.map(Path::to_path_buf),
        line,
        text: text.to_owned(),
        reason,
    };
    let (mut some, mut full) = (None, None);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let slot = match fields.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => return Err(error(i + 1, raw, "expected a `some` or `full` line")),
        };
        if slot.is_some() {
            return Err(error(i + 1, raw, "repeated line"));
        }
        let (mut avg10, mut avg60, mut avg300, mut total_us) = (None, None, None, None);
        for field in fields {
            let Some((key, value)) = field.split_once('=') else {
                return Err(error(i + 1, raw, "expected key=value fields"));
            };
            let avg = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| error(i + 1, raw, "an average is not a non-negative number"))
            };
            match key {
                "avg10" => avg10 = Some(avg()?),
                "avg60" => avg60 = Some(avg()?),
                "avg300" => avg300 = Some(avg()?),
                "total" => {
                    total_us = Some(value.parse::<u64>().map_err(|_| {
                        error(i + 1, raw, "total is not a whole number of microseconds")
                    })?);
                }
                // Fields a later kernel may add.
                _ => {}
            }
        }
        let (Some(avg10), Some(avg60), Some(avg300), Some(total_us)) =
            (avg10, avg60, avg300, total_us)
        else {
            return Err(error(
                i + 1,
                raw,
                "missing one of avg10, avg60, avg300, total",
            ));
        };
        *slot = Some(PsiLine {
            avg10,
            avg60,
            avg300,
            total_us,
        });
    }
    let some = some.ok_or_else(|| error(0, text, "no `some` line"))?;
    Ok(Psi { some, full })
}

/// A trigger registered on a pressure file: the kernel signals it (POLLPRI) when the group
/// stalled for at least `stall` within any `window`, at most once per window.
pub struct PsiTrigger {
    fd: TriggerFd,
    path: PathBuf,
    stall: Duration,
    window: Duration,
}

/// The registered file, put under the tokio reactor at the first wait (so registering needs no
/// runtime; an event signalled before then is still reported, the kernel keeps it pending).
enum TriggerFd {
    Registered(File),
    Polled(AsyncFd<File>),
    /// POLLERR was seen (the file is closed), or putting it under the reactor failed.
    Ended,
}

impl PsiTrigger {
    /// Registers `"<some|full> <stall_us> <window_us>"` on `path` (a `*.pressure` file). The
    /// window is clamped to the kernel's 500 ms..10 s and, when this process lacks
    /// CAP_SYS_RESOURCE, rounded up to a multiple of 2 s (the kernel's rule for unprivileged
    /// writers); the stall is kept below the window. The trigger lives as long as this value.
    pub fn new(
        path: &Path,
        full: bool,
        stall: Duration,
        window: Duration,
    ) -> Result<PsiTrigger, PsiError> {
        let privileged = crate::sys::has_capability(CAP_SYS_RESOURCE);
        let (stall, window) = effective(stall, window, privileged);
        let trigger = format!(
            "{} {} {}",
            if full { "full" } else { "some" },
            stall.as_micros(),
            window.as_micros()
        );
        let register = |source| PsiError::Register {
            path: path.to_owned(),
            trigger: trigger.clone(),
            source,
        };
        // O_RDWR | O_NONBLOCK, and O_CLOEXEC as std opens every file.
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(register)?;
        // One write, NUL-terminated as psi.rst's example: `/proc/pressure/*` overwrites the last
        // byte written with a NUL, which must not cut the window's last digit.
        let mut bytes = trigger.clone().into_bytes();
        bytes.push(0);
        file.write_all(&bytes).map_err(register)?;
        Ok(PsiTrigger {
            fd: TriggerFd::Registered(file),
            path: path.to_owned(),
            stall,
            window,
        })
    }

    /// The window the kernel was given.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The stall threshold the kernel was given.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until the kernel signals the trigger (POLLPRI). POLLERR — the cgroup was removed —
    /// ends it with [`PsiError::Ended`]; every later call says the same. Cancel-safe.
    /// Must be called within a tokio runtime.
    pub async fn fired(&mut self) -> Result<(), PsiError> {
        let path = &self.path;
        let wait = |source| PsiError::Wait {
            path: path.clone(),
            source,
        };
        if let TriggerFd::Registered(_) = self.fd
            && let TriggerFd::Registered(file) = std::mem::replace(&mut self.fd, TriggerFd::Ended)
        {
            self.fd = TriggerFd::Polled(crate::sys::register_priority(file).map_err(wait)?);
        }
        let TriggerFd::Polled(fd) = &self.fd else {
            return Err(PsiError::Ended { path: path.clone() });
        };
        loop {
            let mut guard = fd
                .ready(Interest::PRIORITY.add(Interest::ERROR))
                .await
                .map_err(wait)?;
            let ready = guard.ready();
            guard.clear_ready();
            drop(guard);
            // A removed cgroup polls as ERR|PRI: the error comes first.
            if ready.is_error() || (ready.is_read_closed() && !ready.is_priority()) {
                self.fd = TriggerFd::Ended;
                return Err(PsiError::Ended {
                    path: self.path.clone(),
                });
            }
            if ready.is_priority() {
                return Ok(());
            }
        }
    }
}

/// The (stall, window) the kernel accepts for the asked ones: the window clamped to
/// 500 ms..10 s and, unprivileged, rounded up to a multiple of 2 s; the stall between 1 µs and
/// just below the window. Whole microseconds, rounded up.
fn effective(stall: Duration, window: Duration, privileged: bool) -> (Duration, Duration) {
    let micros = |d: Duration| d.as_nanos().div_ceil(1_000).min(u128::from(u64::MAX)) as u64;
    let min = micros(WINDOW_MIN);
    let max = micros(WINDOW_MAX);
    let mut window_us = micros(window).clamp(min, max);
    if !privileged {
        window_us = window_us
            .next_multiple_of(UNPRIVILEGED_WINDOW_UNIT_US)
            .min(max);
    }
    let stall_us = micros(stall).clamp(1, window_us - 1);
    (
        Duration::from_micros(stall_us),
        Duration::from_micros(window_us),
    )
}

#[cfg(test)]
mod tests;
