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
/// `memory.available` threshold and the node's pre-allocated huge pages, `hugepages_bytes` of
/// them (upstream's `MachineInfo` setter: memory held as huge pages is no pod's to request as
/// memory; it is allocatable as `hugepages-<size>` instead).
pub fn cpu_and_memory(
    config: &Config,
    cpu_millis: i64,
    memory_bytes: u64,
    hugepages_bytes: u64,
) -> (i64, i64) {
    let memory = i64::try_from(memory_bytes).unwrap_or(i64::MAX);
    let eviction = hard_threshold(config, Signal::MemoryAvailable, memory);
    let hugepages = i64::try_from(hugepages_bytes).unwrap_or(i64::MAX);
    (
        (cpu_millis - config.reserved.cpu_millis()).max(0),
        memory
            .saturating_sub(config.reserved.memory_bytes())
            .saturating_sub(eviction)
            .saturating_sub(hugepages)
            .max(0),
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::{Args, Command};

    fn config(flags: &[&str]) -> Config {
        let argv = ["swiftlet", "run"].into_iter().chain(flags.iter().copied());
        let Command::Run(args) = Args::try_parse_from(argv).expect("flags parse").command else {
            panic!("not run");
        };
        Config::load_with(&args, &|| Ok("node".to_owned())).expect("config")
    }

    /// Upstream's example: 16 GiB with 2 GiB of huge pages and 1 GiB reserved, the default
    /// 100Mi hard threshold: the pages come off allocatable memory, never below zero.
    #[test]
    fn huge_pages_come_off_allocatable_memory() {
        const GI: u64 = 1 << 30;
        let config = config(&["--system-reserved", "cpu=500m,memory=1Gi"]);
        let eviction = 100 << 20;
        let (cpu, memory) = cpu_and_memory(&config, 4000, 16 * GI, 2 * GI);
        assert_eq!(cpu, 3500);
        assert_eq!(memory, (13 * GI - eviction) as i64);
        let (_, without) = cpu_and_memory(&config, 4000, 16 * GI, 0);
        assert_eq!(without, (15 * GI - eviction) as i64);
        // More pages than memory (or a sum that overflows): zero, not a negative or a wrap.
        assert_eq!(cpu_and_memory(&config, 4000, 16 * GI, 32 * GI).1, 0);
        assert_eq!(cpu_and_memory(&config, 4000, u64::MAX, u64::MAX).1, 0);
    }
}
