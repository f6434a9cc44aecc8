//! The memory cgroup level trigger (cgroup v2): wakes the agent inside the very charge that takes
//! the pods' cgroup to the level it armed, instead of it polling `memory.current`.
//!
//! - `fentry/page_counter_try_charge` and `fentry/page_counter_charge` see every rise of any
//!   memory cgroup's usage: the memory controller charges a leaf counter in per-CPU stock
//!   batches (64 pages), and these walk the parents. Each hit follows `counter->parent` (at most
//!   [`MEMCG_MAX_HOPS`]) comparing pointers with the watched counter; on a match, if armed and
//!   `usage + nr_pages >= level`, it disarms and emits one record. Pointer equality is exact:
//!   the swap, hugetlb and socket counters the same functions charge never have the pods'
//!   `memory` counter as a parent.
//! - `fentry/memory_current_read` learns that counter's address once: when the agent itself
//!   reads the watched cgroup's `memory.current` (matched by its tgid and the cgroup's id), the
//!   `css` argument is the cgroup's memory controller state, and `memory` sits at a BTF offset
//!   from it. Deriving the cgroup from a counter instead would misread a swap counter (on 6.1,
//!   `swap - memory` lands on `css.parent`).
//!
//! Every offset comes from the running kernel's BTF (`CONFIG.memcg_*`). Not here: the level
//! (the agent's eviction manager arms it after every decision). No upstream counterpart (the
//! kubelet's memcg notifier is cgroup v1 only).

use aya_ebpf::{bindings::BPF_RB_FORCE_WAKEUP, macros::map, maps::Array, programs::FEntryContext};
use swiftlet_common::{EventKind, MEMCG_MAX_HOPS, MemcgLevelEvent, MemcgWatch};

use crate::{
    config,
    emit::{self, Result, read_kernel},
};

#[map]
static MEMCG_WATCH: Array<MemcgWatch> = Array::with_max_entries(1, 0);

/// `page_counter_try_charge(counter, nr_pages, fail)` and `page_counter_charge(counter,
/// nr_pages)`: the same first two arguments.
pub fn try_charge(ctx: &FEntryContext) -> Result<()> {
    let Some(watch) = MEMCG_WATCH.get_ptr_mut(0) else {
        return Err(emit::Error::Read);
    };
    // SAFETY: the array's one value; programs on other CPUs may store to `armed` at the same
    // time, which at worst emits a second record for one arming (the agent coalesces wake-ups).
    let watch = unsafe { &mut *watch };
    if watch.armed == 0 || watch.counter == 0 {
        return Ok(());
    }
    let target = watch.counter;
    let mut counter: u64 = ctx.arg(0);
    let nr_pages: u64 = ctx.arg(1);
    for _ in 0..MEMCG_MAX_HOPS {
        if counter == 0 {
            return Ok(());
        }
        if counter == target {
            let usage: u64 = read_kernel(counter as *const u8, config!(memcg_pc_usage))?;
            if usage.saturating_add(nr_pages) < watch.level_pages || watch.armed == 0 {
                return Ok(());
            }
            watch.armed = 0;
            return emit_level(watch, usage, nr_pages);
        }
        counter = read_kernel(counter as *const u8, config!(memcg_pc_parent))?;
    }
    Ok(())
}

fn emit_level(watch: &MemcgWatch, usage_pages: u64, nr_pages: u64) -> Result<()> {
    let now = emit::now();
    let mut entry = emit::reserve::<MemcgLevelEvent>(EventKind::MemcgLevel)?;
    let record = entry.as_mut_ptr();
    // SAFETY: `record` is a reserved, exclusively owned slot; every field is written before
    // submit.
    unsafe {
        (*record).header = emit::header(EventKind::MemcgLevel, now);
        (*record).cgroup_id = watch.cgroup_id;
        (*record).usage_pages = usage_pages;
        (*record).nr_pages = nr_pages;
        (*record).level_pages = watch.level_pages;
    }
    // The one record that matters this arming: wake the reader now rather than when the ring's
    // adaptive notification decides to.
    entry.submit(u64::from(BPF_RB_FORCE_WAKEUP));
    emit::count_submitted(EventKind::MemcgLevel);
    Ok(())
}

/// `memory_current_read(css, cft)`: the agent reading the watched cgroup's `memory.current`
/// gives away its `mem_cgroup`.
pub fn try_discover(ctx: &FEntryContext) -> Result<()> {
    let Some(watch) = MEMCG_WATCH.get_ptr_mut(0) else {
        return Err(emit::Error::Read);
    };
    // SAFETY: as in `try_charge`; only this program writes `counter`, and only while it is 0.
    let watch = unsafe { &mut *watch };
    if watch.counter != 0 || watch.agent_tgid == 0 {
        return Ok(());
    }
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid != watch.agent_tgid {
        return Ok(());
    }
    let css: u64 = ctx.arg(0);
    let cgroup: u64 = read_kernel(css as *const u8, config!(memcg_css_cgroup))?;
    let kn: u64 = read_kernel(cgroup as *const u8, config!(memcg_cgroup_kn))?;
    let id: u64 = read_kernel(kn as *const u8, config!(memcg_kn_id))?;
    if id != watch.cgroup_id {
        return Ok(());
    }
    // `css` is `&memcg->css`.
    let memcg = css.wrapping_sub(u64::from(config!(memcg_css)));
    watch.counter = memcg.wrapping_add(u64::from(config!(memcg_memory)));
    Ok(())
}
