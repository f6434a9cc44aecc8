//! Mounts on the node (upstream `k8s.io/mount-utils`): what `/proc/self/mountinfo` says is
//! mounted where, and mounting and unmounting a tmpfs.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use super::{Error, Result};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fs_type: String,
}

/// Parses mountinfo text (`proc(5)`): the mount point is the 5th field (octal-escaped), the
/// filesystem type the first field after the ` - ` separator.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split(' ').nth(4)?;
            let fs_type = after.split(' ').next()?;
            Some(MountInfo {
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: fs_type.to_owned(),
            })
        })
        .collect()
}

/// Undoes the kernel's `\ooo` escapes of space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(digits) = std::str::from_utf8(&bytes[i + 1..i + 4])
            && let Ok(v) = u8::from_str_radix(digits, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mounts of this process's mount namespace now.
pub fn mounts() -> Result<Vec<MountInfo>> {
    let path = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(super::error::io("reading", path))?;
    Ok(parse_mountinfo(&text))
}

/// The filesystem type mounted at exactly `path` (the last mount there wins), if any.
pub fn mounted_at(mounts: &[MountInfo], path: &Path) -> Option<String> {
    mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == path)
        .map(|m| m.fs_type.clone())
}

/// Mount points at or below `dir`, deepest first (the order to unmount them in).
pub fn mounts_below(mounts: &[MountInfo], dir: &Path) -> Vec<PathBuf> {
    let mut below: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .map(|m| m.mount_point.clone())
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    below.dedup();
    below
}

/// The tmpfs options upstream passes (`generateTmpfsMountOptions`): the size when positive.
pub fn tmpfs_options(size: Option<i64>) -> String {
    match size {
        Some(bytes) if bytes > 0 => format!("size={bytes}"),
        _ => String::new(),
    }
}

/// Mounts a tmpfs with `options` on `target` (a directory's `/proc/self/fd` path), which is
/// `path` (for messages).
pub fn mount_tmpfs_on(target: &Path, path: &Path, options: &str) -> Result<()> {
    let data = (!options.is_empty()).then_some(options);
    nix::mount::mount(Some("tmpfs"), target, Some("tmpfs"), MsFlags::empty(), data).map_err(
        |source| Error::Mount {
            op: "mounting a tmpfs at",
            path: path.to_owned(),
            source,
        },
    )
}

/// Binds `source` on `target`, both `/proc/self/fd` paths of descriptors opened safely, so the
/// mount holds exactly the objects opened, whatever changed along their paths since (upstream
/// `doBindSubPath`). `path` is the target, for messages.
pub fn bind(source: &Path, target: &Path, path: &Path) -> Result<()> {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| Error::Mount {
        op: "bind-mounting a subPath at",
        path: path.to_owned(),
        source,
    })
}

/// Unmounts `dir`; a path that is not mounted (EINVAL) or gone (ENOENT) is fine. Its last
/// component is not followed if a link (`UMOUNT_NOFOLLOW`); the ones before are swiftlet's own
/// directories for every mount swiftlet makes.
pub fn unmount(dir: &Path) -> Result<()> {
    match nix::mount::umount2(dir, MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) | Err(nix::Error::EINVAL | nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(Error::Mount {
            op: "unmounting",
            path: dir.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 0:50 / /var/lib/swiftlet/pods/u1/volumes/kubernetes.io~empty-dir/mem rw,relatime shared:60 - tmpfs tmpfs rw,size=65536k
99 22 0:51 / /var/lib/swiftlet/pods/u1/volumes/kubernetes.io~empty-dir/with\\040space rw - tmpfs tmpfs rw
100 98 0:52 / /var/lib/swiftlet/pods/u1/volumes/kubernetes.io~empty-dir/mem/inner rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_mount_points_and_types() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4);
        let mem = Path::new("/var/lib/swiftlet/pods/u1/volumes/kubernetes.io~empty-dir/mem");
        assert_eq!(mounted_at(&mounts, mem).as_deref(), Some("tmpfs"));
        assert_eq!(mounted_at(&mounts, Path::new("/")).as_deref(), Some("ext4"));
        assert_eq!(mounted_at(&mounts, Path::new("/var")), None);
        let spaced =
            Path::new("/var/lib/swiftlet/pods/u1/volumes/kubernetes.io~empty-dir/with space");
        assert_eq!(mounted_at(&mounts, spaced).as_deref(), Some("tmpfs"));
    }

    #[test]
    fn mounts_below_a_pod_dir_deepest_first() {
        let mounts = parse_mountinfo(MOUNTINFO);
        let below = mounts_below(&mounts, Path::new("/var/lib/swiftlet/pods/u1"));
        assert_eq!(below.len(), 3);
        assert!(below[0].ends_with("mem/inner"), "{below:?}");
        assert!(mounts_below(&mounts, Path::new("/var/lib/swiftlet/pods/u2")).is_empty());
    }

    #[test]
    fn tmpfs_size_option_only_when_positive() {
        assert_eq!(tmpfs_options(Some(1 << 20)), "size=1048576");
        assert_eq!(tmpfs_options(Some(0)), "");
        assert_eq!(tmpfs_options(None), "");
    }
}
