//! The benchmark's own view of the pods' memory: the working set of the pods' cgroup as the
//! eviction manager computes it (usage minus inactive file: `memory.usage_in_bytes` −
//! `total_inactive_file` on a v1 memory controller, `memory.current` − `inactive_file` on cgroup
//! v2), read by a dedicated thread about every millisecond and stamped with CLOCK_MONOTONIC, the
//! clock of the agent's decisions and of the kernel's events. The first sample past the bar
//! (allocatable − threshold) is "pressure crossed".
//!
//! A sample is stamped when its read returns: the crossing happened between the previous
//! sample and this one, so the latencies measured from it are short by at most one interval
//! (each crossing's interval is kept).

use std::{
    fs::File,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde::Serialize;
use tokio::sync::oneshot;

/// The sampling interval.
pub const INTERVAL: Duration = Duration::from_millis(1);

/// Where cgroups are mounted.
const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";

/// Which files hold the pods' cgroup's memory figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryFiles {
    /// The pods' cgroup in the memory controller's hierarchy.
    pub dir: PathBuf,
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2).
    pub usage: &'static str,
    /// The key of the inactive file pages in `memory.stat` (hierarchical on v1).
    pub inactive_key: &'static str,
}

impl MemoryFiles {
    /// The pods' cgroup (`<cgroup_root>/kubepods`) on this machine: in the v1 memory hierarchy
    /// when there is one (a hybrid layout), else in cgroup v2 (mounted at `/sys/fs/cgroup`, or at
    /// `/sys/fs/cgroup/unified` with the memory controller there).
    pub fn detect(cgroup_root: &str) -> MemoryFiles {
        let mounts = Path::new(CGROUP_MOUNTS);
        let relative = Path::new(cgroup_root.trim_start_matches('/')).join("kubepods");
        let v1 = mounts.join("memory");
        if !mounts.join("cgroup.controllers").exists() && v1.join("memory.stat").exists() {
            return MemoryFiles {
                dir: v1.join(relative),
                usage: "memory.usage_in_bytes",
                inactive_key: "total_inactive_file",
            };
        }
        let unified = if mounts.join("cgroup.controllers").exists() {
            mounts.to_owned()
        } else {
            mounts.join("unified")
        };
        MemoryFiles {
            dir: unified.join(relative),
            usage: "memory.current",
            inactive_key: "inactive_file",
        }
    }

    fn open(&self) -> Result<Reader> {
        let open = |name: &str| {
            let path = self.dir.join(name);
            File::open(&path).with_context(|| format!("opening {}", path.display()))
        };
        Ok(Reader {
            usage: open(self.usage)?,
            stat: open("memory.stat")?,
            inactive_key: self.inactive_key,
            buf: vec![0; 8192],
        })
    }

    /// The working set now, in bytes.
    pub fn working_set(&self) -> Result<u64> {
        self.open()?.working_set(None)
    }
}

/// The two files, kept open and re-read from offset 0 (a cgroup file is generated afresh by
/// each read from its start).
struct Reader {
    usage: File,
    stat: File,
    inactive_key: &'static str,
    buf: Vec<u8>,
}

impl Reader {
    fn read(file: &File, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        loop {
            let n = file.read_at(buf, 0)?;
            if n < buf.len() {
                return Ok(n);
            }
            // memory.stat grew past the buffer: read it whole.
            buf.resize(buf.len() * 2, 0);
        }
    }

    /// Usage minus inactive file. When `bar` is given and usage alone is below it, the working
    /// set (never more than usage) is below it too, and `memory.stat` (the costlier read) is
    /// skipped: the usage is returned.
    fn working_set(&mut self, bar: Option<u64>) -> Result<u64> {
        let n = Self::read(&self.usage, &mut self.buf).context("reading the memory usage")?;
        let usage: u64 = std::str::from_utf8(&self.buf[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .context("the memory usage is not a number")?;
        if bar.is_some_and(|bar| usage <= bar) {
            return Ok(usage);
        }
        let n = Self::read(&self.stat, &mut self.buf).context("reading memory.stat")?;
        let text = String::from_utf8_lossy(&self.buf[..n]);
        let inactive = stat_value(&text, self.inactive_key).unwrap_or(0);
        Ok(usage.saturating_sub(inactive))
    }
}

/// The stall totals (`some`, µs) of the four PSI files the eviction manager sets triggers on: the
/// pods' cgroup's `memory.pressure` and `io.pressure` (in the cgroup v2 hierarchy, which PSI
/// accounts in also on a hybrid layout) and the node's; `None` where one cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PsiTotals {
    pub pods_memory: Option<u64>,
    pub pods_io: Option<u64>,
    pub node_memory: Option<u64>,
    pub node_io: Option<u64>,
}

/// Stall in ms over an interval, per PSI file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StallMs {
    /// The interval's length.
    pub over_ms: f64,
    pub pods_memory: Option<f64>,
    pub pods_io: Option<f64>,
    pub node_memory: Option<f64>,
    pub node_io: Option<f64>,
}

impl PsiTotals {
    pub fn read(cgroup_root: &str) -> PsiTotals {
        let mounts = Path::new(CGROUP_MOUNTS);
        let unified = if mounts.join("cgroup.controllers").exists() {
            mounts.to_owned()
        } else {
            mounts.join("unified")
        };
        let pods = unified
            .join(cgroup_root.trim_start_matches('/'))
            .join("kubepods");
        let total = |path: PathBuf| some_total_us(&std::fs::read_to_string(path).ok()?);
        PsiTotals {
            pods_memory: total(pods.join("memory.pressure")),
            pods_io: total(pods.join("io.pressure")),
            node_memory: total(PathBuf::from("/proc/pressure/memory")),
            node_io: total(PathBuf::from("/proc/pressure/io")),
        }
    }

    /// The stall from `earlier` to this, over `over`.
    pub fn since(&self, earlier: &PsiTotals, over: Duration) -> StallMs {
        let ms = |now: Option<u64>, then: Option<u64>| {
            now.zip(then)
                .map(|(now, then)| now.saturating_sub(then) as f64 / 1e3)
        };
        StallMs {
            over_ms: over.as_secs_f64() * 1e3,
            pods_memory: ms(self.pods_memory, earlier.pods_memory),
            pods_io: ms(self.pods_io, earlier.pods_io),
            node_memory: ms(self.node_memory, earlier.node_memory),
            node_io: ms(self.node_io, earlier.node_io),
        }
    }
}

/// `total=` of the `some` line of a PSI file.
fn some_total_us(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total=")?.parse().ok())
}

/// The value of `key` in a `memory.stat` text.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The first sample past the bar.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Crossing {
    /// CLOCK_MONOTONIC ns when the sample's read returned.
    pub at_ns: u64,
    /// Since the previous sample: how early the crossing may have been.
    pub interval_ns: u64,
    pub working_set_bytes: u64,
    /// Samples taken until then.
    pub samples: u64,
}

/// A time after the crossing when the working set was back at or below the bar: from the first
/// sample below to the first one past it again (or to the last sample, if it never was).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Dip {
    pub from_ns: u64,
    pub to_ns: u64,
}

/// Dips kept at most (a working set hovering at the bar would make one every other sample).
const MAX_DIPS: usize = 10_000;

/// A sampling thread, stopped by [`Sampler::finish`] or when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    /// The highest working set sampled before the crossing, for telling a slow hog from a stuck one.
    highest: Arc<AtomicU64>,
    thread: Option<JoinHandle<Vec<Dip>>>,
    crossing: oneshot::Receiver<Result<Crossing>>,
}

impl Sampler {
    /// Starts sampling: the first sample whose working set exceeds `bar` bytes is sent as the
    /// crossing; after it, the sampling goes on to record the dips back below the bar, until
    /// stopped.
    pub fn start(files: &MemoryFiles, bar: u64) -> Result<Sampler> {
        let mut reader = files.open()?;
        let stop = Arc::new(AtomicBool::new(false));
        let highest = Arc::new(AtomicU64::new(0));
        let (tx, crossing) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("ws-sampler".into())
            .spawn({
                let stop = stop.clone();
                let highest = highest.clone();
                move || sample(&mut reader, bar, &stop, &highest, tx)
            })
            .context("starting the sampling thread")?;
        Ok(Sampler {
            stop,
            highest,
            thread: Some(thread),
            crossing,
        })
    }

    /// The crossing, once there is one (pending forever if the sampling ended without one).
    pub async fn crossing(&mut self) -> Result<Crossing> {
        match (&mut self.crossing).await {
            Ok(found) => found,
            Err(_) => std::future::pending().await,
        }
    }

    /// The highest working set sampled so far before the crossing, in bytes.
    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Relaxed)
    }

    /// Stops the sampling; the dips after the crossing.
    pub fn finish(mut self) -> Vec<Dip> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Vec<Dip> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The loop of the sampling thread: absolute deadlines one interval apart, so that the time a
/// read takes does not stretch the interval.
fn sample(
    reader: &mut Reader,
    bar: u64,
    stop: &AtomicBool,
    highest: &AtomicU64,
    crossing: oneshot::Sender<Result<Crossing>>,
) -> Vec<Dip> {
    let mut crossing = Some(crossing);
    let mut dips = Vec::new();
    let mut dip: Option<u64> = None;
    let mut next = Instant::now();
    let mut previous_ns = None;
    let mut samples = 0;
    while !stop.load(Ordering::Relaxed) {
        let ws = match reader.working_set(Some(bar)) {
            Ok(ws) => ws,
            Err(e) => {
                if let Some(tx) = crossing.take() {
                    let _ = tx.send(Err(e));
                }
                break;
            }
        };
        let at_ns = swiftlet::kernel::monotonic_ns();
        samples += 1;
        match (&crossing, ws > bar) {
            (Some(_), true) => {
                if let Some(tx) = crossing.take() {
                    let _ = tx.send(Ok(Crossing {
                        at_ns,
                        interval_ns: previous_ns.map_or(0, |p| at_ns.saturating_sub(p)),
                        working_set_bytes: ws,
                        samples,
                    }));
                }
            }
            (Some(_), false) => {
                highest.fetch_max(ws, Ordering::Relaxed);
            }
            (None, false) => {
                dip.get_or_insert(at_ns);
            }
            (None, true) => {
                if let Some(from_ns) = dip.take()
                    && dips.len() < MAX_DIPS
                {
                    dips.push(Dip {
                        from_ns,
                        to_ns: at_ns,
                    });
                }
            }
        }
        previous_ns = Some(at_ns);
        next += INTERVAL;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Late (the machine is busy): the next sample at once, the schedule from now.
            next = now;
        }
    }
    if let (Some(from_ns), Some(to_ns)) = (dip, previous_ns)
        && dips.len() < MAX_DIPS
    {
        dips.push(Dip { from_ns, to_ns });
    }
    dips
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt as _;

    use super::*;

    #[test]
    fn psi_totals_of_the_some_line() {
        let text = "some avg10=1.00 avg60=0.15 avg300=0.24 total=5260619\n\
                    full avg10=0.00 avg60=0.02 avg300=0.08 total=3174330\n";
        assert_eq!(some_total_us(text), Some(5_260_619));
        assert_eq!(some_total_us("full total=1\n"), None);
        let then = PsiTotals {
            pods_memory: Some(1_000),
            pods_io: Some(0),
            node_memory: None,
            node_io: Some(5),
        };
        let now = PsiTotals {
            pods_memory: Some(151_000),
            pods_io: Some(2_500),
            node_memory: Some(9),
            node_io: Some(5),
        };
        let stall = now.since(&then, Duration::from_secs(2));
        assert_eq!(stall.pods_memory, Some(150.0));
        assert_eq!(stall.pods_io, Some(2.5));
        assert_eq!(stall.node_memory, None);
        assert_eq!(stall.node_io, Some(0.0));
        assert!((stall.over_ms - 2000.0).abs() < 1e-9);
    }

    #[test]
    fn stat_values_by_exact_key() {
        let v1 = "cache 10\ninactive_file 5\ntotal_inactive_file 4096\ntotal_active_file 1\n";
        assert_eq!(stat_value(v1, "total_inactive_file"), Some(4096));
        assert_eq!(stat_value(v1, "inactive_file"), Some(5));
        assert_eq!(stat_value(v1, "active_file"), None);
    }

    #[test]
    fn a_crossing_is_the_first_sample_past_the_bar() {
        let dir = std::env::temp_dir().join(format!("ws-sampler-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), "3000\n").unwrap();
        std::fs::write(dir.join("memory.stat"), "anon 1\ninactive_file 1000\n").unwrap();
        let files = MemoryFiles {
            dir: dir.clone(),
            usage: "memory.current",
            inactive_key: "inactive_file",
        };
        assert_eq!(files.working_set().unwrap(), 2000);
        // Usage at or below the bar: memory.stat is not read.
        assert_eq!(files.open().unwrap().working_set(Some(3000)).unwrap(), 3000);

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut sampler = Sampler::start(&files, 2500).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // In place, the same length: the sampler never reads a half-written file.
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("memory.current"))
            .unwrap()
            .write_all_at(b"4000\n", 0)
            .unwrap();
        let crossing = rt.block_on(sampler.crossing()).unwrap();
        assert_eq!(crossing.working_set_bytes, 3000);
        assert!(crossing.samples > 1);
        assert!(crossing.interval_ns > 0);
        // Back at the bar, then past it again: one dip.
        let write = |text: &[u8]| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("memory.current"))
                .unwrap()
                .write_all_at(text, 0)
                .unwrap();
        };
        write(b"3500\n");
        std::thread::sleep(Duration::from_millis(20));
        write(b"4000\n");
        std::thread::sleep(Duration::from_millis(20));
        let dips = sampler.finish();
        assert_eq!(dips.len(), 1, "{dips:?}");
        assert!(dips[0].from_ns > crossing.at_ns && dips[0].to_ns > dips[0].from_ns);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
