//! Ring-buffer records. Each starts with an [`EventHeader`]; userspace reads the header, checks
//! `size`, then reads the whole record of that kind.

/// Length of a task's `comm` in the kernel (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Bytes kept of a path (exec filename, cgroup path); longer ones are cut and flagged.
pub const PATH_LEN: usize = 256;

/// Event kinds. The numbers are part of the kernel/user contract: never reuse or renumber one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Exit = 1,
    Exec = 2,
    Oom = 3,
    CgroupMkdir = 4,
    CgroupRmdir = 5,
    Pressure = 6,
    MemcgLevel = 7,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::Exit,
        EventKind::Exec,
        EventKind::Oom,
        EventKind::CgroupMkdir,
        EventKind::CgroupRmdir,
        EventKind::Pressure,
        EventKind::MemcgLevel,
    ];

    /// The kind for a raw header value, or `None` for a kind this build does not know.
    pub const fn from_raw(raw: u32) -> Option<EventKind> {
        match raw {
            1 => Some(EventKind::Exit),
            2 => Some(EventKind::Exec),
            3 => Some(EventKind::Oom),
            4 => Some(EventKind::CgroupMkdir),
            5 => Some(EventKind::CgroupRmdir),
            6 => Some(EventKind::Pressure),
            7 => Some(EventKind::MemcgLevel),
            _ => None,
        }
    }

    /// The name used in JSON output, metrics labels and the gRPC API.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Exit => "exit",
            EventKind::Exec => "exec",
            EventKind::Oom => "oom",
            EventKind::CgroupMkdir => "cgroup_mkdir",
            EventKind::CgroupRmdir => "cgroup_rmdir",
            EventKind::Pressure => "pressure",
            EventKind::MemcgLevel => "memcg_level",
        }
    }

    /// Size of this kind's record, which the header's `size` must equal.
    pub const fn record_size(self) -> usize {
        match self {
            EventKind::Exit => size_of::<ExitEvent>(),
            EventKind::Exec => size_of::<ExecEvent>(),
            EventKind::Oom => size_of::<OomEvent>(),
            EventKind::CgroupMkdir | EventKind::CgroupRmdir => size_of::<CgroupEvent>(),
            EventKind::Pressure => size_of::<PressureEvent>(),
            EventKind::MemcgLevel => size_of::<MemcgLevelEvent>(),
        }
    }
}

/// The first 24 bytes of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// An [`EventKind`] as `u32`.
    pub kind: u32,
    /// Size in bytes of the whole record, header included.
    pub size: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, comparable with userspace `clock_gettime`.
    pub ts_ns: u64,
    /// Events this CPU failed to reserve since its previous successful record: a non-zero value
    /// tells the consumer at once that it missed something.
    pub lost_before: u32,
    /// The CPU the program ran on.
    pub cpu: u32,
}

/// A whole process (thread group) is gone.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// cgroup2 id of the exiting task (the inode number of its cgroup directory).
    pub cgroup_id: u64,
    /// Thread id of the last thread to exit (the one that made the group dead).
    pub pid: u32,
    /// The process id.
    pub tgid: u32,
    /// The wait status as the parent will see it: `(code << 8)` for an exit, the signal number
    /// (with 0x80 when a core was dumped) for a fatal signal.
    pub exit_code: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

/// A task replaced its program image.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub header: EventHeader,
    pub cgroup_id: u64,
    pub pid: u32,
    pub tgid: u32,
    /// The pid before exec (differs from `pid` when a non-leader thread execs).
    pub old_pid: u32,
    /// Bytes of `filename` used, NUL excluded.
    pub filename_len: u32,
    pub comm: [u8; COMM_LEN],
    pub filename: [u8; PATH_LEN],
}

/// Which optional fields of an [`OomEvent`] the running kernel supplied (the `mark_victim`
/// tracepoint gained them in 6.8; older kernels only give the pid).
#[derive(Clone, Copy, Debug)]
pub struct OomFields;

impl OomFields {
    pub const COMM: u32 = 1 << 0;
    pub const MEMORY: u32 = 1 << 1;
    pub const UID: u32 = 1 << 2;
    pub const OOM_SCORE_ADJ: u32 = 1 << 3;
}

/// The OOM killer chose this process. Recorded at `oom:mark_victim` (the header's timestamp) and
/// emitted when the victim's task exits, in the victim's own context, which is how its cgroup is
/// known without a race; the emission always precedes the victim's [`ExitEvent`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomEvent {
    pub header: EventHeader,
    pub cgroup_id: u64,
    /// The victim task's pid as the tracepoint gives it.
    pub pid: u32,
    pub tgid: u32,
    /// When the victim task exited (CLOCK_MONOTONIC), i.e. when this record was emitted.
    pub exit_ts_ns: u64,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    pub pgtables_kb: u64,
    pub uid: u32,
    pub oom_score_adj: i32,
    /// [`OomFields`] bits.
    pub fields: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

/// A cgroup was created or removed on the cgroup2 hierarchy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupEvent {
    pub header: EventHeader,
    /// The cgroup's id (the inode number of its directory).
    pub id: u64,
    /// Depth below the hierarchy's root (the root is level 0).
    pub level: u32,
    /// Bytes of `path` used, NUL excluded.
    pub path_len: u32,
    /// The path relative to the cgroup2 mount, starting with `/`.
    pub path: [u8; PATH_LEN],
}

/// Why the kernel is reclaiming memory: which `vmscan` tracepoint fired. The numbers are part of
/// the kernel/user contract (they index the programs' per-source rate limit): never renumber one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PressureSource {
    /// `vmscan:mm_vmscan_memcg_reclaim_begin`: a task reclaims because a memory cgroup it is
    /// charged to (its own or an ancestor) hit its limit.
    MemcgReclaim = 1,
    /// `vmscan:mm_vmscan_direct_reclaim_begin`: a task stalls in global direct reclaim; the node
    /// is short of memory.
    DirectReclaim = 2,
    /// `vmscan:mm_vmscan_kswapd_wake`: free memory fell below a zone's low watermark and kswapd
    /// started reclaiming in the background.
    KswapdWake = 3,
}

impl PressureSource {
    pub const ALL: [PressureSource; 3] = [
        PressureSource::MemcgReclaim,
        PressureSource::DirectReclaim,
        PressureSource::KswapdWake,
    ];

    /// The source for a raw record value, or `None` for one this build does not know.
    pub const fn from_raw(raw: u32) -> Option<PressureSource> {
        match raw {
            1 => Some(PressureSource::MemcgReclaim),
            2 => Some(PressureSource::DirectReclaim),
            3 => Some(PressureSource::KswapdWake),
            _ => None,
        }
    }

    /// The name used in JSON output and the gRPC API.
    pub const fn as_str(self) -> &'static str {
        match self {
            PressureSource::MemcgReclaim => "memcg_reclaim",
            PressureSource::DirectReclaim => "direct_reclaim",
            PressureSource::KswapdWake => "kswapd_wake",
        }
    }

    /// The program (function name in `ebpf/src/main.rs`) and the tracepoint (category, name)
    /// it attaches to.
    pub const fn program(self) -> (&'static str, &'static str, &'static str) {
        match self {
            PressureSource::MemcgReclaim => (
                "vmscan_memcg_reclaim_begin",
                "vmscan",
                "mm_vmscan_memcg_reclaim_begin",
            ),
            PressureSource::DirectReclaim => (
                "vmscan_direct_reclaim_begin",
                "vmscan",
                "mm_vmscan_direct_reclaim_begin",
            ),
            PressureSource::KswapdWake => ("vmscan_kswapd_wake", "vmscan", "mm_vmscan_kswapd_wake"),
        }
    }
}

/// Index bound of the per-source rate-limit map: one slot per [`PressureSource`] plus the unused
/// slot 0.
pub const PRESSURE_SOURCES: u32 = 4;

/// The kernel started reclaiming memory. Rate limited in the kernel, per CPU and per source, to
/// one record per `ProgramConfig::pressure_min_interval_ns`: a reclaim storm makes a few records,
/// not millions. Records skipped that way are not lost (nothing was dropped that had been
/// produced); they are counted in `suppressed` of the same CPU's next record of that source.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PressureEvent {
    pub header: EventHeader,
    /// cgroup2 id of the current task: the reclaiming task for `MemcgReclaim` and
    /// `DirectReclaim`; 0 for `KswapdWake` (kswapd belongs to no workload).
    pub cgroup_id: u64,
    /// A [`PressureSource`] as `u32`.
    pub source: u32,
    /// The allocation order from the tracepoint; -1 when the kernel's tracepoint has no `order`.
    pub order: i32,
    /// Records of this source this CPU skipped (rate limit) since its previous one.
    pub suppressed: u64,
}

/// The programs' per-CPU, per-source rate-limit state (a map value, never in the ring).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PressureLimit {
    /// When this CPU last emitted a record of this source (0: never).
    pub last_emit_ns: u64,
    /// Records skipped since then.
    pub suppressed: u64,
}

/// A charge is taking the watched memory cgroup's usage to or past the armed level (see
/// [`crate::MemcgWatch`]). One record per arming: the program disarms the trigger as it emits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcgLevelEvent {
    pub header: EventHeader,
    /// The watched cgroup's cgroup2 id (its directory's inode).
    pub cgroup_id: u64,
    /// `page_counter.usage` of the watched cgroup before the charge, in pages.
    pub usage_pages: u64,
    /// Pages being charged (a whole per-CPU stock batch, usually 64).
    pub nr_pages: u64,
    /// The armed level, in pages.
    pub level_pages: u64,
}

const _: () = assert!(size_of::<EventHeader>() == 24);
const _: () = assert!(size_of::<MemcgLevelEvent>() == 56);
const _: () = assert!(size_of::<ExitEvent>() == 64);
const _: () = assert!(size_of::<ExecEvent>() == 320);
const _: () = assert!(size_of::<OomEvent>() == 120);
const _: () = assert!(size_of::<CgroupEvent>() == 296);
const _: () = assert!(size_of::<PressureEvent>() == 48);
const _: () = assert!(size_of::<PressureLimit>() == 16);
const _: () = assert!(align_of::<ExecEvent>() <= 8 && align_of::<CgroupEvent>() <= 8);
