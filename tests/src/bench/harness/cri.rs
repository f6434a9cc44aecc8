//! The benchmark's view of the runtime, over CRI: which of its pods' sandboxes exist, and the
//! clean-up between rounds (swiftlet leaves its pods running when it stops, as the kubelet does,
//! so that the next round starts on an empty runtime). Only pods in the benchmark's namespace
//! are ever touched.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use k8s_cri::v1::{
    ContainerFilter, ContainerStatusRequest, ListContainersRequest, ListPodSandboxRequest,
    PodSandboxFilter, RemoveContainerRequest, RemovePodSandboxRequest, StopPodSandboxRequest,
    VersionRequest, runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;

use super::NAMESPACE;

/// The labels the kubelet (and swiftlet) puts on every sandbox and container: the pod's
/// namespace and UID.
const NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
const UID_LABEL: &str = "io.kubernetes.pod.uid";

/// Where swiftlet keeps pod logs (`/var/log/pods/<namespace>_<name>_<uid>`); the benchmark's are
/// removed after each round.
const POD_LOG_ROOT: &str = "/var/log/pods";

/// How long [`Cri::clear`] keeps trying, and how long it waits between passes.
const CLEAR_TIMEOUT: Duration = Duration::from_secs(30);
const CLEAR_RETRY: Duration = Duration::from_millis(500);

/// Bound on the wait for the CRI plugin of a containerd that has just started.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
}

/// What [`Cri::clear`] found.
#[derive(Debug, Default)]
pub struct Cleared {
    /// Sandboxes, and containers outside them.
    pub found: usize,
    /// The UIDs of the pods whose sandboxes or log folders it removed.
    pub pod_uids: Vec<String>,
}

impl Cri {
    /// Connects to `endpoint` (`unix://PATH`) and waits until CRI answers `Version`.
    pub async fn connect(endpoint: &str) -> Result<Cri> {
        let Some(socket) = endpoint.strip_prefix("unix://") else {
            bail!("{endpoint} is not a unix:// endpoint");
        };
        let socket = PathBuf::from(socket);
        let channel = crate::unix_channel(socket)
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

    /// The runtime's name and version as CRI `Version` gives them, e.g. "containerd 2.1.9".
    pub async fn runtime_version(&mut self) -> Result<String> {
        let version = self
            .runtime
            .version(VersionRequest::default())
            .await
            .context("Version")?
            .into_inner();
        Ok(format!(
            "{} {}",
            version.runtime_name, version.runtime_version
        ))
    }

    fn selector() -> HashMap<String, String> {
        HashMap::from([(NAMESPACE_LABEL.to_owned(), NAMESPACE.to_owned())])
    }

    /// The ids of the benchmark's sandboxes, ready or not.
    pub async fn sandboxes(&mut self) -> Result<Vec<String>> {
        Ok(self
            .list_sandboxes()
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }

    /// The benchmark's sandboxes: id and pod UID.
    async fn list_sandboxes(&mut self) -> Result<Vec<(String, String)>> {
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
            .map(|s| {
                let uid = s.labels.get(UID_LABEL).cloned().unwrap_or_default();
                (s.id, uid)
            })
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

    /// The host pid of a running container's init, from the runtime's verbose status
    /// (containerd reports it as `pid` in the `info` JSON).
    pub async fn container_pid(&mut self, id: &str) -> Result<u32> {
        let status = self
            .runtime
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            })
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner();
        let info = status
            .info
            .get("info")
            .with_context(|| format!("ContainerStatus {id}: no verbose info"))?;
        let pid = serde_json::from_str::<serde_json::Value>(info)
            .ok()
            .and_then(|v| v.get("pid").and_then(serde_json::Value::as_u64))
            .filter(|&pid| pid > 0)
            .with_context(|| format!("ContainerStatus {id}: no pid in its info"))?;
        Ok(u32::try_from(pid)?)
    }

    /// Stops and removes every sandbox and container of the benchmark, and its pod logs. After a
    /// clean round it finds nothing. A pass that fails is tried again for a while: a container
    /// still starting (its swiftlet was stopped midway) cannot be removed until it has started.
    pub async fn clear(&mut self) -> Result<Cleared> {
        let deadline = tokio::time::Instant::now() + CLEAR_TIMEOUT;
        let mut seen = Seen::default();
        loop {
            match self.clear_once(&mut seen).await {
                Ok(()) => break,
                Err(error) if tokio::time::Instant::now() < deadline => {
                    eprintln!("clearing the benchmark's pods: {error:#}; trying again");
                    tokio::time::sleep(CLEAR_RETRY).await;
                }
                Err(error) => return Err(error),
            }
        }
        seen.pod_uids.extend(remove_pod_logs()?);
        Ok(Cleared {
            found: seen.sandboxes.len() + seen.containers.len(),
            pod_uids: seen.pod_uids.into_iter().collect(),
        })
    }

    async fn clear_once(&mut self, seen: &mut Seen) -> Result<()> {
        for (id, uid) in self.list_sandboxes().await? {
            seen.sandboxes.insert(id.clone());
            seen.pod_uids.insert(uid);
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
        for id in self.containers().await? {
            seen.containers.insert(id.clone());
            self.runtime
                .remove_container(RemoveContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .with_context(|| format!("RemoveContainer {id}"))?;
        }
        Ok(())
    }
}

/// What the passes of one [`Cri::clear`] found, each counted once however many passes saw it.
#[derive(Default)]
struct Seen {
    sandboxes: BTreeSet<String>,
    containers: BTreeSet<String>,
    pod_uids: BTreeSet<String>,
}

/// Removes the benchmark's folders under /var/log/pods.
/// Returns the UIDs their names end with (`<namespace>_<name>_<uid>`): a pod whose sandbox never
/// came about still has its log folder, and may have its cgroup.
fn remove_pod_logs() -> Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(POD_LOG_ROOT) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{NAMESPACE}_");
    let mut uids = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            if let Some((_, uid)) = name.rsplit_once('_') {
                uids.push(uid.to_owned());
            }
        }
    }
    Ok(uids)
}
