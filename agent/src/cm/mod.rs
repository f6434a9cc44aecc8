//! Container management on the node's cgroups: which cgroup layout the node has, pod QoS classes
//! and OOM score adjustments, resource quantities, the QoS hierarchy and pod cgroups, and their
//! pressure (PSI). Later issues add the CPU manager here.

pub mod layout;
pub mod pod_cgroups;
pub mod pressure_targets;
pub mod psi;
pub mod qos;
pub mod quantity;

pub use layout::{CgroupLayout, LayoutError};
