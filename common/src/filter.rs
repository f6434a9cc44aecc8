//! The cgroup filter: events are emitted only for tasks (or cgroups) inside one of the watched
//! subtrees. An empty filter means the whole machine.

use crate::PATH_LEN;

/// How many subtrees can be watched at once. Kept small: each costs one helper call per event.
pub const MAX_WATCHED: u32 = 16;

/// Set in `WATCH_COUNT` whenever a filter is in force; the low bits count the live entries. Zero
/// (the bit clear) means no filter: the whole machine. With the bit set and no entries, nothing
/// matches, which is what a filter briefly looks like while the agent rewrites it.
pub const FILTER_ACTIVE: u32 = 1 << 31;

/// One watched subtree of the cgroup2 hierarchy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WatchedCgroup {
    /// The subtree root's cgroup id.
    pub id: u64,
    /// The subtree root's level (the hierarchy root is 0).
    pub level: u32,
    /// Bytes of `path` used, NUL excluded; 1 for the hierarchy root (`/`).
    pub path_len: u32,
    /// Path relative to the cgroup2 mount, starting with `/`, zero-padded (cgroup mkdir/rmdir
    /// events are matched by path prefix, since the tracepoint gives no ancestors).
    pub path: [u8; PATH_LEN],
}

impl WatchedCgroup {
    pub const EMPTY: WatchedCgroup = WatchedCgroup {
        id: 0,
        level: 0,
        path_len: 0,
        path: [0; PATH_LEN],
    };
}

const _: () = assert!(size_of::<WatchedCgroup>() == 272);
