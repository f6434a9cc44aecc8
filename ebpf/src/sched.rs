//! The scheduler audit: one BTF tracepoint program on `sched_switch` (`tp_btf`: the raw
//! arguments, `prev` and `next` task pointers, without the classic tracepoint's record), which
//! aggregates in per-CPU maps that userspace reads on demand (no record per switch).
//!
//! - Foreign time on exclusive CPUs: at every switch on CPU `c`, the time since the previous
//!   switch on `c` belongs to the task switched out, which is still the current task, so
//!   `bpf_get_current_cgroup_id` names its cgroup. If `SCHED_OWNER[c]` names another cgroup (and
//!   the task is not the idle task), the time is added to `SCHED_FOREIGN[{owner, intruder}]`. On a
//!   CPU nobody owns this costs two array lookups.
//! - Run-queue latency per cgroup, from the kernel's own account (`CONFIG_SCHED_INFO`): every
//!   wait on a run queue (woken, or preempted while runnable, until switched in) is added to the
//!   task's `sched_info.run_delay` just after this tracepoint. So at the switch-in the program
//!   parks `next`'s `run_delay` in the CPU's state, and at that task's own switch-out (where it is
//!   the current task, whose cgroup a helper reads) the growth is the wait, charged to the
//!   cgroup's histogram. No wakeup programs and no per-task map: the cost of the audit is one
//!   program on the switch path.
//!
//! The programs are loaded only by the agent's `SchedAudit`, never with the event programs.
//! Upstream counterpart: none; the kubelet's CPU manager trusts cpusets and does not check them.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_cgroup_id, bpf_get_smp_processor_id},
    macros::map,
    maps::{Array, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use swiftlet_common::{
    FOREIGN_ENTRIES, ForeignKey, MAX_CPUS, RUNQ_ENTRIES, RunqHist, SchedCounters, SchedCpuState,
    runq_bucket,
};

use crate::{
    config,
    emit::{self, Result, read_kernel},
};

#[map]
static SCHED_OWNER: Array<u64> = Array::with_max_entries(MAX_CPUS, 0);

#[map]
static SCHED_FOREIGN: PerCpuHashMap<ForeignKey, u64> =
    PerCpuHashMap::with_max_entries(FOREIGN_ENTRIES, 0);

#[map]
static SCHED_RUNQ: LruPerCpuHashMap<u64, RunqHist> =
    LruPerCpuHashMap::with_max_entries(RUNQ_ENTRIES, 0);

#[map]
static SCHED_CPU: PerCpuArray<SchedCpuState> = PerCpuArray::with_max_entries(1, 0);

#[map]
static SCHED_COUNTERS: PerCpuArray<SchedCounters> = PerCpuArray::with_max_entries(1, 0);

/// The wrappers' return: a failed read is counted, never panicked on.
#[inline(always)]
pub fn finish(result: Result<()>) -> u32 {
    if result.is_err() {
        bump(|c| c.errors += 1);
    }
    0
}

#[inline(always)]
fn bump(f: impl FnOnce(&mut SchedCounters)) {
    if let Some(counters) = SCHED_COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU slot, touched only by the sched programs on this CPU, which do not
        // nest (sched_switch runs with the run queue locked, the wakeups under the task's lock).
        f(unsafe { &mut *counters });
    }
}

pub fn try_switch(ctx: &BtfTracePointContext) -> Result<()> {
    let now = emit::now();
    // `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
    // unsigned int prev_state)`: the task pointers are only read through
    // `bpf_probe_read_kernel`.
    let (prev, next): (*const u8, *const u8) = (ctx.arg(1), ctx.arg(2));
    let prev_pid: i32 = read_kernel(prev, config!(task_pid))?;
    let Some(state) = SCHED_CPU.get_ptr_mut(0) else {
        return Err(emit::Error::Read);
    };
    // SAFETY: this CPU's slot; the switch program is the only one touching it and it does not
    // nest on a CPU.
    let state = unsafe { &mut *state };

    let last = core::mem::replace(&mut state.last_switch_ns, now);
    if last != 0 && prev_pid != 0 {
        account_foreign(now.wrapping_sub(last));
    }

    if state.stash_valid != 0 {
        state.stash_valid = 0;
        // The task switched in last on this CPU is leaving it now: it is the current task, and
        // its `run_delay` has grown by the wait that ended when it came in.
        if state.stash_pid == prev_pid as u32 {
            let run_delay: u64 = read_kernel(prev, config!(task_run_delay))?;
            if run_delay >= state.stash_run_delay {
                charge_runq(run_delay - state.stash_run_delay);
            }
        }
    }

    let next_pid: i32 = read_kernel(next, config!(task_pid))?;
    if next_pid != 0 {
        state.stash_run_delay = read_kernel(next, config!(task_run_delay))?;
        state.stash_pid = next_pid as u32;
        state.stash_valid = 1;
    }
    Ok(())
}

/// Adds `ns` to the current task's cgroup's time on this CPU if another cgroup owns it.
#[inline(always)]
fn account_foreign(ns: u64) {
    // SAFETY: a helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let owner = match SCHED_OWNER.get(cpu) {
        Some(&owner) if owner != 0 => owner,
        _ => return,
    };
    // SAFETY: a helper without preconditions.
    let intruder = unsafe { bpf_get_current_cgroup_id() };
    if intruder == owner {
        return;
    }
    let key = ForeignKey { owner, intruder };
    if let Some(total) = SCHED_FOREIGN.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a per-CPU map; the switch program does not nest.
        unsafe { *total += ns };
        return;
    }
    if SCHED_FOREIGN
        .insert(key, ns, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        return;
    }
    // Another CPU may have inserted the pair in between; else the map is full.
    match SCHED_FOREIGN.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(total) => unsafe { *total += ns },
        None => bump(|c| c.foreign_full += 1),
    }
}

/// Adds a run-queue latency to the current task's cgroup's histogram on this CPU.
#[inline(always)]
fn charge_runq(latency_ns: u64) {
    // SAFETY: a helper without preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let hist = match SCHED_RUNQ.get_ptr_mut(cgroup) {
        Some(hist) => hist,
        None => {
            // An EEXIST (another CPU inserted it) is fine: the lookup below finds it.
            let _ = SCHED_RUNQ.insert(cgroup, RunqHist::ZERO, u64::from(BPF_NOEXIST));
            match SCHED_RUNQ.get_ptr_mut(cgroup) {
                Some(hist) => hist,
                None => {
                    bump(|c| c.runq_full += 1);
                    return;
                }
            }
        }
    };
    // SAFETY: this CPU's value of a per-CPU map; the switch program does not nest.
    let hist = unsafe { &mut *hist };
    if let Some(bucket) = hist.buckets.get_mut(runq_bucket(latency_ns)) {
        *bucket += 1;
    }
    hist.sum_ns += latency_ns;
}
