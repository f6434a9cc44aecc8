//! Facts about a `v1.Pod` that every loop needs, with no loop of their own: its identity (UID,
//! full name), the read-only views of its spec (`spec`), its QoS class (`qos`), its resource
//! quantities and effective requests (`quantity`, `resources`), and the two questions both the
//! runtime decisions and the status generator ask of the runtime's view (`restart`, `sandbox`),
//! and which sysctls a pod may set (`sysctl`, the admission check and its allowlist, which the
//! config validates `allowedUnsafeSysctls` with).
//! Upstream spreads these over `pkg/kubelet/container/helpers.go`, `pkg/kubelet/types`,
//! `pkg/apis/core/v1/helper/qos` and `component-helpers/resource`.
//!
//! This module sits just above `container` (the runtime-neutral model) and imports nothing else
//! of the agent, so that any module may use it without a cycle (`module_graph_tests.rs` keeps it so).
//! Not here: where a pod's cgroup lives (`cgroup`), what is done with any of these facts.

mod admission;
#[cfg(test)]
pub(crate) mod fixtures;
mod identity;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod restart;
pub mod sandbox;
pub mod spec;
pub mod sysctl;

pub use admission::Rejection;
pub use identity::{format_pod, full_name, pod_uid};
