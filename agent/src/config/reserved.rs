//! Node allocatable's inputs: what is reserved for Kubernetes' daemons (`kubeReserved`) and for
//! the OS (`systemReserved`), and what allocatable is enforced on (`enforceNodeAllocatable`).
//! Allocatable = capacity − kube − system − the hard eviction threshold.
//!
//! Not here: computing allocatable from the node's capacity, or writing the pods' cgroup limits
//! (`cm/`). Upstream: `cmd/kubelet/app/server.go` (`parseResourceList`), the enforcement checks
//! of `pkg/kubelet/apis/config/validation/validation.go`, and
//! `pkg/kubelet/cm/node_container_manager_linux.go`.
//!
//! `pods` limits the pods' cgroup; `system-reserved` and `kube-reserved` limit an existing cgroup
//! the operator names (`systemReservedCgroup`, `kubeReservedCgroup`) to its reservation, and
//! their `-compressible` forms to its CPU alone ([`ReservedCgroup`], written by
//! `cm::reserved_cgroups` at start).

use super::{
    error::{ConfigError, Origin, invalid},
    input::{Given, MapField},
    settings::Settings,
};
use crate::cm::quantity::Quantity;
pub use crate::cm::reserved_cgroups::ReservedCgroup;

const FIELD: &str = "enforceNodeAllocatable";

/// One reservation; zero for what is not reserved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservedResources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pids: i64,
}

/// `kubeReserved`, `systemReserved` and what node allocatable is enforced on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub kube: ReservedResources,
    pub system: ReservedResources,
    /// `enforceNodeAllocatable` contains `pods` (the default): the pods' cgroup is limited to
    /// allocatable and `allocatableMemory.available` thresholds are derived.
    pub enforce_pods: bool,
    /// The reserved cgroups to limit at start: system's first, then kube's.
    pub cgroups: Vec<ReservedCgroup>,
}

impl Reserved {
    /// Kube + system, in millicores.
    pub fn cpu_millis(&self) -> i64 {
        self.kube.cpu_millis.saturating_add(self.system.cpu_millis)
    }

    /// Kube + system, in bytes.
    pub fn memory_bytes(&self) -> i64 {
        self.kube
            .memory_bytes
            .saturating_add(self.system.memory_bytes)
    }

    /// Kube + system, in bytes.
    pub fn ephemeral_storage_bytes(&self) -> i64 {
        self.kube
            .ephemeral_storage_bytes
            .saturating_add(self.system.ephemeral_storage_bytes)
    }

    /// Kube + system.
    pub fn pids(&self) -> i64 {
        self.kube.pids.saturating_add(self.system.pids)
    }
}

/// The reservations and enforcement: flags over file over defaults (nothing reserved, `pods`).
pub(super) fn resolve(settings: &Settings) -> Result<Reserved, ConfigError> {
    let (kube, kube_listed) = resources("kubeReserved", settings.kube_reserved.as_ref())?;
    let (system, system_listed) = resources("systemReserved", settings.system_reserved.as_ref())?;
    let enforced = enforcement(settings)?;
    let mut cgroups = Vec::new();
    for (side, resources, listed) in [
        (Side::System, system, system_listed),
        (Side::Kube, kube, kube_listed),
    ] {
        let Some(compressible_only) = enforced.of(side) else {
            continue;
        };
        let (field, name) = match side {
            Side::System => ("systemReservedCgroup", &settings.system_reserved_cgroup),
            Side::Kube => ("kubeReservedCgroup", &settings.kube_reserved_cgroup),
        };
        let enforcement = side.key(compressible_only);
        // `enforcement` checked that the name is given.
        let Some(name) = name else {
            return Err(missing_cgroup(&enforced.origin, side, enforcement));
        };
        let full = |listed: bool, value: i64| (listed && !compressible_only).then_some(value);
        cgroups.push(ReservedCgroup {
            field,
            enforcement,
            name: name.value.clone(),
            cpu_millis: listed.cpu.then_some(resources.cpu_millis),
            memory_bytes: full(listed.memory, resources.memory_bytes),
            pids: full(listed.pids, resources.pids),
        });
    }
    Ok(Reserved {
        kube,
        system,
        enforce_pods: enforced.pods,
        cgroups,
    })
}

/// Which resources a reservation names: upstream limits a reserved cgroup only in those.
#[derive(Clone, Copy, Debug, Default)]
struct Listed {
    cpu: bool,
    memory: bool,
    pids: bool,
}

fn resources(
    field: &'static str,
    map: Option<&MapField>,
) -> Result<(ReservedResources, Listed), ConfigError> {
    let mut out = ReservedResources::default();
    let mut listed = Listed::default();
    let Some(map) = map else {
        return Ok((out, listed));
    };
    for entry in &map.entries {
        let bad = |reason: String| invalid(&map.origin, field, "reservation", &entry.shown, reason);
        let slot = match entry.key.as_str() {
            "cpu" => &mut out.cpu_millis,
            "memory" => &mut out.memory_bytes,
            "ephemeral-storage" => &mut out.ephemeral_storage_bytes,
            "pid" => &mut out.pids,
            other => {
                return Err(bad(format!(
                    "cannot reserve {other:?}: expected cpu, memory, ephemeral-storage or pid"
                )));
            }
        };
        let quantity = Quantity::parse(&entry.value).map_err(|e| {
            bad(format!(
                "{:?}: not a quantity ({}), expected e.g. 100m or 1Gi",
                entry.key, e.kind
            ))
        })?;
        if quantity.nanos() < 0 {
            return Err(bad(format!("{:?} must not be negative", entry.key)));
        }
        *slot = if entry.key == "cpu" {
            quantity.milli_value()
        } else {
            quantity.value()
        };
        match entry.key.as_str() {
            "cpu" => listed.cpu = true,
            "memory" => listed.memory = true,
            "pid" => listed.pids = true,
            _ => {}
        }
    }
    Ok((out, listed))
}

/// Whose reservation a cgroup enforcement is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    System,
    Kube,
}

impl Side {
    fn key(self, compressible_only: bool) -> &'static str {
        match (self, compressible_only) {
            (Side::System, false) => "system-reserved",
            (Side::System, true) => "system-reserved-compressible",
            (Side::Kube, false) => "kube-reserved",
            (Side::Kube, true) => "kube-reserved-compressible",
        }
    }
}

/// `enforceNodeAllocatable` as checked.
struct Enforcement {
    origin: Origin,
    pods: bool,
    /// `Some(compressible_only)` when the system reservation is enforced.
    system: Option<bool>,
    kube: Option<bool>,
}

impl Enforcement {
    fn of(&self, side: Side) -> Option<bool> {
        match side {
            Side::System => self.system,
            Side::Kube => self.kube,
        }
    }
}

fn missing_cgroup(origin: &Origin, side: Side, value: &str) -> ConfigError {
    let (field, flag) = match side {
        Side::System => ("systemReservedCgroup", "--system-reserved-cgroup"),
        Side::Kube => ("kubeReservedCgroup", "--kube-reserved-cgroup"),
    };
    invalid(
        origin,
        FIELD,
        "value",
        value,
        format!(
            "{field} ({flag}) must name the cgroup when {:?} or {:?} is enforced",
            side.key(false),
            side.key(true)
        ),
    )
}

/// `enforceNodeAllocatable`, checked as upstream's `ValidateKubeletConfiguration`: known values,
/// no duplicates, `none` alone, a reservation's full and `-compressible` forms not together,
/// the reserved cgroup named for each reservation enforced, and `cgroupsPerQOS` for anything
/// enforced.
fn enforcement(settings: &Settings) -> Result<Enforcement, ConfigError> {
    let Given {
        value: values,
        origin,
    } = settings
        .enforce_node_allocatable
        .clone()
        .unwrap_or_else(|| Given {
            value: vec!["pods".to_owned()],
            origin: Origin::Default,
        });
    let bad = |value: &str, reason: String| invalid(&origin, FIELD, "value", value, reason);
    let mut out = Enforcement {
        origin: origin.clone(),
        pods: false,
        system: None,
        kube: None,
    };
    for (i, value) in values.iter().enumerate() {
        if values[..i].contains(value) {
            return Err(bad(value, "listed twice".to_owned()));
        }
        let (side, compressible_only) = match value.as_str() {
            "none" if values.len() > 1 => {
                return Err(bad(
                    value,
                    "\"none\" cannot be combined with other values".to_owned(),
                ));
            }
            "none" => continue,
            "pods" => {
                out.pods = true;
                (None, false)
            }
            "system-reserved" => (Some(Side::System), false),
            "system-reserved-compressible" => (Some(Side::System), true),
            "kube-reserved" => (Some(Side::Kube), false),
            "kube-reserved-compressible" => (Some(Side::Kube), true),
            _ => {
                return Err(bad(
                    value,
                    "expected \"pods\", \"system-reserved\", \"system-reserved-compressible\", \
                     \"kube-reserved\", \"kube-reserved-compressible\" or \"none\""
                        .to_owned(),
                ));
            }
        };
        if let Some(side) = side {
            let slot = match side {
                Side::System => &mut out.system,
                Side::Kube => &mut out.kube,
            };
            if let Some(other) = *slot {
                return Err(bad(
                    value,
                    format!(
                        "cannot be combined with {:?}: the cgroup is limited either fully or in \
                         CPU only",
                        side.key(other)
                    ),
                ));
            }
            *slot = Some(compressible_only);
            let named = match side {
                Side::System => settings.system_reserved_cgroup.is_some(),
                Side::Kube => settings.kube_reserved_cgroup.is_some(),
            };
            if !named {
                return Err(missing_cgroup(&origin, side, value));
            }
        }
        if !settings.cgroups_per_qos {
            return Err(bad(
                value,
                "needs cgroupsPerQOS: true; without the pods' cgroup, set \
                 enforceNodeAllocatable to [] or [none]"
                    .to_owned(),
            ));
        }
    }
    Ok(out)
}
