//! The eviction manager (upstream `pkg/kubelet/eviction`), woken by the kernel instead of a 10 s
//! poll: PSI triggers, memory cgroup notifications, OOM kills and reclaim from the eBPF programs,
//! with the periodic check kept as the safety net. Thresholds, ranking, grace periods, minimum
//! reclaim, node conditions and admission follow upstream.
//!
//! - `thresholds.rs`: signals and thresholds as configured;
//! - `logic.rs`: upstream's rules as pure functions;
//! - `observe.rs`: fresh figures from cgroups, `/proc` and `statvfs`;
//! - `rank.rs`: which pod first, and its status message;
//! - `local_storage.rs`: pods over an emptyDir `sizeLimit` or `ephemeral-storage` limits, evicted
//!   before any threshold;
//! - `manager.rs`: the loop and its metrics; `wakeups.rs`: what wakes it; `memcg.rs`: memory
//!   cgroup notifications; `admission.rs`: pods turned away under pressure.

pub mod admission;
pub mod local_storage;
pub mod logic;
pub mod manager;
pub mod memcg;
pub mod observe;
pub mod rank;
pub mod thresholds;
pub mod wakeups;

pub use logic::NodeCondition;
pub use manager::{EvictionManager, EvictionMetrics, Evictor, Sources, WakeSource, Waker};
