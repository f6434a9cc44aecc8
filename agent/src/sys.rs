//! Where the agent's `unsafe` lives, each block with its reason, and small facts about this
//! process the kernel decides by (its capabilities).

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use tokio::io::{Interest, unix::AsyncFd};

/// Registers an fd-owning object with the runtime for readability.
pub fn register_readable<T: AsFd + AsRawFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `T: AsFd` owns (or borrows for its whole lifetime) an open fd and returns the same
    // one from `as_raw_fd` each time (aya's `RingBuf` and `EbpfLogger` hand out their map's fd);
    // the `AsyncFd` owns `inner`, so the fd outlives the registration.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(io::Error::from)
}

/// Registers an open file with the runtime for its exceptional condition (POLLPRI), which is how
/// the kernel signals a PSI trigger.
pub fn register_priority(file: std::fs::File) -> io::Result<AsyncFd<std::fs::File>> {
    // SAFETY: a `File` owns its fd and returns the same one from `as_raw_fd` for its whole life;
    // the `AsyncFd` owns the file, so the fd outlives the registration.
    unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }.map_err(io::Error::from)
}

/// Reads a `T` from the start of `bytes` (ring-buffer records are 8-aligned, but the slice type
/// does not say so, hence the unaligned read).
pub fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked, and `T: Pod` is valid for any bit pattern.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Whether this process's effective capability set has capability number `cap` (e.g. 24,
/// CAP_SYS_RESOURCE), read from `/proc/self/status`.
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << cap) != 0)
}

/// Keeps `fd` open in `command`'s child across its exec (the parent's copy stays close-on-exec,
/// so that no other child inherits it): executing `/proc/self/fd/N` needs it, and so does the
/// interpreter of a `#!` script executed that way, which opens the script by that name.
pub fn keep_fd_across_exec(command: &mut tokio::process::Command, fd: std::os::fd::RawFd) {
    let clear = move || {
        // SAFETY: `fcntl(F_SETFD)` on a descriptor number takes no pointers; a bad number is
        // an error returned, not undefined behaviour.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec and only calls `fcntl`, which
    // is async-signal-safe; it allocates nothing and touches no lock of the parent's threads.
    unsafe {
        command.pre_exec(clear);
    }
}
