//! The memory cgroup level trigger on cgroup v2: the agent arms a level (in pages) on one memory
//! cgroup's `page_counter` (the pods' cgroup), and the charge programs emit one
//! [`crate::MemcgLevelEvent`] when a charge takes its usage there. The counter's kernel address
//! is learnt once, by the discovery program, from the agent's own read of the cgroup's
//! `memory.current`.

/// Parents a charge program follows from the charged counter towards the root: a container's
/// counter sits three below the pods' (QoS class, pod, container), which is at most four below
/// the root.
pub const MEMCG_MAX_HOPS: u32 = 8;

/// The trigger: the one entry of the `MEMCG_WATCH` array. Userspace writes it whole; the
/// programs write `counter` (discovery, only while it is 0) and `armed` (to 0, when they fire).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgWatch {
    /// Kernel address of the watched cgroup's `mem_cgroup.memory` (a `struct page_counter`);
    /// 0 until discovered. Compared, never dereferenced by userspace.
    pub counter: u64,
    /// Fire when `usage + nr_pages >= level_pages`.
    pub level_pages: u64,
    /// The cgroup2 id (directory inode) of the watched cgroup, for discovery and the records.
    pub cgroup_id: u64,
    /// Non-zero while armed.
    pub armed: u32,
    /// Discovery only counts reads of `memory.current` by this process (the agent).
    pub agent_tgid: u32,
}

const _: () = assert!(size_of::<MemcgWatch>() == 32);
