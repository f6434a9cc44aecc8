//! Connecting to a socket inside the namespace as a process of its PID namespace: a peer
//! outside it shows as PID 0 in `SO_PEERCRED`, which systemd refuses on its private socket
//! (`bus_on_connection` → `bus_check_peercred` → `getpeercred`: `-ENODATA`) and which leaves
//! the bus daemon no PID for its peer.

use std::{
    fs,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{net::UnixStream, process::CommandExt as _},
    },
    path::Path,
    process::{Command, Stdio},
};

/// A stream connected to `path` by a short-lived child forked into the PID namespace of `pid`:
/// `SO_PEERCRED` names whoever called connect(2), and the socket itself is shared with the
/// child, so it stays here, connected.
pub(super) fn connect(pid: i32, path: &Path) -> std::io::Result<UnixStream> {
    let address = socket_address(path)?;
    // SAFETY: socket(2) has no memory effects; the fd is owned at once.
    let socket = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let fd = socket.as_raw_fd();
    let mut child = Command::new("/bin/true");
    child.stdin(Stdio::null()).stdout(Stdio::null());
    // SAFETY: the closure runs between fork and exec and only calls connect(2) with an
    // address built before the fork, which is async-signal-safe.
    unsafe {
        child.pre_exec(move || {
            let length = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, (&raw const address).cast(), length) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = {
        let _inside = PidNamespaceForChildren::enter(pid)?;
        child.status()?
    };
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "the connecting child exited with {status}"
        )));
    }
    Ok(UnixStream::from(socket))
}

/// This thread's children are forked into another PID namespace until the guard drops
/// (`setns(2)` with `CLONE_NEWPID` changes only `pid_for_children`, and only this thread's).
struct PidNamespaceForChildren {
    original: fs::File,
}

impl PidNamespaceForChildren {
    fn enter(pid: i32) -> std::io::Result<PidNamespaceForChildren> {
        let original = fs::File::open("/proc/thread-self/ns/pid_for_children")?;
        let target = fs::File::open(format!("/proc/{pid}/ns/pid"))?;
        // SAFETY: setns(2) on an open namespace fd; no memory effects.
        if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(PidNamespaceForChildren { original })
    }
}

impl Drop for PidNamespaceForChildren {
    fn drop(&mut self) {
        // SAFETY: as in `enter`; back to this thread's own namespace, which is always allowed.
        if unsafe { libc::setns(self.original.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            panic!(
                "cannot return to the test's own PID namespace: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A `sockaddr_un` for a path socket.
pub(super) fn socket_address(path: &Path) -> std::io::Result<libc::sockaddr_un> {
    use std::os::unix::ffi::OsStrExt as _;
    // SAFETY: sockaddr_un is plain data, valid all zeros.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} cannot be a socket address", path.display()),
        ));
    }
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    Ok(address)
}
