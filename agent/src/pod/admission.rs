//! Why a pod was not admitted (upstream `lifecycle.PodAdmitResult`): the one answer every admit
//! handler gives, whether the kubelet's own checks or the eviction manager's.

/// Why a pod was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `OutOfpods`, `OutOfcpu`, `OutOfmemory`, `NodeAffinity`, `NodeName`, `NodePorts`,
    /// `TaintToleration`, `PodOSSelectorNodeLabelDoesNotMatch`, `PodOSNotSupported`,
    /// `UnexpectedAdmissionError` (`kubelet/admission.rs`); the eviction manager's `Evicted`;
    /// `SysctlForbidden`, `AppArmor`,
    /// `SupplementalGroupsPolicyNotSupported`, `UserNamespacesNotSupported`
    /// (`kubelet/security_admission.rs`).
    pub reason: String,
    pub message: String,
}
