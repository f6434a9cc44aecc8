//! Admission of a pod's security settings: what the node cannot enforce turns the pod away before
//! anything of it starts (phase `Failed`, upstream's reason and message), instead of starting it
//! with less protection than it asked for.
//!
//! - sysctls (`kubelet::sysctl`, upstream `sysctl.patternAllowlist.Admit`): `SysctlForbidden`.
//! - AppArmor (upstream `lifecycle.appArmorAdmitHandler` and `apparmor.validator`): a pod that
//!   needs a profile on a host without AppArmor is refused, reason `AppArmor`, message
//!   `Cannot enforce AppArmor: AppArmor is not enabled on the host`; so is a Localhost profile
//!   without a name. `Unconfined` needs nothing and passes.
//! - `supplementalGroupsPolicy: Strict` (upstream `rejectPodAdmissionBasedOnSupplementalGroupsPolicy`)
//!   on a runtime whose CRI `Status` does not report the feature: `SupplementalGroupsPolicyNotSupported`.
//! - `hostUsers: false` on a runtime handler without the `user_namespaces` feature. Upstream
//!   fails the sandbox's creation instead (the pod stays Pending, retried forever); swiftlet
//!   refuses at admission (reason `UserNamespacesNotSupported`, upstream's message) so the pod
//!   says at once why it will never run here.
//!
//! The AppArmor check differs from upstream in one detail: upstream looks only at the first
//! AppArmor annotation its (randomly ordered) map walk meets; here any annotation that is not
//! `unconfined` requires AppArmor, so the answer does not depend on map order.

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::{admission::Rejection, sysctl::Allowlist};
use crate::{
    container::RuntimeFeatures,
    kuberuntime::security_context::{
        APPARMOR_ANNOTATION_PREFIX, APPARMOR_UNCONFINED, apparmor_profile_of,
    },
};

/// Where the kernel says whether AppArmor is on (what runc's `apparmor.IsEnabled` reads).
pub const APPARMOR_ENABLED_FILE: &str = "/sys/module/apparmor/parameters/enabled";

/// Reasons of the refusals (upstream's where it has one).
pub const APPARMOR_REASON: &str = "AppArmor";
pub const SUPPLEMENTAL_GROUPS_POLICY_REASON: &str = "SupplementalGroupsPolicyNotSupported";
pub const USER_NAMESPACES_REASON: &str = "UserNamespacesNotSupported";

/// Whether the host can enforce AppArmor profiles (upstream `validateHost`), decided once at
/// start, as upstream does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppArmorHost {
    Enabled,
    /// Why not, as upstream words it.
    Unavailable(String),
}

impl AppArmorHost {
    /// The host's answer, from `/sys/module/apparmor/parameters/enabled`.
    pub fn detect() -> AppArmorHost {
        Self::from_enabled_file(
            std::fs::read_to_string(APPARMOR_ENABLED_FILE)
                .ok()
                .as_deref(),
        )
    }

    /// From the enabled file's content (`None`: no such file, no AppArmor module).
    pub fn from_enabled_file(content: Option<&str>) -> AppArmorHost {
        if content.is_some_and(|c| c.starts_with('Y')) {
            AppArmorHost::Enabled
        } else {
            AppArmorHost::Unavailable("AppArmor is not enabled on the host".into())
        }
    }
}

/// The security checks of admission, with what they depend on.
pub struct SecurityAdmission {
    pub sysctls: Allowlist,
    pub apparmor: AppArmorHost,
    /// The runtime's features, from its last CRI `Status` answer (`None` before the first).
    pub features: watch::Receiver<Option<RuntimeFeatures>>,
    /// The runtime handler pods run with (`""`: the runtime's default).
    pub runtime_handler: String,
}

impl SecurityAdmission {
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        self.sysctls.admit(pod)?;
        self.admit_apparmor(pod)?;
        let features = self.features.borrow().clone().unwrap_or_default();
        admit_supplemental_groups_policy(pod, &features)?;
        admit_user_namespaces(pod, &features, &self.runtime_handler)
    }

    /// Upstream `appArmorAdmitHandler.Admit` with `validator.Validate`.
    fn admit_apparmor(&self, pod: &Pod) -> Result<(), Rejection> {
        if !apparmor_required(pod) {
            return Ok(());
        }
        let refuse = |why: String| Rejection {
            reason: APPARMOR_REASON.into(),
            message: format!("Cannot enforce AppArmor: {why}"),
        };
        if let AppArmorHost::Unavailable(why) = &self.apparmor {
            return Err(refuse(why.clone()));
        }
        for container in all_containers(pod) {
            if let Some(profile) = apparmor_profile_of(pod, container)
                && profile.type_ == "Localhost"
                && profile
                    .localhost_profile
                    .as_deref()
                    .is_none_or(|p| p.trim().is_empty())
            {
                return Err(refuse(format!(
                    "invalid empty AppArmor profile name (container {})",
                    container.name
                )));
            }
        }
        Ok(())
    }
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// Upstream `isRequired`: any profile other than Unconfined, in a field or an old annotation.
pub fn apparmor_required(pod: &Pod) -> bool {
    let needs = |p: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| {
        p.is_some_and(|p| p.type_ != "Unconfined")
    };
    let spec = pod.spec.as_ref();
    if needs(
        spec.and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.app_armor_profile.as_ref()),
    ) {
        return true;
    }
    let ephemeral = spec
        .into_iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| c.security_context.as_ref());
    if all_containers(pod)
        .map(|c| c.security_context.as_ref())
        .chain(ephemeral)
        .any(|sc| needs(sc.and_then(|s| s.app_armor_profile.as_ref())))
    {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(key, value)| {
            key.starts_with(APPARMOR_ANNOTATION_PREFIX) && value != APPARMOR_UNCONFINED
        })
}

/// Upstream `rejectPodAdmissionBasedOnSupplementalGroupsPolicy`.
fn admit_supplemental_groups_policy(
    pod: &Pod,
    features: &RuntimeFeatures,
) -> Result<(), Rejection> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.supplemental_groups_policy.as_deref());
    if policy == Some("Strict") && !features.supplemental_groups_policy {
        return Err(Rejection {
            reason: SUPPLEMENTAL_GROUPS_POLICY_REASON.into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    Ok(())
}

/// `hostUsers: false` needs the handler's `user_namespaces` feature.
fn admit_user_namespaces(
    pod: &Pod,
    features: &RuntimeFeatures,
    handler: &str,
) -> Result<(), Rejection> {
    let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
    if host_users == Some(false) && !features.handler_supports_user_namespaces(handler) {
        return Err(Rejection {
            reason: USER_NAMESPACES_REASON.into(),
            message: format!(
                "hostUsers: false needs a user namespace, and this node cannot give one: \
                 RuntimeClass handler {handler:?} does not support user namespaces (the \
                 runtime's CRI Status does not report the user_namespaces feature)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
