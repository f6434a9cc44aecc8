//! Settings of what a pod's securityContext may get: `seccompDefault` (RuntimeDefault seccomp for
//! containers that ask for no profile; flag `--seccomp-default`) and `allowedUnsafeSysctls`
//! (sysctls and `prefix*` patterns beyond the safe set; flag `--allowed-unsafe-sysctls`,
//! comma-separated, repeatable). A pattern is checked as upstream's `NewAllowlist` checks it
//! (syntax, and that the kernel namespaces the sysctl per pod; the rule is in `rules.rs`), so a
//! bad one stops the start naming the field and the value.
//!
//! Not here: the admission itself (`kubelet::sysctl`) and the conversion (`kuberuntime::
//! security_context`). Upstream: `KubeletConfiguration.SeccompDefault`, `AllowedUnsafeSysctls`.

use super::settings::Settings;

/// The securityContext settings, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// Containers without a seccomp profile get the runtime's default instead of none.
    pub seccomp_default: bool,
    /// Unsafe sysctls (or `prefix*` patterns) pods may set, beyond the safe set.
    pub allowed_unsafe_sysctls: Vec<String>,
}

pub(super) fn resolve(settings: &Settings) -> SecurityConfig {
    SecurityConfig {
        seccomp_default: settings.seccomp_default,
        allowed_unsafe_sysctls: settings.allowed_unsafe_sysctls.clone(),
    }
}
