//! A cgroup's figures for the Summary API, read from its files in any layout (v1 controllers,
//! hybrid, pure v2): cumulative CPU time, memory (usage, working set — the eviction manager's
//! definition, [`NodeObserver::working_set`] — RSS, page faults, limit) and PSI; and the CPU
//! sampler that turns two readings of cumulative CPU time into `usageNanoCores`, keeping the last
//! reading per cgroup as upstream's cadvisor-less CRI stats provider keeps one per container.
//!
//! Not here: which cgroups a pod or container has (`mod.rs`). Upstream: cadvisor's
//! `container/libcontainer` handlers and `pkg/kubelet/stats/cri_stats_provider.go`
//! (`getAndUpdateContainerUsageNanoCores`).

use crate::lock::MutexExt as _;
use std::{collections::HashMap, path::PathBuf, sync::Mutex, time::SystemTime};

use crate::{
    cm::{
        CgroupLayout,
        psi::{Psi, PsiResource},
    },
    eviction::observe::{NodeObserver, stat_value},
};

/// A v1 memory limit at or above this is "no limit" (the kernel writes `PAGE_COUNTER_MAX` pages).
const V1_UNLIMITED: u64 = 1 << 62;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryFigures {
    pub usage: Option<u64>,
    pub working_set: Option<u64>,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// The cgroup's limit, when it has one.
    pub limit: Option<u64>,
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
        std::fs::read_to_string(path).ok()
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
        let dir = match &self.observer.layout {
            CgroupLayout::Unified { root } => root.join(path),
            layout => layout.v1_controller("pids")?.join(path),
        };
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
