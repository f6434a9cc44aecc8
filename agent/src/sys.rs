//! Where the agent's `unsafe` lives, each block with its reason.

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

/// Reads a `T` from the start of `bytes` (ring-buffer records are 8-aligned, but the slice type
/// does not say so, hence the unaligned read).
pub fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked, and `T: Pod` is valid for any bit pattern.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}
