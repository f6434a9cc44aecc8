//! The node's filesystem as swiftlet touches it: through directory file descriptors, one path
//! component at a time, never following a symbolic link it did not make and never crossing a
//! mount point it was not asked to cross, with every directory and file given a deliberate mode
//! (the umask never decides).
//!
//! swiftlet runs as root next to containers that write into their volumes (emptyDir, hostPath)
//! and local users who may write below directories a misconfiguration opened to them. A path
//! that is checked and then used by name can be swapped between the two (the class of
//! CVE-2017-1002101 and CVE-2021-25741); a descriptor cannot. So:
//! - [`Dir`] is an open directory; its children are opened with `openat2`
//!   (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and `RESOLVE_NO_XDEV` where a mount must not be
//!   crossed), made with `mkdirat` + `fchmod`, read with `readlinkat`/`fstatat`, written with
//!   `O_CREAT | O_EXCL | O_NOFOLLOW`, removed with `unlinkat`.
//! - [`remove_all`] removes a tree through descriptors (upstream's `os.RemoveAll` follows no
//!   links either, but crosses mounts): a link is removed as a link, a mount point is refused by
//!   name, and a tree of any depth is removed with a bounded number of open descriptors.
//! - [`ensure_dir`] makes swiftlet's own directories with their mode and narrows one that exists
//!   with a wider mode (an upgraded node keeps no world-readable pod directories).
//!
//! The path kept in a [`Dir`] is only for messages: nothing is ever resolved by it again.

mod burst;
mod dir;
mod remove;

pub use burst::{BurstEnd, next_burst};
pub use dir::{Dir, FileKind, Stat, check_component, ensure_dir, proc_fd_path};
pub use remove::{MAX_OPEN_DEPTH, remove_all, remove_path};

use std::{io, path::PathBuf};

/// What went wrong, with the path it concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is a symbolic link, which swiftlet does not follow")]
    Symlink { path: PathBuf },
    #[error("{path} is a mount point, which swiftlet does not cross")]
    MountPoint { path: PathBuf },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{name:?} is not a single path component")]
    BadComponent { name: String },
    #[error("{path} kept changing while it was being removed")]
    Unstable { path: PathBuf },
}

impl Error {
    /// The OS error behind an I/O failure, if that is what it was.
    pub fn errno(&self) -> Option<nix::Error> {
        match self {
            Error::Io { source, .. } => source.raw_os_error().map(nix::Error::from_raw),
            _ => None,
        }
    }

    /// Whether the thing was not there.
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(nix::Error::ENOENT)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of `op` on `path` from a nix call.
pub(crate) fn errno(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(nix::Error) -> Error {
    let path = path.into();
    move |e| match e {
        nix::Error::ELOOP => Error::Symlink { path },
        nix::Error::EXDEV => Error::MountPoint { path },
        nix::Error::ENOTDIR => Error::NotADirectory { path },
        e => Error::Io {
            op,
            path,
            source: io::Error::from(e),
        },
    }
}
