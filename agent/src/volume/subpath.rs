//! `subPath` of a volumeMount, the safe way (upstream `makeMounts` in `kubelet_pods.go` and
//! `pkg/volume/util/subpath/subpath_linux.go`: `doSafeMakeDir`, `safeOpenSubPath`,
//! `prepareSubpathTarget`, `doBindSubPath`, `doCleanSubPaths`).
//!
//! A container can write its volume while another container of the pod starts, and a path
//! checked and then handed to the runtime can be swapped for a link to `/` in between
//! (CVE-2017-1002101, CVE-2021-25741). So the subPath is resolved once, relative to the volume's
//! directory descriptor with `openat2(RESOLVE_BENEATH)` (links are followed only while they stay
//! inside the volume, upstream's rule; one climbing out fails), missing directories are made one
//! component at a time with the volume's mode (`mkdirat` + `fchmod`), and the descriptor finally
//! opened is bind-mounted through its `/proc/self/fd` path on
//! `<podDir>/volume-subpaths/<volume>/<container>/<index>` — a directory or an empty file, as
//! the source is. That path is what the runtime gets: whatever happens in the volume afterwards,
//! the bind holds what was resolved. A bind already there holding the same object is reused (an
//! agent restart, a container restart); one holding something else is replaced. All of a
//! volume's binds are unmounted before the volume is torn down.
//!
//! Messages are upstream's: the details of a failure stay in the agent's log, because they could
//! tell a pod about the node's filesystem.

use std::{
    ffi::OsStr,
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path, PathBuf},
};

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag, openat2},
    sys::stat::{Mode, mkdirat},
};

use super::{
    Error, Result,
    mount::{self, MountInfo},
    paths::{DIR_MODE, PodDirs, VOLUME_SUBPATHS},
};
use crate::{
    container::PodUid,
    hostfs::{self, Dir, FileKind, Stat},
};

/// The mode of the empty file a file subPath is bound on (upstream `prepareSubpathTarget`: 0640).
/// The bind covers it at once; only root ever sees it bare.
const FILE_TARGET_MODE: u32 = 0o640;
/// How many stacked mounts an old target may carry before the replacement gives up.
const MAX_STACKED: usize = 8;

/// One subPath to prepare.
#[derive(Clone, Copy, Debug)]
pub struct SubPath<'a> {
    pub uid: &'a PodUid,
    pub volume: &'a str,
    /// The volume's root on the node (the node's own path for hostPath).
    pub volume_path: &'a Path,
    /// Whether the volume is a hostPath (its path is the pod's, resolved once as upstream's
    /// `EvalSymlinks` does); others are swiftlet's directories, opened without links.
    pub host_path: bool,
    pub container: &'a str,
    pub index: usize,
    pub sub_path: &'a str,
}

/// `subPathExpr` with the container's `$(VAR)`s expanded (upstream
/// `ExpandContainerVolumeMounts`): a variable that is undefined or empty is an error.
pub fn expand(expr: &str, env: &[k8s_cri::v1::KeyValue]) -> Result<String> {
    let defined: std::collections::HashMap<String, String> = env
        .iter()
        .filter(|kv| !kv.value.is_empty())
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    let mut missing: Vec<String> = referenced(expr)
        .into_iter()
        .filter(|name| !defined.contains_key(name))
        .collect();
    missing.sort();
    missing.dedup();
    if !missing.is_empty() {
        return Err(Error::SubPathExprMissing {
            names: missing.join(", "),
        });
    }
    crate::kuberuntime::env::expand(expr, &defined)
        .map_err(|source| Error::SubPathExprTooLong { source })
}

/// The names `$(NAME)` refers to in `input` (`$$` escapes a `$`).
fn referenced(input: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            names.push(inner[..end].to_owned());
            rest = &inner[end + 1..];
        } else {
            rest = after;
        }
    }
    names
}

/// Upstream `ValidatePathNoBacksteps` plus the absolute-path check.
pub fn validate(sub_path: &str) -> Result<()> {
    if Path::new(sub_path).is_absolute() {
        return Err(Error::AbsoluteSubPath {
            sub_path: sub_path.to_owned(),
        });
    }
    if sub_path.split('/').any(|part| part == "..") {
        return Err(Error::SubPathBacksteps {
            sub_path: sub_path.to_owned(),
        });
    }
    Ok(())
}

/// Prepares `sp` (see the module doc) and returns the path to hand to the runtime.
pub fn prepare(dirs: &PodDirs, sp: SubPath<'_>) -> Result<PathBuf> {
    validate(sp.sub_path)?;
    let create_failed = |detail: &dyn std::fmt::Display| {
        tracing::warn!(volume = sp.volume, container = sp.container, sub_path = sp.sub_path, error = %detail, "failed to create subPath directory");
        Error::SubPathCreate {
            volume: sp.volume.to_owned(),
            container: sp.container.to_owned(),
        }
    };
    let prepare_failed = |detail: &dyn std::fmt::Display| {
        tracing::warn!(volume = sp.volume, container = sp.container, sub_path = sp.sub_path, error = %detail, "failed to prepare subPath");
        Error::SubPathPrepare {
            volume: sp.volume.to_owned(),
            container: sp.container.to_owned(),
        }
    };
    let root = if sp.host_path {
        Dir::open_resolved(sp.volume_path)
    } else {
        Dir::open(dirs.root()).and_then(|r| {
            let relative = sp
                .volume_path
                .strip_prefix(dirs.root())
                .unwrap_or(sp.volume_path);
            r.open_path(relative, true)
        })
    }
    .map_err(|e| prepare_failed(&e))?;
    let parts: Vec<&OsStr> = Path::new(sp.sub_path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let source = match open_beneath(&root, &parts) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() => {
            make_dirs(&root, &parts).map_err(|e| create_failed(&e))?;
            open_beneath(&root, &parts).map_err(|e| prepare_failed(&e))?
        }
        Err(e) => return Err(prepare_failed(&e)),
    };
    bind_target(dirs, sp, &source).map_err(|e| prepare_failed(&e))
}

/// Opens `parts` below `root` as an `O_PATH` handle: links followed only while they stay below
/// `root` (`RESOLVE_BENEATH`), no magic links.
fn open_beneath(root: &Dir, parts: &[&OsStr]) -> hostfs::Result<OwnedFd> {
    let relative: PathBuf = parts.iter().collect();
    let relative = if parts.is_empty() {
        PathBuf::from(".")
    } else {
        relative
    };
    let path = root.path().join(&relative);
    openat2(
        root.as_fd(),
        &relative,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
    .map_err(|e| escape_or(e, &path))
}

/// EXDEV from `RESOLVE_BENEATH` is an escape, not a mount.
fn escape_or(e: nix::Error, path: &Path) -> hostfs::Error {
    match e {
        nix::Error::EXDEV => hostfs::Error::Io {
            op: "resolving (it leads outside the volume)",
            path: path.to_owned(),
            source: std::io::Error::from(e),
        },
        e => hostfs::Error::Io {
            op: "resolving",
            path: path.to_owned(),
            source: std::io::Error::from(e),
        },
    }
}

/// Makes the missing directories of `parts` below `root`, one component at a time, each with
/// the volume root's mode (upstream `doSafeMakeDir`).
fn make_dirs(root: &Dir, parts: &[&OsStr]) -> hostfs::Result<()> {
    let mode = root.stat()?.mode;
    for i in 0..parts.len() {
        match open_beneath(root, &parts[..=i]) {
            Ok(_) => continue,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let parent_path: PathBuf = parts[..i].iter().collect();
        let parent = if i == 0 {
            root.try_clone()?
        } else {
            open_dir_beneath(root, &parent_path)?
        };
        let name = parts[i];
        match mkdirat(parent.as_fd(), name, Mode::from_bits_retain(mode & 0o777)) {
            Ok(()) => {
                // Opened without following: it was just made, a link swapped in is refused.
                let made = parent.open_dir(name)?;
                made.set_mode(mode)?;
            }
            Err(nix::Error::EEXIST) => {}
            Err(e) => {
                return Err(hostfs::Error::Io {
                    op: "creating",
                    path: parent.child_path(name),
                    source: std::io::Error::from(e),
                });
            }
        }
    }
    Ok(())
}

fn open_dir_beneath(root: &Dir, relative: &Path) -> hostfs::Result<Dir> {
    let fd = openat2(
        root.as_fd(),
        relative,
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
    .map_err(|e| escape_or(e, &root.path().join(relative)))?;
    Ok(Dir::from_fd(fd, root.path().join(relative)))
}

/// Binds `source` on the container's target (made when missing) unless it is already there.
fn bind_target(dirs: &PodDirs, sp: SubPath<'_>, source: &OwnedFd) -> hostfs::Result<PathBuf> {
    let want =
        Stat::from(
            nix::sys::stat::fstat(source.as_fd()).map_err(|e| hostfs::Error::Io {
                op: "inspecting",
                path: sp.volume_path.join(sp.sub_path),
                source: std::io::Error::from(e),
            })?,
        );
    let dir = dirs.ensure_in_pod(sp.uid, &[VOLUME_SUBPATHS, sp.volume, sp.container])?;
    let name_string = sp.index.to_string();
    let name = OsStr::new(&name_string);
    let target_path = dir.child_path(name);
    let bound = |dir: &Dir| -> hostfs::Result<Option<Stat>> {
        match dir.open_handle(name) {
            Ok(fd) => Ok(Some(Stat::from(
                nix::sys::stat::fstat(fd.as_fd()).map_err(|e| hostfs::Error::Io {
                    op: "inspecting",
                    path: target_path.clone(),
                    source: std::io::Error::from(e),
                })?,
            ))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    };
    let same = |s: &Stat| s.dev == want.dev && s.ino == want.ino;
    let mut current = bound(&dir)?;
    if current.as_ref().is_some_and(same) {
        return Ok(target_path);
    }
    // Something else is bound there (the subPath now resolves elsewhere): off with it.
    for _ in 0..MAX_STACKED {
        if current.is_none() {
            break;
        }
        match nix::mount::umount2(&target_path, nix::mount::MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => current = bound(&dir)?,
            Err(nix::Error::EINVAL | nix::Error::ENOENT) => break,
            Err(e) => {
                return Err(hostfs::Error::Io {
                    op: "unmounting",
                    path: target_path.clone(),
                    source: std::io::Error::from(e),
                });
            }
        }
    }
    let want_dir = want.kind == FileKind::Directory;
    match current {
        Some(s) if (s.kind == FileKind::Directory) == want_dir && s.kind != FileKind::Symlink => {}
        Some(_) => {
            hostfs::remove_all(&dir, name)?;
            make_target(&dir, name, want_dir)?;
        }
        None => make_target(&dir, name, want_dir)?,
    }
    let target = dir.open_handle(name)?;
    mount::bind(
        &hostfs::proc_fd_path(source.as_fd()),
        &hostfs::proc_fd_path(target.as_fd()),
        &target_path,
    )
    .map_err(|e| hostfs::Error::Io {
        op: "bind-mounting",
        path: target_path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(target_path)
}

fn make_target(dir: &Dir, name: &OsStr, directory: bool) -> hostfs::Result<()> {
    if directory {
        dir.create_dir(name, DIR_MODE, true).map(drop)
    } else {
        dir.write_new_file(name, b"", FILE_TARGET_MODE)
    }
}

/// Unmounts every subPath bind of `volume` of pod `uid` and removes their directory (upstream
/// `doCleanSubPaths`).
pub fn clean(dirs: &PodDirs, uid: &PodUid, volume: &str, mounts: &[MountInfo]) -> Result<()> {
    let base = dirs.pod(uid).join(VOLUME_SUBPATHS).join(volume);
    for point in mount::mounts_below(mounts, &base) {
        mount::unmount(&point)?;
    }
    match dirs.open_in_pod(uid, &[VOLUME_SUBPATHS]) {
        Ok(parent) => hostfs::remove_all(&parent, OsStr::new(volume))?,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    // The last volume's: `volume-subpaths` goes too, as upstream (still used: it stays).
    if let Ok(pod) = dirs.open_in_pod(uid, &[]) {
        let _ = pod.remove_empty_dir(OsStr::new(VOLUME_SUBPATHS));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn absolute_and_backstepping_sub_paths_are_refused() {
        let cases = [
            (
                "/etc",
                Some("error SubPath `/etc` must not be an absolute path"),
            ),
            (
                "../x",
                Some("unable to provision SubPath `../x`: must not contain '..'"),
            ),
            (
                "a/../../x",
                Some("unable to provision SubPath `a/../../x`: must not contain '..'"),
            ),
            ("a/b", None),
            ("a..b/c", None),
            ("./a", None),
        ];
        for (sub, want) in cases {
            let got = validate(sub).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), want, "{sub}");
        }
    }

    #[test]
    fn sub_path_expr_expands_the_environment_and_names_what_is_missing() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| k8s_cri::v1::KeyValue {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect::<Vec<_>>()
        };
        let e = env(&[("POD", "web-1"), ("EMPTY", "")]);
        assert_eq!(expand("logs/$(POD)", &e).expect("expanded"), "logs/web-1");
        assert_eq!(expand("a$$(POD)", &e).expect("escaped"), "a$(POD)");
        let err = expand("$(EMPTY)/$(NOPE)/$(POD)", &e)
            .err()
            .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("missing value for EMPTY, NOPE"));
    }

    fn root_only() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        eprintln!("skipped: bind mounts need root");
        false
    }

    /// A pod directory with an emptyDir-like volume `v` below a temporary root.
    struct Fixture {
        _root: tempfile::TempDir,
        dirs: PodDirs,
        uid: PodUid,
        volume: PathBuf,
        outside: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let root = tempfile::tempdir().expect("tempdir");
            let dirs = PodDirs::new(root.path());
            let uid = PodUid::from("uid-1");
            let parent = dirs
                .plugin_dir(&uid, super::super::Plugin::EmptyDir)
                .expect("plugin dir");
            parent
                .create_dir(OsStr::new("v"), 0o777, false)
                .expect("volume");
            let volume = parent.child_path(OsStr::new("v"));
            let outside = tempfile::tempdir().expect("tempdir");
            std::fs::write(outside.path().join("victim"), "keep").expect("write");
            Fixture {
                _root: root,
                dirs,
                uid,
                volume,
                outside,
            }
        }

        fn sub_path<'a>(&'a self, sub_path: &'a str, index: usize) -> SubPath<'a> {
            SubPath {
                uid: &self.uid,
                volume: "v",
                volume_path: &self.volume,
                host_path: false,
                container: "app",
                index,
                sub_path,
            }
        }

        fn prepare(&self, sub_path: &str, index: usize) -> Result<PathBuf> {
            prepare(&self.dirs, self.sub_path(sub_path, index))
        }

        fn clean(&self) {
            let mounts = mount::mounts().expect("mounts");
            clean(&self.dirs, &self.uid, "v", &mounts).expect("cleaned");
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            if let Ok(mounts) = mount::mounts() {
                let _ = clean(&self.dirs, &self.uid, "v", &mounts);
            }
        }
    }

    #[test]
    fn missing_dirs_are_made_with_the_volume_mode_and_bound() {
        if !root_only() {
            return;
        }
        let f = Fixture::new();
        let target = f.prepare("a/b", 0).expect("prepared");
        assert_eq!(
            target,
            f.dirs.pod(&f.uid).join("volume-subpaths/v/app/0"),
            "the runtime gets the bind, not the volume's path"
        );
        let made = f.volume.join("a/b");
        let mode = std::fs::metadata(&made).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o777);
        std::fs::write(target.join("through-the-bind"), "x").expect("write");
        assert!(made.join("through-the-bind").exists());
        // Again (a container restart): the same bind, not a second one.
        assert_eq!(f.prepare("a/b", 0).expect("again"), target);
        let stacked = mount::mounts()
            .expect("mounts")
            .iter()
            .filter(|m| m.mount_point == target)
            .count();
        assert_eq!(stacked, 1);
        // A file subPath is bound on a file.
        std::fs::write(f.volume.join("a/conf"), "c").expect("write");
        let file = f.prepare("a/conf", 1).expect("file");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "c");
        f.clean();
        assert!(!f.dirs.pod(&f.uid).join("volume-subpaths/v").exists());
        assert!(made.join("through-the-bind").exists(), "the volume stays");
    }

    #[test]
    fn a_symlink_out_of_the_volume_is_refused_and_nothing_made_outside() {
        let f = Fixture::new();
        std::os::unix::fs::symlink(f.outside.path(), f.volume.join("out")).expect("symlink");
        let climb = PathBuf::from("../../../../../../../../../..").join(f.outside.path());
        std::os::unix::fs::symlink(&climb, f.volume.join("climb")).expect("symlink");
        for sub in ["out", "out/new", "climb", "climb/new"] {
            let err = f.prepare(sub, 0).err().map(|e| e.to_string());
            assert_eq!(
                err.as_deref(),
                Some("failed to prepare subPath for volumeMount \"v\" of container \"app\""),
                "{sub}"
            );
        }
        assert!(
            !f.outside.path().join("new").exists(),
            "nothing made outside"
        );
        assert_eq!(
            std::fs::read_to_string(f.outside.path().join("victim")).expect("victim"),
            "keep"
        );
    }

    #[test]
    fn a_link_inside_is_followed_and_a_swap_after_the_bind_changes_nothing() {
        if !root_only() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir(f.volume.join("inner")).expect("mkdir");
        std::fs::write(f.volume.join("inner/mine"), "m").expect("write");
        std::os::unix::fs::symlink("inner", f.volume.join("in")).expect("symlink");
        let target = f.prepare("in", 0).expect("inside");
        assert_eq!(
            std::fs::read_to_string(target.join("mine")).expect("read"),
            "m"
        );
        // The container swaps the directory for a link to `/`: the bind still holds the
        // directory, and preparing again refuses the link.
        std::fs::rename(f.volume.join("inner"), f.volume.join("moved")).expect("rename");
        std::os::unix::fs::symlink("/", f.volume.join("inner")).expect("symlink");
        assert_eq!(
            std::fs::read_to_string(target.join("mine")).expect("read"),
            "m"
        );
        assert!(f.prepare("in", 0).is_err());
        assert!(!target.join("etc").exists(), "never the node's /");
    }
}
