//! The agent's servers: the gRPC API (`swiftlet.v1`, on a unix socket) and the HTTP endpoints
//! `/healthz` and `/metrics`. Upstream counterpart: kubelet `pkg/kubelet/server` (its healthz and
//! metrics endpoints); the gRPC API is swiftlet's own.

pub mod grpc;
pub mod http;

pub use grpc::EventsService;
pub use http::{Health, HttpState};
