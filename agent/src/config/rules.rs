//! Rules of one setting each, for the settings that need more than a generic rule of `input.rs`:
//! the PLEG mode, the cgroup root and driver, the pod CIDR, cluster DNS and domain, `rootDir`,
//! `podPidsLimit`, `reservedSystemCPUs`, `containerLogMaxSize` and `podLogsDir`. Each gets the
//! setting's [`Input`] and returns its value or a [`ConfigError`] naming field, origin and value.
//!
//! Not here: which setting uses which rule (`settings.rs`). Upstream:
//! `pkg/kubelet/apis/config/validation/validation.go`.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use super::{
    duration::GoDuration,
    error::{ConfigError, invalid},
    input::{Given, Input, given, is_dns1123_subdomain, list, plain, positive_duration},
    types::{CgroupDriver, Cidr, PlegMode},
};
use crate::{
    cm::{cpumanager::CpuSet, quantity::Quantity},
    pod::sysctl::Allowlist,
};

/// Upstream's smallest `containerLogMonitorInterval`.
const MIN_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(3);

type Resolved<T> = Result<Option<T>, ConfigError>;

/// `pleg`: the flag is a clap value enum; the file's text is checked here.
pub(super) fn pleg_mode(input: Input<Option<PlegMode>, String>) -> Resolved<PlegMode> {
    if let Some((Some(mode), _)) = input.flag {
        return Ok(Some(*mode));
    }
    input
        .file
        .map(|s| {
            s.parse::<PlegMode>().map_err(|()| {
                invalid(
                    input.file_origin,
                    input.field,
                    "value",
                    s,
                    "expected \"relist\", \"ebpf\" or \"evented\"",
                )
            })
        })
        .transpose()
}

/// Absolute in the cgroup hierarchy.
pub(super) fn cgroup_root(input: Input<Option<String>, String>) -> Resolved<PathBuf> {
    let Some(root) = input.file.map(PathBuf::from) else {
        return Ok(None);
    };
    if !root.is_absolute() {
        return Err(invalid(
            input.file_origin,
            input.field,
            "cgroup",
            root.display(),
            "must be absolute in the cgroup hierarchy, e.g. / or /kubepods",
        ));
    }
    Ok(Some(root))
}

/// `cgroupfs` or `systemd` (upstream's two values; whether systemd can serve it is checked at
/// start, `cm::systemd::preflight`).
pub(super) fn cgroup_driver(input: Input<Option<String>, String>) -> Resolved<CgroupDriver> {
    let bad = |value: &str, reason| invalid(input.file_origin, input.field, "value", value, reason);
    match input.file.map(String::as_str) {
        None => Ok(None),
        Some("cgroupfs") => Ok(Some(CgroupDriver::Cgroupfs)),
        Some("systemd") => Ok(Some(CgroupDriver::Systemd)),
        Some(other) => Err(bad(other, "expected \"cgroupfs\" or \"systemd\"")),
    }
}

/// An empty CIDR is none.
pub(super) fn pod_cidr(input: Input<Option<String>, String>) -> Resolved<Cidr> {
    match input.file {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s
            .parse::<Cidr>()
            .map(Some)
            .map_err(|why| invalid(input.file_origin, input.field, "CIDR", s, why)),
    }
}

pub(super) fn cluster_dns(input: Input<Option<Vec<String>>, Vec<String>>) -> Resolved<Vec<IpAddr>> {
    input
        .file
        .map(|list| {
            list.iter()
                .map(|s| {
                    s.parse::<IpAddr>().map_err(|_| {
                        invalid(
                            input.file_origin,
                            input.field,
                            "IP address",
                            s,
                            "expected e.g. 10.96.0.10",
                        )
                    })
                })
                .collect()
        })
        .transpose()
}

/// A lowercase DNS name (a trailing dot allowed); empty is none.
pub(super) fn cluster_domain(input: Input<Option<String>, String>) -> Resolved<String> {
    match input.file {
        None => Ok(None),
        Some(d) if d.is_empty() => Ok(None),
        Some(d) if is_dns1123_subdomain(d.trim_end_matches('.')) => Ok(Some(d.clone())),
        Some(d) => Err(invalid(
            input.file_origin,
            input.field,
            "domain",
            d,
            "must be a lowercase DNS name, e.g. cluster.local",
        )),
    }
}

/// A path, or none when empty (`resolvConf: ""`).
pub(super) fn resolv_conf(input: Input<Option<PathBuf>, PathBuf>) -> Resolved<Option<PathBuf>> {
    Ok(plain(input)?.map(|p| (!p.as_os_str().is_empty()).then_some(p)))
}

/// Any path but an empty one.
pub(super) fn root_dir(input: Input<Option<PathBuf>, PathBuf>) -> Resolved<PathBuf> {
    let origin = input.file_origin;
    let field = input.field;
    match plain(input)? {
        Some(dir) if dir.as_os_str().is_empty() => {
            Err(invalid(origin, field, "path", "", "must not be empty"))
        }
        dir => Ok(dir),
    }
}

/// Any negative limit means "none", as upstream defaults it.
pub(super) fn pod_pids_limit(input: Input<Option<i64>, i64>) -> Resolved<i64> {
    Ok(input.file.map(|n| (*n).max(-1)))
}

/// A CPU list such as `0-1,4`; an empty one is none.
pub(super) fn cpu_list(input: Input<Option<String>, String>) -> Resolved<CpuSet> {
    let field = input.field;
    let Some(Given { value, origin }) = given(input)? else {
        return Ok(None);
    };
    let set = CpuSet::parse(value.trim()).map_err(|e| {
        invalid(
            &origin,
            field,
            "CPU list",
            &value,
            format!("{e}; expected e.g. \"0\" or \"0-1,4\""),
        )
    })?;
    Ok((!set.is_empty()).then_some(set))
}

/// A quantity in whole bytes; negative disables log rotation, as upstream.
pub(super) fn log_size(input: Input<Option<String>, String>) -> Resolved<i64> {
    let field = input.field;
    let Some(Given { value, origin }) = given(input)? else {
        return Ok(None);
    };
    let quantity = Quantity::parse(&value).map_err(|e| {
        invalid(
            &origin,
            field,
            "quantity",
            &value,
            format!(
                "{}; expected e.g. 10Mi (negative disables rotation)",
                e.kind
            ),
        )
    })?;
    Ok(Some(quantity.value()))
}

/// `systemReservedCgroup` / `kubeReservedCgroup`: empty for none (upstream's default), else an
/// absolute cgroup below the root, with no `.` or `..` component. swiftlet resolves it as root
/// without following links (`cm::reserved_cgroups`), but a name that climbs out of the cgroup
/// hierarchy is refused here, by name, before anything opens it.
pub(super) fn reserved_cgroup(input: Input<Option<String>, String>) -> Resolved<Given<String>> {
    let field = input.field;
    let Some(Given { value, origin }) = given(input)? else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    let bad = |reason| Err(invalid(&origin, field, "cgroup", &value, reason));
    if !value.starts_with('/') {
        return bad("must be absolute in the cgroup hierarchy, e.g. /system.slice");
    }
    if value.contains('\0') {
        return bad("must not contain a NUL byte");
    }
    if value.len() > MAX_CGROUP_NAME {
        return bad("is longer than a path can be (4096 bytes)");
    }
    if value.split('/').any(|part| part == "." || part == "..") {
        return bad("must not contain \".\" or \"..\" components");
    }
    if value.split('/').all(str::is_empty) {
        return bad("names the root cgroup, which takes no limits; name a cgroup below it");
    }
    Ok(Some(Given { value, origin }))
}

/// The longest path the kernel resolves (`PATH_MAX`).
const MAX_CGROUP_NAME: usize = 4096;

/// An absolute path.
pub(super) fn absolute_path(input: Input<Option<PathBuf>, PathBuf>) -> Resolved<PathBuf> {
    let field = input.field;
    match given(input)? {
        Some(Given { value, origin }) if !value.is_absolute() => Err(invalid(
            &origin,
            field,
            "path",
            value.display(),
            "must be an absolute path",
        )),
        path => Ok(path.map(|p| p.value)),
    }
}

/// How often log sizes are checked: at least 3s, as upstream.
pub(super) fn log_monitor_interval(input: Input<Option<GoDuration>, String>) -> Resolved<Duration> {
    let (field, origin, text) = (input.field, input.file_origin, input.file);
    let interval = positive_duration(input)?;
    if interval.is_some_and(|d| d < MIN_LOG_MONITOR_INTERVAL) {
        return Err(invalid(
            origin,
            field,
            "duration",
            text.map(String::as_str).unwrap_or_default(),
            "must be at least 3s",
        ));
    }
    Ok(interval)
}

/// Sysctl names and `prefix*` patterns, each checked as upstream's `NewAllowlist` checks it
/// (syntax, and that the kernel namespaces the sysctl per pod).
pub(super) fn unsafe_sysctls(input: Input<Vec<String>, Vec<String>>) -> Resolved<Vec<String>> {
    let field = input.field;
    let Some(Given { value, origin }) = list(input)? else {
        return Ok(None);
    };
    for pattern in &value {
        // The kernel release only decides which safe sysctls join; any will do here.
        Allowlist::new(None, std::slice::from_ref(pattern))
            .map_err(|e| invalid(&origin, field, "sysctl", pattern, e.to_string()))?;
    }
    Ok(Some(value))
}
