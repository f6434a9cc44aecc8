//! emptyDir volumes (upstream `pkg/volume/emptydir/empty_dir.go`): a 0777 directory under the
//! pod's volumes, or a tmpfs mounted there for `medium: Memory`. Set-up is idempotent (an agent
//! restarted finds its pods' volumes as it left them); tear-down unmounts and removes, through
//! descriptors: nothing a container left in the volume (links, mounts) is followed or crossed.
//!
//! Everyone may write a volume's root, as upstream: containers run as any user. What keeps local
//! accounts out is the 0750 root-owned directories above it ([`super::paths::DIR_MODE`]).
//!
//! Not here: `sizeLimit` of a disk emptyDir. Upstream enforces it through the eviction manager
//! (or project quotas); swiftlet measures the usage ([`disk_usage`]) and leaves eviction to it.

use std::{ffi::OsStr, os::fd::AsFd, path::Path};

use k8s_openapi::api::core::v1::Pod;

use super::{
    Result,
    mount::{self, MountInfo},
    spec::Medium,
};
use crate::{
    cm::{helpers::CfsQuota, pod_cgroups::PodLimits},
    hostfs::{self, Dir},
};

/// Upstream `defaultPerm`: every container user may write.
const DEFAULT_PERM: u32 = 0o777;

/// The size of a memory emptyDir's tmpfs (upstream `calculateEmptyDirMemorySize`): node
/// allocatable memory, lowered to the pod's memory limit when it has one, lowered to `sizeLimit`
/// when that is smaller still. Zero values are ignored.
pub fn memory_size(node_allocatable: i64, size_limit: Option<i64>, pod: &Pod) -> i64 {
    let mut size = node_allocatable;
    if let Ok(PodLimits {
        memory_bytes: Some(limit),
        ..
    }) = PodLimits::of(pod, &CfsQuota::default())
        && limit > 0
        && limit <= size
    {
        size = limit;
    }
    if let Some(limit) = size_limit
        && limit > 0
        && limit <= size
    {
        size = limit;
    }
    size
}

/// Makes volume `name` in `parent` ready and opens it: the directory, and for memory a tmpfs of
/// `size` bytes on it unless one is there already. Its permission bits become 0777; special bits
/// are kept (a tmpfs root's sticky bit, as upstream, which only compares the permission bits).
pub fn set_up(
    parent: &Dir,
    name: &str,
    medium: Medium,
    size: i64,
    mounts: &[MountInfo],
) -> Result<Dir> {
    let name = OsStr::new(name);
    // An existing volume may be a mount point already (its tmpfs): opened crossing onto it,
    // never through a link.
    let dir = match parent.create_dir(name, DEFAULT_PERM, false) {
        Ok(dir) => dir,
        Err(e) if e.errno() == Some(nix::Error::EEXIST) => parent.open_dir_crossing(name)?,
        Err(e) => return Err(e.into()),
    };
    let path = parent.child_path(name);
    let dir = if medium == Medium::Memory
        && mount::mounted_at(mounts, &path).as_deref() != Some("tmpfs")
    {
        // Mounted on the directory just opened (its `/proc/self/fd` path), not on a path.
        mount::mount_tmpfs_on(
            &hostfs::proc_fd_path(dir.as_fd()),
            &path,
            &mount::tmpfs_options(Some(size)),
        )?;
        parent.open_dir_crossing(name)?
    } else if medium == Medium::Memory {
        parent.open_dir_crossing(name)?
    } else {
        dir
    };
    // After the mount: the tmpfs root is what containers see. Set explicitly, the umask does not
    // apply (upstream `setupDir` chmods for the same reason).
    let mode = dir.stat()?.mode;
    if mode & 0o777 != DEFAULT_PERM {
        dir.set_mode((mode & 0o7000) | DEFAULT_PERM)?;
    }
    Ok(dir)
}

/// Unmounts whatever is mounted at or below volume `name` in `parent` (deepest first) and
/// removes it without following a link or crossing a mount.
pub fn tear_down(parent: &Dir, name: &str, mounts: &[MountInfo]) -> Result<()> {
    let path = parent.child_path(OsStr::new(name));
    for point in mount::mounts_below(mounts, &path) {
        mount::unmount(&point)?;
    }
    hostfs::remove_all(parent, OsStr::new(name))?;
    Ok(())
}

/// Bytes used by the files below `dir` (upstream's `du` metrics provider counts blocks; this
/// counts allocated blocks too, so sparse files count as what they take).
pub fn disk_usage(dir: &Path) -> u64 {
    // Through descriptors: a link a container swapped in is counted as a link, never walked,
    // and a mount below is not the volume's.
    let Ok(top) = Dir::open(dir) else {
        return 0;
    };
    let mut total = top.stat().map(|s| s.blocks * 512).unwrap_or(0);
    let mut stack = vec![top];
    while let Some(current) = stack.pop() {
        let Ok(names) = current.entries(usize::MAX) else {
            continue;
        };
        for name in names {
            let Ok(Some(stat)) = current.stat_at(&name) else {
                continue;
            };
            total += stat.blocks * 512;
            if stat.kind == hostfs::FileKind::Directory
                && stack.len() < hostfs::MAX_OPEN_DEPTH
                && let Ok(child) = current.open_dir(&name)
            {
                stack.push(child);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(memory_limits: &[Option<&str>]) -> Pod {
        crate::testing::pod()
            .containers(
                memory_limits
                    .iter()
                    .enumerate()
                    .map(|(i, l)| Container {
                        resources: l.map(|l| ResourceRequirements {
                            limits: Some([("memory".to_owned(), Quantity(l.to_owned()))].into()),
                            ..Default::default()
                        }),
                        ..crate::testing::container(&format!("c{i}"))
                    })
                    .collect(),
            )
            .build()
    }

    #[test]
    fn tmpfs_size_follows_upstreams_rule() {
        const GI: i64 = 1 << 30;
        const MI: i64 = 1 << 20;
        let cases = [
            // No pod limit, no sizeLimit: node allocatable.
            (pod(&[None]), None, 8 * GI),
            // A container without a limit: the pod has none.
            (pod(&[Some("1Gi"), None]), None, 8 * GI),
            // Every container limited: their sum.
            (pod(&[Some("1Gi"), Some("512Mi")]), None, GI + 512 * MI),
            // sizeLimit below the pod limit wins.
            (pod(&[Some("1Gi")]), Some(64 * MI), 64 * MI),
            // sizeLimit above the pod limit is ignored.
            (pod(&[Some("1Gi")]), Some(2 * GI), GI),
            // A pod limit above allocatable is ignored; sizeLimit 0 is ignored.
            (pod(&[Some("16Gi")]), Some(0), 8 * GI),
            // sizeLimit above allocatable is ignored.
            (pod(&[None]), Some(32 * GI), 8 * GI),
        ];
        for (p, limit, want) in cases {
            assert_eq!(memory_size(8 * GI, limit, &p), want, "{limit:?} {p:?}");
        }
    }

    #[test]
    fn a_disk_empty_dir_is_a_world_writable_dir_and_goes_away() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("tempdir");
        let parent = Dir::open(root.path()).expect("open");
        let dir = root.path().join("cache");
        set_up(&parent, "cache", Medium::Disk, 0, &[]).expect("set up");
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o777);
        std::fs::write(dir.join("f"), vec![1u8; 8192]).expect("write");
        assert!(disk_usage(&dir) >= 8192);
        // Idempotent.
        set_up(&parent, "cache", Medium::Disk, 0, &[]).expect("set up again");
        assert!(dir.join("f").exists());
        // A link a container left in it goes as a link.
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("victim"), "keep").expect("write");
        std::os::unix::fs::symlink(outside.path(), dir.join("out")).expect("symlink");
        tear_down(&parent, "cache", &[]).expect("tear down");
        assert!(!dir.exists());
        assert!(outside.path().join("victim").exists());
        tear_down(&parent, "cache", &[]).expect("tear down what is gone");
    }
}
