//! [`RuntimeService`] over gRPC: request building, per-call deadlines and the response checks
//! of upstream `remote_runtime.go` (`verifySandboxStatus`, `verifyContainerStatus`, empty ids,
//! incomplete `Version`/`Status` answers).

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use super::{GrpcRuntime, request, whole_seconds};
use crate::cri::{ContainerEventStream, Error, Operation, Result, RuntimeService};

/// The CRI API version the kubelet announces in `Version` (`kubeRuntimeAPIVersion`).
const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

#[tonic::async_trait]
impl RuntimeService for GrpcRuntime {
    fn runtime_name(&self) -> &str {
        &self.version.runtime_name
    }

    async fn version(&self) -> Result<cri::VersionResponse> {
        let timeout = Some(self.request_timeout);
        let message = cri::VersionRequest {
            version: KUBE_RUNTIME_API_VERSION.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.version(request(message, timeout));
        self.call(Operation::Version, "", timeout, exchange, check_version)
            .await
    }

    async fn status(&self) -> Result<cri::StatusResponse> {
        let timeout = Some(self.request_timeout);
        let message = cri::StatusRequest { verbose: false };
        let mut client = self.runtime.clone();
        let exchange = client.status(request(message, timeout));
        self.call(Operation::Status, "", timeout, exchange, |r| {
            // The kubelet needs RuntimeReady and NetworkReady to judge the node.
            match &r.status {
                Some(status) if status.conditions.len() >= 2 => Ok(r),
                _ => Err("RuntimeReady or NetworkReady condition are not set"),
            }
        })
        .await
    }

    async fn runtime_config(&self) -> Result<cri::RuntimeConfigResponse> {
        let timeout = Some(self.request_timeout);
        let mut client = self.runtime.clone();
        let exchange = client.runtime_config(request(cri::RuntimeConfigRequest {}, timeout));
        // Every field is optional: a response without `linux` means "no opinion".
        self.call(Operation::RuntimeConfig, "", timeout, exchange, Ok)
            .await
    }

    async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String> {
        // Sandboxes get twice the ordinary deadline (network setup can be slow), as upstream.
        let timeout = Some(self.request_timeout * 2);
        let id = config
            .metadata
            .as_ref()
            .map(|m| format!("{}/{}", m.namespace, m.name))
            .unwrap_or_default();
        let message = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.run_pod_sandbox(request(message, timeout));
        self.call(Operation::RunPodSandbox, &id, timeout, exchange, |r| {
            non_empty(r.pod_sandbox_id, "PodSandboxId is not set")
        })
        .await
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.stop_pod_sandbox(request(message, timeout));
        self.call(
            Operation::StopPodSandbox,
            sandbox_id,
            timeout,
            exchange,
            drop_ok,
        )
        .await
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.remove_pod_sandbox(request(message, timeout));
        self.call(
            Operation::RemovePodSandbox,
            sandbox_id,
            timeout,
            exchange,
            drop_ok,
        )
        .await
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<cri::PodSandboxStatus> {
        let timeout = Some(self.request_timeout);
        let message = cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            verbose: false,
        };
        let mut client = self.runtime.clone();
        let exchange = client.pod_sandbox_status(request(message, timeout));
        self.call(
            Operation::PodSandboxStatus,
            sandbox_id,
            timeout,
            exchange,
            |r| {
                let status = r.status.ok_or("pod sandbox status is nil")?;
                check_sandbox_status(&status)?;
                Ok(status)
            },
        )
        .await
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let timeout = Some(self.request_timeout);
        let message = cri::ListPodSandboxRequest { filter };
        let mut client = self.runtime.clone();
        let exchange = client.list_pod_sandbox(request(message, timeout));
        self.call(Operation::ListPodSandbox, "", timeout, exchange, |r| {
            Ok(r.items)
        })
        .await
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String> {
        let timeout = Some(self.request_timeout);
        let message = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let mut client = self.runtime.clone();
        let exchange = client.create_container(request(message, timeout));
        self.call(
            Operation::CreateContainer,
            sandbox_id,
            timeout,
            exchange,
            |r| non_empty(r.container_id, "ContainerId is not set"),
        )
        .await
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::StartContainerRequest {
            container_id: container_id.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.start_container(request(message, timeout));
        self.call(
            Operation::StartContainer,
            container_id,
            timeout,
            exchange,
            drop_ok,
        )
        .await
    }

    async fn stop_container(&self, container_id: &str, grace: Duration) -> Result<()> {
        // The grace period plus the ordinary deadline, leaving time for the SIGKILL.
        let timeout = Some(self.request_timeout + grace);
        let message = cri::StopContainerRequest {
            container_id: container_id.to_owned(),
            timeout: whole_seconds(grace),
        };
        let mut client = self.runtime.clone();
        let exchange = client.stop_container(request(message, timeout));
        self.call(
            Operation::StopContainer,
            container_id,
            timeout,
            exchange,
            drop_ok,
        )
        .await
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::RemoveContainerRequest {
            container_id: container_id.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.remove_container(request(message, timeout));
        self.call(
            Operation::RemoveContainer,
            container_id,
            timeout,
            exchange,
            drop_ok,
        )
        .await
    }

    async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>> {
        let timeout = Some(self.request_timeout);
        let message = cri::ListContainersRequest { filter };
        let mut client = self.runtime.clone();
        let exchange = client.list_containers(request(message, timeout));
        self.call(Operation::ListContainers, "", timeout, exchange, |r| {
            Ok(r.containers)
        })
        .await
    }

    async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>> {
        let timeout = Some(self.request_timeout);
        let message = cri::ListContainerStatsRequest { filter };
        let mut client = self.runtime.clone();
        let exchange = client.list_container_stats(request(message, timeout));
        self.call(Operation::ListContainerStats, "", timeout, exchange, |r| {
            Ok(r.stats)
        })
        .await
    }

    async fn container_status(&self, container_id: &str) -> Result<cri::ContainerStatus> {
        let timeout = Some(self.request_timeout);
        let message = cri::ContainerStatusRequest {
            container_id: container_id.to_owned(),
            verbose: false,
        };
        let mut client = self.runtime.clone();
        let exchange = client.container_status(request(message, timeout));
        self.call(
            Operation::ContainerStatus,
            container_id,
            timeout,
            exchange,
            |r| {
                let status = r.status.ok_or("container status is nil")?;
                check_container_status(&status)?;
                Ok(status)
            },
        )
        .await
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::UpdateContainerResourcesRequest {
            container_id: container_id.to_owned(),
            linux: Some(resources),
            ..Default::default()
        };
        let mut client = self.runtime.clone();
        let exchange = client.update_container_resources(request(message, timeout));
        let operation = Operation::UpdateContainerResources;
        self.call(operation, container_id, timeout, exchange, drop_ok)
            .await
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse> {
        // The command's own timeout plus the ordinary deadline for the runtime to clean up; no
        // deadline for a command without one, as upstream.
        let deadline = (!timeout.is_zero()).then(|| self.request_timeout + timeout);
        let message = cri::ExecSyncRequest {
            container_id: container_id.to_owned(),
            cmd,
            timeout: whole_seconds(timeout),
        };
        let mut client = self.runtime.clone();
        let exchange = client.exec_sync(request(message, deadline));
        self.call(Operation::ExecSync, container_id, deadline, exchange, Ok)
            .await
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let message = cri::ReopenContainerLogRequest {
            container_id: container_id.to_owned(),
        };
        let mut client = self.runtime.clone();
        let exchange = client.reopen_container_log(request(message, timeout));
        let operation = Operation::ReopenContainerLog;
        self.call(operation, container_id, timeout, exchange, drop_ok)
            .await
    }

    async fn get_container_events(&self) -> Result<ContainerEventStream> {
        // No deadline, as upstream (`context.Background()`): the stream is meant to last; each
        // message is bounded by the client's maximum message size.
        let operation = Operation::GetContainerEvents;
        let mut client = self.runtime.clone();
        let message = request(cri::GetEventsRequest {}, None);
        let mut exchange: Exchange =
            Box::pin(async move { client.get_container_events(message).await });
        let start = Instant::now();
        let opening = match tokio::time::timeout(EVENTS_ANSWER_WAIT, &mut exchange).await {
            Ok(Ok(response)) => Opening::Open(Box::new(response.into_inner())),
            Ok(Err(status)) => {
                self.metrics.observe(operation, start.elapsed(), true);
                let error = Error::from_status(operation, "", &self.endpoint, None, status);
                tracing::debug!(%error, "CRI call failed");
                return Err(error);
            }
            Err(_) => Opening::Waiting(exchange),
        };
        self.metrics.observe(operation, start.elapsed(), false);
        let endpoint = self.endpoint.clone();
        Ok(Box::pin(futures::stream::unfold(opening, move |opening| {
            let endpoint = endpoint.clone();
            let to_error = move |status| Error::from_status(operation, "", &endpoint, None, status);
            async move {
                let mut events = match opening {
                    Opening::Waiting(exchange) => match exchange.await {
                        Ok(response) => Box::new(response.into_inner()),
                        Err(status) => return Some((Err(to_error(status)), Opening::Done)),
                    },
                    Opening::Open(events) => events,
                    Opening::Done => return None,
                };
                match events.message().await {
                    Ok(Some(event)) => Some((Ok(event), Opening::Open(events))),
                    Ok(None) => None,
                    Err(status) => Some((Err(to_error(status)), Opening::Done)),
                }
            }
        })))
    }
}

/// How long a subscription to container events waits for the runtime's answer. A runtime that
/// cannot stream them refuses at once (Unimplemented); one that can (containerd 1.7 and 2.x, on
/// grpc-go) sends its response headers only with the first event, so past this wait the stream
/// is taken as open and the answer is read as its first item.
const EVENTS_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The `GetContainerEvents` call before the runtime answered it.
type Exchange = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    tonic::Response<tonic::Streaming<cri::ContainerEventResponse>>,
                    tonic::Status,
                >,
            > + Send,
    >,
>;

/// Where a container event stream is.
enum Opening {
    /// The runtime has not answered the call yet.
    Waiting(Exchange),
    Open(Box<tonic::Streaming<cri::ContainerEventResponse>>),
    /// Broken: the error was the last item.
    Done,
}

fn drop_ok<T>(_: T) -> Result<(), &'static str> {
    Ok(())
}

fn non_empty(id: String, problem: &'static str) -> Result<String, &'static str> {
    if id.is_empty() { Err(problem) } else { Ok(id) }
}

fn check_version(v: cri::VersionResponse) -> Result<cri::VersionResponse, &'static str> {
    if v.version.is_empty()
        || v.runtime_name.is_empty()
        || v.runtime_version.is_empty()
        || v.runtime_api_version.is_empty()
    {
        return Err("not all fields are set in VersionResponse");
    }
    Ok(v)
}

/// Upstream `verifySandboxStatus`.
pub(super) fn check_sandbox_status(s: &cri::PodSandboxStatus) -> Result<(), &'static str> {
    if s.id.is_empty() {
        return Err("status.Id is not set");
    }
    let Some(m) = &s.metadata else {
        return Err("status.Metadata is not set");
    };
    if m.name.is_empty() || m.namespace.is_empty() || m.uid.is_empty() {
        return Err("metadata.Name, metadata.Namespace or metadata.Uid is not set");
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set");
    }
    Ok(())
}

/// Upstream `verifyContainerStatus`.
pub(super) fn check_container_status(s: &cri::ContainerStatus) -> Result<(), &'static str> {
    if s.id.is_empty() {
        return Err("status.Id is not set");
    }
    match &s.metadata {
        None => return Err("status.Metadata is not set"),
        Some(m) if m.name.is_empty() => return Err("metadata.Name is not set"),
        Some(_) => {}
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set");
    }
    if s.image.as_ref().is_none_or(|i| i.image.is_empty()) {
        return Err("status.Image is not set");
    }
    if s.image_ref.is_empty() {
        return Err("status.ImageRef is not set");
    }
    Ok(())
}
