//! [`StreamingService`] over gRPC: one ordinary-deadline call each, an empty URL an invalid
//! answer (upstream `remote_runtime.go` `Exec`/`Attach`/`PortForward`).

use k8s_cri::v1 as cri;

use super::{GrpcRuntime, request};
use crate::cri::{Operation, Result, StreamingService};

fn url(url: String) -> Result<String, &'static str> {
    if url.is_empty() {
        Err("URL is not set")
    } else {
        Ok(url)
    }
}

#[tonic::async_trait]
impl StreamingService for GrpcRuntime {
    async fn exec(&self, message: cri::ExecRequest) -> Result<String> {
        let timeout = Some(self.request_timeout);
        let id = message.container_id.clone();
        let mut client = self.runtime.clone();
        let exchange = client.exec(request(message, timeout));
        self.call(Operation::Exec, &id, timeout, exchange, |r| url(r.url))
            .await
    }

    async fn attach(&self, message: cri::AttachRequest) -> Result<String> {
        let timeout = Some(self.request_timeout);
        let id = message.container_id.clone();
        let mut client = self.runtime.clone();
        let exchange = client.attach(request(message, timeout));
        self.call(Operation::Attach, &id, timeout, exchange, |r| url(r.url))
            .await
    }

    async fn port_forward(&self, message: cri::PortForwardRequest) -> Result<String> {
        let timeout = Some(self.request_timeout);
        let id = message.pod_sandbox_id.clone();
        let mut client = self.runtime.clone();
        let exchange = client.port_forward(request(message, timeout));
        self.call(Operation::PortForward, &id, timeout, exchange, |r| {
            url(r.url)
        })
        .await
    }
}
