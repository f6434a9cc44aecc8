//! Per-CPU, per-kind counters the programs keep so that every event is accounted for:
//! `submitted + lost` is what the kernel produced for the watched cgroups.

/// Index bound of the counters array: one slot per [`crate::EventKind`] plus slot 0, which counts
/// work that has no kind yet (e.g. a failed read of the OOM pending map).
pub const MAX_KIND: u32 = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindCounters {
    /// Records written to the ring buffer.
    pub submitted: u64,
    /// Records that did not fit (the ring buffer was full).
    pub lost: u64,
    /// Records given up on because a kernel read failed.
    pub errors: u64,
}

const _: () = assert!(size_of::<KindCounters>() == 24);
