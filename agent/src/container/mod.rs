//! The runtime-neutral model of what runs on the node (upstream: `pkg/kubelet/container`,
//! "kubecontainer"): pods, sandboxes and containers as the runtime reports them, with the labels
//! that tie a runtime object back to its Kubernetes pod. The CRI client (`cri`) produces these;
//! the PLEG caches them; `kuberuntime` decides from them; `status` turns them into `v1.PodStatus`.
//!
//! Not here: the desired state (that is the `v1.Pod` spec) or any CRI type.

mod features;
mod labels;

use std::{collections::BTreeMap, fmt, time::SystemTime};

pub use features::{RuntimeFeatures, RuntimeHandler};
pub use labels::*;

/// A pod's UID (`metadata.uid`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct PodUid(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for PodUid {
    fn from(s: &str) -> Self {
        PodUid(s.to_owned())
    }
}

/// A container (or sandbox) id as the runtime gives it, with the runtime's name, printed as
/// Kubernetes prints it in `containerID`: `containerd://<id>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerId {
    pub runtime: String,
    pub id: String,
}

impl ContainerId {
    pub fn new(runtime: &str, id: &str) -> Self {
        ContainerId {
            runtime: runtime.to_owned(),
            id: id.to_owned(),
        }
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.runtime, self.id)
    }
}

/// The state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// One pod sandbox as the runtime reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxStatus {
    pub id: String,
    pub state: SandboxState,
    pub created_at: SystemTime,
    /// The kubelet's attempt counter for this pod's sandboxes (0 for the first).
    pub attempt: u32,
    /// Pod IPs (empty with host networking until the node IP is filled in by status).
    pub ips: Vec<String>,
    /// Whether the sandbox uses the node's network namespace.
    pub host_network: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The state of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One container instance (one attempt of one spec container) as the runtime reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerStatus {
    pub id: ContainerId,
    /// The spec container's name.
    pub name: String,
    pub state: ContainerState,
    pub created_at: Option<SystemTime>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    pub exit_code: Option<i32>,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`, ...).
    pub reason: String,
    pub message: String,
    /// The image as the spec named it.
    pub image: String,
    /// The image id the runtime resolved (`sha256:...`).
    pub image_ref: String,
    /// Restart count the kubelet recorded when it created this instance (the CRI attempt).
    pub restart_count: u32,
    /// Hash of the spec container this instance was created from ([`container_hash`]).
    pub hash: u64,
    /// Which sandbox it belongs to.
    pub sandbox_id: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Everything the runtime knows about one pod: all its sandboxes and all container instances
/// (every attempt, newest first for each name). Upstream `kubecontainer.PodStatus`.
#[derive(Clone, Debug, PartialEq)]
pub struct PodStatus {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    /// Newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Newest first (by creation time).
    pub containers: Vec<ContainerStatus>,
    /// When the runtime was asked (the PLEG cache orders statuses by this).
    pub observed_at: SystemTime,
}

impl PodStatus {
    /// The status of a pod the runtime knows nothing about.
    pub fn empty(uid: PodUid, name: &str, namespace: &str) -> Self {
        PodStatus {
            uid,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            sandboxes: Vec::new(),
            containers: Vec::new(),
            observed_at: SystemTime::UNIX_EPOCH,
        }
    }

    /// The newest instance of the spec container `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// All instances of the spec container `name`, newest first.
    pub fn instances<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ContainerStatus> {
        self.containers.iter().filter(move |c| c.name == name)
    }

    /// The pod IPs of the newest sandbox.
    pub fn ips(&self) -> &[String] {
        self.sandboxes.first().map_or(&[], |s| &s.ips)
    }
}

/// A lighter view for listing (upstream `kubecontainer.Pod`): what `GetPods` returns, enough for
/// the PLEG to diff container states without a status call per pod.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningPod {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<(String, SandboxState)>,
    /// (container id, spec name, state)
    pub containers: Vec<(ContainerId, String, ContainerState)>,
}
