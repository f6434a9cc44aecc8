//! The flags of every command that loads the kernel programs (`swiftlet run`, `swiftlet events`):
//! which cgroup subtrees to watch and the size of the events ring buffer.
//!
//! Not here: loading the programs (`kernel/`). No upstream counterpart: the kubelet has no kernel
//! programs.

use std::path::PathBuf;

use clap::Args as ClapArgs;

use crate::kernel::LoadOptions;

/// Flags shared by every command that loads the kernel programs.
#[derive(Clone, Debug, PartialEq, Eq, ClapArgs)]
pub struct KernelArgs {
    /// Only events of this cgroup subtree (repeatable): a directory on the cgroup2 mount, or a
    /// path relative to it. Without any, the whole machine.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<PathBuf>,
    /// Size of the kernel's events ring buffer in bytes: a power-of-two multiple of the page size.
    #[arg(long, value_name = "BYTES", default_value_t = swiftlet_common::DEFAULT_RING_BYTES)]
    pub ring_buffer_bytes: u32,
}

impl KernelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            ring_bytes: self.ring_buffer_bytes,
            watch: self.cgroups.clone(),
            // Only the eviction manager arms the level trigger: the agent turns it on for it.
            memcg_level: false,
            ..LoadOptions::default()
        }
    }
}
