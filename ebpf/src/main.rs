//! swiftlet's kernel side: tracepoint programs that turn process exits and execs, OOM kills,
//! cgroup creation/removal and memory reclaim (rate limited) into records in one BPF ring buffer,
//! filtered to the cgroup subtrees the agent watches (node-wide reclaim is not filtered); fentry
//! programs on the memory controller's charges that fire once when the pods' cgroup reaches an
//! armed level (`memcg.rs`, optional); and,
//! loaded apart by the scheduler audit, a context-switch program that aggregates foreign time on
//! exclusive CPUs and run-queue latency in per-CPU maps (`sched.rs`). Every entry point is a
//! one-line wrapper around a `try_*` function; failures are counted per CPU (`COUNTERS`,
//! `SCHED_COUNTERS`), never panicked on.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod cgroup;
mod emit;
mod exec;
mod exit;
mod filter;
mod memcg;
mod oom;
mod pressure;
mod sched;

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, tracepoint},
    programs::{BtfTracePointContext, FEntryContext, TracePointContext},
};
use swiftlet_common::{EventKind, PressureSource, ProgramConfig};

/// Offsets for the running kernel, written by the agent at load time (see `common::config`).
#[unsafe(no_mangle)]
static CONFIG: ProgramConfig = ProgramConfig::UNSET;

/// Reads one field of [`CONFIG`]. The volatile read keeps the compiler from folding the default
/// value in: the loader rewrites the global's bytes before the verifier sees the program.
macro_rules! config {
    ($field:ident) => {
        // SAFETY: CONFIG is a plain static of integers that nothing writes at run time.
        unsafe { core::ptr::read_volatile(&raw const $crate::CONFIG.$field) }
    };
}
pub(crate) use config;

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    emit::finish(EventKind::Exit, exit::try_exit(&ctx))
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    emit::finish(EventKind::Exec, exec::try_exec(&ctx))
}

#[tracepoint]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    emit::finish(EventKind::Oom, oom::try_mark_victim(&ctx))
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    emit::finish(
        EventKind::CgroupMkdir,
        cgroup::try_cgroup(&ctx, EventKind::CgroupMkdir),
    )
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    emit::finish(
        EventKind::CgroupRmdir,
        cgroup::try_cgroup(&ctx, EventKind::CgroupRmdir),
    )
}

#[tracepoint]
pub fn vmscan_memcg_reclaim_begin(ctx: TracePointContext) -> u32 {
    emit::finish(
        EventKind::Pressure,
        pressure::try_pressure(&ctx, PressureSource::MemcgReclaim),
    )
}

#[tracepoint]
pub fn vmscan_direct_reclaim_begin(ctx: TracePointContext) -> u32 {
    emit::finish(
        EventKind::Pressure,
        pressure::try_pressure(&ctx, PressureSource::DirectReclaim),
    )
}

#[tracepoint]
pub fn vmscan_kswapd_wake(ctx: TracePointContext) -> u32 {
    emit::finish(
        EventKind::Pressure,
        pressure::try_pressure(&ctx, PressureSource::KswapdWake),
    )
}

#[fentry(function = "page_counter_try_charge")]
pub fn memcg_try_charge(ctx: FEntryContext) -> u32 {
    emit::finish(EventKind::MemcgLevel, memcg::try_charge(&ctx))
}

#[fentry(function = "page_counter_charge")]
pub fn memcg_charge(ctx: FEntryContext) -> u32 {
    emit::finish(EventKind::MemcgLevel, memcg::try_charge(&ctx))
}

#[fentry(function = "memory_current_read")]
pub fn memcg_discover(ctx: FEntryContext) -> u32 {
    emit::finish(EventKind::MemcgLevel, memcg::try_discover(&ctx))
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    sched::finish(sched::try_switch(&ctx))
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The programs are written without panicking paths; the verifier would reject any left.
    // SAFETY: unreachable by construction (no indexing without a bound, no unwrap).
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// Built for the host only so that workspace-wide `cargo build`/`clippy` work; never run.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
