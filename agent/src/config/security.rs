//! Settings of what a pod's securityContext may get: `seccompDefault` (RuntimeDefault seccomp for
//! containers that ask for no profile; flag `--seccomp-default`) and `allowedUnsafeSysctls`
//! (sysctls and `prefix*` patterns beyond the safe set; flag `--allowed-unsafe-sysctls`,
//! comma-separated, repeatable). A pattern is checked as upstream's `NewAllowlist` checks it
//! (syntax, and that the kernel namespaces the sysctl per pod), so a bad one stops the start
//! naming the field and the value.
//!
//! Not here: the admission itself (`kubelet::sysctl`) and the conversion (`kuberuntime::
//! security_context`). Upstream: `KubeletConfiguration.SeccompDefault`, `AllowedUnsafeSysctls`.

use super::{
    RunArgs,
    error::{ConfigError, invalid},
    fields::Resolver,
    file::FileConfig,
};
use crate::kubelet::sysctl::Allowlist;

/// The securityContext settings, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// Containers without a seccomp profile get the runtime's default instead of none.
    pub seccomp_default: bool,
    /// Unsafe sysctls (or `prefix*` patterns) pods may set, beyond the safe set.
    pub allowed_unsafe_sysctls: Vec<String>,
}

pub(super) fn resolve(
    r: &Resolver,
    args: &RunArgs,
    file: &FileConfig,
) -> Result<SecurityConfig, ConfigError> {
    let seccomp_default = args
        .seccomp_default
        .or(file.seccomp_default)
        .unwrap_or(false);
    let allowed_unsafe_sysctls = match r.list_field(
        (&args.allowed_unsafe_sysctls, "--allowed-unsafe-sysctls"),
        &file.allowed_unsafe_sysctls,
    ) {
        None => Vec::new(),
        Some((origin, patterns)) => {
            for pattern in &patterns {
                // The kernel release only decides which safe sysctls join; any will do here.
                Allowlist::new(None, std::slice::from_ref(pattern)).map_err(|e| {
                    invalid(
                        &origin,
                        "allowedUnsafeSysctls",
                        "sysctl",
                        pattern,
                        e.to_string(),
                    )
                })?;
            }
            patterns
        }
    };
    Ok(SecurityConfig {
        seccomp_default,
        allowed_unsafe_sysctls,
    })
}
