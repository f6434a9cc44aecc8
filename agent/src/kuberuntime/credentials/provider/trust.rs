//! Whether a path may tell the agent what to execute as root: the credential provider
//! configuration (a file, or a directory and every file merged from it), the bin dir and each
//! plugin. swiftlet runs as root and executes the plugins the configuration names from the bin
//! dir, so a local user who can write any of them, or any directory above them, can run code as
//! root. Upstream's kubelet checks none of this (`RegisterCredentialProviderPlugins` only asks
//! `exec.LookPath`); the checks here are sshd's `StrictModes` (`secure_filename`) and sudo's
//! checks of its sudoers and plugin files:
//!
//! - every component of the path is opened from `/` one at a time with `O_PATH|O_NOFOLLOW`
//!   and inspected through its descriptor (never re-resolved by name); a symbolic link anywhere
//!   is refused;
//! - every directory on the way, `/` included, and the path itself must be owned by root (or
//!   the agent's effective uid) and writable by neither its group nor others — a sticky,
//!   world-writable directory such as `/tmp` is refused too, since anyone may create the next
//!   component in it;
//! - the path must be of the kind expected: the configuration a regular file or a directory,
//!   its merged files regular files, the bin dir a directory, a plugin a regular file with an
//!   execute bit.
//!
//! The caller keeps the descriptor of what was checked and reads or executes through it
//! (`/proc/self/fd/N`), so a swap after the check cannot substitute another file.
//!
//! Not here: what the files say (`config.rs`) or the exec (`exec.rs`).

use std::{
    ffi::OsStr,
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Component, Path, PathBuf},
};

use nix::{
    fcntl::OFlag,
    sys::stat::{FileStat, Mode, SFlag},
};

/// What a checked path is to the agent; it names the path in an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// `--image-credential-provider-config`: a file or a directory of files.
    Config,
    /// One file merged from the configuration directory.
    ConfigFile,
    /// `--image-credential-provider-bin-dir`.
    BinDir,
    /// A plugin binary in the bin dir.
    Plugin,
}

impl What {
    pub fn noun(self) -> &'static str {
        match self {
            What::Config => "credential provider config",
            What::ConfigFile => "credential provider config file",
            What::BinDir => "credential provider bin dir",
            What::Plugin => "credential provider plugin",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            What::Config => "a regular file or a directory",
            What::ConfigFile => "a regular file",
            What::BinDir => "a directory",
            What::Plugin => "a regular file with an execute bit",
        }
    }
}

/// Why a path is not trusted. Each names the path, what it is and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{what} {}: not found", path.display())]
    NotFound { what: &'static str, path: PathBuf },
    #[error("unable to inspect {what} {}: {source}", path.display())]
    Inspect {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: the path has a '..' component; expected a path without one", path.display())]
    ParentComponent { what: &'static str, path: PathBuf },
    #[error(
        "{what} {}: a symbolic link (owner uid {uid}); expected no symbolic link on the path \
         (links are not followed)",
        path.display()
    )]
    Symlink {
        what: &'static str,
        path: PathBuf,
        uid: u32,
    },
    #[error(
        "{what} {}: owned by uid {uid} (mode {mode:04o}); expected owned by root{}",
        path.display(),
        agent_uid.map(|u| format!(" or the agent's uid {u}")).unwrap_or_default()
    )]
    Owner {
        what: &'static str,
        path: PathBuf,
        uid: u32,
        mode: u32,
        agent_uid: Option<u32>,
    },
    #[error(
        "{what} {}: mode {mode:04o} (owner uid {uid}) is writable by {}; expected writable by \
         its owner only",
        path.display(),
        writable_by(*mode)
    )]
    Writable {
        what: &'static str,
        path: PathBuf,
        uid: u32,
        mode: u32,
    },
    #[error("{what} {}: a {kind} (mode {mode:04o}); expected {expected}", path.display())]
    Kind {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
        mode: u32,
        expected: &'static str,
    },
}

fn writable_by(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "its group and others",
        (true, false) => "its group",
        _ => "others",
    }
}

/// Who may own the paths, and from which directory down ancestors are checked.
#[derive(Clone, Debug)]
pub struct Trust {
    /// The agent's effective uid, trusted as root is.
    agent_uid: u32,
    /// Directories above this one are not checked: `/` for the agent (everything is).
    checked_from: PathBuf,
}

impl Trust {
    /// The agent's trust: root and the agent's effective uid, every ancestor checked.
    pub fn system() -> Trust {
        Trust {
            agent_uid: nix::unistd::geteuid().as_raw(),
            checked_from: PathBuf::from("/"),
        }
    }

    /// Trust as [`Trust::system`], but the directories above `dir` unchecked: for unit tests in
    /// a temporary directory (whose parent is a sticky `/tmp`). `dir` itself is checked.
    #[cfg(test)]
    pub fn beneath(dir: &Path) -> Trust {
        Trust {
            agent_uid: nix::unistd::geteuid().as_raw(),
            checked_from: dir.to_owned(),
        }
    }

    /// Opens `path` (`O_PATH`) after checking it and every directory above it; the descriptor
    /// is of the checked file.
    pub fn open(&self, path: &Path, what: What) -> Result<OwnedFd, TrustError> {
        let noun = what.noun();
        let absolute = std::path::absolute(path).map_err(|source| TrustError::Inspect {
            what: noun,
            path: path.to_owned(),
            source,
        })?;
        let mut names: Vec<&OsStr> = Vec::new();
        for component in absolute.components() {
            match component {
                Component::Normal(name) => names.push(name),
                Component::ParentDir => {
                    return Err(TrustError::ParentComponent {
                        what: noun,
                        path: absolute.clone(),
                    });
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        let root = Path::new("/");
        let mut dir = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| inspect_error("directory", root, e))?;
        let Some((last, above)) = names.split_last() else {
            let stat = fstat(&dir, "directory", root)?;
            self.check_final(root, &stat, what)?;
            return Ok(dir);
        };
        let mut at = PathBuf::from("/");
        self.check_directory(&at, &fstat(&dir, "directory", &at)?)?;
        for name in above {
            at.push(name);
            let next = open_at(&dir, name, "directory", &at)?;
            self.check_directory(&at, &fstat(&next, "directory", &at)?)?;
            dir = next;
        }
        at.push(last);
        self.open_in(&dir, &at, what)
    }

    /// Opens the entry `path` names in `dir` (already checked, with its ancestors) after
    /// checking it as `what`.
    pub fn open_in(&self, dir: &OwnedFd, path: &Path, what: What) -> Result<OwnedFd, TrustError> {
        let noun = what.noun();
        let Some(name) = path.file_name() else {
            return Err(TrustError::ParentComponent {
                what: noun,
                path: path.to_owned(),
            });
        };
        let fd = open_at(dir, name, noun, path)?;
        let stat = fstat(&fd, noun, path)?;
        self.check_final(path, &stat, what)?;
        Ok(fd)
    }

    fn check_directory(&self, path: &Path, stat: &FileStat) -> Result<(), TrustError> {
        let what = "directory";
        check_not_link(path, stat, what)?;
        if !path.starts_with(&self.checked_from) {
            return Ok(());
        }
        if file_type(stat) != SFlag::S_IFDIR {
            return Err(kind_error(path, stat, what, "a directory"));
        }
        self.check_owner_and_mode(path, stat, what)
    }

    fn check_final(&self, path: &Path, stat: &FileStat, what: What) -> Result<(), TrustError> {
        let noun = what.noun();
        check_not_link(path, stat, noun)?;
        let kind = file_type(stat);
        let fits = match what {
            What::Config => kind == SFlag::S_IFREG || kind == SFlag::S_IFDIR,
            What::ConfigFile => kind == SFlag::S_IFREG,
            What::BinDir => kind == SFlag::S_IFDIR,
            What::Plugin => kind == SFlag::S_IFREG && stat.st_mode & 0o111 != 0,
        };
        if !fits {
            return Err(kind_error(path, stat, noun, what.expected()));
        }
        self.check_owner_and_mode(path, stat, noun)
    }

    fn check_owner_and_mode(
        &self,
        path: &Path,
        stat: &FileStat,
        what: &'static str,
    ) -> Result<(), TrustError> {
        let mode = stat.st_mode & 0o7777;
        if stat.st_uid != 0 && stat.st_uid != self.agent_uid {
            return Err(TrustError::Owner {
                what,
                path: path.to_owned(),
                uid: stat.st_uid,
                mode,
                agent_uid: (self.agent_uid != 0).then_some(self.agent_uid),
            });
        }
        if mode & 0o022 != 0 {
            return Err(TrustError::Writable {
                what,
                path: path.to_owned(),
                uid: stat.st_uid,
                mode,
            });
        }
        Ok(())
    }
}

/// The path through which the file `fd` holds is opened again (for reading) or executed:
/// the magic link resolves to the very inode that was checked, whatever its name is now.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn open_at(
    dir: &OwnedFd,
    name: &OsStr,
    what: &'static str,
    path: &Path,
) -> Result<OwnedFd, TrustError> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| inspect_error(what, path, e))
}

fn fstat(fd: &OwnedFd, what: &'static str, path: &Path) -> Result<FileStat, TrustError> {
    nix::sys::stat::fstat(fd).map_err(|e| inspect_error(what, path, e))
}

fn inspect_error(what: &'static str, path: &Path, errno: nix::errno::Errno) -> TrustError {
    if errno == nix::errno::Errno::ENOENT {
        TrustError::NotFound {
            what,
            path: path.to_owned(),
        }
    } else {
        TrustError::Inspect {
            what,
            path: path.to_owned(),
            source: errno.into(),
        }
    }
}

fn file_type(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

fn check_not_link(path: &Path, stat: &FileStat, what: &'static str) -> Result<(), TrustError> {
    if file_type(stat) == SFlag::S_IFLNK {
        return Err(TrustError::Symlink {
            what,
            path: path.to_owned(),
            uid: stat.st_uid,
        });
    }
    Ok(())
}

fn kind_error(
    path: &Path,
    stat: &FileStat,
    what: &'static str,
    expected: &'static str,
) -> TrustError {
    let kind = match file_type(stat) {
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFREG if stat.st_mode & 0o111 == 0 => "file without an execute bit",
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        _ => "file of unknown type",
    };
    TrustError::Kind {
        what,
        path: path.to_owned(),
        kind,
        mode: stat.st_mode & 0o7777,
        expected,
    }
}

#[cfg(test)]
#[path = "trust_tests.rs"]
mod tests;
