//! Container management on the node's cgroups: OOM score adjustments, CPU requests as cgroup
//! values (`helpers`), the QoS hierarchy and pod cgroups, and their pressure (PSI), and the CPU
//! manager (`cpumanager/`: the static policy, applied at admission and through CRI, and the
//! scheduler audit's view of the exclusive CPUs), and the reserved cgroups' limits
//! (`reserved_cgroups`). Which cgroup layout the node has (`cgroup`),
//! QoS classes and resource quantities (`pod`) are facts below every loop, re-exported here.

pub mod cpumanager;
pub mod helpers;
pub mod hugepages;
pub mod pod_cgroups;
pub mod pressure_targets;
pub mod psi;
pub mod qos;
pub mod reserved_cgroups;
pub mod systemd;

// The node's cgroup layout and resource quantities are facts every loop reads (`cgroup`, `pod`,
// below them all); these keep the paths `cm`'s callers have always used.
pub use crate::cgroup::layout::{self, CgroupLayout, LayoutError};
pub use crate::pod::quantity;
