//! The fake's call log entries: one per CRI call, with the arguments tests assert on.

use std::time::Duration;

use k8s_cri::v1 as cri;

use crate::cri::Operation;

/// One call the fake received, with the arguments tests assert on.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Version,
    Status,
    RuntimeConfig,
    RunPodSandbox {
        uid: String,
        name: String,
        namespace: String,
        attempt: u32,
        runtime_handler: String,
    },
    StopPodSandbox {
        id: String,
    },
    RemovePodSandbox {
        id: String,
    },
    PodSandboxStatus {
        id: String,
    },
    ListPodSandbox {
        filter: Option<cri::PodSandboxFilter>,
    },
    CreateContainer {
        sandbox_id: String,
        name: String,
        attempt: u32,
    },
    StartContainer {
        id: String,
    },
    StopContainer {
        id: String,
        grace: Duration,
    },
    RemoveContainer {
        id: String,
    },
    ListContainers {
        filter: Option<cri::ContainerFilter>,
    },
    ContainerStatus {
        id: String,
    },
    UpdateContainerResources {
        id: String,
    },
    ExecSync {
        id: String,
        cmd: Vec<String>,
        timeout: Duration,
    },
    ReopenContainerLog {
        id: String,
    },
    GetContainerEvents,
    ListContainerStats,
    ListImages,
    ImageStatus {
        image: String,
    },
    PullImage {
        image: String,
    },
    RemoveImage {
        image: String,
    },
    ImageFsInfo,
}

impl Call {
    pub fn operation(&self) -> Operation {
        match self {
            Call::Version => Operation::Version,
            Call::Status => Operation::Status,
            Call::RuntimeConfig => Operation::RuntimeConfig,
            Call::RunPodSandbox { .. } => Operation::RunPodSandbox,
            Call::StopPodSandbox { .. } => Operation::StopPodSandbox,
            Call::RemovePodSandbox { .. } => Operation::RemovePodSandbox,
            Call::PodSandboxStatus { .. } => Operation::PodSandboxStatus,
            Call::ListPodSandbox { .. } => Operation::ListPodSandbox,
            Call::CreateContainer { .. } => Operation::CreateContainer,
            Call::StartContainer { .. } => Operation::StartContainer,
            Call::StopContainer { .. } => Operation::StopContainer,
            Call::RemoveContainer { .. } => Operation::RemoveContainer,
            Call::ListContainers { .. } => Operation::ListContainers,
            Call::ContainerStatus { .. } => Operation::ContainerStatus,
            Call::UpdateContainerResources { .. } => Operation::UpdateContainerResources,
            Call::ExecSync { .. } => Operation::ExecSync,
            Call::ReopenContainerLog { .. } => Operation::ReopenContainerLog,
            Call::GetContainerEvents => Operation::GetContainerEvents,
            Call::ListContainerStats => Operation::ListContainerStats,
            Call::ListImages => Operation::ListImages,
            Call::ImageStatus { .. } => Operation::ImageStatus,
            Call::PullImage { .. } => Operation::PullImage,
            Call::RemoveImage { .. } => Operation::RemoveImage,
            Call::ImageFsInfo => Operation::ImageFsInfo,
        }
    }

    /// The object the call names (a sandbox or container id, an image), empty for the rest.
    pub fn target(&self) -> &str {
        match self {
            Call::StopPodSandbox { id }
            | Call::RemovePodSandbox { id }
            | Call::PodSandboxStatus { id }
            | Call::StartContainer { id }
            | Call::StopContainer { id, .. }
            | Call::RemoveContainer { id }
            | Call::ContainerStatus { id }
            | Call::UpdateContainerResources { id }
            | Call::ExecSync { id, .. }
            | Call::ReopenContainerLog { id } => id,
            Call::CreateContainer { sandbox_id, .. } => sandbox_id,
            Call::ImageStatus { image }
            | Call::PullImage { image }
            | Call::RemoveImage { image } => image,
            Call::RunPodSandbox { .. }
            | Call::Version
            | Call::Status
            | Call::RuntimeConfig
            | Call::GetContainerEvents
            | Call::ListContainerStats
            | Call::ListPodSandbox { .. }
            | Call::ListContainers { .. }
            | Call::ListImages
            | Call::ImageFsInfo => "",
        }
    }
}
