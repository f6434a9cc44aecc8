//! [`RuntimeService`] of the fake: the sandbox and container state machines
//! (created → running → exited → removed; ready → not ready → removed) and the CRI objects
//! containerd would report for them.

use std::time::Duration;

use k8s_cri::v1 as cri;
use tonic::Code;

use super::{Call, Container, FakeRuntime, Sandbox, State, fail, objects::namespace_options};
use crate::cri::{ContainerEventStream, Operation, Result, RuntimeService};

/// Exit code of a process killed by SIGKILL (128 + 9), as containerd reports it.
const EXIT_SIGKILL: i32 = 137;
/// Exit code of a process ended by SIGTERM's default action (128 + 15).
const EXIT_SIGTERM: i32 = 143;

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    fn runtime_name(&self) -> &str {
        &self.runtime_name
    }

    async fn version(&self) -> Result<cri::VersionResponse> {
        let state = self.begin(Call::Version)?;
        Ok(cri::VersionResponse {
            version: "0.1.0".to_owned(),
            runtime_name: self.runtime_name.clone(),
            runtime_version: state.runtime_version.clone(),
            runtime_api_version: "v1".to_owned(),
        })
    }

    async fn status(&self) -> Result<cri::StatusResponse> {
        let state = self.begin(Call::Status)?;
        let condition = |kind: &str, ready: bool| cri::RuntimeCondition {
            r#type: kind.to_owned(),
            status: ready,
            reason: if ready {
                String::new()
            } else {
                format!("{kind}False")
            },
            message: String::new(),
        };
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition("RuntimeReady", state.runtime_ready),
                    condition("NetworkReady", state.network_ready),
                ],
            }),
            runtime_handlers: state.runtime_handlers.clone(),
            features: state.features,
            ..Default::default()
        })
    }

    async fn runtime_config(&self) -> Result<cri::RuntimeConfigResponse> {
        let state = self.begin(Call::RuntimeConfig)?;
        state.runtime_config.ok_or_else(|| {
            fail(
                Operation::RuntimeConfig,
                "",
                Code::Unimplemented,
                "unknown method RuntimeConfig for service runtime.v1.RuntimeService",
            )
        })
    }

    async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String> {
        let op = Operation::RunPodSandbox;
        let meta = config.metadata.clone().unwrap_or_default();
        let mut state = self.begin(Call::RunPodSandbox {
            uid: meta.uid.clone(),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            attempt: meta.attempt,
            runtime_handler: runtime_handler.to_owned(),
        })?;
        if meta.name.is_empty() || meta.namespace.is_empty() || meta.uid.is_empty() {
            return Err(fail(
                op,
                "",
                Code::InvalidArgument,
                "sandbox metadata is incomplete",
            ));
        }
        // containerd reserves the name name_namespace_uid_attempt.
        let taken = state
            .sandboxes
            .values()
            .any(|s| s.config.metadata.as_ref() == Some(&meta));
        if taken {
            return Err(fail(
                op,
                "",
                Code::Unknown,
                "failed to reserve sandbox name",
            ));
        }
        let host_network =
            namespace_options(&config).is_some_and(|n| n.network() == cri::NamespaceMode::Node);
        let ip = (!host_network).then(|| {
            state.next_ip += 1;
            format!("10.88.{}.{}", state.next_ip / 256, state.next_ip % 256)
        });
        let id = state.new_id("sandbox");
        let created_at = state.tick();
        let sandbox = Sandbox {
            config,
            runtime_handler: runtime_handler.to_owned(),
            state: cri::PodSandboxState::SandboxReady,
            created_at,
            ip,
        };
        state.sandboxes.insert(id.clone(), sandbox);
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let op = Operation::StopPodSandbox;
        let mut state = self.begin(Call::StopPodSandbox {
            id: sandbox_id.to_owned(),
        })?;
        let Some(sandbox) = state.sandboxes.get_mut(sandbox_id) else {
            return Err(fail(op, sandbox_id, Code::NotFound, "sandbox not found"));
        };
        sandbox.state = cri::PodSandboxState::SandboxNotready;
        // The network is torn down; containerd then reports no IP.
        sandbox.ip = None;
        kill_containers_of(&mut state, sandbox_id);
        Ok(())
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let mut state = self.begin(Call::RemovePodSandbox {
            id: sandbox_id.to_owned(),
        })?;
        state.containers.retain(|_, c| c.sandbox_id != sandbox_id);
        state.sandboxes.remove(sandbox_id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<cri::PodSandboxStatus> {
        let op = Operation::PodSandboxStatus;
        let state = self.begin(Call::PodSandboxStatus {
            id: sandbox_id.to_owned(),
        })?;
        let Some(s) = state.sandboxes.get(sandbox_id) else {
            return Err(fail(op, sandbox_id, Code::NotFound, "sandbox not found"));
        };
        Ok(s.to_status(sandbox_id))
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let state = self.begin(Call::ListPodSandbox {
            filter: filter.clone(),
        })?;
        let filter = filter.unwrap_or_default();
        Ok(state
            .sandboxes
            .iter()
            .filter(|(id, s)| {
                (filter.id.is_empty() || filter.id == **id)
                    && filter.state.as_ref().is_none_or(|v| v.state() == s.state)
                    && selects(&filter.label_selector, &s.config.labels)
            })
            .map(|(id, s)| s.to_list_item(id))
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        _sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String> {
        let op = Operation::CreateContainer;
        let meta = config.metadata.clone().unwrap_or_default();
        let mut state = self.begin(Call::CreateContainer {
            sandbox_id: sandbox_id.to_owned(),
            name: meta.name.clone(),
            attempt: meta.attempt,
        })?;
        let fail_with = |code, message| Err(fail(op, sandbox_id, code, message));
        if meta.name.is_empty() {
            return fail_with(Code::InvalidArgument, "container metadata is incomplete");
        }
        match state.sandboxes.get(sandbox_id) {
            None => return fail_with(Code::NotFound, "sandbox not found"),
            // containerd looks for the sandbox's task, which a stopped sandbox no longer has.
            Some(s) if s.state != cri::PodSandboxState::SandboxReady => {
                return fail_with(Code::NotFound, "failed to get sandbox container task");
            }
            Some(_) => {}
        }
        let taken = state
            .containers
            .values()
            .any(|c| c.sandbox_id == sandbox_id && c.config.metadata.as_ref() == Some(&meta));
        if taken {
            return fail_with(Code::Unknown, "failed to reserve container name");
        }
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        // The kubelet creates containers from the image id it resolved; a name works too.
        let resolved = state
            .images
            .get(&image)
            .or_else(|| state.images.values().find(|i| i.id == image))
            .map(|i| i.id.clone());
        let Some(image_ref) = resolved else {
            return fail_with(Code::NotFound, "failed to resolve image");
        };
        let id = state.new_id("container");
        let created_at = state.tick();
        let container = Container {
            sandbox_id: sandbox_id.to_owned(),
            resources: config.linux.as_ref().and_then(|l| l.resources.clone()),
            config,
            image_ref,
            state: cri::ContainerState::ContainerCreated,
            created_at,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
        };
        state.containers.insert(id.clone(), container);
        Ok(id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let op = Operation::StartContainer;
        let mut state = self.begin(Call::StartContainer {
            id: container_id.to_owned(),
        })?;
        let now = state.tick();
        let Some(c) = state.containers.get_mut(container_id) else {
            return Err(fail(
                op,
                container_id,
                Code::NotFound,
                "container not found",
            ));
        };
        if c.state != cri::ContainerState::ContainerCreated {
            let message = format!("container is in {} state", c.state.as_str_name());
            return Err(fail(op, container_id, Code::Unknown, &message));
        }
        c.state = cri::ContainerState::ContainerRunning;
        c.started_at = now;
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, grace: Duration) -> Result<()> {
        let op = Operation::StopContainer;
        let mut state = self.begin(Call::StopContainer {
            id: container_id.to_owned(),
            grace,
        })?;
        if !state.containers.contains_key(container_id) {
            return Err(fail(
                op,
                container_id,
                Code::NotFound,
                "container not found",
            ));
        }
        // With a grace period the process is assumed to die of the SIGTERM; a created or
        // exited container is left as it is.
        let code = if grace.is_zero() {
            EXIT_SIGKILL
        } else {
            EXIT_SIGTERM
        };
        state.exit(container_id, code, None);
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let mut state = self.begin(Call::RemoveContainer {
            id: container_id.to_owned(),
        })?;
        state.containers.remove(container_id);
        state.exec_results.remove(container_id);
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>> {
        let state = self.begin(Call::ListContainers {
            filter: filter.clone(),
        })?;
        let filter = filter.unwrap_or_default();
        Ok(state
            .containers
            .iter()
            .filter(|(id, c)| {
                (filter.id.is_empty() || filter.id == **id)
                    && (filter.pod_sandbox_id.is_empty() || filter.pod_sandbox_id == c.sandbox_id)
                    && filter.state.as_ref().is_none_or(|v| v.state() == c.state)
                    && selects(&filter.label_selector, &c.config.labels)
            })
            .map(|(id, c)| c.to_list_item(id))
            .collect())
    }

    async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>> {
        let state = self.begin(Call::ListContainerStats)?;
        let filter = filter.unwrap_or_default();
        Ok(state
            .containers
            .iter()
            .filter(|(id, c)| {
                (filter.id.is_empty() || filter.id == **id)
                    && (filter.pod_sandbox_id.is_empty() || filter.pod_sandbox_id == c.sandbox_id)
                    && selects(&filter.label_selector, &c.config.labels)
            })
            .map(|(id, c)| cri::ContainerStats {
                attributes: Some(cri::ContainerAttributes {
                    id: id.clone(),
                    metadata: c.config.metadata.clone(),
                    labels: c.config.labels.clone(),
                    annotations: c.config.annotations.clone(),
                }),
                writable_layer: state
                    .writable_layers
                    .get(id)
                    .map(|bytes| cri::FilesystemUsage {
                        used_bytes: Some(cri::UInt64Value { value: *bytes }),
                        ..Default::default()
                    }),
                ..Default::default()
            })
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<cri::ContainerStatus> {
        let op = Operation::ContainerStatus;
        let state = self.begin(Call::ContainerStatus {
            id: container_id.to_owned(),
        })?;
        let Some(c) = state.containers.get(container_id) else {
            return Err(fail(
                op,
                container_id,
                Code::NotFound,
                "container not found",
            ));
        };
        let log_dir = state
            .sandboxes
            .get(&c.sandbox_id)
            .map(|s| s.config.log_directory.clone())
            .unwrap_or_default();
        Ok(c.to_status(container_id, &log_dir))
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<()> {
        let op = Operation::UpdateContainerResources;
        let mut state = self.begin(Call::UpdateContainerResources {
            id: container_id.to_owned(),
        })?;
        let Some(c) = state.containers.get_mut(container_id) else {
            return Err(fail(
                op,
                container_id,
                Code::NotFound,
                "container not found",
            ));
        };
        // containerd accepts (and records) an update of an exited container too.
        c.resources = Some(resources);
        Ok(())
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse> {
        let op = Operation::ExecSync;
        let answer = {
            let state = self.begin(Call::ExecSync {
                id: container_id.to_owned(),
                cmd,
                timeout,
            })?;
            let Some(c) = state.containers.get(container_id) else {
                return Err(fail(
                    op,
                    container_id,
                    Code::NotFound,
                    "container not found",
                ));
            };
            if c.state != cri::ContainerState::ContainerRunning {
                let message = format!("container is in {} state", c.state.as_str_name());
                return Err(fail(op, container_id, Code::Unknown, &message));
            }
            (!state.exec_hangs).then(|| {
                state
                    .exec_results
                    .get(container_id)
                    .cloned()
                    .unwrap_or_default()
            })
        };
        if let Some(answer) = answer {
            return Ok(answer);
        }
        let _waiting = WaitingExec::new(&self.execs_waiting);
        if timeout.is_zero() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(timeout).await;
        let message = format!("timeout {timeout:?} exceeded: context deadline exceeded");
        Err(fail(op, container_id, Code::DeadlineExceeded, &message))
    }

    /// As containerd: only a running container's log can be reopened, and reopening creates
    /// the file at its log path afresh if it was renamed away (the one thing about logs the
    /// fake does on disk, so the log manager's rotation can be tested against it).
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let op = Operation::ReopenContainerLog;
        let state = self.begin(Call::ReopenContainerLog {
            id: container_id.to_owned(),
        })?;
        let Some(c) = state.containers.get(container_id) else {
            return Err(fail(
                op,
                container_id,
                Code::NotFound,
                "container not found",
            ));
        };
        if c.state != cri::ContainerState::ContainerRunning {
            return Err(fail(
                op,
                container_id,
                Code::Unknown,
                "container is not running",
            ));
        }
        let log_dir = state
            .sandboxes
            .get(&c.sandbox_id)
            .map(|s| s.config.log_directory.clone())
            .unwrap_or_default();
        if log_dir.is_empty() || c.config.log_path.is_empty() {
            return Ok(());
        }
        let path = std::path::Path::new(&log_dir).join(&c.config.log_path);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map(drop)
            .map_err(|e| {
                let message = format!("failed to create and open log file {}: {e}", path.display());
                fail(op, container_id, Code::Unknown, &message)
            })
    }

    async fn get_container_events(&self) -> Result<ContainerEventStream> {
        let op = Operation::GetContainerEvents;
        let mut state = self.begin(Call::GetContainerEvents)?;
        if !state.container_events {
            // containerd 1.6's answer.
            return Err(fail(
                op,
                "",
                Code::Unimplemented,
                "unknown method GetContainerEvents for service runtime.v1.RuntimeService",
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        state.event_subscribers.push(tx);
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })))
    }
}

/// Running containers of a stopping sandbox are killed without grace.
fn kill_containers_of(state: &mut State, sandbox_id: &str) {
    let running: Vec<String> = state
        .containers
        .iter()
        .filter(|(_, c)| {
            c.sandbox_id == sandbox_id && c.state == cri::ContainerState::ContainerRunning
        })
        .map(|(id, _)| id.clone())
        .collect();
    for id in running {
        state.exit(&id, EXIT_SIGKILL, None);
    }
}

/// CRI label selectors are equality matches, ANDed.
fn selects(
    selector: &std::collections::HashMap<String, String>,
    labels: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Counts an `ExecSync` waiting for its answer for as long as the call lives.
struct WaitingExec(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl WaitingExec {
    fn new(count: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> WaitingExec {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        WaitingExec(count.clone())
    }
}

impl Drop for WaitingExec {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
