//! The watched-subtree filter. Tasks are matched by ancestry (`bpf_get_current_ancestor_cgroup_id`
//! at each watched subtree's level); cgroup mkdir/rmdir, which run in an unrelated task's context
//! and whose tracepoint gives only the new cgroup's path, are matched by path prefix.

use aya_ebpf::{
    helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id},
    macros::map,
    maps::Array,
};
use swiftlet_common::{FILTER_ACTIVE, MAX_WATCHED, PATH_LEN, WatchedCgroup};

/// The prefix comparison's unit is a u64; its word index is masked with `WORDS - 1`.
const WORDS: usize = PATH_LEN / 8;
const _: () = assert!(WORDS.is_power_of_two() && WORDS * 8 == PATH_LEN);

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
    // Eight bytes at a time: the verifier walks every iteration of this loop for every watched
    // entry, and byte by byte that made each cgroup program 16 × 256 steps to verify.
    let mut w = 0;
    while w < WORDS && w * 8 < prefix_len {
        // The index goes through memory and a mask: left to itself the compiler turns this loop
        // into pointer walks bounded by a down-counter, a relation the 6.1 verifier cannot follow
        // ("invalid access to map value ... off=256"); masked, every access is provably within
        // both arrays on any verifier.
        // SAFETY: a read of a local.
        let at = unsafe { core::ptr::read_volatile(&raw const w) } & (WORDS - 1);
        let left = prefix_len.saturating_sub(at * 8);
        // Only the prefix's bytes count: past the NUL the path buffer holds an older event's.
        let mask = if left >= 8 {
            u64::MAX
        } else {
            (1u64 << (left * 8)) - 1
        };
        if (word(&watched.path, at) ^ word(path, at)) & mask != 0 {
            return false;
        }
        w += 1;
    }
    // "/a/b" contains "/a/b" and "/a/b/c", not "/a/bc".
    len == prefix_len || path.get(prefix_len).copied() == Some(b'/')
}

/// The `at`-th eight bytes of a path, little-endian (as the prefix's bytes are laid out).
#[inline(always)]
fn word(bytes: &[u8; PATH_LEN], at: usize) -> u64 {
    let mut chunk = [0u8; 8];
    chunk.copy_from_slice(&bytes[at * 8..at * 8 + 8]);
    u64::from_le_bytes(chunk)
}
