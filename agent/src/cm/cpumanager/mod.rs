//! The CPU manager: under the static policy, a Guaranteed container with whole CPUs gets those
//! CPUs to itself, so that no other pod's work runs there. swiftlet applies an assignment the
//! moment a pod is admitted instead of on the kubelet's 10 s reconcile, and has the scheduler
//! audit it. `manager.rs` allocates at admission and applies cpusets through CRI; `policy.rs`
//! keeps the static policy's bookkeeping; `allocate.rs` (packed) and `distribute.rs`
//! (`distribute-cpus-across-numa`) choose CPUs from the node's topology (`topology.rs`, from
//! sysfs), as sets in cpulist form (`cpuset.rs`); `state.rs` checkpoints the assignments;
//! `audit.rs` and `metrics.rs` read the scheduler audit back. Upstream
//! `pkg/kubelet/cm/cpumanager/` (`cpu_manager.go`, `cpu_assignment.go`, `topology/topology.go`,
//! `policy_static.go`, `state/`) and `k8s.io/utils/cpuset`.
//!
//! The `none` policy is no code: without `--cpu-manager-policy static` there is no CPU manager.
//! Not supported: topology-manager hints, and upstream's pluggable policy interface (the static
//! policy is the only one).

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
