//! The scheduler audit: `sched/sched_switch`, `sched/sched_wakeup` and `sched/sched_wakeup_new`,
//! aggregated in per-CPU maps that userspace reads on demand (no record per switch).
//!
//! - Foreign time on exclusive CPUs: at every switch on CPU `c`, the time since the previous
//!   switch on `c` belongs to the task switched out, which is still the current task, so
//!   `bpf_get_current_cgroup_id` names its cgroup. If `SCHED_OWNER[c]` names another cgroup (and
//!   the task is not the idle task), the time is added to `SCHED_FOREIGN[{owner, intruder}]`. On a
//!   CPU nobody owns this costs two array lookups.
//! - Run-queue latency per cgroup, as bcc's `runqlat`: a task becomes runnable when woken or when
//!   it leaves the CPU still runnable (preempted); its wait ends when it is switched in. At that
//!   switch the current task is the one leaving, so the latency is parked in the CPU's state and
//!   charged at the task's own switch-out, where its cgroup is the current one.
//!
//! The programs are loaded only by the agent's `SchedAudit`, never with the event programs.
//! Upstream counterpart: none; the kubelet's CPU manager trusts cpusets and does not check them.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_cgroup_id, bpf_get_smp_processor_id},
    macros::map,
    maps::{Array, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
};
use swiftlet_common::{
    FOREIGN_ENTRIES, ForeignKey, MAX_CPUS, PREV_STATE_BLOCKED_MASK, RUNQ_ENTRIES, RunqHist,
    SchedCounters, SchedCpuState, WAKEUP_ENTRIES, runq_bucket,
};

use crate::{
    config,
    emit::{self, Result, read_field},
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
static SCHED_WAKEUP: LruHashMap<u32, u64> = LruHashMap::with_max_entries(WAKEUP_ENTRIES, 0);

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

pub fn try_switch(ctx: &TracePointContext) -> Result<()> {
    let now = emit::now();
    let prev_pid: i32 = read_field(ctx, config!(sched_prev_pid))?;
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
        // The task switched in last on this CPU is leaving it now: it is the current task.
        if state.stash_pid == prev_pid as u32 {
            charge_runq(state.stash_latency_ns);
        }
    }
    if prev_pid != 0 && prev_runnable(ctx)? {
        record_runnable(prev_pid as u32, now);
    }

    let next_pid: i32 = read_field(ctx, config!(sched_next_pid))?;
    if next_pid == 0 {
        return Ok(());
    }
    let next = next_pid as u32;
    if let Some(since) = SCHED_WAKEUP.get_ptr(next) {
        // SAFETY: a value of the map, copied out before the entry is removed.
        let since = unsafe { *since };
        let _ = SCHED_WAKEUP.remove(next);
        if now >= since {
            state.stash_pid = next;
            state.stash_latency_ns = now - since;
            state.stash_valid = 1;
        }
    }
    Ok(())
}

pub fn try_wakeup(ctx: &TracePointContext, pid_field: u32) -> Result<()> {
    let pid: i32 = read_field(ctx, pid_field)?;
    if pid != 0 {
        record_runnable(pid as u32, emit::now());
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

/// Whether the task leaving the CPU is still runnable (preempted or yielding), so its wait for
/// the CPU starts now.
#[inline(always)]
fn prev_runnable(ctx: &TracePointContext) -> Result<bool> {
    let offset = config!(sched_prev_state);
    let state = if config!(sched_prev_state_size) == 8 {
        read_field::<i64>(ctx, offset)? as u64
    } else {
        u64::from(read_field::<u32>(ctx, offset)?)
    };
    Ok(state & PREV_STATE_BLOCKED_MASK == 0)
}

#[inline(always)]
fn record_runnable(pid: u32, now: u64) {
    if SCHED_WAKEUP.insert(pid, now, 0).is_err() {
        bump(|c| c.wakeup_full += 1);
    }
}
