//! The seccomp and AppArmor profiles of a container as CRI gets them (upstream
//! `pkg/kubelet/kuberuntime/helpers.go` `getSeccompProfile`/`fieldSeccompProfile`,
//! `getAppArmorProfile`, and `pkg/security/apparmor/helpers.go` `GetProfile`): the container's
//! field, else the old annotation (AppArmor only), else the pod's field, else the kubelet's
//! default.
//!
//! Deliberate differences from upstream, each for a reason:
//! - An unknown `seccompProfile.type` is refused (`CreateContainerConfigError`) instead of meaning
//!   Unconfined: the API server rejects such a pod, but a static pod is not validated there, and
//!   a typo must not silently turn seccomp off.
//! - A Localhost seccomp profile must be a relative path without `..` (the API server's
//!   `validateLocalDescendingPath`), checked here too for the same reason, so the profile the
//!   runtime reads is always below `<rootDir>/seccomp`.

use std::path::{Component, Path};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod, SeccompProfile};

use super::security_context::{SecurityContextError, SecurityOptions, pod_security};

/// Prefix of the old per-container AppArmor annotation (upstream
/// `DeprecatedAppArmorBetaContainerAnnotationKeyPrefix`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// The old annotation's values (upstream `DeprecatedAppArmorBeta*`).
pub const APPARMOR_RUNTIME_DEFAULT: &str = "runtime/default";
pub const APPARMOR_UNCONFINED: &str = "unconfined";
pub const APPARMOR_LOCALHOST_PREFIX: &str = "localhost/";

/// The seccomp profile of a container (upstream `getSeccompProfile`): the container's field,
/// else the pod's, else RuntimeDefault under `seccompDefault` and Unconfined without.
pub fn seccomp_profile(
    pod: &Pod,
    container: &Container,
    options: &SecurityOptions,
) -> Result<cri::SecurityProfile, SecurityContextError> {
    let field = container
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| pod_security(pod).and_then(|p| p.seccomp_profile.as_ref()));
    match field {
        Some(profile) => field_seccomp_profile(profile, &options.seccomp_profile_root),
        None => Ok(profile_of(if options.seccomp_default {
            cri::security_profile::ProfileType::RuntimeDefault
        } else {
            cri::security_profile::ProfileType::Unconfined
        })),
    }
}

pub(super) fn profile_of(kind: cri::security_profile::ProfileType) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: String::new(),
    }
}

/// Upstream `fieldSeccompProfile`, with the API server's path check for Localhost.
fn field_seccomp_profile(
    profile: &SeccompProfile,
    root: &Path,
) -> Result<cri::SecurityProfile, SecurityContextError> {
    use cri::security_profile::ProfileType;
    match profile.type_.as_str() {
        "RuntimeDefault" => Ok(profile_of(ProfileType::RuntimeDefault)),
        "Unconfined" => Ok(profile_of(ProfileType::Unconfined)),
        "Localhost" => {
            let name = profile
                .localhost_profile
                .as_deref()
                .filter(|p| !p.is_empty())
                .ok_or(SecurityContextError::SeccompLocalhostMissing)?;
            let bad = |detail| SecurityContextError::SeccompLocalhostPath {
                profile: name.to_owned(),
                detail,
            };
            let path = Path::new(name);
            if path.is_absolute() {
                return Err(bad("must be a relative path"));
            }
            if name.split('/').any(|part| part == "..") {
                return Err(bad("must not contain '..'"));
            }
            if name.contains('\0') {
                return Err(bad("must not contain a NUL byte"));
            }
            // Only plain components remain (`.` and empty ones are harmless), so the join
            // stays below the root.
            debug_assert!(
                path.components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            );
            Ok(cri::SecurityProfile {
                profile_type: ProfileType::Localhost as i32,
                localhost_ref: root.join(path).display().to_string(),
            })
        }
        other => Err(SecurityContextError::SeccompType(other.to_owned())),
    }
}

/// The AppArmor profile that applies to a container (upstream `apparmor.GetProfile`): its own
/// field, else the old annotation (static pods may have only that), else the pod's field.
pub fn apparmor_profile_of(pod: &Pod, container: &Container) -> Option<AppArmorProfile> {
    if let Some(profile) = container
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
    {
        return Some(profile.clone());
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{APPARMOR_ANNOTATION_PREFIX}{}", container.name)));
    if let Some(value) = annotation {
        let profile = |kind: &str, localhost: Option<&str>| AppArmorProfile {
            type_: kind.to_owned(),
            localhost_profile: localhost.map(str::to_owned),
        };
        if value == APPARMOR_RUNTIME_DEFAULT {
            return Some(profile("RuntimeDefault", None));
        }
        if value == APPARMOR_UNCONFINED {
            return Some(profile("Unconfined", None));
        }
        if let Some(name) = value.strip_prefix(APPARMOR_LOCALHOST_PREFIX) {
            return Some(profile("Localhost", Some(name)));
        }
        // An invalid annotation is ignored, as upstream ignores it.
    }
    pod_security(pod).and_then(|p| p.app_armor_profile.clone())
}

/// The container's AppArmor profile for CRI (upstream `getAppArmorProfile`): the profile and the
/// deprecated string form older runtimes (containerd 1.6) read; `None` leaves the runtime's
/// default.
pub fn apparmor_profile(
    pod: &Pod,
    container: &Container,
) -> Result<Option<(cri::SecurityProfile, String)>, SecurityContextError> {
    use cri::security_profile::ProfileType;
    let Some(profile) = apparmor_profile_of(pod, container) else {
        return Ok(None);
    };
    let converted = match profile.type_.as_str() {
        "RuntimeDefault" => (
            profile_of(ProfileType::RuntimeDefault),
            APPARMOR_RUNTIME_DEFAULT.to_owned(),
        ),
        "Unconfined" => (
            profile_of(ProfileType::Unconfined),
            APPARMOR_UNCONFINED.to_owned(),
        ),
        "Localhost" => {
            let name = profile
                .localhost_profile
                .ok_or(SecurityContextError::AppArmorLocalhostMissing)?;
            (
                cri::SecurityProfile {
                    profile_type: ProfileType::Localhost as i32,
                    localhost_ref: name.clone(),
                },
                format!("{APPARMOR_LOCALHOST_PREFIX}{name}"),
            )
        }
        other => return Err(SecurityContextError::AppArmorType(other.to_owned())),
    };
    Ok(Some(converted))
}
