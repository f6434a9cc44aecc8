//! The benchmark's view of the runtime, over CRI: which of its pods' sandboxes exist, and the
//! clean-up between rounds (swiftlet leaves its pods running when it stops, as the kubelet does,
//! so that the next round starts on an empty runtime). Only pods in the benchmark's namespace
//! are ever touched.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use k8s_cri::v1::{
    ContainerFilter, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
    RemoveContainerRequest, RemovePodSandboxRequest, StopPodSandboxRequest, VersionRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;

use super::manifest::NAMESPACE;

/// The label the kubelet (and swiftlet) puts on every sandbox and container with the pod's
/// namespace.
const NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";

/// Where swiftlet keeps pod logs (`/var/log/pods/<namespace>_<name>_<uid>`); the benchmark's are
/// removed after each round.
const POD_LOG_ROOT: &str = "/var/log/pods";

/// Bound on the wait for the CRI plugin of a containerd that has just started.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to `endpoint` (`unix://PATH`) and waits until CRI answers `Version`.
    pub async fn connect(endpoint: &str) -> Result<Cri> {
        let Some(socket) = endpoint.strip_prefix("unix://") else {
            bail!("{endpoint} is not a unix:// endpoint");
        };
        let socket = PathBuf::from(socket);
        let channel = tonic::transport::Endpoint::try_from("http://containerd.invalid")?
            .connect_with_connector(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        let mut runtime = RuntimeServiceClient::new(channel);
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            match runtime.version(VersionRequest::default()).await {
                Ok(_) => return Ok(Cri { runtime }),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => bail!("CRI at {endpoint} did not answer Version: {status}"),
            }
        }
    }

    fn selector() -> HashMap<String, String> {
        HashMap::from([(NAMESPACE_LABEL.to_owned(), NAMESPACE.to_owned())])
    }

    /// The ids of the benchmark's sandboxes, ready or not.
    pub async fn sandboxes(&mut self) -> Result<Vec<String>> {
        let listed = self
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: Self::selector(),
                    ..Default::default()
                }),
            })
            .await
            .context("ListPodSandbox")?;
        Ok(listed
            .into_inner()
            .items
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    async fn containers(&mut self) -> Result<Vec<String>> {
        let listed = self
            .runtime
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    label_selector: Self::selector(),
                    ..Default::default()
                }),
            })
            .await
            .context("ListContainers")?;
        Ok(listed
            .into_inner()
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect())
    }

    /// Stops and removes every sandbox and container of the benchmark, and its pod logs.
    /// Returns how many sandboxes (and containers outside them) it found: after a clean round,
    /// none.
    pub async fn clear(&mut self) -> Result<usize> {
        let sandboxes = self.sandboxes().await?;
        for id in &sandboxes {
            self.runtime
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .with_context(|| format!("StopPodSandbox {id}"))?;
            self.runtime
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .with_context(|| format!("RemovePodSandbox {id}"))?;
        }
        // Removing a sandbox removes its containers; any left belong to no sandbox.
        let containers = self.containers().await?;
        for id in &containers {
            self.runtime
                .remove_container(RemoveContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .with_context(|| format!("RemoveContainer {id}"))?;
        }
        remove_pod_logs()?;
        Ok(containers.len() + sandboxes.len())
    }
}

/// Removes the benchmark's folders under /var/log/pods.
fn remove_pod_logs() -> Result<()> {
    let Ok(entries) = std::fs::read_dir(POD_LOG_ROOT) else {
        return Ok(());
    };
    let prefix = format!("{NAMESPACE}_");
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}
