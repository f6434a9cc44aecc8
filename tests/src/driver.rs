//! The cgroup driver the system tests run their agents with, and where that driver puts the
//! pods' cgroups. `SWIFTLET_TEST_CGROUP_DRIVER` chooses it: unset or `cgroupfs` (the host
//! suite, whose private containerd runs runc with cgroupfs), or `systemd` (the node VM's
//! scenario 2, where systemd is PID 1 and containerd runs runc with `SystemdCgroup = true`).
//! The driver is a configuration-file field only (`cgroupDriver`, as upstream's), so
//! [`crate::node::Node`] hands the agent a file holding it; the runtime's own cgroup driver
//! must match, which is the harness's business (the tests cannot change containerd's).
//!
//! The names come from the agent's own `PodCgroupLayout`: a test asserting where a pod's cgroup
//! is checks the agent's naming and the runtime's placement together, not a copy of the naming.

use std::path::PathBuf;

use swiftlet::{
    cgroup::{PodCgroupLayout, pods::CgroupDriver},
    cm::CgroupLayout,
    pod::qos::QosClass,
};

/// The variable that chooses the driver.
pub const ENV: &str = "SWIFTLET_TEST_CGROUP_DRIVER";

/// The driver of this test run. A value other than the two drivers fails the test naming the
/// variable: a typo must not quietly test cgroupfs twice.
pub fn cgroup_driver() -> CgroupDriver {
    let value = std::env::var_os(ENV);
    parse(value.as_deref().map(|v| v.to_string_lossy()).as_deref())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn parse(value: Option<&str>) -> Result<CgroupDriver, String> {
    match value {
        None | Some("" | "cgroupfs") => Ok(CgroupDriver::Cgroupfs),
        Some("systemd") => Ok(CgroupDriver::Systemd),
        Some(other) => Err(format!(
            "{ENV}={other:?}: expected \"cgroupfs\" or \"systemd\""
        )),
    }
}

/// The line an agent's configuration file gets when the run's driver is not the default, if
/// any.
pub fn config_line() -> Option<&'static str> {
    match cgroup_driver() {
        CgroupDriver::Cgroupfs => None,
        CgroupDriver::Systemd => Some("cgroupDriver: systemd"),
    }
}

/// A `cgroupRoot` of a test's own named after `name` (unique per test process): `/<name>` with
/// cgroupfs; with systemd a slice, `/<name>.slice` with each `-` made `_` (a `-` in a slice's
/// name would nest it below other slices).
pub fn own_cgroup_root(name: &str) -> String {
    root_named(cgroup_driver(), &format!("{name}-{}", std::process::id()))
}

fn root_named(driver: CgroupDriver, name: &str) -> String {
    match driver {
        CgroupDriver::Cgroupfs => format!("/{name}"),
        CgroupDriver::Systemd => format!("/{}.slice", name.replace('-', "_")),
    }
}

/// The pods' cgroups of an agent with the default `cgroupRoot` (`/`) and QoS cgroups, under
/// the run's driver.
pub fn pod_layout() -> PodCgroupLayout {
    PodCgroupLayout::for_driver(cgroup_driver(), std::path::Path::new("/"), true)
}

/// The cgroup2 mount (pure v2: `/sys/fs/cgroup`; hybrid: its `unified` mount).
fn cgroup2_root() -> PathBuf {
    CgroupLayout::detect()
        .expect("the cgroup layout")
        .cgroup2_root()
        .expect("a cgroup2 hierarchy")
        .to_owned()
}

/// The directory of pod `uid`'s cgroup of QoS `class` in hierarchy `root` (a v1 controller's
/// mount, or the cgroup2 one).
pub fn pod_cgroup_in(root: &std::path::Path, class: QosClass, uid: &str) -> PathBuf {
    root.join(pod_layout().pod_dir(class, uid))
}

/// The cgroup2 directory of container `id` of pod `uid`, whatever its QoS class: `None` when
/// there is none (yet).
pub fn container_cgroup(uid: &str, id: &str) -> Option<PathBuf> {
    let layout = pod_layout();
    let root = cgroup2_root();
    layout.pod_parents().iter().find_map(|parent| {
        let pod = root.join(layout.pod_dir_in(parent, uid));
        layout
            .container_dir_names(id)
            .into_iter()
            .map(|name| pod.join(name))
            .find(|dir| dir.is_dir())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_one_of_the_two_drivers() {
        assert_eq!(parse(None), Ok(CgroupDriver::Cgroupfs));
        assert_eq!(parse(Some("cgroupfs")), Ok(CgroupDriver::Cgroupfs));
        assert_eq!(parse(Some("systemd")), Ok(CgroupDriver::Systemd));
        let typo = parse(Some("sytemd")).expect_err("a typo is refused");
        assert!(typo.contains(ENV) && typo.contains("sytemd"), "{typo}");
    }

    #[test]
    fn a_tests_own_root_is_a_slice_under_systemd() {
        assert_eq!(root_named(CgroupDriver::Cgroupfs, "evict-7"), "/evict-7");
        assert_eq!(
            root_named(CgroupDriver::Systemd, "swiftlet-evict-7"),
            "/swiftlet_evict_7.slice"
        );
        let systemd =
            PodCgroupLayout::for_driver(CgroupDriver::Systemd, std::path::Path::new("/"), true);
        assert_eq!(
            systemd.pod_dir(QosClass::Burstable, "a-b"),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice"
        );
    }
}
