//! Node allocatable (upstream `GetNodeAllocatableAbsolute` in `pkg/kubelet/cm`): capacity minus
//! the kube and system reservations and the hard eviction thresholds. Admission fits pods into
//! it, the Node object reports it, the volume manager sizes memory-backed volumes by it.
//!
//! Not here: measuring the capacity (the app's node facts) or enforcing it on the `kubepods`
//! cgroup (`cm::pod_cgroups`).

use crate::{
    config::Config,
    eviction::{logic::quantity, thresholds::Signal},
};

/// Allocatable CPU (millicores) and memory (bytes) of a node with `cpu_millis` and
/// `memory_bytes` of capacity: minus the reservations, and for memory also the hard
/// `memory.available` threshold.
pub fn cpu_and_memory(config: &Config, cpu_millis: i64, memory_bytes: u64) -> (i64, i64) {
    let memory = i64::try_from(memory_bytes).unwrap_or(i64::MAX);
    let eviction = hard_threshold(config, Signal::MemoryAvailable, memory);
    (
        (cpu_millis - config.reserved.cpu_millis()).max(0),
        (memory - config.reserved.memory_bytes() - eviction).max(0),
    )
}

/// `ephemeral-storage` capacity and allocatable: the size of the filesystem holding the root dir,
/// minus the reservations and the hard `nodefs.available` threshold. `None` when the filesystem
/// cannot be read.
pub fn ephemeral_storage(config: &Config) -> Option<(u64, u64)> {
    let dir = config
        .root_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(std::path::Path::new("/"));
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    #[allow(
        clippy::useless_conversion,
        reason = "the field widths differ by platform"
    )]
    let capacity = u64::from(stat.blocks()).saturating_mul(u64::from(stat.fragment_size()));
    let capacity_i = i64::try_from(capacity).unwrap_or(i64::MAX);
    let eviction = hard_threshold(config, Signal::NodeFsAvailable, capacity_i);
    let allocatable = (capacity_i - config.reserved.ephemeral_storage_bytes() - eviction).max(0);
    Some((capacity, u64::try_from(allocatable).unwrap_or(0)))
}

/// The largest hard threshold on `signal`, as a quantity of `capacity`; 0 without one.
fn hard_threshold(config: &Config, signal: Signal, capacity: i64) -> i64 {
    config
        .eviction
        .thresholds
        .iter()
        .filter(|t| t.is_hard() && t.signal == signal)
        .map(|t| quantity(t.value, capacity))
        .max()
        .unwrap_or(0)
}
