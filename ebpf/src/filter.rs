//! The watched-subtree filter. Tasks are matched by ancestry (`bpf_get_current_ancestor_cgroup_id`
//! at each watched subtree's level); cgroup mkdir/rmdir, which run in an unrelated task's context
//! and whose tracepoint gives only the new cgroup's path, are matched by path prefix.

use aya_ebpf::{
    helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id},
    macros::map,
    maps::Array,
};
use swiftlet_common::{FILTER_ACTIVE, MAX_WATCHED, PATH_LEN, WatchedCgroup};

// The prefix comparison masks indices with `PATH_LEN - 1`.
const _: () = assert!(PATH_LEN.is_power_of_two());

#[map]
static WATCHED: Array<WatchedCgroup> = Array::with_max_entries(MAX_WATCHED, 0);

#[map]
static WATCH_COUNT: Array<u32> = Array::with_max_entries(1, 0);

/// `None` when there is no filter (the whole machine), else the number of live entries.
#[inline(always)]
fn watch_count() -> Option<u32> {
    let raw = WATCH_COUNT.get(0).copied().unwrap_or(0);
    if raw & FILTER_ACTIVE == 0 {
        None
    } else {
        Some(raw & !FILTER_ACTIVE)
    }
}

/// The current task's cgroup id if the task is inside a watched subtree (or nothing is watched).
#[inline(always)]
pub fn current_watched() -> Option<u64> {
    // SAFETY: a helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let Some(count) = watch_count() else {
        return Some(cgroup_id);
    };
    for i in 0..MAX_WATCHED {
        if i >= count {
            break;
        }
        let Some(watched) = WATCHED.get(i) else {
            break;
        };
        // SAFETY: a helper without preconditions; it returns 0 above the task's own level.
        let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(watched.level as i32) };
        if ancestor == watched.id {
            return Some(cgroup_id);
        }
    }
    None
}

/// Whether a cgroup path (relative to the cgroup2 root, `len` bytes) lies in a watched subtree.
#[inline(always)]
pub fn path_watched(path: &[u8; PATH_LEN], len: usize) -> bool {
    let Some(count) = watch_count() else {
        return true;
    };
    for i in 0..MAX_WATCHED {
        if i >= count {
            break;
        }
        let Some(watched) = WATCHED.get(i) else {
            break;
        };
        if prefix_matches(watched, path, len) {
            return true;
        }
    }
    false
}

#[inline(always)]
fn prefix_matches(watched: &WatchedCgroup, path: &[u8; PATH_LEN], len: usize) -> bool {
    let prefix_len = watched.path_len as usize;
    if prefix_len == 0 || prefix_len > len || prefix_len > PATH_LEN {
        return false;
    }
    if prefix_len == 1 {
        // The hierarchy root "/" contains everything.
        return true;
    }
    let mut j = 0;
    while j < prefix_len && j < PATH_LEN {
        // The index goes through memory and a mask: left to itself the compiler turns this loop
        // into two pointer walks bounded by a down-counter, a relation the 6.1 verifier cannot
        // follow ("invalid access to map value ... off=256"); masked, every access is provably
        // within both arrays on any verifier.
        // SAFETY: a read of a local.
        let at = unsafe { core::ptr::read_volatile(&raw const j) } & (PATH_LEN - 1);
        if watched.path[at] != path[at] {
            return false;
        }
        j += 1;
    }
    // "/a/b" contains "/a/b" and "/a/b/c", not "/a/bc".
    len == prefix_len || path.get(prefix_len).copied() == Some(b'/')
}
