//! Which sysctls a pod may set (upstream `pkg/kubelet/sysctl`: `allowlist.go`, `safe_sysctls.go`,
//! and `component-helpers/node/util/sysctl/namespace.go`): the safe set, plus what the node's
//! `allowedUnsafeSysctls` names (a sysctl or a `prefix*` pattern) among the sysctls the kernel
//! namespaces per pod (IPC and network ones). Anything else turns the pod away at admission,
//! `Failed` with reason `SysctlForbidden`. A sysctl of a namespace the pod shares with the host
//! (`hostNetwork`, `hostIPC`) is refused even when allowed, since it would change the node.
//!
//! Pure: the kernel version (for the safe sysctls newer kernels namespace) is handed in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::admission::Rejection;

/// Reason of a pod refused for its sysctls (upstream `ForbiddenReason`).
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";
/// Upstream `SysctlMaxLength`.
pub const SYSCTL_MAX_LENGTH: usize = 253;
/// Upstream `SysctlContainSlashPatternFmt`, for messages.
pub const SYSCTL_PATTERN_REGEX: &str =
    r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// The safe sysctls and the kernel release that namespaces each (upstream `safeSysctls`).
const SAFE_SYSCTLS: &[(&str, Option<(u32, u32)>)] = &[
    ("kernel.shm_rmid_forced", None),
    ("net.ipv4.ip_local_port_range", None),
    ("net.ipv4.tcp_syncookies", None),
    ("net.ipv4.ping_group_range", None),
    ("net.ipv4.ip_unprivileged_port_start", None),
    ("net.ipv4.ip_local_reserved_ports", Some((3, 16))),
    ("net.ipv4.tcp_keepalive_time", Some((4, 5))),
    ("net.ipv4.tcp_fin_timeout", Some((4, 6))),
    ("net.ipv4.tcp_keepalive_intvl", Some((4, 5))),
    ("net.ipv4.tcp_keepalive_probes", Some((4, 5))),
    ("net.ipv4.tcp_rmem", Some((4, 15))),
    ("net.ipv4.tcp_wmem", Some((4, 15))),
];

/// The kernel namespace a sysctl belongs to (upstream `utilsysctl.Namespace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    Ipc,
    Net,
}

/// Why a sysctl is refused (upstream `validateSysctl`'s messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForbiddenSysctl {
    #[error("{sysctl:?} not allowlisted")]
    NotAllowlisted { sysctl: String },
    #[error("{sysctl:?} not allowed with host {} enabled", namespace.as_str())]
    HostNamespace {
        sysctl: String,
        namespace: Namespace,
    },
}

impl Namespace {
    /// Upstream's names, as messages print them.
    pub fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "IPC",
            Namespace::Net => "Net",
        }
    }
}

/// Upstream `namespaceOf`: the IPC sysctls by name, `net.*` and `fs.mqueue.*` by prefix.
fn namespace_of(name: &str) -> Option<Namespace> {
    match name {
        "kernel.sem"
        | "kernel.shmall"
        | "kernel.shmmax"
        | "kernel.shmmni"
        | "kernel.shm_rmid_forced"
        | "kernel.shm"
        | "kernel.msgmax"
        | "kernel.msgmnb"
        | "kernel.msgmni"
        | "kernel.msg" => return Some(Namespace::Ipc),
        _ => {}
    }
    if name.starts_with("net.") {
        Some(Namespace::Net)
    } else if name.starts_with("fs.mqueue.") {
        Some(Namespace::Ipc)
    } else {
        None
    }
}

/// Upstream `NormalizeName`: `net/ipv4/conf/eno2.100/rp_filter` becomes
/// `net.ipv4.conf.eno2/100.rp_filter` (the first separator decides the form).
pub fn normalize_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                other => other,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// Upstream `IsValidSysctlPattern`: at most 253 characters matching [`SYSCTL_PATTERN_REGEX`] (a
/// `*` only at the very end).
pub fn is_valid_pattern(pattern: &str) -> bool {
    if pattern.is_empty() || pattern.len() > SYSCTL_MAX_LENGTH {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let inner = |c: u8| alnum(c) || c == b'-' || c == b'_';
    let segments: Vec<&[u8]> = pattern
        .as_bytes()
        .split(|c| *c == b'.' || *c == b'/')
        .collect();
    let Some((last, leading)) = segments.split_last() else {
        return false;
    };
    let leading_ok = leading.iter().all(|s| match s {
        [] => false,
        [only] => alnum(*only),
        [first, middle @ .., end] => {
            alnum(*first) && alnum(*end) && middle.iter().all(|c| inner(*c))
        }
    });
    let last_ok = match last {
        [] => false,
        [only] => alnum(*only) || *only == b'*',
        [first, middle @ .., end] => {
            alnum(*first) && middle.iter().all(|c| inner(*c)) && (alnum(*end) || *end == b'*')
        }
    };
    leading_ok && last_ok
}

/// The safe sysctls a kernel of `release` (major, minor) namespaces (upstream
/// `SafeSysctlAllowlist`); without a known release, only those every kernel namespaces.
pub fn safe_sysctls(release: Option<(u32, u32)>) -> Vec<String> {
    SAFE_SYSCTLS
        .iter()
        .filter(|(_, needs)| match (needs, release) {
            (None, _) => true,
            (Some(needs), Some(have)) => have >= *needs,
            (Some(_), None) => false,
        })
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

/// `6.18.44-fc-v657` → (6, 18).
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Why a pattern of `allowedUnsafeSysctls` is not accepted (upstream `NewAllowlist`'s errors).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error(
        "sysctl {0:?} must have at most {SYSCTL_MAX_LENGTH} characters and match regex {SYSCTL_PATTERN_REGEX}"
    )]
    Syntax(String),
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
}

/// The sysctls a pod may set: whole names, and prefixes from `prefix*` patterns (upstream
/// `patternAllowlist`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    sysctls: BTreeMap<String, Namespace>,
    prefixes: BTreeMap<String, Namespace>,
}

impl Allowlist {
    /// The safe set for the running kernel plus the unsafe sysctls the node allows.
    pub fn new(
        release: Option<(u32, u32)>,
        allowed_unsafe: &[String],
    ) -> Result<Allowlist, PatternError> {
        let mut list = Allowlist::default();
        for pattern in safe_sysctls(release).iter().chain(allowed_unsafe) {
            list.add(pattern)?;
        }
        Ok(list)
    }

    /// Upstream `NewAllowlist` for one pattern.
    fn add(&mut self, pattern: &str) -> Result<(), PatternError> {
        if !is_valid_pattern(pattern) {
            return Err(PatternError::Syntax(pattern.to_owned()));
        }
        let normalized = normalize_name(pattern);
        let (name, prefixed) = match normalized.find('*') {
            Some(at) => (normalized[..at].to_owned(), true),
            None => (normalized, false),
        };
        let namespace =
            namespace_of(&name).ok_or_else(|| PatternError::NotNamespaced(name.clone()))?;
        if prefixed {
            self.prefixes.insert(name, namespace);
        } else {
            self.sysctls.insert(name, namespace);
        }
        Ok(())
    }

    /// Upstream `validateSysctl`: allowed by name or prefix, and not of a namespace the pod
    /// shares with the node.
    pub fn check(
        &self,
        sysctl: &str,
        host_network: bool,
        host_ipc: bool,
    ) -> Result<(), ForbiddenSysctl> {
        let sysctl = normalize_name(sysctl);
        let namespace = self.sysctls.get(&sysctl).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| sysctl.starts_with(prefix.as_str()))
                .map(|(_, ns)| *ns)
        });
        match namespace {
            None => Err(ForbiddenSysctl::NotAllowlisted { sysctl }),
            Some(namespace @ Namespace::Ipc) if host_ipc => {
                Err(ForbiddenSysctl::HostNamespace { sysctl, namespace })
            }
            Some(namespace @ Namespace::Net) if host_network => {
                Err(ForbiddenSysctl::HostNamespace { sysctl, namespace })
            }
            Some(_) => Ok(()),
        }
    }

    /// Upstream `Admit`: every sysctl of the pod must pass [`Allowlist::check`].
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_deref())
            .unwrap_or_default();
        for s in sysctls {
            self.check(
                &s.name,
                spec.host_network.unwrap_or(false),
                spec.host_ipc.unwrap_or(false),
            )
            .map_err(|why| Rejection {
                reason: FORBIDDEN_REASON.into(),
                message: format!("forbidden sysctl: {why}"),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
