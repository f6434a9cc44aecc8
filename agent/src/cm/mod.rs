//! Container management on the node's cgroups: which cgroup layout the node has, pod QoS classes
//! and OOM score adjustments, and resource quantities. Later issues add the QoS hierarchy, pod
//! cgroups and the CPU manager here.

pub mod layout;
pub mod pod_cgroups;
pub mod qos;
pub mod quantity;

pub use layout::{CgroupLayout, LayoutError};
