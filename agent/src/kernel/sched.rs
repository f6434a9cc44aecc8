//! The scheduler audit: loads the context-switch programs (`ebpf/src/sched.rs`) on their own and
//! reads what they aggregate in the kernel, on demand. It says how long other cgroups ran on the
//! CPUs a container owns exclusively (what the CPU manager's static policy promises), and how long
//! each cgroup's tasks waited in run queues (a histogram per cgroup).
//!
//! Independent of [`super::KernelEvents`]: it loads the same object with only its own program, a
//! BTF tracepoint on `sched_switch` (the event programs stay unloaded, the events ring shrinks to
//! a page), so it costs nothing unless the static policy asks for it, and dropping the last clone
//! detaches it. Not here: what the numbers mean for pods (the CPU manager, the metrics).
//! Upstream counterpart: none; the kubelet's CPU manager writes cpusets and never checks them.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeMap, HashMap},
    io,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex},
};

use aya::{
    Btf, Ebpf, EbpfLoader, Endianness,
    maps::{Array, MapData, MapError, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePoint,
};
use swiftlet_common::{
    ForeignKey, MAX_CPUS, ProgramConfig, RUNQ_BUCKETS, RunqHist, SchedCounters, names,
    runq_upper_bound_us,
};

use super::{
    Error, SchedLayout,
    loader::{OBJECT, check_privileges, program_mut, raise_memlock_limit, take_map},
};

/// Maps of the event programs that this load does not use, kept to their smallest size.
const UNUSED_MAPS: [&str; 3] = [names::OOM_PENDING, names::EXIT_SEEN, names::WATCHED];

/// The loaded audit programs and their maps. Cheap to clone; the programs detach when the last
/// clone is dropped.
#[derive(Clone)]
pub struct SchedAudit {
    inner: Arc<Inner>,
}

struct Inner {
    owners: Mutex<Array<MapData, u64>>,
    foreign: Mutex<PerCpuHashMap<MapData, ForeignKey, u64>>,
    runq: Mutex<PerCpuHashMap<MapData, u64, RunqHist>>,
    counters: PerCpuArray<MapData, SchedCounters>,
    /// CPUs the kernel can have (the owner array is read up to here).
    possible_cpus: u32,
    // Last, so the map handles above go first; dropping it detaches the programs.
    _ebpf: Mutex<Ebpf>,
}

/// Time a cgroup ran on a CPU that another cgroup owns exclusively, since the audit was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForeignRun {
    pub cpu: u32,
    /// The owner's cgroup2 id.
    pub owner: u64,
    /// The cgroup2 id of the cgroup that ran there.
    pub intruder: u64,
    pub ns: u64,
}

/// A cgroup's run-queue latencies (woken or preempted → running), summed over CPUs. Bucket `k`
/// counts latencies below [`RunqHistogram::upper_bounds_seconds`]`[k]` and at or above the
/// bound before it; the last bucket has no upper bound (`+Inf`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunqHistogram {
    pub buckets: [u64; RUNQ_BUCKETS],
    pub sum_ns: u64,
}

impl Default for RunqHistogram {
    fn default() -> Self {
        RunqHistogram {
            buckets: [0; RUNQ_BUCKETS],
            sum_ns: 0,
        }
    }
}

impl RunqHistogram {
    /// Sums one cgroup's per-CPU histograms.
    pub fn sum_of<'a>(per_cpu: impl IntoIterator<Item = &'a RunqHist>) -> RunqHistogram {
        let mut total = RunqHistogram::default();
        for hist in per_cpu {
            for (sum, count) in total.buckets.iter_mut().zip(hist.buckets) {
                *sum += count;
            }
            total.sum_ns += hist.sum_ns;
        }
        total
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// The finite upper bounds of the buckets, in seconds: `RUNQ_BUCKETS - 1` of them, 2 µs to
    /// about 33.5 s, doubling. The last bucket is `+Inf`, which Prometheus adds by itself.
    pub fn upper_bounds_seconds() -> Vec<f64> {
        (0..RUNQ_BUCKETS - 1)
            .map(|k| runq_upper_bound_us(k) as f64 / 1e6)
            .collect()
    }

    /// Cumulative counts at each of [`Self::upper_bounds_seconds`] (Prometheus' `le` buckets).
    pub fn cumulative(&self) -> Vec<u64> {
        self.buckets[..RUNQ_BUCKETS - 1]
            .iter()
            .scan(0, |running, &count| {
                *running += count;
                Some(*running)
            })
            .collect()
    }
}

impl SchedAudit {
    /// Loads and attaches the `sched_switch` program. Checks privileges and reads the task
    /// offsets it needs from the kernel's BTF (`btf`).
    pub fn load(btf: &Path) -> Result<SchedAudit, Error> {
        check_privileges()?;
        // The audit loads the whole object: every map of the event programs is created too.
        super::features::require(super::features::EVENT_PROGRAMS)?;
        super::features::require(super::features::SCHED_AUDIT)?;
        let layout = SchedLayout::from_btf_file(btf)?;
        let config = sched_config(&layout);
        let possible_cpus = aya::util::nr_cpus()
            .map_err(|(path, source)| Error::PossibleCpus { path, source })?
            as u32;

        raise_memlock_limit();
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::CONFIG, &config, true)
            .map_max_entries(names::EVENTS, page_size());
        for map in UNUSED_MAPS {
            loader.map_max_entries(map, 1);
        }
        let mut ebpf = loader.load(OBJECT).map_err(Error::Load)?;
        let owners: Array<MapData, u64> = take_map(&mut ebpf, names::SCHED_OWNER)?;
        let foreign = take_map(&mut ebpf, names::SCHED_FOREIGN)?;
        let runq = take_map(&mut ebpf, names::SCHED_RUNQ)?;
        let counters = take_map(&mut ebpf, names::SCHED_COUNTERS)?;
        attach_switch(&mut ebpf, btf)?;
        tracing::info!(
            possible_cpus,
            "scheduler audit attached (tp_btf/sched_switch)"
        );
        Ok(SchedAudit {
            inner: Arc::new(Inner {
                owners: Mutex::new(owners),
                foreign: Mutex::new(foreign),
                runq: Mutex::new(runq),
                counters,
                possible_cpus,
                _ebpf: Mutex::new(ebpf),
            }),
        })
    }

    /// Marks `cpu` as owned exclusively by the cgroup `cgroup_id` (see [`cgroup_id_of`]); 0
    /// clears it. Time other cgroups run there is counted from the next context switch on.
    pub fn set_owner(&self, cpu: u32, cgroup_id: u64) -> Result<(), Error> {
        if cpu >= MAX_CPUS {
            return Err(Error::CpuOutOfRange { cpu, max: MAX_CPUS });
        }
        self.inner
            .owners
            .lock_unpoisoned()
            .set(cpu, cgroup_id, 0)
            .map_err(map_error(names::SCHED_OWNER))
    }

    /// The owned CPUs: `(cpu, owner cgroup id)`, ascending by CPU.
    pub fn owners(&self) -> Result<Vec<(u32, u64)>, Error> {
        let owners = self.inner.owners.lock_unpoisoned();
        let mut owned = Vec::new();
        for cpu in 0..self.inner.possible_cpus.min(MAX_CPUS) {
            let owner = owners.get(&cpu, 0).map_err(map_error(names::SCHED_OWNER))?;
            if owner != 0 {
                owned.push((cpu, owner));
            }
        }
        Ok(owned)
    }

    /// Time cgroups ran on CPUs owned by others, cumulative since the load: one entry per CPU
    /// and (owner, intruder) pair that has any, sorted.
    pub fn foreign(&self) -> Result<Vec<ForeignRun>, Error> {
        let foreign = self.inner.foreign.lock_unpoisoned();
        // A map keyed by the whole entry: an iteration that restarts (a key removed under it)
        // cannot list one twice.
        let mut runs = BTreeMap::new();
        for entry in foreign.iter() {
            let (key, per_cpu) = entry.map_err(map_error(names::SCHED_FOREIGN))?;
            for run in foreign_runs(key, &per_cpu) {
                runs.insert((run.cpu, run.owner, run.intruder), run);
            }
        }
        Ok(runs.into_values().collect())
    }

    /// Run-queue latency histograms by cgroup2 id, summed over CPUs. Cgroups that have not run
    /// for a long while may have been evicted (the map is LRU).
    pub fn runqueue(&self) -> Result<HashMap<u64, RunqHistogram>, Error> {
        let runq = self.inner.runq.lock_unpoisoned();
        let mut by_cgroup = HashMap::new();
        for entry in runq.iter() {
            let (cgroup, per_cpu) = entry.map_err(map_error(names::SCHED_RUNQ))?;
            by_cgroup.insert(cgroup, RunqHistogram::sum_of(per_cpu.iter()));
        }
        Ok(by_cgroup)
    }

    /// What the programs could not record, summed over CPUs (all zero when healthy).
    pub fn counters(&self) -> Result<SchedCounters, Error> {
        let per_cpu = self
            .inner
            .counters
            .get(&0, 0)
            .map_err(map_error(names::SCHED_COUNTERS))?;
        Ok(sum_counters(per_cpu.iter()))
    }

    /// Forgets a cgroup that is gone: its foreign-time pairs (as owner or intruder) and its
    /// run-queue histogram. Its CPUs' ownership is the caller's to clear.
    pub fn remove_cgroup(&self, cgroup_id: u64) -> Result<(), Error> {
        {
            let mut foreign = self.inner.foreign.lock_unpoisoned();
            let keys: Vec<ForeignKey> = foreign
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.owner == cgroup_id || k.intruder == cgroup_id)
                .collect();
            for key in keys {
                ignore_missing(foreign.remove(&key)).map_err(map_error(names::SCHED_FOREIGN))?;
            }
        }
        ignore_missing(self.inner.runq.lock_unpoisoned().remove(&cgroup_id))
            .map_err(map_error(names::SCHED_RUNQ))
    }
}

/// The program's configuration: the task offsets; the other programs' fields stay unset (they
/// are not loaded with it).
pub fn sched_config(layout: &SchedLayout) -> ProgramConfig {
    ProgramConfig {
        task_pid: layout.task_pid,
        task_run_delay: layout.task_run_delay,
        ..ProgramConfig::UNSET
    }
}

fn attach_switch(ebpf: &mut Ebpf, btf_path: &Path) -> Result<(), Error> {
    let program = names::SCHED_SWITCH;
    let btf = Btf::parse_file(btf_path, Endianness::default()).map_err(|e| Error::Btf {
        path: btf_path.to_owned(),
        reason: e.to_string(),
    })?;
    let prog: &mut BtfTracePoint = program_mut(ebpf, program)?;
    prog.load("sched_switch", &btf)
        .map_err(|source| Error::Program { program, source })?;
    prog.attach()
        .map_err(|source| Error::Program { program, source })?;
    Ok(())
}

/// The cgroup2 id of a cgroup directory: its inode number on the cgroup2 mount (what
/// `bpf_get_current_cgroup_id` returns for its tasks). A directory on another file system (a v1
/// hierarchy, whose inode numbers are not cgroup2 ids) is an `InvalidInput` error.
pub fn cgroup_id_of(dir: &Path) -> io::Result<u64> {
    let fs = nix::sys::statfs::statfs(dir).map_err(io::Error::from)?;
    if fs.filesystem_type() != nix::sys::statfs::CGROUP2_SUPER_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not on a cgroup2 mount", dir.display()),
        ));
    }
    Ok(std::fs::metadata(dir)?.ino())
}

/// One pair's per-CPU totals as runs, skipping CPUs where it never ran.
fn foreign_runs(key: ForeignKey, per_cpu: &[u64]) -> impl Iterator<Item = ForeignRun> + '_ {
    per_cpu
        .iter()
        .enumerate()
        .filter(|(_, ns)| **ns > 0)
        .map(move |(cpu, &ns)| ForeignRun {
            cpu: cpu as u32,
            owner: key.owner,
            intruder: key.intruder,
            ns,
        })
}

fn sum_counters<'a>(per_cpu: impl IntoIterator<Item = &'a SchedCounters>) -> SchedCounters {
    per_cpu
        .into_iter()
        .fold(SchedCounters::default(), |acc, c| SchedCounters {
            errors: acc.errors + c.errors,
            foreign_full: acc.foreign_full + c.foreign_full,
            runq_full: acc.runq_full + c.runq_full,
        })
}

fn page_size() -> u32 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(4096)
}

fn map_error(map: &'static str) -> impl Fn(MapError) -> Error {
    move |source| Error::Map { map, source }
}

fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use swiftlet_common::{FIELD_ABSENT, runq_bucket};

    use super::*;

    #[test]
    fn latencies_fall_in_log2_microsecond_buckets() {
        let cases: [(u64, usize); 12] = [
            (0, 0),
            (999, 0),
            (1_000, 0),
            (1_999, 0),
            (2_000, 1),
            (3_999, 1),
            (4_000, 2),
            (1_000_000, 9), // 1 ms: 2^9 = 512 ≤ 1000 < 1024
            (1_024_000, 10),
            ((1 << 24) * 1000, 24),
            ((1 << 25) * 1000, RUNQ_BUCKETS - 1),
            (u64::MAX, RUNQ_BUCKETS - 1),
        ];
        for (ns, bucket) in cases {
            assert_eq!(runq_bucket(ns), bucket, "{ns} ns");
        }
    }

    #[test]
    fn upper_bounds_match_the_kernel_buckets() {
        let bounds = RunqHistogram::upper_bounds_seconds();
        assert_eq!(bounds.len(), RUNQ_BUCKETS - 1);
        assert_eq!(bounds.first(), Some(&2e-6));
        assert_eq!(bounds.last(), Some(&33.554432));
        assert!(bounds.windows(2).all(|w| w[1] == 2.0 * w[0]));
        // Just below a bound falls in its bucket (or an earlier one); at the bound, in the next.
        for (k, bound) in bounds.iter().enumerate() {
            let ns = (bound * 1e9).round() as u64;
            assert!(runq_bucket(ns - 1) <= k, "bucket {k}");
            assert_eq!(runq_bucket(ns), k + 1, "bucket {k}");
        }
    }

    #[test]
    fn histograms_sum_over_cpus() {
        let mut a = RunqHist::ZERO;
        a.buckets[0] = 3;
        a.buckets[RUNQ_BUCKETS - 1] = 1;
        a.sum_ns = 40_000_000_000;
        let mut b = RunqHist::ZERO;
        b.buckets[0] = 2;
        b.buckets[5] = 4;
        b.sum_ns = 500;
        let total = RunqHistogram::sum_of([&a, &b, &RunqHist::ZERO]);
        assert_eq!(total.buckets[0], 5);
        assert_eq!(total.buckets[5], 4);
        assert_eq!(total.buckets[RUNQ_BUCKETS - 1], 1);
        assert_eq!(total.count(), 10);
        assert_eq!(total.sum_ns, 40_000_000_500);
        let cumulative = total.cumulative();
        assert_eq!(cumulative.len(), RUNQ_BUCKETS - 1);
        assert_eq!(cumulative[0], 5);
        assert_eq!(cumulative[4], 5);
        assert_eq!(cumulative[5], 9);
        assert_eq!(
            cumulative.last(),
            Some(&9),
            "the +Inf bucket is the count, 10"
        );
        assert_eq!(RunqHistogram::sum_of([]), RunqHistogram::default());
    }

    #[test]
    fn foreign_runs_are_per_cpu_and_skip_empty_slots() {
        let key = ForeignKey {
            owner: 7,
            intruder: 9,
        };
        let runs: Vec<_> = foreign_runs(key, &[0, 150, 0, 20]).collect();
        assert_eq!(
            runs,
            [
                ForeignRun {
                    cpu: 1,
                    owner: 7,
                    intruder: 9,
                    ns: 150
                },
                ForeignRun {
                    cpu: 3,
                    owner: 7,
                    intruder: 9,
                    ns: 20
                },
            ]
        );
        assert_eq!(foreign_runs(key, &[0, 0]).count(), 0);
    }

    #[test]
    fn counters_sum_over_cpus() {
        let one = SchedCounters {
            errors: 1,
            foreign_full: 2,
            runq_full: 3,
        };
        assert_eq!(
            sum_counters([&one, &one]),
            SchedCounters {
                errors: 2,
                foreign_full: 4,
                runq_full: 6,
            }
        );
    }

    #[test]
    fn the_task_offsets_of_this_kernel_come_from_its_btf() {
        let btf = Path::new("/sys/kernel/btf/vmlinux");
        if !btf.exists() {
            // Unit tests also run on build machines without kernel BTF; the system tests load
            // the program for real.
            return;
        }
        let layout = SchedLayout::from_btf_file(btf).expect("task_struct layout");
        assert!(layout.task_pid > 0 && layout.task_run_delay > 0);
        assert_ne!(layout.task_pid, layout.task_run_delay);
        let config = sched_config(&layout);
        assert_eq!(
            (config.task_pid, config.task_run_delay),
            (layout.task_pid, layout.task_run_delay)
        );
        assert_eq!(
            config.exec_pid, FIELD_ABSENT,
            "the event programs' fields stay unset"
        );
        let missing = SchedLayout::from_btf_file(Path::new("/nonexistent/vmlinux"));
        assert!(matches!(missing, Err(Error::NoBtf { .. })));
    }

    #[test]
    fn a_directory_off_cgroup2_has_no_cgroup_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = cgroup_id_of(dir.path()).expect_err("a tmp dir is not a cgroup");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_audit_is_shareable() {
        fn send_sync<T: Send + Sync + Clone>() {}
        send_sync::<SchedAudit>();
    }
}
