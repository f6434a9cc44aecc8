//! Memory pressure: the kernel started reclaiming. `vmscan/mm_vmscan_memcg_reclaim_begin` (a
//! task in a watched subtree reclaims because its memory cgroup hit its limit),
//! `vmscan/mm_vmscan_direct_reclaim_begin` (a task stalls in global direct reclaim) and
//! `vmscan/mm_vmscan_kswapd_wake` (free memory fell below the low watermark). The last two are
//! about the node, so they are not filtered by cgroup.
//!
//! Reclaim comes in storms (thousands of calls a second under a tight limit), so every source is
//! rate limited here, per CPU: at most one record per `pressure_min_interval_ns`, the skipped ones
//! counted into the next record's `suppressed`. Skipped is not lost: the consumer only needs to be
//! woken, and the count says how hard the kernel is pushing.
//!
//! Not here: `memcg/count_memcg_events`, which fires on every page fault (deliberately left out).
//! Upstream counterpart: the kubelet's eviction manager polls memory usage instead
//! (`pkg/kubelet/eviction`, with the optional memcg threshold notifier of cgroup v1).

use aya_ebpf::{
    helpers::bpf_get_current_cgroup_id, macros::map, maps::PerCpuArray, programs::TracePointContext,
};
use swiftlet_common::{
    EventKind, FIELD_ABSENT, PRESSURE_SOURCES, PressureEvent, PressureLimit, PressureSource,
};

use crate::{
    config,
    emit::{self, Result, read_field},
    filter,
};

/// When each source last emitted on this CPU and how many it skipped since. Per CPU, so the
/// programs never race on it (tracepoint programs do not nest on one CPU).
#[map]
static PRESSURE_LIMIT: PerCpuArray<PressureLimit> =
    PerCpuArray::with_max_entries(PRESSURE_SOURCES, 0);

pub fn try_pressure(ctx: &TracePointContext, source: PressureSource) -> Result<()> {
    let (cgroup_id, order_field) = match source {
        PressureSource::MemcgReclaim => {
            // The reclaiming task is the one charging memory: a task of the cgroup at its limit
            // (or below it, when an ancestor's limit was hit).
            let Some(cgroup_id) = filter::current_watched() else {
                return Ok(());
            };
            (cgroup_id, config!(pressure_memcg_order))
        }
        PressureSource::DirectReclaim => {
            // SAFETY: a helper without preconditions.
            let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
            (cgroup_id, config!(pressure_direct_order))
        }
        // kswapd is a kernel thread of the root cgroup: its cgroup says nothing.
        PressureSource::KswapdWake => (0, config!(pressure_kswapd_order)),
    };

    let now = emit::now();
    let Some(limit) = PRESSURE_LIMIT.get_ptr_mut(source as u32) else {
        return Err(emit::Error::Read);
    };
    // SAFETY: a per-CPU slot, touched only by the pressure programs on this CPU, which do not
    // nest.
    let limit = unsafe { &mut *limit };
    if limit.last_emit_ns != 0
        && now.wrapping_sub(limit.last_emit_ns) < config!(pressure_min_interval_ns)
    {
        limit.suppressed += 1;
        return Ok(());
    }

    let order: i32 = if order_field == FIELD_ABSENT {
        -1
    } else {
        read_field(ctx, order_field)?
    };
    // A full ring counts this record lost and leaves the limit as it was: the next call tries
    // again, and the skipped count waits for the record that gets through.
    let mut entry = emit::reserve::<PressureEvent>(EventKind::Pressure)?;
    let record = entry.as_mut_ptr();
    // SAFETY: `record` is a reserved, exclusively owned slot; every field is written before submit.
    unsafe {
        (*record).header = emit::header(EventKind::Pressure, now);
        (*record).cgroup_id = cgroup_id;
        (*record).source = source as u32;
        (*record).order = order;
        (*record).suppressed = core::mem::replace(&mut limit.suppressed, 0);
    }
    limit.last_emit_ns = now;
    emit::submit(EventKind::Pressure, entry);
    Ok(())
}
