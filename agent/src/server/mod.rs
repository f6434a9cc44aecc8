//! The agent's servers: the gRPC API (`swiftlet.v1`, on a unix socket) and the HTTP endpoints
//! `/healthz`, `/metrics`, `/pods` and `/containerLogs` (`logs.rs`). Upstream counterpart:
//! kubelet `pkg/kubelet/server`; the gRPC API is swiftlet's own.

pub mod grpc;
pub mod http;
pub mod logs;

pub use grpc::EventsService;
pub use http::{Health, HttpState};
