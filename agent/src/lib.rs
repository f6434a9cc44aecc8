//! swiftlet: a Kubernetes node agent that learns what happens to containers from kernel events.
//! The binary (`main.rs`) only wires; everything lives in these modules.

pub mod app;
pub mod certificate;
pub mod cgroup;
pub mod clock;
pub mod cm;
pub mod commands;
pub mod config;
pub mod container;
pub mod cri;
pub mod events;
pub mod eviction;
pub mod hostfs;
pub mod kernel;
pub mod kubelet;
pub mod kuberuntime;
pub mod lock;
pub mod logs;
pub mod metrics;
#[cfg(test)]
mod module_graph_tests;
pub mod node;
pub mod nodeshutdown;
pub mod notify;
pub mod pleg;
pub mod pod;
pub mod pod_workers;
pub mod prober;
pub mod server;
pub mod sources;
pub mod status;
pub mod sys;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
pub mod volume;
