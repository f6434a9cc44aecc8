//! Facts about the node's cgroup tree that several loops read and none owns: which hierarchy is
//! mounted where (`layout`, from `/proc/self/mountinfo`), and where the pods' cgroups are in it
//! (`pods`). Changes nothing: making and changing cgroups is `cm`'s; `kernel` watches them.
//!
//! Imports nothing of the agent but `pod` and `container` (`module_graph_tests.rs` keeps it so),
//! so the kernel side can use it without depending on `cm`.

pub mod layout;
pub mod pods;

pub use layout::{CgroupLayout, LayoutError};
pub use pods::PodCgroupLayout;
