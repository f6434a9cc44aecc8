//! A test-only program for the kernel matrix (`cargo xtask vm-test`), built as its own object so
//! that nothing of it reaches the agent's programs: it deliberately needs a feature newer than
//! Linux 6.1 (cgroup local storage and its `bpf_cgrp_storage_get` helper, 6.2), so on 6.1 the
//! matrix must show it refused with that reason, and on newer kernels loaded and attached.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    btf_maps::CgrpStorage,
    macros::{btf_map, tracepoint},
    programs::TracePointContext,
};

#[btf_map]
static CANARY_STORAGE: CgrpStorage<u64> = CgrpStorage::new();

#[tracepoint]
pub fn canary_exec(_ctx: TracePointContext) -> u32 {
    // SAFETY: the helper takes a null cgroup (it returns null then); nothing is dereferenced.
    let value = unsafe { CANARY_STORAGE.get_ptr_mut(core::ptr::null_mut()) };
    u32::from(value.is_null())
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the program above has no panicking path.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// Built for the host only so that workspace-wide `cargo build`/`clippy` work; never run.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
