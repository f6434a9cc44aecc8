//! The securityContext of a pod and its containers as CRI gets it (upstream
//! `pkg/kubelet/kuberuntime/security_context.go` `determineEffectiveSecurityContext`,
//! `pkg/securitycontext/util.go`, `kuberuntime_sandbox_linux.go` `generatePodSandboxLinuxConfig`,
//! `security_context_others.go` `verifyRunAsNonRoot`): pod-level fields merged under the
//! container's, capabilities, privileged, no_new_privs, users and groups, SELinux, the masked and
//! read-only `/proc` paths, namespaces; the seccomp and AppArmor profiles come from
//! `security_profiles.rs`. Pure: the image's user, the kubelet's settings and the
//! user-namespace mappings are handed in.
//!
//! Not here: admission (`kubelet::security_admission`, `kubelet::sysctl`), fsGroup ownership of
//! volume files (`volume`).
//!
//! Deliberate differences from upstream, each for a reason:
//! - A privileged container gets no masked or read-only paths in the request. Upstream sends the
//!   defaults and relies on the runtime to drop them (containerd's `WithPrivileged` does); saying
//!   it in the request keeps the meaning independent of the runtime.
//! - Windows-only fields (`windowsOptions`) are ignored, as upstream ignores them on Linux.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};

use super::security_profiles::profile_of;
pub use super::security_profiles::{
    APPARMOR_ANNOTATION_PREFIX, APPARMOR_LOCALHOST_PREFIX, APPARMOR_RUNTIME_DEFAULT,
    APPARMOR_UNCONFINED, apparmor_profile, apparmor_profile_of, seccomp_profile,
};

/// Paths a container's `/proc` and `/sys` hide (upstream `defaultMaskedPaths`, kept in sync with
/// moby's).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths a container sees read-only (upstream `defaultReadonlyPaths`).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The kubelet settings the conversion depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityOptions {
    /// `<rootDir>/seccomp`: where Localhost seccomp profiles are looked up.
    pub seccomp_profile_root: PathBuf,
    /// `seccompDefault`: RuntimeDefault instead of Unconfined when neither the pod nor the
    /// container asks for a profile.
    pub seccomp_default: bool,
}

impl SecurityOptions {
    /// The options of a kubelet whose state lives in `root_dir`.
    pub fn new(root_dir: &Path, seccomp_default: bool) -> SecurityOptions {
        SecurityOptions {
            seccomp_profile_root: root_dir.join("seccomp"),
            seccomp_default,
        }
    }
}

/// The user an image runs as, from CRI `ImageStatus` (upstream `getImageUser`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageUser {
    Uid(i64),
    /// A name the runtime resolves in the image's `/etc/passwd`.
    Name(String),
}

impl ImageUser {
    /// The image's user; an image that names neither a uid nor a user runs as root.
    pub fn of(image: Option<&cri::Image>) -> ImageUser {
        match image {
            Some(i) if i.uid.is_some() => ImageUser::Uid(i.uid.as_ref().map_or(0, |u| u.value)),
            Some(i) if !i.username.is_empty() => ImageUser::Name(i.username.clone()),
            _ => ImageUser::Uid(0),
        }
    }
}

/// Why a container's security context cannot be built; the message is what its status shows
/// under `CreateContainerConfigError` (upstream's wording where upstream has one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecurityContextError {
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserIsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRunsAsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is \
         non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericImageUser {
        user: String,
        pod: String,
        container: String,
    },
    #[error("localhostProfile must be set if seccompProfile type is Localhost.")]
    SeccompLocalhostMissing,
    #[error("seccompProfile.localhostProfile: Invalid value: {profile:?}: {detail}")]
    SeccompLocalhostPath {
        profile: String,
        detail: &'static str,
    },
    #[error(
        "seccompProfile.type: Unsupported value: {0:?}: supported values: \"Localhost\", \
         \"RuntimeDefault\", \"Unconfined\""
    )]
    SeccompType(String),
    #[error("missing localhost apparmor profile name")]
    AppArmorLocalhostMissing,
    #[error("unknown apparmor profile type: {0:?}")]
    AppArmorType(String),
    #[error("unsupported supplementalGroupsPolicy: {0}")]
    SupplementalGroupsPolicy(String),
}

/// `<name>_<namespace>(<uid>)`, as upstream's `format.Pod` names a pod in messages.
pub fn pod_description(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

pub(super) fn pod_security(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref()?.security_context.as_ref()
}

/// The container's security context with the pod's merged under it (upstream
/// `DetermineEffectiveSecurityContext`): the pod contributes its SELinux options, users and
/// `runAsNonRoot`; a field the container sets wins. Seccomp and AppArmor profiles are resolved
/// apart ([`seccomp_profile`], [`apparmor_profile`]), as upstream does.
pub fn effective_security_context(pod: &Pod, container: &Container) -> SecurityContext {
    let mut effective = pod_security(pod)
        .map(|p| SecurityContext {
            se_linux_options: p.se_linux_options.clone(),
            windows_options: p.windows_options.clone(),
            run_as_user: p.run_as_user,
            run_as_group: p.run_as_group,
            run_as_non_root: p.run_as_non_root,
            ..Default::default()
        })
        .unwrap_or_default();
    let Some(c) = container.security_context.as_ref() else {
        return effective;
    };
    if c.se_linux_options.is_some() {
        effective.se_linux_options.clone_from(&c.se_linux_options);
    }
    if c.capabilities.is_some() {
        effective.capabilities.clone_from(&c.capabilities);
    }
    effective.privileged = c.privileged.or(effective.privileged);
    effective.run_as_user = c.run_as_user.or(effective.run_as_user);
    effective.run_as_group = c.run_as_group.or(effective.run_as_group);
    effective.run_as_non_root = c.run_as_non_root.or(effective.run_as_non_root);
    effective.read_only_root_filesystem = c.read_only_root_filesystem;
    effective.allow_privilege_escalation = c.allow_privilege_escalation;
    if c.proc_mount.is_some() {
        effective.proc_mount.clone_from(&c.proc_mount);
    }
    effective
}

/// Upstream `verifyRunAsNonRoot`: with `runAsNonRoot: true`, a root `runAsUser`, or no
/// `runAsUser` and an image that runs as root or names its user, stops the container.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
) -> Result<(), SecurityContextError> {
    let effective = effective_security_context(pod, container);
    if effective.run_as_non_root != Some(true) {
        return Ok(());
    }
    let pod_name = || pod_description(pod);
    if let Some(uid) = effective.run_as_user {
        if uid == 0 {
            return Err(SecurityContextError::RunAsUserIsRoot {
                pod: pod_name(),
                container: container.name.clone(),
            });
        }
        return Ok(());
    }
    match image_user {
        ImageUser::Uid(0) => Err(SecurityContextError::ImageRunsAsRoot {
            pod: pod_name(),
            container: container.name.clone(),
        }),
        ImageUser::Name(user) => Err(SecurityContextError::NonNumericImageUser {
            user: user.clone(),
            pod: pod_name(),
            container: container.name.clone(),
        }),
        ImageUser::Uid(_) => Ok(()),
    }
}

/// Upstream `AddNoNewPrivileges`: only an explicit `allowPrivilegeEscalation: false` sets it.
pub fn no_new_privileges(effective: &SecurityContext) -> bool {
    effective.allow_privilege_escalation == Some(false)
}

/// Upstream `ConvertToRuntimeMaskedPaths`/`ReadonlyPaths`: `Unmasked` has none, anything else
/// the defaults.
pub fn proc_paths(proc_mount: Option<&str>) -> (Vec<String>, Vec<String>) {
    if proc_mount == Some("Unmasked") {
        return (Vec::new(), Vec::new());
    }
    let owned = |paths: &[&str]| paths.iter().map(|p| (*p).to_owned()).collect();
    (owned(DEFAULT_MASKED_PATHS), owned(DEFAULT_READONLY_PATHS))
}

/// Whether any container of the pod (init, regular, ephemeral) is privileged (upstream
/// `HasPrivilegedContainer`): the sandbox must then allow it.
pub fn has_privileged_container(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let privileged = |sc: Option<&SecurityContext>| sc.and_then(|s| s.privileged) == Some(true);
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| privileged(c.security_context.as_ref()))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| privileged(c.security_context.as_ref()))
}

/// The CRI value of `supplementalGroupsPolicy`, when the pod sets one.
pub fn supplemental_groups_policy(pod: &Pod) -> Result<Option<i32>, SecurityContextError> {
    match pod_security(pod).and_then(|p| p.supplemental_groups_policy.as_deref()) {
        None => Ok(None),
        Some("Merge") => Ok(Some(cri::SupplementalGroupsPolicy::Merge as i32)),
        Some("Strict") => Ok(Some(cri::SupplementalGroupsPolicy::Strict as i32)),
        Some(other) => Err(SecurityContextError::SupplementalGroupsPolicy(
            other.to_owned(),
        )),
    }
}

/// The pod's namespaces (upstream `NamespacesForPod`): network and IPC of the pod or the node,
/// PID of the container, the pod (`shareProcessNamespace`) or the node, and the user namespace
/// the caller chose (`None` for the node's when the runtime is not told).
pub fn namespace_options(pod: &Pod, userns: Option<cri::UserNamespace>) -> cri::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        spec.and_then(f).unwrap_or(false)
    };
    let node_or_pod = |host: bool| {
        if host {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        }
    };
    cri::NamespaceOption {
        network: node_or_pod(flag(|s| s.host_network)),
        pid: if flag(|s| s.host_pid) {
            cri::NamespaceMode::Node as i32
        } else if flag(|s| s.share_process_namespace) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: node_or_pod(flag(|s| s.host_ipc)),
        target_id: String::new(),
        userns_options: userns,
    }
}

/// The container's CRI security context (upstream `determineEffectiveSecurityContext`).
pub fn container_security_context(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
    namespaces: cri::NamespaceOption,
    options: &SecurityOptions,
) -> Result<cri::LinuxContainerSecurityContext, SecurityContextError> {
    let effective = effective_security_context(pod, container);
    let privileged = effective.privileged.unwrap_or(false);
    let (masked_paths, readonly_paths) = if privileged {
        (Vec::new(), Vec::new())
    } else {
        proc_paths(effective.proc_mount.as_deref())
    };
    let (apparmor, apparmor_profile) = apparmor_profile(pod, container)?.unzip();
    let (run_as_user, run_as_username) = match (effective.run_as_user, image_user) {
        (Some(uid), _) => (Some(uid), String::new()),
        (None, ImageUser::Uid(uid)) => (Some(*uid), String::new()),
        (None, ImageUser::Name(name)) => (None, name.clone()),
    };
    let pod_sc = pod_security(pod);
    // Upstream's order: fsGroup, then supplementalGroups.
    let supplemental_groups = pod_sc
        .and_then(|p| p.fs_group)
        .into_iter()
        .chain(
            pod_sc
                .and_then(|p| p.supplemental_groups.clone())
                .into_iter()
                .flatten(),
        )
        .collect();
    #[expect(
        deprecated,
        reason = "containerd 1.6 reads only the deprecated string form of the AppArmor profile"
    )]
    let context = cri::LinuxContainerSecurityContext {
        capabilities: effective.capabilities.as_ref().map(|c| cri::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged,
        namespace_options: Some(namespaces),
        selinux_options: effective.se_linux_options.as_ref().map(selinux_option),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: effective
            .run_as_group
            .map(|value| cri::Int64Value { value }),
        run_as_username,
        readonly_rootfs: effective.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups,
        supplemental_groups_policy: supplemental_groups_policy(pod)?.unwrap_or_default(),
        no_new_privs: no_new_privileges(&effective),
        masked_paths,
        readonly_paths,
        seccomp: Some(seccomp_profile(pod, container, options)?),
        apparmor,
        apparmor_profile: apparmor_profile.unwrap_or_default(),
        seccomp_profile_path: String::new(),
    };
    Ok(context)
}

fn selinux_option(o: &k8s_openapi::api::core::v1::SELinuxOptions) -> cri::SeLinuxOption {
    cri::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// The sandbox's CRI security context (upstream `generatePodSandboxLinuxConfig`): privileged when
/// any container is, RuntimeDefault seccomp always (so that a pod-level profile may be as strict
/// as it likes without breaking the pause process), the pod's users and groups, SELinux options.
pub fn sandbox_security_context(
    pod: &Pod,
    namespaces: cri::NamespaceOption,
) -> Result<cri::LinuxSandboxSecurityContext, SecurityContextError> {
    let sc = pod_security(pod);
    // Upstream's order for the sandbox: fsGroup, then supplementalGroups.
    let supplemental_groups = sc
        .and_then(|p| p.fs_group)
        .into_iter()
        .chain(
            sc.and_then(|p| p.supplemental_groups.clone())
                .into_iter()
                .flatten(),
        )
        .collect();
    Ok(cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces),
        selinux_options: sc
            .and_then(|p| p.se_linux_options.as_ref())
            .map(selinux_option),
        run_as_user: sc
            .and_then(|p| p.run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: sc
            .and_then(|p| p.run_as_group)
            .map(|value| cri::Int64Value { value }),
        readonly_rootfs: false,
        supplemental_groups,
        supplemental_groups_policy: supplemental_groups_policy(pod)?.unwrap_or_default(),
        privileged: has_privileged_container(pod),
        seccomp: Some(profile_of(
            cri::security_profile::ProfileType::RuntimeDefault,
        )),
        apparmor: None,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
