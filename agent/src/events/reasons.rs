//! The event reasons the node reports, with upstream's names (`pkg/kubelet/events/event.go`, and
//! the few the call sites spell out themselves: `SystemOOM` in `pkg/kubelet/oom`, the node
//! conditions' in `pkg/kubelet/nodestatus/setters.go`). Admission rejections carry the reason
//! their admit handler gives (`OutOfcpu`, `NodeAffinity`, ...), as upstream's `rejectPod`.

// Containers (kuberuntime_container.go, kuberuntime_manager.go).
pub const CREATED_CONTAINER: &str = "Created";
pub const STARTED_CONTAINER: &str = "Started";
/// Also `FailedToStartContainer` and `FailedToPullImage`: upstream gives all three this reason.
pub const FAILED_TO_CREATE_CONTAINER: &str = "Failed";
pub const KILLING_CONTAINER: &str = "Killing";
/// Also `BackOffPullImage`.
pub const BACK_OFF_START_CONTAINER: &str = "BackOff";
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";

// Pod sandboxes.
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
pub const SANDBOX_CHANGED: &str = "SandboxChanged";

// Images (images/image_manager.go).
pub const PULLING_IMAGE: &str = "Pulling";
pub const PULLED_IMAGE: &str = "Pulled";
pub const FAILED_TO_INSPECT_IMAGE: &str = "InspectFailed";
pub const ERR_IMAGE_NEVER_PULL_POLICY: &str = "ErrImageNeverPull";

// Probes (prober/prober.go).
pub const CONTAINER_UNHEALTHY: &str = "Unhealthy";
pub const CONTAINER_PROBE_WARNING: &str = "ProbeWarning";

// Volumes.
pub const FAILED_MOUNT_VOLUME: &str = "FailedMount";

// Eviction (eviction/eviction_manager.go `Reason`).
pub const EVICTED: &str = "Evicted";

// Active deadline (active_deadline.go `reason`).
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

// The node.
pub const STARTING_KUBELET: &str = "Starting";
pub const NODE_READY: &str = "NodeReady";
pub const NODE_NOT_READY: &str = "NodeNotReady";
pub const NODE_REBOOTED: &str = "Rebooted";
pub const SUCCESSFUL_NODE_ALLOCATABLE_ENFORCEMENT: &str = "NodeAllocatableEnforced";
pub const SYSTEM_OOM: &str = "SystemOOM";
/// The node shutdown manager saw a shutdown or its cancellation (upstream `NodeShutdown`).
pub const NODE_SHUTDOWN: &str = "NodeShutdown";

// Garbage collection (kubelet.go `StartGarbageCollection`, images/image_gc_manager.go).
pub const CONTAINER_GC_FAILED: &str = "ContainerGCFailed";
pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";

/// What the node did, for events.k8s.io's required `action` (upstream's kubelet writes core/v1
/// events, which have none; these name the kubelet operation each event reports on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    PullImage,
    CreateContainer,
    StartContainer,
    KillContainer,
    RunHook,
    CreatePodSandbox,
    ProbeContainer,
    MountVolume,
    AdmitPod,
    EvictPod,
    StartKubelet,
    UpdateNodeStatus,
    EnforceNodeAllocatable,
    WatchOom,
    CollectGarbage,
    ShutdownNode,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::PullImage => "PullImage",
            Action::CreateContainer => "CreateContainer",
            Action::StartContainer => "StartContainer",
            Action::KillContainer => "KillContainer",
            Action::RunHook => "RunHook",
            Action::CreatePodSandbox => "CreatePodSandbox",
            Action::ProbeContainer => "ProbeContainer",
            Action::MountVolume => "MountVolume",
            Action::AdmitPod => "AdmitPod",
            Action::EvictPod => "EvictPod",
            Action::StartKubelet => "StartKubelet",
            Action::UpdateNodeStatus => "UpdateNodeStatus",
            Action::EnforceNodeAllocatable => "EnforceNodeAllocatable",
            Action::WatchOom => "WatchOOM",
            Action::CollectGarbage => "CollectGarbage",
            Action::ShutdownNode => "ShutdownNode",
        }
    }
}
