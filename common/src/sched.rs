//! The scheduler audit's maps: which container owns each exclusive CPU, how long other cgroups
//! ran on it, and each cgroup's run-queue latency histogram. The programs aggregate in these
//! per-CPU maps on every context switch; nothing goes through the ring buffer, and userspace
//! reads the maps when asked (the CPU manager's audit, a metrics scrape).

/// Entries of the CPU owner array: CPU numbers at or above it cannot be marked exclusive.
pub const MAX_CPUS: u32 = 1024;

/// Entries of the foreign-time map: distinct (owner, intruder) pairs. When full, new pairs are
/// dropped and counted in [`SchedCounters::foreign_full`]; the agent removes the pairs of
/// containers that are gone.
pub const FOREIGN_ENTRIES: u32 = 4096;

/// Entries of the run-queue histogram map (LRU, by cgroup id). Each entry is a
/// [`RunqHist`] per possible CPU: 1024 entries take 216 KiB per CPU.
pub const RUNQ_ENTRIES: u32 = 1024;

/// Buckets of a run-queue latency histogram. Bucket `k` counts latencies whose whole number of
/// microseconds `us` has `floor(log2(max(us, 1))) == k`: bucket 0 holds `[0, 2)` µs, bucket
/// `k ≥ 1` holds `[2^k, 2^(k+1))` µs, and the last one, `k = RUNQ_BUCKETS - 1`, everything from
/// `2^(RUNQ_BUCKETS-1)` µs (about 33.5 s) up. As a Prometheus histogram: bucket `k < RUNQ_BUCKETS
/// - 1` has the upper bound `le = 2^(k+1)` µs ([`runq_upper_bound_us`]), the last one `+Inf`.
pub const RUNQ_BUCKETS: usize = 26;

/// Key of the foreign-time map: a cgroup that ran on a CPU owned by another.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ForeignKey {
    /// The cgroup2 id of the container owning the CPU exclusively.
    pub owner: u64,
    /// The cgroup2 id of the task that ran there.
    pub intruder: u64,
}

/// One cgroup's run-queue latency histogram on one CPU: the time from a task becoming runnable
/// (woken, or preempted while runnable) to it running, for every task of the cgroup — the
/// kernel's own account of it (`sched_info.run_delay`, what `/proc/<pid>/schedstat` reports).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqHist {
    /// See [`RUNQ_BUCKETS`] for the bounds.
    pub buckets: [u64; RUNQ_BUCKETS],
    /// Sum of the latencies, in ns.
    pub sum_ns: u64,
}

impl RunqHist {
    pub const ZERO: RunqHist = RunqHist {
        buckets: [0; RUNQ_BUCKETS],
        sum_ns: 0,
    };
}

/// Per-CPU state of the `sched_switch` program (one entry per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedCpuState {
    /// When the last context switch on this CPU happened (0: none seen yet).
    pub last_switch_ns: u64,
    /// The `sched_info.run_delay` of the task switched in last, as it was then: the kernel adds
    /// the wait that just ended right after the tracepoint, so at the task's own switch-out the
    /// difference is that wait, charged to its cgroup (then the current one, which a helper
    /// can read).
    pub stash_run_delay: u64,
    pub stash_pid: u32,
    /// Non-zero when the stash holds a task.
    pub stash_valid: u32,
}

/// Per-CPU counters of the sched programs: work they could not do. All zero in a healthy run.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedCounters {
    /// Task fields or per-CPU state that could not be read.
    pub errors: u64,
    /// Foreign time not recorded: the foreign map was full.
    pub foreign_full: u64,
    /// Run-queue latencies not recorded: inserting the cgroup's histogram failed.
    pub runq_full: u64,
}

/// The histogram bucket of a run-queue latency (see [`RUNQ_BUCKETS`]). Written without loops or
/// `leading_zeros`, which the BPF target has no instruction for.
#[inline(always)]
pub const fn runq_bucket(latency_ns: u64) -> usize {
    let mut v = latency_ns / 1000;
    if v == 0 {
        v = 1;
    }
    let mut log = 0u64;
    let mut shift = ((v > 0xffff_ffff) as u64) << 5;
    v >>= shift;
    log |= shift;
    shift = ((v > 0xffff) as u64) << 4;
    v >>= shift;
    log |= shift;
    shift = ((v > 0xff) as u64) << 3;
    v >>= shift;
    log |= shift;
    shift = ((v > 0xf) as u64) << 2;
    v >>= shift;
    log |= shift;
    shift = ((v > 0x3) as u64) << 1;
    v >>= shift;
    log |= shift;
    log |= v >> 1;
    let log = log as usize;
    if log >= RUNQ_BUCKETS {
        RUNQ_BUCKETS - 1
    } else {
        log
    }
}

/// The exclusive upper bound, in µs, of histogram bucket `k` (`k < RUNQ_BUCKETS - 1`; the last
/// bucket has none).
pub const fn runq_upper_bound_us(k: usize) -> u64 {
    1 << (k + 1)
}

const _: () = assert!(size_of::<ForeignKey>() == 16);
const _: () = assert!(size_of::<RunqHist>() == (RUNQ_BUCKETS + 1) * 8);
const _: () = assert!(size_of::<SchedCpuState>() == 24);
const _: () = assert!(size_of::<SchedCounters>() == 24);
const _: () = assert!(runq_bucket(0) == 0 && runq_bucket(1_999) == 0 && runq_bucket(2_000) == 1);
const _: () = assert!(runq_bucket(u64::MAX) == RUNQ_BUCKETS - 1);
