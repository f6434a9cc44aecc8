//! The CPU manager's core for the static policy: CPU sets in cpulist form, the node's CPU
//! topology (from sysfs), the packed choice of exclusive and reserved CPUs, the
//! `distribute-cpus-across-numa` choice (`distribute.rs`), and the checkpointed
//! assignments (`state.rs`). Upstream `pkg/kubelet/cm/cpumanager/` (`cpu_assignment.go`,
//! `topology/topology.go`, the CPU parts of `policy_static.go`, `state/`) and
//! `k8s.io/utils/cpuset`. Not here yet (issue 6 is in progress): the policy trait and its
//! none/static implementations, topology-manager hints, and applying assignments through CRI.

pub mod allocate;
pub mod audit;
pub mod cpuset;
pub mod distribute;
pub mod manager;
pub mod metrics;
pub mod policy;
pub mod state;
pub mod topology;

pub use allocate::{AllocateError, reserved_cpus, take_by_topology, take_full_physical_cores};
pub use cpuset::{CpuSet, CpuSetError, CpuSetErrorReason};
pub use distribute::take_by_topology_numa_distributed;
pub use manager::{AdmitError, ApplyMode, CpuManager, CpuManagerOptions, OnBadCheckpoint};
pub use policy::{PolicyError, PolicyOptions, StaticPolicy};
pub use topology::{CpuInfo, Topology, TopologyError};
