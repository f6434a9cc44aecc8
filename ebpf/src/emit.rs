//! The ring buffer, the counters, and the reserve/submit discipline shared by every program: a
//! failed reserve is counted as lost (and remembered per CPU so the next record reports it); a
//! submitted record is counted as submitted; a failed kernel read is counted as an error.

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{PerCpuArray, RingBuf, ring_buf::RingBufEntry},
    programs::TracePointContext,
};
use swiftlet_common::{DEFAULT_RING_BYTES, EventHeader, EventKind, KindCounters, MAX_KIND};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map]
static COUNTERS: PerCpuArray<KindCounters> = PerCpuArray::with_max_entries(MAX_KIND, 0);

#[map]
static PENDING_LOST: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[map]
static LOST_TOTAL: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Why a program gave up on an event.
#[derive(Clone, Copy)]
pub enum Error {
    /// A kernel read (`bpf_probe_read_*`) failed.
    Read,
    /// The ring buffer was full; already counted as lost.
    Full,
}

impl From<i32> for Error {
    fn from(_: i32) -> Self {
        Error::Read
    }
}

impl From<i64> for Error {
    fn from(_: i64) -> Self {
        Error::Read
    }
}

pub type Result<T> = core::result::Result<T, Error>;

/// The wrappers' return: tracepoint programs' return value is ignored, failures are counted.
#[inline(always)]
pub fn finish(kind: EventKind, result: Result<()>) -> u32 {
    if let Err(Error::Read) = result {
        bump(kind, |c| c.errors += 1);
    }
    0
}

#[inline(always)]
fn bump(kind: EventKind, f: impl FnOnce(&mut KindCounters)) {
    if let Some(counters) = COUNTERS.get_ptr_mut(kind as u32) {
        // SAFETY: a per-CPU slot, touched only by programs on this CPU, which do not nest.
        f(unsafe { &mut *counters });
    }
}

/// Reserves a record of type `T`; on failure counts it lost and returns [`Error::Full`].
#[inline(always)]
pub fn reserve<T: 'static>(kind: EventKind) -> Result<RingBufEntry<T>> {
    match EVENTS.reserve::<T>(0) {
        Some(entry) => Ok(entry),
        None => {
            bump(kind, |c| c.lost += 1);
            if let Some(pending) = PENDING_LOST.get_ptr_mut(0) {
                // SAFETY: per-CPU slot, as above.
                unsafe { *pending = (*pending).saturating_add(1) };
            }
            if let Some(total) = LOST_TOTAL.get_ptr_mut(0) {
                // SAFETY: per-CPU slot, as above.
                unsafe { *total += 1 };
            }
            Err(Error::Full)
        }
    }
}

/// The header for a record about to be submitted; takes this CPU's pending-loss count.
#[inline(always)]
pub fn header(kind: EventKind, ts_ns: u64) -> EventHeader {
    let lost_before = match PENDING_LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, as above.
        Some(pending) => unsafe { core::mem::replace(&mut *pending, 0) },
        None => 0,
    };
    EventHeader {
        kind: kind as u32,
        size: kind.record_size() as u32,
        ts_ns,
        lost_before,
        // SAFETY: a helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
    }
}

/// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Submits a record and counts it.
#[inline(always)]
pub fn submit<T: 'static>(kind: EventKind, entry: RingBufEntry<T>) {
    entry.submit(0);
    count_submitted(kind);
}

/// Counts a record its program submitted itself (with its own flags).
#[inline(always)]
pub fn count_submitted(kind: EventKind) {
    bump(kind, |c| c.submitted += 1);
}

/// Reads a `T` at `base + offset` in kernel memory. The offsets come from the running kernel's
/// BTF or tracepoint formats; a bad address makes the helper fail, which is returned as an error.
#[inline(always)]
pub fn read_kernel<T>(base: *const u8, offset: u32) -> Result<T> {
    // SAFETY: `bpf_probe_read_kernel` validates the address itself and never faults; the pointer
    // arithmetic only forms an address, it is not dereferenced here.
    Ok(unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }?)
}

/// A header for a record that is parked before submission (no CPU, no loss count yet); `header`
/// replaces it when the record is finally submitted.
#[inline(always)]
pub fn header_unsubmitted(kind: EventKind, ts_ns: u64) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        size: kind.record_size() as u32,
        ts_ns,
        lost_before: 0,
        cpu: 0,
    }
}

/// Reads a `T` at byte `offset` of the tracepoint record. Offsets come from this kernel's
/// tracepoint format (parsed by the agent from tracefs).
#[inline(always)]
pub fn read_field<T>(ctx: &TracePointContext, offset: u32) -> Result<T> {
    // SAFETY: `read_at` is a probe read of the record; a wrong offset fails or reads a wrong value,
    // it cannot fault.
    Ok(unsafe { ctx.read_at(offset as usize) }?)
}
