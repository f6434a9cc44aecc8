//! The streaming half of CRI: `Exec`, `Attach` and `PortForward` do not stream themselves; each
//! returns the URL of the runtime's streaming server where the session is served, which the
//! kubelet server proxies its client to (upstream `internalapi.StreamingRuntime`).

use k8s_cri::v1 as cri;

use super::Result;

#[tonic::async_trait]
pub trait StreamingService: Send + Sync {
    /// The URL of an exec session.
    async fn exec(&self, request: cri::ExecRequest) -> Result<String>;
    /// The URL of an attach session.
    async fn attach(&self, request: cri::AttachRequest) -> Result<String>;
    /// The URL of a port-forward session into a sandbox.
    async fn port_forward(&self, request: cri::PortForwardRequest) -> Result<String>;
}
