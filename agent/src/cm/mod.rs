//! Container management on the node's cgroups: which cgroup layout the node has, pod QoS classes
//! and OOM score adjustments, resource quantities, the QoS hierarchy and pod cgroups, and their
//! pressure (PSI), and the CPU manager (`cpumanager/`: the static policy, applied at admission
//! and through CRI, and the scheduler audit's view of the exclusive CPUs).

pub mod cpumanager;
pub mod layout;
pub mod pod_cgroups;
pub mod pressure_targets;
pub mod psi;
pub mod qos;
pub mod quantity;

pub use layout::{CgroupLayout, LayoutError};
