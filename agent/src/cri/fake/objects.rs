//! The fake's records of sandboxes and containers, and the CRI objects containerd reports for
//! them (list items and statuses).

use k8s_cri::v1 as cri;

#[derive(Clone, Debug)]
pub(super) struct Sandbox {
    pub(super) config: cri::PodSandboxConfig,
    pub(super) runtime_handler: String,
    pub(super) state: cri::PodSandboxState,
    pub(super) created_at: i64,
    pub(super) ip: Option<String>,
}

#[derive(Clone, Debug)]
pub(super) struct Container {
    pub(super) sandbox_id: String,
    pub(super) config: cri::ContainerConfig,
    pub(super) image_ref: String,
    pub(super) state: cri::ContainerState,
    pub(super) created_at: i64,
    pub(super) started_at: i64,
    pub(super) finished_at: i64,
    pub(super) exit_code: i32,
    pub(super) reason: String,
    pub(super) resources: Option<cri::LinuxContainerResources>,
}

/// The sandbox's namespace modes, as configured.
pub(super) fn namespace_options(config: &cri::PodSandboxConfig) -> Option<&cri::NamespaceOption> {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|c| c.namespace_options.as_ref())
}

impl Sandbox {
    pub(super) fn to_list_item(&self, id: &str) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.to_owned(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    /// containerd reports an empty IP for a host-network sandbox, and the namespace modes it
    /// was created with.
    pub(super) fn to_status(&self, id: &str) -> cri::PodSandboxStatus {
        cri::PodSandboxStatus {
            id: id.to_owned(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            network: Some(cri::PodSandboxNetworkStatus {
                ip: self.ip.clone().unwrap_or_default(),
                additional_ips: Vec::new(),
            }),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: namespace_options(&self.config).cloned(),
                }),
            }),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }
}

impl Container {
    pub(super) fn to_list_item(&self, id: &str) -> cri::Container {
        cri::Container {
            id: id.to_owned(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.config.image.clone(),
            image_ref: self.image_ref.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            image_id: self.image_ref.clone(),
        }
    }

    /// `log_dir` is the sandbox's log directory (the container's `log_path` is relative to it).
    pub(super) fn to_status(&self, id: &str, log_dir: &str) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: id.to_owned(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: self.config.image.clone(),
            image_ref: self.image_ref.clone(),
            reason: self.reason.clone(),
            message: String::new(),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            mounts: self.config.mounts.clone(),
            log_path: format!("{log_dir}/{}", self.config.log_path),
            resources: self.resources.clone().map(|linux| cri::ContainerResources {
                linux: Some(linux),
                windows: None,
            }),
            image_id: self.image_ref.clone(),
            user: None,
        }
    }
}
