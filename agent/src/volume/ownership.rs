//! A pod's `fsGroup` on its volumes (upstream `pkg/volume/volume_linux.go`
//! `SetVolumeOwnership`): every file and directory of the volume gets the group, keeps its owner,
//! and gains group read (read-only volumes: downwardAPI, configMap, secret, projected) or read and
//! write (emptyDir); directories also gain group search and setgid, so files made later inherit
//! the group. Links are skipped (their mode means nothing, and following one would change the
//! file it points at). `fsGroupChangePolicy: OnRootMismatch` skips a volume whose root already
//! has the group, the bits and setgid. hostPath volumes are never changed, as upstream.
//!
//! The walk goes through descriptors: each entry is opened with `O_PATH | O_NOFOLLOW`, checked
//! with `fstat` and changed through that descriptor, so a link swapped in meanwhile is never
//! followed; it stays on the volume's mount and opens at most [`MAX_OPEN_DEPTH`] directories at
//! once (deeper ones are left as they are, said once).
//!
//! Adding the group to the containers' supplementary groups is the CRI config's part.

use std::{ffi::OsStr, os::fd::AsFd};

use k8s_openapi::api::core::v1::Pod;
use nix::{fcntl::AtFlags, unistd::Gid};

use super::Result;
use crate::hostfs::{self, Dir, FileKind, MAX_OPEN_DEPTH, Stat};

/// Upstream `rwMask`, `roMask`, `execMask`.
const RW_MASK: u32 = 0o660;
pub(super) const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// `fsGroup` and `fsGroupChangePolicy` of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsGroup {
    pub gid: u32,
    /// `OnRootMismatch`; otherwise (`Always`, unset) every file is changed.
    pub on_root_mismatch: bool,
}

impl FsGroup {
    /// The pod's, when it sets one (a negative or oversized value is ignored: the API server
    /// refuses them).
    pub fn of(pod: &Pod) -> Option<FsGroup> {
        let sc = pod.spec.as_ref()?.security_context.as_ref()?;
        let gid = u32::try_from(sc.fs_group?).ok()?;
        Some(FsGroup {
            gid,
            on_root_mismatch: sc.fs_group_change_policy.as_deref() == Some("OnRootMismatch"),
        })
    }
}

/// Applies `fs_group` to the volume open as `root` and everything below it.
pub fn set_volume_ownership(root: &Dir, fs_group: FsGroup, read_only: bool) -> Result<()> {
    if fs_group.on_root_mismatch && !requires_change(&root.stat()?, fs_group.gid, read_only) {
        tracing::debug!(volume = %root.path().display(), "fsGroup: the volume's root already matches; skipped");
        return Ok(());
    }
    change_below(root, fs_group.gid, read_only)?;
    // The root last: once it matches, `OnRootMismatch` trusts the rest.
    change_dir(root, fs_group.gid, read_only)
}

/// Applies the group to directory `dir` itself.
pub fn change_dir(dir: &Dir, gid: u32, read_only: bool) -> Result<()> {
    let stat = dir.stat()?;
    dir.set_owner(None, Some(gid))?;
    dir.set_mode(stat.mode | mask(FileKind::Directory, read_only))?;
    Ok(())
}

/// Applies the group to everything below `dir` (not `dir` itself).
pub fn change_below(dir: &Dir, gid: u32, read_only: bool) -> Result<()> {
    let mut stack = vec![dir.try_clone()?];
    let mut too_deep = false;
    while let Some(current) = stack.pop() {
        // Bounded per directory: a volume may hold many files, and each is changed once.
        for name in current.entries(usize::MAX)? {
            match change_entry(&current, &name, gid, read_only) {
                Ok(Some(FileKind::Directory)) => {
                    if stack.len() + 1 >= MAX_OPEN_DEPTH {
                        too_deep = true;
                        continue;
                    }
                    match current.open_dir(&name) {
                        Ok(child) => stack.push(child),
                        // A mount below the volume is not the volume's: left alone.
                        Err(hostfs::Error::MountPoint { .. } | hostfs::Error::Symlink { .. }) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if too_deep {
        tracing::warn!(volume = %dir.path().display(), "fsGroup: directories nested deeper than {MAX_OPEN_DEPTH} levels were left as they are");
    }
    Ok(())
}

/// Changes one entry through an `O_PATH` handle; what it is (links are left alone).
fn change_entry(
    dir: &Dir,
    name: &OsStr,
    gid: u32,
    read_only: bool,
) -> hostfs::Result<Option<FileKind>> {
    let handle = dir.open_handle(name)?;
    let path = dir.child_path(name);
    let stat = Stat::from(
        nix::sys::stat::fstat(handle.as_fd()).map_err(|e| io_error("inspecting", &path, e))?,
    );
    if stat.kind == FileKind::Symlink {
        return Ok(Some(FileKind::Symlink));
    }
    nix::unistd::fchownat(
        handle.as_fd(),
        "",
        None,
        Some(Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| io_error("changing the group of", &path, e))?;
    // `chmod` of the descriptor's `/proc/self/fd` entry reaches exactly the object opened
    // above, which is not a link (an `O_PATH` descriptor cannot `fchmod`).
    let mode = stat.mode | mask(stat.kind, read_only);
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        hostfs::proc_fd_path(handle.as_fd()),
        std::fs::Permissions::from_mode(mode),
    )
    .map_err(|source| hostfs::Error::Io {
        op: "setting the mode of",
        path,
        source,
    })?;
    Ok(Some(stat.kind))
}

fn io_error(op: &'static str, path: &std::path::Path, e: nix::Error) -> hostfs::Error {
    hostfs::Error::Io {
        op,
        path: path.to_owned(),
        source: std::io::Error::from(e),
    }
}

/// The bits upstream adds (`changeFilePermission`).
fn mask(kind: FileKind, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if kind == FileKind::Directory {
        mask |= SETGID | EXEC_MASK;
    }
    mask
}

/// Upstream `requiresPermissionChange`: the root's group differs, it lacks one of the bits, or
/// it lacks setgid.
fn requires_change(root: &Stat, gid: u32, read_only: bool) -> bool {
    if root.gid != gid || root.kind != FileKind::Directory {
        return true;
    }
    let want = (if read_only { RO_MASK } else { RW_MASK }) | EXEC_MASK;
    root.mode & want != want || root.mode & SETGID == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    fn root_only() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        eprintln!("skipped: changing a file's group to an arbitrary gid needs root");
        false
    }

    #[test]
    fn an_fs_group_is_read_from_the_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "securityContext": {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"}}
        }))
        .expect("pod");
        assert_eq!(
            FsGroup::of(&pod),
            Some(FsGroup {
                gid: 2000,
                on_root_mismatch: true
            })
        );
        let none: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).expect("pod");
        assert_eq!(FsGroup::of(&none), None);
    }

    #[test]
    fn group_bits_and_setgid_as_upstream_links_never_followed() {
        if !root_only() {
            return;
        }
        let outside = tempfile::tempdir().expect("tempdir");
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").expect("write");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let vol = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(vol.path().join("d")).expect("mkdir");
        std::fs::set_permissions(vol.path().join("d"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        std::fs::write(vol.path().join("d/f"), "x").expect("write");
        std::fs::set_permissions(
            vol.path().join("d/f"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        std::os::unix::fs::symlink(&victim, vol.path().join("link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), vol.path().join("dirlink")).expect("symlink");
        let root = Dir::open(vol.path()).expect("open");
        let group = FsGroup {
            gid: 4321,
            on_root_mismatch: false,
        };
        set_volume_ownership(&root, group, false).expect("rw");
        let meta = |p: &std::path::Path| std::fs::symlink_metadata(p).expect("stat");
        let d = meta(&vol.path().join("d"));
        assert_eq!((d.gid(), d.mode() & 0o7777), (4321, 0o2770));
        let f = meta(&vol.path().join("d/f"));
        assert_eq!((f.gid(), f.mode() & 0o7777), (4321, 0o660));
        let top = meta(vol.path());
        assert_eq!(top.gid(), 4321);
        assert_eq!(top.mode() & 0o2070, 0o2070);
        // What the links point at is untouched.
        let v = meta(&victim);
        assert_eq!((v.gid(), v.mode() & 0o7777), (0, 0o600));
        assert_ne!(meta(outside.path()).gid(), 4321);

        // Read-only volumes get group read only.
        let ro = tempfile::tempdir().expect("tempdir");
        std::fs::write(ro.path().join("s"), "secret").expect("write");
        std::fs::set_permissions(ro.path().join("s"), std::fs::Permissions::from_mode(0o400))
            .expect("chmod");
        set_volume_ownership(&Dir::open(ro.path()).expect("open"), group, true).expect("ro");
        let s = meta(&ro.path().join("s"));
        assert_eq!((s.gid(), s.mode() & 0o7777), (4321, 0o440));
    }

    #[test]
    fn on_root_mismatch_skips_a_volume_whose_root_matches() {
        if !root_only() {
            return;
        }
        let vol = tempfile::tempdir().expect("tempdir");
        std::fs::write(vol.path().join("f"), "x").expect("write");
        let root = Dir::open(vol.path()).expect("open");
        let group = FsGroup {
            gid: 4321,
            on_root_mismatch: true,
        };
        // The root alone matches: the file is left as it is.
        change_dir(&root, 4321, false).expect("root");
        set_volume_ownership(&root, group, false).expect("skipped");
        assert_ne!(
            std::fs::metadata(vol.path().join("f")).expect("stat").gid(),
            4321
        );
        // A root that does not match: everything changes.
        root.set_owner(None, Some(0)).expect("chgrp");
        set_volume_ownership(&root, group, false).expect("changed");
        assert_eq!(
            std::fs::metadata(vol.path().join("f")).expect("stat").gid(),
            4321
        );
    }
}
