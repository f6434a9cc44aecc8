//! Node allocatable enforced on the reserved cgroups (`enforceNodeAllocatable: [system-reserved,
//! kube-reserved]` and their `-compressible` forms): the existing cgroup the operator names
//! (`systemReservedCgroup`, `kubeReservedCgroup`) is limited, once at start, to its reservation —
//! CPU shares (`cpu.weight` on cgroup v2) from the reserved CPU, the memory limit and `pids.max`
//! from the reserved memory and pids; the `-compressible` forms write the CPU alone. A cgroup
//! that does not exist is an error that stops the start, naming the field and the path.
//!
//! Upstream: `pkg/kubelet/cm/node_container_manager_linux.go` (`enforceNodeAllocatableCgroups`,
//! `enforceExistingCgroup`, `getCgroupConfigInternal`), whose error `cmd/kubelet/app/server.go`
//! returns from the container manager's start. As runc does for a `ResourceConfig`, a zero memory
//! or pids value means "unset" and is not written.
//!
//! The name comes from the configuration, but the tree below it may not be swiftlet's: it is
//! opened from the hierarchy's mount one component at a time with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`), so a link planted anywhere on the
//! way is refused rather than followed out of the cgroup filesystem, and values go only into
//! existing regular files. With `cgroupDriver: systemd` the files are written directly too, as
//! upstream's libcontainer manager also writes them; a `systemctl daemon-reload` may reset what
//! systemd manages until swiftlet's next start.
//!
//! Not here: validating the configuration (`config::reserved`), the pods' cgroup (`pod_cgroups`).

use std::{io, path::PathBuf};

use super::{
    CgroupLayout,
    helpers::{milli_cpu_to_shares, shares_to_weight},
};
use crate::{
    cgroup::pods::{CgroupDriver, existing_cgroup_dir},
    hostfs::{self, Dir},
};

/// An existing cgroup node allocatable is enforced on (`system-reserved`, `kube-reserved` or
/// their `-compressible` forms): the limits upstream's `getCgroupConfigInternal` makes of the
/// reservation, each only when the reservation names its resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedCgroup {
    /// The field naming the cgroup (`systemReservedCgroup`), for messages.
    pub field: &'static str,
    /// The enforcement asking for it (`system-reserved-compressible`), for messages.
    pub enforcement: &'static str,
    /// The cgroup as the operator named it, absolute (`/system.slice`); the driver decides how
    /// it maps to a directory (`cgroup::pods::existing_cgroup_dir`).
    pub name: String,
    /// Reserved CPU in millicores: the cgroup's CPU shares (weight on cgroup v2).
    pub cpu_millis: Option<i64>,
    /// Reserved memory: the cgroup's memory limit. `None` for a `-compressible` enforcement.
    pub memory_bytes: Option<i64>,
    /// Reserved process ids: the cgroup's `pids.max`. `None` for a `-compressible` enforcement.
    pub pids: Option<i64>,
}

/// A reserved cgroup that could not be limited.
#[derive(Debug, thiserror::Error)]
#[error("{field} {name:?} (enforceNodeAllocatable: {enforcement}): {problem}")]
pub struct ReservedCgroupError {
    pub field: &'static str,
    pub name: String,
    pub enforcement: &'static str,
    #[source]
    pub problem: Problem,
}

#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("the cgroup does not exist: {} is missing (create it before swiftlet starts)", path.display())]
    Missing { path: PathBuf },
    #[error("it names the root cgroup, which takes no limits")]
    Root,
    #[error("no {controller} controller is mounted, in cgroup v1 or v2")]
    NoController { controller: &'static str },
    #[error(transparent)]
    Fs(#[from] hostfs::Error),
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One value to write: the controller it belongs to and its file on each cgroup version.
struct Write {
    controller: &'static str,
    v1_file: &'static str,
    v2_file: &'static str,
    v1_value: String,
    v2_value: String,
}

/// The files `cgroup` gets: upstream `getCgroupConfigInternal`'s `ResourceConfig` as the
/// runtime writes it (shares on v1, their weight on v2; 0 memory or pids unset).
fn writes(cgroup: &ReservedCgroup) -> Vec<Write> {
    let mut out = Vec::new();
    if let Some(millis) = cgroup.cpu_millis {
        let shares = u64::try_from(milli_cpu_to_shares(millis)).unwrap_or(2);
        out.push(Write {
            controller: "cpu",
            v1_file: "cpu.shares",
            v2_file: "cpu.weight",
            v1_value: shares.to_string(),
            v2_value: shares_to_weight(shares).to_string(),
        });
    }
    if let Some(bytes) = cgroup.memory_bytes.filter(|b| *b > 0) {
        out.push(Write {
            controller: "memory",
            v1_file: "memory.limit_in_bytes",
            v2_file: "memory.max",
            v1_value: bytes.to_string(),
            v2_value: bytes.to_string(),
        });
    }
    if let Some(pids) = cgroup.pids.filter(|p| *p > 0) {
        out.push(Write {
            controller: "pids",
            v1_file: "pids.max",
            v2_file: "pids.max",
            v1_value: pids.to_string(),
            v2_value: pids.to_string(),
        });
    }
    out
}

/// The controllers whose hierarchies the cgroup must exist in (upstream's `Validate` checks
/// the cgroup in every hierarchy the kubelet manages, not only the ones written).
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// Limits `cgroup` to its reservation (upstream `enforceExistingCgroup`).
pub fn enforce(
    layout: &CgroupLayout,
    driver: CgroupDriver,
    cgroup: &ReservedCgroup,
) -> Result<(), ReservedCgroupError> {
    let fail = |problem| ReservedCgroupError {
        field: cgroup.field,
        name: cgroup.name.clone(),
        enforcement: cgroup.enforcement,
        problem,
    };
    let dir = existing_cgroup_dir(driver, &cgroup.name);
    if dir.is_empty() {
        return Err(fail(Problem::Root));
    }
    let writes = writes(cgroup);
    for controller in CONTROLLERS {
        let hierarchy = hierarchy_of(layout, controller).map_err(fail)?;
        let opened = open_cgroup(&hierarchy.mount, &dir).map_err(fail)?;
        for write in writes.iter().filter(|w| w.controller == controller) {
            let (file, value) = if hierarchy.v2 {
                (write.v2_file, &write.v2_value)
            } else {
                (write.v1_file, &write.v1_value)
            };
            opened
                .write_existing_file(file.as_ref(), value.as_bytes())
                .map_err(|e| fail(Problem::Fs(e)))?;
        }
    }
    Ok(())
}

/// Where a controller's files are.
struct Hierarchy {
    mount: PathBuf,
    v2: bool,
}

/// The controller's own v1 hierarchy if one is mounted (on a hybrid node v1 takes the
/// controllers it has), else the cgroup2 one when it offers the controller.
fn hierarchy_of(layout: &CgroupLayout, controller: &'static str) -> Result<Hierarchy, Problem> {
    if let Some(mount) = layout.v1_controller(controller)
        && mount.join("cgroup.procs").exists()
    {
        return Ok(Hierarchy { mount, v2: false });
    }
    let Ok(root) = layout.cgroup2_root() else {
        return Err(Problem::NoController { controller });
    };
    let file = root.join("cgroup.controllers");
    let controllers = read_bounded(&file).map_err(|source| Problem::Read { path: file, source })?;
    if controllers.split_whitespace().any(|c| c == controller) {
        Ok(Hierarchy {
            mount: root.to_owned(),
            v2: true,
        })
    } else {
        Err(Problem::NoController { controller })
    }
}

/// `cgroup.controllers` is one short line; more than a page is not that file.
fn read_bounded(path: &std::path::Path) -> io::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(4096)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Opens `dir` below the hierarchy's mount: the mount is the node's own (followed, as
/// `/sys/fs/cgroup/cpu` is often a link to `cpu,cpuacct`), everything below it is not.
fn open_cgroup(mount: &std::path::Path, dir: &str) -> Result<Dir, Problem> {
    let root = Dir::open_resolved(mount)?;
    match root.open_path(std::path::Path::new(dir), false) {
        Ok(opened) => Ok(opened),
        Err(e) if e.is_not_found() => Err(Problem::Missing {
            path: mount.join(dir),
        }),
        Err(e) => Err(Problem::Fs(e)),
    }
}

#[cfg(test)]
mod tests;
