//! Load-time configuration of the programs: offsets the agent resolves from the running kernel
//! (tracepoint formats from tracefs, struct layouts from `/sys/kernel/btf/vmlinux`) and writes into
//! the read-only global `CONFIG` before loading. This is what lets one object run on kernels whose
//! tracepoints and structs differ.

/// Marks a tracepoint field the running kernel does not have.
pub const FIELD_ABSENT: u32 = u32::MAX;

/// Default of [`ProgramConfig::pressure_min_interval_ns`]: 20 ms, so a reclaim storm makes at
/// most 50 records a second per CPU and source, while the first sign of pressure still arrives at
/// once.
pub const DEFAULT_PRESSURE_MIN_INTERVAL_NS: u64 = 20_000_000;

/// `signal_struct.flags` bit set once a group exit has begun (`include/linux/sched/signal.h`).
pub const SIGNAL_GROUP_EXIT: u32 = 0x0000_0004;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramConfig {
    // struct offsets (bytes), from BTF
    pub task_signal: u32,
    pub task_exit_code: u32,
    pub signal_flags: u32,
    pub signal_group_exit_code: u32,
    pub signal_live: u32,
    // sched_process_exit
    /// Offset of `group_dead`, or [`FIELD_ABSENT`] (kernels before 6.16): then the program reads
    /// `signal->live` and deduplicates by thread group.
    pub exit_group_dead: u32,
    // sched_process_exec
    pub exec_filename: u32,
    pub exec_pid: u32,
    pub exec_old_pid: u32,
    // oom:mark_victim
    pub oom_pid: u32,
    pub oom_comm: u32,
    pub oom_total_vm: u32,
    pub oom_anon_rss: u32,
    pub oom_file_rss: u32,
    pub oom_shmem_rss: u32,
    pub oom_uid: u32,
    pub oom_pgtables: u32,
    pub oom_score_adj: u32,
    // cgroup:cgroup_mkdir / cgroup_rmdir (same layout)
    pub cgroup_root: u32,
    pub cgroup_level: u32,
    pub cgroup_id: u32,
    /// 8 on kernels since 5.5 (a u64 kernfs id), 4 before.
    pub cgroup_id_size: u32,
    pub cgroup_path: u32,
    /// The cgroup2 hierarchy's id as the cgroup tracepoints report it in `root` (0).
    pub cgroup2_hierarchy_id: u32,
    // vmscan:mm_vmscan_{memcg,direct}_reclaim_begin, vmscan:mm_vmscan_kswapd_wake: `order`, or
    // FIELD_ABSENT (also when the tracepoint itself is missing; its program is then not attached)
    pub pressure_memcg_order: u32,
    pub pressure_direct_order: u32,
    pub pressure_kswapd_order: u32,
    // tp_btf/sched_switch (the scheduler audit): `task_struct` offsets, from BTF
    pub task_pid: u32,
    /// `task_struct.sched_info.run_delay`: the task's total time waiting on a run queue.
    pub task_run_delay: u32,
    pub _pad: u32,
    /// At most one pressure record per source per CPU in this many ns (0: no limit).
    pub pressure_min_interval_ns: u64,
    // fentry memory cgroup level programs: struct offsets from BTF, FIELD_ABSENT when the
    // kernel's BTF lacks one (the programs are then not attached)
    /// `page_counter.usage` (an `atomic_long_t`, pages).
    pub memcg_pc_usage: u32,
    /// `page_counter.parent`.
    pub memcg_pc_parent: u32,
    /// `mem_cgroup.css`.
    pub memcg_css: u32,
    /// `mem_cgroup.memory` (the `page_counter` of memory.current).
    pub memcg_memory: u32,
    /// `cgroup_subsys_state.cgroup`.
    pub memcg_css_cgroup: u32,
    /// `cgroup.kn`.
    pub memcg_cgroup_kn: u32,
    /// `kernfs_node.id` (a u64: the cgroup2 id).
    pub memcg_kn_id: u32,
    pub _pad_memcg: u32,
}

impl ProgramConfig {
    /// Values that make every optional feature off; the agent always overwrites them.
    pub const UNSET: ProgramConfig = ProgramConfig {
        task_signal: FIELD_ABSENT,
        task_exit_code: FIELD_ABSENT,
        signal_flags: FIELD_ABSENT,
        signal_group_exit_code: FIELD_ABSENT,
        signal_live: FIELD_ABSENT,
        exit_group_dead: FIELD_ABSENT,
        exec_filename: FIELD_ABSENT,
        exec_pid: FIELD_ABSENT,
        exec_old_pid: FIELD_ABSENT,
        oom_pid: FIELD_ABSENT,
        oom_comm: FIELD_ABSENT,
        oom_total_vm: FIELD_ABSENT,
        oom_anon_rss: FIELD_ABSENT,
        oom_file_rss: FIELD_ABSENT,
        oom_shmem_rss: FIELD_ABSENT,
        oom_uid: FIELD_ABSENT,
        oom_pgtables: FIELD_ABSENT,
        oom_score_adj: FIELD_ABSENT,
        cgroup_root: FIELD_ABSENT,
        cgroup_level: FIELD_ABSENT,
        cgroup_id: FIELD_ABSENT,
        cgroup_id_size: 0,
        cgroup_path: FIELD_ABSENT,
        cgroup2_hierarchy_id: 0,
        pressure_memcg_order: FIELD_ABSENT,
        pressure_direct_order: FIELD_ABSENT,
        pressure_kswapd_order: FIELD_ABSENT,
        task_pid: FIELD_ABSENT,
        task_run_delay: FIELD_ABSENT,
        _pad: 0,
        pressure_min_interval_ns: DEFAULT_PRESSURE_MIN_INTERVAL_NS,
        memcg_pc_usage: FIELD_ABSENT,
        memcg_pc_parent: FIELD_ABSENT,
        memcg_css: FIELD_ABSENT,
        memcg_memory: FIELD_ABSENT,
        memcg_css_cgroup: FIELD_ABSENT,
        memcg_cgroup_kn: FIELD_ABSENT,
        memcg_kn_id: FIELD_ABSENT,
        _pad_memcg: 0,
    };
}

const _: () = assert!(size_of::<ProgramConfig>() == 30 * 4 + 8 + 8 * 4);
