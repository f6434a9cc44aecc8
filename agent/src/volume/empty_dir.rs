//! emptyDir volumes (upstream `pkg/volume/emptydir/empty_dir.go`): a 0777 directory under the
//! pod's volumes, or a tmpfs mounted there for `medium: Memory`. Set-up is idempotent (an agent
//! restarted finds its pods' volumes as it left them); tear-down unmounts and removes.
//!
//! Not here: `sizeLimit` of a disk emptyDir. Upstream enforces it through the eviction manager
//! (or project quotas); swiftlet measures the usage ([`disk_usage`]) and leaves eviction to it.

use std::{os::unix::fs::PermissionsExt, path::Path};

use k8s_openapi::api::core::v1::Pod;

use super::{
    Result,
    error::io,
    mount::{self, MountInfo},
    spec::Medium,
};
use crate::cm::pod_cgroups::PodLimits;

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
    }) = PodLimits::of(pod)
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

/// Makes `dir` ready: the directory, and for memory a tmpfs of `size` bytes on it unless one is
/// there already.
pub fn set_up(dir: &Path, medium: Medium, size: i64, mounts: &[MountInfo]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    if medium == Medium::Memory && mount::mounted_at(mounts, dir).as_deref() != Some("tmpfs") {
        mount::mount_tmpfs(dir, &mount::tmpfs_options(Some(size)))?;
    }
    // After the mount: the tmpfs root is what containers see. Set explicitly, the umask does not
    // apply (upstream `setupDir` chmods for the same reason).
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DEFAULT_PERM))
        .map_err(io("setting the mode of", dir))?;
    Ok(())
}

/// Unmounts whatever is mounted at or below `dir` and removes it.
pub fn tear_down(dir: &Path, mounts: &[MountInfo]) -> Result<()> {
    for point in mount::mounts_below(mounts, dir) {
        mount::unmount(&point)?;
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("removing", dir)(e)),
    }
}

/// Bytes used by the files below `dir` (upstream's `du` metrics provider counts blocks; this
/// counts allocated blocks too, so sparse files count as what they take).
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        total += meta.blocks() * 512;
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(memory_limits: &[Option<&str>]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: memory_limits
                    .iter()
                    .enumerate()
                    .map(|(i, l)| Container {
                        name: format!("c{i}"),
                        resources: l.map(|l| ResourceRequirements {
                            limits: Some([("memory".to_owned(), Quantity(l.to_owned()))].into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
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
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("volumes/kubernetes.io~empty-dir/cache");
        set_up(&dir, Medium::Disk, 0, &[]).expect("set up");
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o777);
        std::fs::write(dir.join("f"), vec![1u8; 8192]).expect("write");
        assert!(disk_usage(&dir) >= 8192);
        // Idempotent.
        set_up(&dir, Medium::Disk, 0, &[]).expect("set up again");
        assert!(dir.join("f").exists());
        tear_down(&dir, &[]).expect("tear down");
        assert!(!dir.exists());
        tear_down(&dir, &[]).expect("tear down what is gone");
    }
}
