//! The agent's servers: the gRPC API (`swiftlet.v1`, on a unix socket); the HTTP endpoints
//! (`http.rs`): `/healthz` alone on the healthz address, and the unauthenticated read-only port;
//! and the kubelet server (`full.rs`): TLS (`tls.rs`, its swappable certificate in
//! `serving_cert.rs`, reloaded from changed files by `tls_reload.rs`), authentication and authorization
//! (`auth.rs`, with the API server's reviews in `webhook.rs`), the Summary API (`stats/`),
//! container logs (`logs.rs`) and container access (`streaming.rs`, through `stream_proxy.rs`);
//! and the kubelet's pod-resources API (`podresources.rs`, on its own unix socket).
//! Every listener's connections are bounded (`connections.rs`: a limit, eviction at it, idle and
//! stall deadlines; `track_requests.rs` tells it which are busy); the HTTP ones share one accept
//! loop (`listener.rs`). Upstream counterpart:
//! kubelet `pkg/kubelet/server`; the gRPC API is swiftlet's own.

pub mod auth;
pub mod connections;
pub mod full;
pub mod grpc;
pub mod http;
pub mod listener;
pub mod logs;
pub mod podresources;
pub mod review_cache;
pub mod serving_cert;
pub mod stats;
pub mod stream_proxy;
pub mod streaming;
#[cfg(test)]
mod test_pki;
pub mod tls;
pub mod tls_reload;
pub mod track_requests;
pub mod webhook;

pub use grpc::EventsService;
pub use http::{Health, HttpState};
