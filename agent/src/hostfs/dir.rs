//! An open directory and what swiftlet does inside it, each call relative to its descriptor.

use std::{
    ffi::{OsStr, OsString},
    io::Write as _,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Component, Path, PathBuf},
};

use nix::{
    fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat, renameat},
    sys::stat::{FileStat, Mode, fchmod, fstat, fstatat, mkdirat},
    unistd::{Gid, Uid, UnlinkatFlags, fchown, symlinkat, unlinkat},
};

use super::{Error, Result, errno};

/// The `/proc/self/fd/N` path of `fd`: what `mount(2)` takes to bind exactly the object the
/// descriptor holds, whatever has been renamed or swapped along its path since it was opened.
pub fn proc_fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Refuses anything but one plain path component (no `/`, not `.` or `..`, not empty, no NUL).
pub fn check_component(name: &OsStr) -> Result<()> {
    let bytes = name.as_bytes();
    let plain = !bytes.is_empty()
        && bytes != b"."
        && bytes != b".."
        && !bytes.contains(&b'/')
        && !bytes.contains(&0);
    if plain {
        Ok(())
    } else {
        Err(Error::BadComponent {
            name: name.to_string_lossy().into_owned(),
        })
    }
}

/// What an entry is, from `fstatat` without following links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    Regular,
    Symlink,
    Other,
}

/// The facts of one file that swiftlet decides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub kind: FileKind,
    /// Permission bits with setuid/setgid/sticky (`st_mode & 07777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub dev: u64,
    pub ino: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
}

impl From<FileStat> for Stat {
    fn from(st: FileStat) -> Self {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFREG => FileKind::Regular,
            libc::S_IFLNK => FileKind::Symlink,
            _ => FileKind::Other,
        };
        Stat {
            kind,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            dev: st.st_dev,
            ino: st.st_ino,
            blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        }
    }
}

/// An open directory. Its path is kept for messages only.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

impl Dir {
    /// Opens the directory at `path`, refusing a symbolic link as its last component. The
    /// components before it are the node's own (the configured root dir and its parents).
    pub fn open(path: &Path) -> Result<Dir> {
        let fd =
            nix::fcntl::open(path, DIR_FLAGS, Mode::empty()).map_err(errno("opening", path))?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// Opens `relative` below this directory, every component a real directory (no links) on
    /// the same mount unless `cross_mounts`.
    pub fn open_path(&self, relative: &Path, cross_mounts: bool) -> Result<Dir> {
        let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
        if !cross_mounts {
            resolve |= ResolveFlag::RESOLVE_NO_XDEV;
        }
        let path = self.path.join(relative);
        if relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(Error::BadComponent {
                name: relative.to_string_lossy().into_owned(),
            });
        }
        match openat2(
            self.fd.as_fd(),
            relative,
            OpenHow::new().flags(DIR_FLAGS).resolve(resolve),
        ) {
            Ok(fd) => Ok(Dir { fd, path }),
            // `O_DIRECTORY | O_NOFOLLOW` on a link says ENOTDIR: name it for what it is.
            Err(nix::Error::ENOTDIR)
                if fstatat(self.fd.as_fd(), relative, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) =>
            {
                Err(Error::Symlink { path })
            }
            Err(e) => Err(errno("opening", &path)(e)),
        }
    }

    /// Opens directory `path` following links on the way, as a pod's hostPath is resolved
    /// (upstream `EvalSymlinks`): resolved once, then used only through the descriptor.
    pub fn open_resolved(path: &Path) -> Result<Dir> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno("opening", path))?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// A directory descriptor opened elsewhere, with its path for messages.
    pub fn from_fd(fd: OwnedFd, path: PathBuf) -> Dir {
        Dir { fd, path }
    }

    /// Opens child directory `name`: not a link, and on the same mount as this one (a mount
    /// point below is refused with [`Error::MountPoint`]).
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir> {
        check_component(name)?;
        self.open_path(Path::new(name), false)
    }

    /// Opens child directory `name` (not a link) even when a mount sits on it.
    pub fn open_dir_crossing(&self, name: &OsStr) -> Result<Dir> {
        check_component(name)?;
        self.open_path(Path::new(name), true)
    }

    /// Opens regular file `relative` below this directory for reading: no link anywhere on the
    /// way, no mount crossed.
    pub fn open_file(&self, relative: &Path) -> Result<std::fs::File> {
        let path = self.path.join(relative);
        if relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(Error::BadComponent {
                name: relative.to_string_lossy().into_owned(),
            });
        }
        let fd = openat2(
            self.fd.as_fd(),
            relative,
            OpenHow::new()
                .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
                .resolve(
                    ResolveFlag::RESOLVE_BENEATH
                        | ResolveFlag::RESOLVE_NO_SYMLINKS
                        | ResolveFlag::RESOLVE_NO_XDEV,
                ),
        )
        .map_err(errno("opening", &path))?;
        let file = std::fs::File::from(fd);
        match file.metadata() {
            Ok(m) if m.is_file() => Ok(file),
            Ok(_) => Err(Error::Io {
                op: "opening",
                path,
                source: std::io::Error::other("not a regular file"),
            }),
            Err(source) => Err(Error::Io {
                op: "inspecting",
                path,
                source,
            }),
        }
    }

    /// Opens `name` with `O_PATH | O_NOFOLLOW`: a handle on whatever it is (a link stays a link),
    /// good for `fstat`, `fchown` (with `AT_EMPTY_PATH`) and `/proc/self/fd` operations.
    pub fn open_handle(&self, name: &OsStr) -> Result<OwnedFd> {
        check_component(name)?;
        openat(
            self.fd.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno("opening", self.path.join(name)))
    }

    /// The same directory again, as a second descriptor.
    pub fn try_clone(&self) -> Result<Dir> {
        let fd = openat(self.fd.as_fd(), ".", DIR_FLAGS, Mode::empty())
            .map_err(errno("opening", &self.path))?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn child_path(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// This directory's facts.
    pub fn stat(&self) -> Result<Stat> {
        fstat(self.fd.as_fd())
            .map(Stat::from)
            .map_err(errno("inspecting", &self.path))
    }

    /// `name`'s facts without following a link; `None` when it does not exist.
    pub fn stat_at(&self, name: &OsStr) -> Result<Option<Stat>> {
        check_component(name)?;
        match fstatat(self.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st.into())),
            Err(nix::Error::ENOENT) => Ok(None),
            Err(e) => Err(errno("inspecting", self.path.join(name))(e)),
        }
    }

    /// Sets this directory's mode exactly (`fchmod`: the umask plays no part).
    pub fn set_mode(&self, mode: u32) -> Result<()> {
        fchmod(self.fd.as_fd(), Mode::from_bits_retain(mode))
            .map_err(errno("setting the mode of", &self.path))
    }

    /// Sets this directory's owner and group (`None` keeps one).
    pub fn set_owner(&self, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        fchown(
            self.fd.as_fd(),
            uid.map(Uid::from_raw),
            gid.map(Gid::from_raw),
        )
        .map_err(errno("changing the owner of", &self.path))
    }

    /// Makes child directory `name` with exactly `mode` and opens it; with `exist_ok`, an
    /// existing directory (not a link) is opened as it is.
    pub fn create_dir(&self, name: &OsStr, mode: u32, exist_ok: bool) -> Result<Dir> {
        check_component(name)?;
        match mkdirat(self.fd.as_fd(), name, Mode::from_bits_retain(mode & 0o777)) {
            Ok(()) => {
                let dir = self.open_dir(name)?;
                dir.set_mode(mode)?;
                Ok(dir)
            }
            Err(nix::Error::EEXIST) if exist_ok => self.open_dir(name),
            Err(e) => Err(errno("creating", self.path.join(name))(e)),
        }
    }

    /// Child directory `name` with `mode`: made when missing, and narrowed to `mode` when it
    /// exists with bits `mode` does not have.
    pub fn ensure_dir(&self, name: &OsStr, mode: u32) -> Result<Dir> {
        let dir = self.create_dir(name, mode, true)?;
        narrow(&dir, mode)?;
        Ok(dir)
    }

    /// Writes a new file `name` (it must not exist) with `data` and exactly `mode`.
    pub fn write_new_file(&self, name: &OsStr, data: &[u8], mode: u32) -> Result<()> {
        check_component(name)?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_retain(mode & 0o777),
        )
        .map_err(errno("creating", &path))?;
        fchmod(fd.as_fd(), Mode::from_bits_retain(mode))
            .map_err(errno("setting the mode of", &path))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(data).map_err(|source| Error::Io {
            op: "writing",
            path: path.clone(),
            source,
        })?;
        Ok(())
    }

    /// Writes `data` over existing regular file `name`, as a kernel interface file (a cgroup's
    /// `memory.max`) takes a value (`O_TRUNC`, as runc opens them; the kernel ignores it there):
    /// never created or followed, and never a FIFO waited on (`O_NONBLOCK`, and anything but a
    /// regular file is refused before the write).
    pub fn write_existing_file(&self, name: &OsStr, data: &[u8]) -> Result<()> {
        check_component(name)?;
        let path = self.path.join(name);
        let fd = openat2(
            self.fd.as_fd(),
            name,
            OpenHow::new()
                .flags(
                    OFlag::O_WRONLY
                        | OFlag::O_TRUNC
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC
                        | OFlag::O_NONBLOCK,
                )
                .resolve(
                    ResolveFlag::RESOLVE_BENEATH
                        | ResolveFlag::RESOLVE_NO_SYMLINKS
                        | ResolveFlag::RESOLVE_NO_XDEV,
                ),
        )
        .map_err(errno("opening", &path))?;
        let mut file = std::fs::File::from(fd);
        match file.metadata() {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(Error::Io {
                    op: "opening",
                    path,
                    source: std::io::Error::other("not a regular file"),
                });
            }
            Err(source) => {
                return Err(Error::Io {
                    op: "inspecting",
                    path,
                    source,
                });
            }
        }
        file.write_all(data).map_err(|source| Error::Io {
            op: "writing",
            path,
            source,
        })
    }

    /// Replaces file `name` with `data` and exactly `mode`, all at once: written under a
    /// temporary name and renamed over it (whatever `name` was, a link included, is replaced,
    /// never followed).
    pub fn replace_file(&self, name: &OsStr, data: &[u8], mode: u32) -> Result<()> {
        check_component(name)?;
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(".swiftlet-tmp");
        self.remove_file(&tmp)?;
        self.write_new_file(&tmp, data, mode)?;
        self.rename(&tmp, name)
    }

    /// Reads link `name`; `None` when it does not exist or is not a link.
    pub fn read_link(&self, name: &OsStr) -> Result<Option<OsString>> {
        check_component(name)?;
        match readlinkat(self.fd.as_fd(), name) {
            Ok(target) => Ok(Some(target)),
            Err(nix::Error::ENOENT | nix::Error::EINVAL) => Ok(None),
            Err(e) => Err(errno("reading the link", self.path.join(name))(e)),
        }
    }

    /// Makes link `name` → `target`.
    pub fn symlink(&self, target: &OsStr, name: &OsStr) -> Result<()> {
        check_component(name)?;
        symlinkat(target, self.fd.as_fd(), name).map_err(errno("linking", self.path.join(name)))
    }

    /// Renames `from` to `to`, both in this directory (replacing `to`, never following it).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> Result<()> {
        check_component(from)?;
        check_component(to)?;
        renameat(self.fd.as_fd(), from, self.fd.as_fd(), to)
            .map_err(errno("renaming", self.path.join(from)))
    }

    /// Moves `name` into `other` as `new_name` (same filesystem).
    pub fn move_to(&self, name: &OsStr, other: &Dir, new_name: &OsStr) -> Result<()> {
        check_component(name)?;
        check_component(new_name)?;
        renameat(self.fd.as_fd(), name, other.fd.as_fd(), new_name)
            .map_err(errno("moving", self.path.join(name)))
    }

    /// Removes non-directory `name` (a link is removed, not followed); gone already is fine.
    pub fn remove_file(&self, name: &OsStr) -> Result<()> {
        check_component(name)?;
        match unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
            Err(e) => Err(errno("removing", self.path.join(name))(e)),
        }
    }

    /// Removes empty directory `name`; gone already is fine.
    pub fn remove_empty_dir(&self, name: &OsStr) -> Result<()> {
        check_component(name)?;
        match unlinkat(self.fd.as_fd(), name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
            Err(e) => Err(errno("removing", self.path.join(name))(e)),
        }
    }

    /// Up to `limit` entry names (not `.` and `..`), in directory order.
    pub fn entries(&self, limit: usize) -> Result<Vec<OsString>> {
        let again = self.try_clone()?;
        let mut listing = nix::dir::Dir::from_fd(again.fd).map_err(errno("listing", &self.path))?;
        let mut names = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(errno("listing", &self.path))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            names.push(name.to_owned());
            if names.len() >= limit {
                break;
            }
        }
        Ok(names)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Takes away the bits of `dir`'s mode that `mode` does not have (keeping special bits the
/// caller asked for), saying so: an older agent or an admin left it wider.
fn narrow(dir: &Dir, mode: u32) -> Result<()> {
    let now = dir.stat()?.mode;
    if now & !mode & 0o777 != 0 {
        tracing::info!(dir = %dir.path().display(), from = format!("{now:o}"), to = format!("{mode:o}"), "narrowing a directory's mode");
        dir.set_mode(mode)?;
    }
    Ok(())
}

/// Directory `path` with `mode`, made (with its missing parents, each with `mode`) when missing
/// and narrowed when wider (upstream `setupDataDirs` makes its directories 0750 with
/// `os.MkdirAll`; it leaves existing ones as they are). `path` itself must not be a link.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<Dir> {
    match Dir::open(path) {
        Ok(dir) => {
            narrow(&dir, mode)?;
            Ok(dir)
        }
        Err(e) if e.is_not_found() => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(e);
            };
            let parent = if parent.as_os_str().is_empty() {
                Dir::open(Path::new("."))?
            } else {
                match Dir::open(parent) {
                    Ok(d) => d,
                    Err(e) if e.is_not_found() => ensure_dir(parent, mode)?,
                    Err(e) => return Err(e),
                }
            };
            parent.ensure_dir(name, mode)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
    }

    #[test]
    fn components_are_single_and_plain() {
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(check_component(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        for good in ["a", "..data", "..2024_01", ".hidden", "a b"] {
            assert!(check_component(OsStr::new(good)).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn made_directories_and_files_get_their_mode_whatever_the_umask() {
        let root = tempfile::tempdir().expect("tempdir");
        let old = nix::sys::stat::umask(Mode::from_bits_retain(0o077));
        let deep = root.path().join("a/b/c");
        let made = ensure_dir(&deep, 0o750);
        let dir = Dir::open(root.path()).expect("open");
        let file = dir.write_new_file(OsStr::new("f"), b"x", 0o644);
        nix::sys::stat::umask(old);
        made.expect("made");
        file.expect("written");
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode_of(&root.path().join(p)), 0o750, "{p}");
        }
        assert_eq!(mode_of(&root.path().join("f")), 0o644);
        // A new file never replaces what is there.
        assert!(dir.write_new_file(OsStr::new("f"), b"y", 0o644).is_err());
    }

    #[test]
    fn a_wider_existing_directory_is_narrowed_a_narrower_one_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let wide = root.path().join("wide");
        let narrow_dir = root.path().join("narrow");
        std::fs::create_dir(&wide).expect("mkdir");
        std::fs::create_dir(&narrow_dir).expect("mkdir");
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::fs::set_permissions(&narrow_dir, std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        ensure_dir(&wide, 0o750).expect("ensure");
        ensure_dir(&narrow_dir, 0o750).expect("ensure");
        assert_eq!(mode_of(&wide), 0o750);
        assert_eq!(mode_of(&narrow_dir), 0o700);
    }

    #[test]
    fn links_are_never_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("victim"), "keep").expect("write");
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
        let dir = Dir::open(root.path()).expect("open");
        let link = OsStr::new("link");
        let r = dir.open_dir(link);
        assert!(matches!(r, Err(Error::Symlink { .. })), "{r:?}");
        assert!(matches!(
            dir.create_dir(link, 0o755, true),
            Err(Error::Symlink { .. })
        ));
        assert!(matches!(
            dir.open_path(Path::new("link/victim"), true),
            Err(Error::Symlink { .. })
        ));
        assert!(Dir::open(&root.path().join("link")).is_err());
        assert_eq!(
            dir.stat_at(link).expect("stat").map(|s| s.kind),
            Some(FileKind::Symlink)
        );
        // Replacing a link replaces the link.
        dir.replace_file(link, b"mine", 0o600).expect("replaced");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).expect("read"),
            "keep"
        );
        assert_eq!(mode_of(&root.path().join("link")), 0o600);
        assert!(dir.open_path(Path::new("../x"), true).is_err());
    }
}
