//! The one definition of everything that crosses the kernel/user boundary: the ring-buffer records
//! the eBPF programs emit, the map names and value types, and the load-time configuration the agent
//! writes into the programs' read-only globals.
//!
//! Rules that keep the two sides in agreement: every record is `#[repr(C)]`, `Copy`, has explicit
//! padding and no `bool`; every record starts with an [`EventHeader`] naming its kind and size; kind
//! numbers are never reused; sizes are asserted at compile time below. The userspace side gets
//! `aya::Pod` impls through the `user` feature.
#![no_std]

mod config;
mod counters;
mod events;
mod filter;
mod memcg;
mod sched;

pub use config::{
    DEFAULT_PRESSURE_MIN_INTERVAL_NS, FIELD_ABSENT, ProgramConfig, SIGNAL_GROUP_EXIT,
};
pub use counters::{KindCounters, MAX_KIND};
pub use events::{
    COMM_LEN, CgroupEvent, EventHeader, EventKind, ExecEvent, ExitEvent, MemcgLevelEvent, OomEvent,
    OomFields, PATH_LEN, PRESSURE_SOURCES, PressureEvent, PressureLimit, PressureSource,
};
pub use filter::{FILTER_ACTIVE, MAX_WATCHED, WatchedCgroup};
pub use memcg::{MEMCG_MAX_HOPS, MemcgWatch};
pub use sched::{
    FOREIGN_ENTRIES, ForeignKey, MAX_CPUS, RUNQ_BUCKETS, RUNQ_ENTRIES, RunqHist, SchedCounters,
    SchedCpuState, runq_bucket, runq_upper_bound_us,
};

/// Names of the maps and globals in the eBPF object. The programs declare statics with exactly
/// these names; the agent looks them up by these constants.
pub mod names {
    /// The ring buffer every event goes through (one buffer keeps the kernel's order across kinds:
    /// a cgroup's mkdir precedes the exec in it, an OOM kill precedes the victim's exit).
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU [`crate::KindCounters`], indexed by [`crate::EventKind`].
    pub const COUNTERS: &str = "COUNTERS";
    /// Per-CPU count of reserve failures not yet reported in an [`crate::EventHeader`].
    pub const PENDING_LOST: &str = "PENDING_LOST";
    /// Per-CPU `u64`: every reserve failure, all kinds together, so a reader can learn of losses
    /// with one lookup.
    pub const LOST_TOTAL: &str = "LOST_TOTAL";
    /// [`crate::WatchedCgroup`] entries; the first `WATCH_COUNT[0] & !FILTER_ACTIVE` are live.
    pub const WATCHED: &str = "WATCHED";
    /// One `u32`: [`crate::FILTER_ACTIVE`] and how many entries of `WATCHED` are live; zero means
    /// the whole machine.
    pub const WATCH_COUNT: &str = "WATCH_COUNT";
    /// OOM victims (by pid) whose exit has not been seen yet.
    pub const OOM_PENDING: &str = "OOM_PENDING";
    /// Exits already reported, for kernels whose exit tracepoint lacks `group_dead`.
    pub const EXIT_SEEN: &str = "EXIT_SEEN";
    /// Per-CPU [`crate::PressureLimit`], indexed by [`crate::PressureSource`]: the rate limit of
    /// pressure records.
    pub const PRESSURE_LIMIT: &str = "PRESSURE_LIMIT";
    /// One [`crate::MemcgWatch`]: the memory cgroup level trigger.
    pub const MEMCG_WATCH: &str = "MEMCG_WATCH";
    /// The [`crate::ProgramConfig`] global.
    pub const CONFIG: &str = "CONFIG";

    /// `u64` per CPU number (up to [`crate::MAX_CPUS`]): the cgroup2 id of the container owning
    /// that CPU exclusively, 0 when none does.
    pub const SCHED_OWNER: &str = "SCHED_OWNER";
    /// Per-CPU hash [`crate::ForeignKey`] → `u64` ns: how long each cgroup ran on a CPU owned by
    /// another, on each CPU, since the programs were loaded.
    pub const SCHED_FOREIGN: &str = "SCHED_FOREIGN";
    /// LRU per-CPU hash cgroup2 id → [`crate::RunqHist`]: run-queue latency per cgroup.
    pub const SCHED_RUNQ: &str = "SCHED_RUNQ";
    /// LRU hash pid → `u64` ns: when a task was woken (or preempted) and not yet run again.
    /// Per-CPU [`crate::SchedCpuState`] (one entry).
    pub const SCHED_CPU: &str = "SCHED_CPU";
    /// Per-CPU [`crate::SchedCounters`] (one entry).
    pub const SCHED_COUNTERS: &str = "SCHED_COUNTERS";

    /// Program names (the function names in `ebpf/src/main.rs`) with their tracepoints: the
    /// mandatory ones. The memory-pressure programs are optional (a kernel may lack a `vmscan`
    /// tracepoint) and are named by [`crate::PressureSource::program`].
    pub const PROGRAMS: [(&str, &str, &str); 5] = [
        ("sched_process_exit", "sched", "sched_process_exit"),
        ("sched_process_exec", "sched", "sched_process_exec"),
        ("oom_mark_victim", "oom", "mark_victim"),
        ("cgroup_mkdir", "cgroup", "cgroup_mkdir"),
        ("cgroup_rmdir", "cgroup", "cgroup_rmdir"),
    ];

    /// The scheduler audit's program, a BTF tracepoint (`tp_btf`) on `sched_switch`, loaded
    /// only by the audit (never with [`PROGRAMS`]).
    pub const SCHED_SWITCH: &str = "sched_switch";

    /// The memory cgroup level programs (fentry), optional: `(program, kernel function)`. The
    /// first two fire on charges, the last discovers the watched counter.
    pub const MEMCG_PROGRAMS: [(&str, &str); 3] = [
        ("memcg_try_charge", "page_counter_try_charge"),
        ("memcg_charge", "page_counter_charge"),
        ("memcg_discover", "memory_current_read"),
    ];

    /// The maps only the scheduler audit uses, which the event programs' loader shrinks to one
    /// entry each (the object is one, so every load creates every map).
    pub const SCHED_MAPS: [&str; 3] = [SCHED_OWNER, SCHED_FOREIGN, SCHED_RUNQ];
}

// Every kind has its slot in the counters (and the agent's delivered counts).
const _: () = {
    let mut i = 0;
    while i < EventKind::ALL.len() {
        assert!((EventKind::ALL[i] as u32) < MAX_KIND);
        i += 1;
    }
};
// Every pressure source has its slot in the rate-limit map.
const _: () = {
    let mut i = 0;
    while i < PressureSource::ALL.len() {
        assert!((PressureSource::ALL[i] as u32) < PRESSURE_SOURCES);
        i += 1;
    }
};

/// Default size of the events ring buffer: 1 MiB holds about 16k exit records, several seconds of
/// the fastest spawn storm these machines produce.
pub const DEFAULT_RING_BYTES: u32 = 1 << 20;

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY: every type below is `#[repr(C)]`, `Copy`, made only of integers and integer arrays,
    // with all padding explicit, so any bit pattern is a valid value.
    unsafe impl aya::Pod for crate::EventHeader {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ExitEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ExecEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::OomEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::CgroupEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::PressureEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::PressureLimit {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::MemcgLevelEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::MemcgWatch {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::KindCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::WatchedCgroup {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ProgramConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ForeignKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::RunqHist {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::SchedCpuState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::SchedCounters {}
}
