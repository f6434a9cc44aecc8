//! A cgroup's figures for the Summary API and cAdvisor's series, read from its files in any
//! layout (v1 controllers, hybrid, pure v2), each file bounded ([`read_capped`]): cumulative CPU
//! time and CFS throttling, the CPU settings, memory (usage, working set — the eviction manager's
//! definition, [`NodeObserver::working_set`] — RSS, cache, page faults, limit, swap, peak, OOM
//! kills), tasks and PSI; and the CPU sampler that turns two readings of cumulative CPU time into
//! `usageNanoCores`, keeping the last reading per cgroup as upstream's cadvisor-less CRI stats
//! provider keeps one per container.
//!
//! Not here: which cgroups a pod or container has (`mod.rs`). Upstream: cadvisor's
//! `container/libcontainer` handlers and `pkg/kubelet/stats/cri_stats_provider.go`
//! (`getAndUpdateContainerUsageNanoCores`).

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

use crate::{
    cm::{
        CgroupLayout,
        psi::{Psi, PsiResource},
    },
    eviction::observe::{NodeObserver, stat_value},
};

/// A v1 memory limit at or above this is "no limit" (the kernel writes `PAGE_COUNTER_MAX` pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// The most read of one cgroup or /proc file: the largest read here (`memory.stat`) is a few KiB;
/// a bigger file is not what the kernel writes there and is left unread.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The kernel's `USER_HZ`: the unit of `cpuacct.stat`'s ticks (fixed at 100 in its user ABI).
const USER_HZ: u64 = 100;

/// A small kernel file's text, read through a descriptor that does not follow a final symlink nor
/// wait on a FIFO; `None` when it is missing, unreadable or larger than [`MAX_FILE_BYTES`].
pub fn read_capped(path: &Path) -> Option<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= MAX_FILE_BYTES).then_some(text)
}

/// A cgroup's CPU counters, in nanoseconds where they are times.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuFigures {
    pub usage_ns: Option<u64>,
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    /// CFS bandwidth periods elapsed, throttled, and the time throttled.
    pub periods: Option<u64>,
    pub throttled_periods: Option<u64>,
    pub throttled_ns: Option<u64>,
}

/// A cgroup's CPU settings in v1 units, as cAdvisor's `ContainerSpec.Cpu` gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSpec {
    /// CFS period in microseconds.
    pub period_us: Option<u64>,
    /// CFS quota in microseconds; `None` without a quota.
    pub quota_us: Option<u64>,
    /// `cpu.shares`, or on cgroup v2 the shares `cpu.weight` stands for.
    pub shares: Option<u64>,
}

/// The memory figures only cAdvisor's series need, each from a file of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryExtra {
    /// The limit as cAdvisor's spec gives it: 0 for none, `None` without a limit file.
    pub spec_limit: Option<u64>,
    pub swap: Option<u64>,
    /// The highest usage recorded (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub max_usage: Option<u64>,
    /// OOM kills in the cgroup (`oom_kill` of v2 `memory.events`, v1 `memory.oom_control`).
    pub oom_kills: Option<u64>,
}

/// cgroup v2's `cpu.weight` as the `cpu.shares` it was set from: the inverse of the kubelet's
/// `CpuSharesToCpuWeight` (`pkg/kubelet/cm/cgroup_manager_linux.go`), as cAdvisor's
/// `convertCPUWeightToCPULimit` computes it. `None` outside the kernel's 1..=10000.
pub fn weight_to_shares(weight: u64) -> Option<u64> {
    (1..=10_000)
        .contains(&weight)
        .then(|| 2 + (weight - 1) * 262_142 / 9_999)
}

fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryFigures {
    pub usage: Option<u64>,
    pub working_set: Option<u64>,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// The cgroup's limit, when it has one.
    pub limit: Option<u64>,
    /// Page cache and memory-mapped files, from `memory.stat`.
    pub cache: Option<u64>,
    pub mapped_file: Option<u64>,
}

/// Reads cgroups below the layout's roots; `path` arguments are relative to the cgroup root
/// ("" for the root itself).
pub struct CgroupReader<'a> {
    pub observer: &'a NodeObserver,
}

impl CgroupReader<'_> {
    fn unified(&self) -> bool {
        matches!(self.observer.layout, CgroupLayout::Unified { .. })
    }

    fn read(&self, path: PathBuf) -> Option<String> {
        read_capped(&path)
    }

    /// The directory of `path` in the hierarchy of v1 `controller`, or the cgroup2 one.
    fn dir(&self, controller: &str, path: &str) -> Option<PathBuf> {
        match &self.observer.layout {
            CgroupLayout::Unified { root } => Some(root.join(path)),
            layout => layout.v1_controller(controller).map(|d| d.join(path)),
        }
    }

    /// CPU time and CFS throttling; each figure `None` when its file or key is missing.
    /// Upstream: cAdvisor `container/libcontainer/handler.go` (`setCPUStats`).
    pub fn cpu(&self, path: &str) -> CpuFigures {
        let key = |stat: &str, key: &str| stat_value(stat, key).and_then(|v| u64::try_from(v).ok());
        if self.unified() {
            let Some(stat) = self
                .dir("cpu", path)
                .and_then(|d| self.read(d.join("cpu.stat")))
            else {
                return CpuFigures::default();
            };
            let ns = |k: &str| key(&stat, k).and_then(|us| us.checked_mul(1000));
            return CpuFigures {
                usage_ns: ns("usage_usec"),
                user_ns: ns("user_usec"),
                system_ns: ns("system_usec"),
                periods: key(&stat, "nr_periods"),
                throttled_periods: key(&stat, "nr_throttled"),
                throttled_ns: ns("throttled_usec"),
            };
        }
        let acct = self.dir("cpuacct", path);
        let ticks = acct
            .as_ref()
            .and_then(|d| self.read(d.join("cpuacct.stat")))
            .unwrap_or_default();
        let tick_ns = |k: &str| key(&ticks, k).and_then(|t| t.checked_mul(1_000_000_000 / USER_HZ));
        let cfs = self
            .dir("cpu", path)
            .and_then(|d| self.read(d.join("cpu.stat")))
            .unwrap_or_default();
        CpuFigures {
            usage_ns: acct
                .and_then(|d| self.read(d.join("cpuacct.usage")))
                .and_then(|s| number(&s)),
            user_ns: tick_ns("user"),
            system_ns: tick_ns("system"),
            periods: key(&cfs, "nr_periods"),
            throttled_periods: key(&cfs, "nr_throttled"),
            throttled_ns: key(&cfs, "throttled_time"),
        }
    }

    /// The CFS period and quota and the CPU shares. Upstream: cAdvisor
    /// `container/common/helpers.go` (`getSpecInternal`).
    pub fn cpu_spec(&self, path: &str) -> CpuSpec {
        let Some(dir) = self.dir("cpu", path) else {
            return CpuSpec::default();
        };
        if self.unified() {
            // "max 100000" or "50000 100000".
            let max = self.read(dir.join("cpu.max")).unwrap_or_default();
            let mut fields = max.split_whitespace();
            let quota = fields.next();
            return CpuSpec {
                period_us: fields.next().and_then(number),
                quota_us: quota.filter(|q| *q != "max").and_then(number),
                shares: self
                    .read(dir.join("cpu.weight"))
                    .and_then(|w| number(&w))
                    .and_then(weight_to_shares),
            };
        }
        let read = |file: &str| self.read(dir.join(file));
        CpuSpec {
            period_us: read("cpu.cfs_period_us").and_then(|s| number(&s)),
            // -1 is "no quota".
            quota_us: read("cpu.cfs_quota_us").and_then(|s| number(&s)),
            shares: read("cpu.shares").and_then(|s| number(&s)),
        }
    }

    /// Swap, peak usage and OOM kills. Upstream: cAdvisor `setMemoryStats` and its OOM watcher
    /// (which counts the kernel's OOM kills per container, as these counters do).
    pub fn memory_extra(&self, path: &str) -> MemoryExtra {
        let Some(dir) = self.observer.memory_dir(path) else {
            return MemoryExtra::default();
        };
        let read = |file: &str| self.read(dir.join(file));
        let oom = |text: String| stat_value(&text, "oom_kill").and_then(|v| u64::try_from(v).ok());
        if self.unified() {
            let spec_limit = read("memory.max").and_then(|s| match s.trim() {
                "max" => Some(0),
                limit => number(limit),
            });
            return MemoryExtra {
                spec_limit,
                swap: read("memory.swap.current").and_then(|s| number(&s)),
                max_usage: read("memory.peak").and_then(|s| number(&s)),
                oom_kills: read("memory.events").and_then(oom),
            };
        }
        let usage = read("memory.usage_in_bytes").and_then(|s| number(&s));
        MemoryExtra {
            spec_limit: read("memory.limit_in_bytes")
                .and_then(|s| number(&s))
                .map(|l| if l >= V1_UNLIMITED { 0 } else { l }),
            // memsw counts memory and swap together (present with swap accounting only).
            swap: read("memory.memsw.usage_in_bytes")
                .and_then(|s| number(&s))
                .zip(usage)
                .map(|(memsw, usage)| memsw.saturating_sub(usage)),
            max_usage: read("memory.max_usage_in_bytes").and_then(|s| number(&s)),
            oom_kills: read("memory.oom_control").and_then(oom),
        }
    }

    /// Cumulative CPU time in nanoseconds.
    pub fn cpu_usage_ns(&self, path: &str) -> Option<u64> {
        match &self.observer.layout {
            CgroupLayout::Unified { root } => {
                let stat = self.read(root.join(path).join("cpu.stat"))?;
                let usec = stat_value(&stat, "usage_usec")?;
                u64::try_from(usec).ok().map(|u| u * 1000)
            }
            layout => {
                let dir = layout.v1_controller("cpuacct")?.join(path);
                self.read(dir.join("cpuacct.usage"))?.trim().parse().ok()
            }
        }
    }

    pub fn memory(&self, path: &str) -> Option<MemoryFigures> {
        let dir = self.observer.memory_dir(path)?;
        let stat = self.read(dir.join("memory.stat")).unwrap_or_default();
        let value = |key: &str| stat_value(&stat, key).and_then(|v| u64::try_from(v).ok());
        let working_set = self
            .observer
            .working_set(path)
            .and_then(|v| u64::try_from(v).ok());
        if self.unified() {
            let usage = if path.is_empty() {
                // The v2 root has no memory.current: what /proc/meminfo says is in use.
                self.meminfo_used()
            } else {
                self.read(dir.join("memory.current"))?.trim().parse().ok()
            };
            let limit = self
                .read(dir.join("memory.max"))
                .and_then(|s| s.trim().parse().ok());
            Some(MemoryFigures {
                usage,
                working_set,
                rss: value("anon"),
                page_faults: value("pgfault"),
                major_page_faults: value("pgmajfault"),
                limit,
                cache: value("file"),
                mapped_file: value("file_mapped"),
            })
        } else {
            let usage = self
                .read(dir.join("memory.usage_in_bytes"))?
                .trim()
                .parse()
                .ok();
            let limit = self
                .read(dir.join("memory.limit_in_bytes"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|l| *l < V1_UNLIMITED);
            Some(MemoryFigures {
                usage,
                working_set,
                rss: value("total_rss"),
                page_faults: value("total_pgfault"),
                major_page_faults: value("total_pgmajfault"),
                limit,
                cache: value("total_cache"),
                mapped_file: value("total_mapped_file"),
            })
        }
    }

    fn meminfo_used(&self) -> Option<u64> {
        let text = self.read(self.observer.proc.join("meminfo"))?;
        let kib = |key: &str| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        Some(kib("MemTotal:")?.saturating_sub(kib("MemFree:")?))
    }

    /// The cgroup's pressure (cgroup2 only), or the node's for the root.
    pub fn psi(&self, path: &str, resource: PsiResource) -> Option<Psi> {
        if path.is_empty() {
            return Psi::read(&self.observer.proc.join("pressure").join(resource.as_str())).ok();
        }
        let dir = self.observer.layout.cgroup2_root().ok()?.join(path);
        Psi::read_cgroup(&dir, resource).ok()
    }

    /// Tasks in the cgroup (`pids.current`).
    pub fn pids(&self, path: &str) -> Option<u64> {
        let dir = self.dir("pids", path)?;
        self.read(dir.join("pids.current"))?.trim().parse().ok()
    }
}

/// The last cumulative CPU reading per cgroup, to turn the next one into a rate.
#[derive(Default)]
pub struct CpuSampler {
    last: Mutex<HashMap<String, (SystemTime, u64)>>,
}

impl CpuSampler {
    /// Records `usage_ns` read at `at` for `key`; the rate since the previous reading in
    /// nanocores, `None` for a first reading, a counter that went back (a new cgroup of the same
    /// name) or no time passed.
    pub fn nano_cores(&self, key: &str, at: SystemTime, usage_ns: u64) -> Option<u64> {
        let mut last = self.last.lock_unpoisoned();
        let previous = last.get(key).copied();
        match previous {
            // An older reading than the one kept (concurrent requests) changes nothing.
            Some((then, _)) if at < then => return None,
            _ => {
                last.insert(key.to_owned(), (at, usage_ns));
            }
        }
        let (then, before) = previous?;
        let elapsed = at.duration_since(then).ok()?.as_nanos();
        if elapsed == 0 || usage_ns < before {
            return None;
        }
        u64::try_from(u128::from(usage_ns - before) * 1_000_000_000 / elapsed).ok()
    }

    /// Forgets the cgroups not in `keep`.
    pub fn retain(&self, keep: &dyn Fn(&str) -> bool) {
        self.last.lock_unpoisoned().retain(|k, _| keep(k));
    }
}
