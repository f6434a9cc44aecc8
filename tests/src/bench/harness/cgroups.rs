//! The pod cgroup folders a round's pods leave behind. swiftlet removes a pod's cgroup in the
//! controllers it manages (cpu, memory, pids, and the unified hierarchy), but on a hybrid layout
//! runc also creates the pod's folder in every other v1 hierarchy it joins (blkio, cpuacct,
//! cpuset, devices, freezer, systemd), and those stay when the pod is gone. The benchmark removes
//! them after each round, so that rounds and runs do not pile up thousands of empty cgroups, and
//! counts them, so that the leak shows in the results until the agent stops leaking.
//!
//! Only empty folders of the round's own pods are removed (`rmdir`, which the kernel refuses for
//! a cgroup with processes or children left): nothing running is ever touched.

use std::path::{Path, PathBuf};

/// Where the cgroup hierarchies are mounted (v1 controllers and the unified one below it on a
/// hybrid layout; the cgroup2 root itself on a pure v2 layout).
const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";

/// swiftlet's default cgroup root (`cgroupRoot: /`) with the kubelet's QoS classes below it.
const QOS_PARENTS: [&str; 3] = ["kubepods", "kubepods/burstable", "kubepods/besteffort"];

/// The cgroup mount and every hierarchy below it (v1 controllers, the hybrid layout's cgroup2).
fn hierarchies() -> Vec<PathBuf> {
    let mut hierarchies = vec![PathBuf::from(CGROUP_MOUNTS)];
    if let Ok(entries) = std::fs::read_dir(CGROUP_MOUNTS) {
        hierarchies.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    hierarchies
}

/// Removes the `pod<uid>` folders of `uids` (and any empty folders inside them) from every
/// hierarchy; returns how many pod folders there were.
pub fn remove_pod_dirs(uids: &[String]) -> usize {
    let hierarchies = hierarchies();
    let mut found = 0;
    for hierarchy in &hierarchies {
        for parent in QOS_PARENTS {
            for uid in uids.iter().filter(|u| !u.is_empty()) {
                let dir = hierarchy.join(parent).join(format!("pod{uid}"));
                if dir.is_dir() {
                    found += 1;
                    if let Err(e) = remove_empty_tree(&dir) {
                        eprintln!("cannot remove {}: {e}", dir.display());
                    }
                }
            }
        }
    }
    found
}

/// `rmdir` of `dir` after its subfolders, deepest first. A cgroup's files are not files to
/// delete: an empty cgroup goes with one `rmdir`.
fn remove_empty_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

/// Removes the cgroup folder `root` (a `cgroupRoot` such as `/swiftlet-bench-eviction`) and every
/// folder below it from every hierarchy, deepest first, for a benchmark that gives its agents a
/// cgroup root of their own; call it once their pods are gone (the kernel refuses to remove a
/// cgroup that still has processes). Returns the hierarchies it was removed from.
pub fn remove_root(root: &str) -> usize {
    let relative = root.trim_start_matches('/');
    if relative.is_empty() {
        return 0;
    }
    let hierarchies = hierarchies();
    let mut removed = 0;
    for hierarchy in &hierarchies {
        let dir = hierarchy.join(relative);
        if dir.is_dir() {
            match remove_empty_tree(&dir) {
                Ok(()) => removed += 1,
                Err(e) => eprintln!("cannot remove {}: {e}", dir.display()),
            }
        }
    }
    removed
}
