//! swiftlet: a Kubernetes node agent that learns what happens to containers from kernel events.
//! The binary (`main.rs`) only wires; everything lives in these modules.

pub mod app;
pub mod cm;
pub mod commands;
pub mod config;
pub mod container;
pub mod kernel;
pub mod metrics;
pub mod server;
pub mod sources;
pub mod sys;
pub mod telemetry;
