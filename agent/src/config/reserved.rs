//! Node allocatable's inputs: what is reserved for Kubernetes' daemons (`kubeReserved`) and for
//! the OS (`systemReserved`), and what allocatable is enforced on (`enforceNodeAllocatable`).
//! Allocatable = capacity − kube − system − the hard eviction threshold.
//!
//! Not here: computing allocatable from the node's capacity, or writing the pods' cgroup limits
//! (`cm/`). Upstream: `cmd/kubelet/app/server.go` (`parseResourceList`), the enforcement checks
//! of `pkg/kubelet/apis/config/validation/validation.go`, and
//! `pkg/kubelet/cm/node_container_manager_linux.go`.
//!
//! Only `pods` is enforced: `system-reserved` and `kube-reserved` (and their `-compressible`
//! forms) are recognised, so the message can say they are not supported yet rather than unknown;
//! they need the reserved cgroups (`--system-reserved-cgroup`), which swiftlet does not manage.

use super::{
    error::{ConfigError, Origin, invalid},
    input::{Given, MapField},
    settings::Settings,
};
use crate::cm::quantity::Quantity;

/// One reservation; zero for what is not reserved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservedResources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pids: i64,
}

/// `kubeReserved`, `systemReserved` and whether node allocatable is enforced on the pods' cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub kube: ReservedResources,
    pub system: ReservedResources,
    /// `enforceNodeAllocatable` contains `pods` (the default): the pods' cgroup is limited to
    /// allocatable and `allocatableMemory.available` thresholds are derived.
    pub enforce_pods: bool,
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
    Ok(Reserved {
        kube: resources("kubeReserved", settings.kube_reserved.as_ref())?,
        system: resources("systemReserved", settings.system_reserved.as_ref())?,
        enforce_pods: enforce_pods(settings)?,
    })
}

fn resources(
    field: &'static str,
    map: Option<&MapField>,
) -> Result<ReservedResources, ConfigError> {
    let mut out = ReservedResources::default();
    let Some(map) = map else {
        return Ok(out);
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
    }
    Ok(out)
}

/// `enforceNodeAllocatable`, checked as upstream: known values, no duplicates, `none` alone,
/// and `cgroupsPerQOS` for anything enforced.
fn enforce_pods(settings: &Settings) -> Result<bool, ConfigError> {
    const FIELD: &str = "enforceNodeAllocatable";
    let cgroups_per_qos = settings.cgroups_per_qos;
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
    let bad = |value: &str, reason: &str| invalid(&origin, FIELD, "value", value, reason);
    for (i, value) in values.iter().enumerate() {
        if values[..i].contains(value) {
            return Err(bad(value, "listed twice"));
        }
        match value.as_str() {
            "pods" if !cgroups_per_qos => {
                return Err(bad(
                    value,
                    "needs cgroupsPerQOS: true; without the pods' cgroup, set \
                     enforceNodeAllocatable to [] or [none]",
                ));
            }
            "pods" => {}
            "none" if values.len() > 1 => {
                return Err(bad(value, "\"none\" cannot be combined with other values"));
            }
            "none" => {}
            "system-reserved"
            | "kube-reserved"
            | "system-reserved-compressible"
            | "kube-reserved-compressible" => {
                return Err(bad(
                    value,
                    "not supported yet: only \"pods\" and \"none\" are",
                ));
            }
            _ => {
                return Err(bad(
                    value,
                    "expected \"pods\", \"system-reserved\", \"kube-reserved\" or \"none\"",
                ));
            }
        }
    }
    Ok(values.iter().any(|v| v == "pods"))
}
