//! Container management on the node's cgroups. For now: which cgroup layout the node has. Later
//! issues add the QoS hierarchy, pod cgroups and the CPU manager here.

pub mod layout;

pub use layout::{CgroupLayout, LayoutError};
