//! The only module that talks to aya: it loads swiftlet's eBPF object (embedded in the binary),
//! resolves the running kernel's layouts for it, attaches the programs, and turns the events ring
//! buffer into one typed async stream ([`KernelEvents::next`]) with every loss accounted for:
//! process exits and execs, OOM kills, cgroup mkdir/rmdir, and memory pressure (the kernel
//! starting to reclaim, rate limited in the kernel). Apart from those, [`SchedAudit`] loads the
//! context-switch programs alone and reads their per-CPU aggregates on demand (foreign time on
//! exclusive CPUs, run-queue latency per cgroup).
//!
//! Not here: what events mean for pods (the PLEG), or who consumes them (`app`, `commands`).
//! Upstream counterpart: none in the kubelet; it replaces the runtime relist as the source of
//! container state changes (kubelet `pkg/kubelet/pleg`).

mod btf;
#[cfg(feature = "kernel-canary")]
pub mod canary;
mod counters;
mod error;
pub mod event;
pub mod features;
pub mod filter;
mod loader;
pub mod memcg;
pub mod sched;
mod stream;
pub mod tracefs;

pub use btf::{KernelBtf, MemcgLayout, SchedLayout, TaskLayout};
pub use counters::{CounterReader, KernelCounters};
pub use error::Error;
pub use event::{
    CgroupChange, EventBody, KernelEvent, MemcgLevel, MemoryPressure, OomKill, ProcessExec,
    ProcessExit,
};
pub use filter::{FilterHandle, Watch};
pub use loader::{KernelEvents, LoadInfo, LoadOptions};
pub use memcg::MemcgTrigger;
pub use sched::{ForeignRun, RunqHistogram, SchedAudit, cgroup_id_of};
pub use stream::StreamItem;
pub use swiftlet_common::PressureSource;

/// CLOCK_MONOTONIC now, in ns: the clock `bpf_ktime_get_ns` reads, so the two compare directly.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

/// The wall-clock time of a kernel timestamp (CLOCK_MONOTONIC ns), as of now: what a status
/// shows as when something happened.
pub fn wall_clock_of(ts_ns: u64) -> std::time::SystemTime {
    let ago = std::time::Duration::from_nanos(monotonic_ns().saturating_sub(ts_ns));
    std::time::SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}
