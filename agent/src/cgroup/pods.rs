//! Where the pods' cgroups live, for both cgroup drivers, relative to the root of every
//! hierarchy. The cgroupfs driver (upstream `qos_container_manager_linux.go`,
//! `pod_container_manager_linux.go`):
//!
//! ```text
//! <cgroupRoot>/kubepods/                      Guaranteed pods directly below
//! <cgroupRoot>/kubepods/burstable/pod<uid>/   one per Burstable pod
//! <cgroupRoot>/kubepods/besteffort/pod<uid>/  one per BestEffort pod
//! <cgroupRoot>/pod<uid>/                      every pod, with cgroupsPerQOS: false
//! ```
//!
//! The systemd driver names the same cgroups as slices (upstream `cgroup_manager_linux.go`
//! `CgroupName.ToSystemd` and runc's `systemd.ExpandSlice`): the components are joined with `-`
//! after each one's own `-` became `_`, and a slice's directory is nested in its parents':
//!
//! ```text
//! kubepods.slice/                                                 Guaranteed pods directly below
//! kubepods.slice/kubepods-pod<uid_>.slice/                        a Guaranteed pod
//! kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
//! kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/
//! ```
//!
//! with `cgroupRoot` a slice itself (`/` or `/<name>.slice`, its components in front of
//! `kubepods`). The runtime names each container's cgroup below its pod's: by the container's id
//! with cgroupfs, as a scope `cri-containerd-<id>.scope` (containerd, `SystemdCgroup = true`) or
//! `crio-<id>.scope` (CRI-O) with systemd. One definition for who makes these paths
//! (`cm::pod_cgroups`, `cm::systemd`), who lists them (`cm::pressure_targets`) and who maps a
//! cgroup back to its pod and container (the PLEG's index, the CPU manager).

use std::{fmt, path::Path};

use crate::{container::PodUid, pod::qos::QosClass};

/// The cgroup driver (`cgroupDriver`): how pod cgroups are named and who makes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Directories written directly in the cgroup filesystem.
    #[default]
    Cgroupfs,
    /// Slices made by systemd over D-Bus.
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `cgroupRoot` the systemd driver cannot name its slices below.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "cgroupRoot {root:?} with cgroupDriver: systemd: {reason} (it must be \"/\" or a slice, e.g. /kube.slice or /kube.slice/kube-pods.slice)"
)]
pub struct SliceRootError {
    pub root: String,
    pub reason: &'static str,
}

/// The suffix of a slice unit (upstream `systemdSuffix`).
const SLICE: &str = ".slice";
/// The scope name prefixes of the runtimes' container cgroups with the systemd driver:
/// containerd's CRI (`cri-containerd`) and CRI-O (`crio`).
const SCOPE_PREFIXES: [&str; 2] = ["cri-containerd-", "crio-"];
const SCOPE: &str = ".scope";
/// The sub-cgroup crun makes in a container's systemd scope on cgroup v2 and runs the container's
/// processes in (its `run.oci.systemd.subgroup`, `container` unless an OCI annotation says
/// otherwise): events from there are the container's. Only this name: a privileged container
/// may make sub-cgroups of its own, and those must not grow what the agent keeps per cgroup.
const CRUN_SUBGROUP: &str = "container";

/// The QoS levels below `kubepods`, Guaranteed (the top itself) first.
const QOS_LEVELS: [Option<&str>; 3] = [None, Some("burstable"), Some("besteffort")];

/// Where the pods' cgroups are, from `cgroupDriver`, `cgroupRoot` and `cgroupsPerQOS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroupLayout {
    driver: CgroupDriver,
    /// `cgroupRoot` as upstream's `CgroupName`: its components, none for `/`.
    root: Vec<String>,
    /// `kubepods` below `cgroupRoot`, as components.
    kubepods: Vec<String>,
    per_qos: bool,
}

impl PodCgroupLayout {
    /// The cgroupfs layout below `cgroup_root` (the config's `cgroupRoot`, absolute in the
    /// hierarchy).
    pub fn new(cgroup_root: &Path, per_qos: bool) -> Self {
        let kubepods = cgroup_root.join("kubepods");
        let kubepods = kubepods.to_string_lossy();
        PodCgroupLayout::with_kubepods(&kubepods, per_qos)
    }

    /// The layout of `driver` below `cgroup_root`. With systemd `cgroupRoot` names a slice by
    /// its last component, as upstream's `ParseSystemdToCgroupName` reads it (`/`, `/a.slice`,
    /// `/a.slice/a-b.slice`); [`validate_slice_root`] is what refuses any other.
    pub fn for_driver(driver: CgroupDriver, cgroup_root: &Path, per_qos: bool) -> Self {
        match driver {
            CgroupDriver::Cgroupfs => PodCgroupLayout::new(cgroup_root, per_qos),
            CgroupDriver::Systemd => {
                let root = slice_components(&cgroup_root.to_string_lossy());
                let mut kubepods = root.clone();
                kubepods.push("kubepods".to_owned());
                PodCgroupLayout {
                    driver,
                    root,
                    kubepods,
                    per_qos,
                }
            }
        }
    }

    /// The cgroupfs layout with its top given directly (`kubepods`, or
    /// `<cgroupRoot>/kubepods`).
    pub fn with_kubepods(kubepods: &str, per_qos: bool) -> Self {
        let kubepods = kubepods.trim_matches('/');
        let kubepods = if kubepods.is_empty() {
            "kubepods"
        } else {
            kubepods
        };
        let root = kubepods
            .strip_suffix("kubepods")
            .unwrap_or_default()
            .trim_matches('/');
        PodCgroupLayout {
            driver: CgroupDriver::Cgroupfs,
            root: components(root),
            kubepods: components(kubepods),
            per_qos,
        }
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// Where pod cgroups are made, relative to the cgroup root: `kubepods` (whose QoS levels
    /// hold them), or without `cgroupsPerQOS` the `cgroupRoot` itself (`""` for `/`). What the
    /// kernel programs watch for the pods' events.
    pub fn pods_parent(&self) -> String {
        if self.per_qos {
            self.kubepods()
        } else {
            self.render(&self.root)
        }
    }

    /// `cgroupsPerQOS`.
    pub fn per_qos(&self) -> bool {
        self.per_qos
    }

    /// The top of the QoS hierarchy, relative to the cgroup root: `kubepods` (or
    /// `kubepods.slice`) below `cgroupRoot`.
    pub fn kubepods(&self) -> String {
        self.render(&self.kubepods)
    }

    /// The QoS class's level: `kubepods`, `kubepods/burstable` or `kubepods/besteffort`
    /// (systemd: `kubepods.slice`, `kubepods.slice/kubepods-burstable.slice`, ...).
    pub fn qos_dir(&self, class: QosClass) -> String {
        self.render(&self.qos_name(class))
    }

    /// The three QoS levels, the top first: what `cgroupsPerQOS` makes, and where a pod's cgroup
    /// can be whatever class it was computed with.
    pub fn qos_dirs(&self) -> [String; 3] {
        QOS_LEVELS.map(|level| self.render(&self.level_name(level)))
    }

    /// The directories pod cgroups are made in: the QoS levels, or `cgroupRoot` itself (`""` for
    /// `/`) without `cgroupsPerQOS`.
    pub fn pod_parents(&self) -> Vec<String> {
        if self.per_qos {
            self.qos_dirs().to_vec()
        } else {
            vec![self.render(&self.root)]
        }
    }

    /// The pod's cgroup relative to the cgroup root, e.g. `kubepods/burstable/pod<uid>` or
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`.
    pub fn pod_dir(&self, class: QosClass, uid: &str) -> String {
        self.render(&self.pod_name(class, uid))
    }

    /// The pod's cgroup the way the CRI sandbox's `cgroup_parent` names it (upstream
    /// `podContainerManagerImpl.GetPodContainerName` through `CgroupName.ToSystemd`/
    /// `ToCgroupfs`): an absolute path with cgroupfs, the slice's unit name
    /// (`kubepods-burstable-pod<uid_>.slice`) with systemd.
    pub fn cgroup_parent(&self, class: QosClass, uid: &str) -> String {
        let dir = self.pod_dir(class, uid);
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{dir}"),
            CgroupDriver::Systemd => dir.rsplit('/').next().unwrap_or_default().to_owned(),
        }
    }

    /// The pod's cgroup below `parent`, one of [`PodCgroupLayout::pod_parents`].
    pub fn pod_dir_in(&self, parent: &str, uid: &str) -> String {
        let name = match self.driver {
            CgroupDriver::Cgroupfs => format!("pod{uid}"),
            CgroupDriver::Systemd => {
                let prefix = slice_prefix(parent);
                let pod = escape(&format!("pod{uid}"));
                if prefix.is_empty() {
                    format!("{pod}{SLICE}")
                } else {
                    format!("{prefix}-{pod}{SLICE}")
                }
            }
        };
        if parent.is_empty() {
            name
        } else {
            format!("{parent}/{name}")
        }
    }

    /// The names a container's cgroup may have below its pod's: its id (cgroupfs), or the
    /// runtimes' scopes (systemd).
    pub fn container_dir_names(&self, container_id: &str) -> Vec<String> {
        match self.driver {
            CgroupDriver::Cgroupfs => vec![container_id.to_owned()],
            CgroupDriver::Systemd => SCOPE_PREFIXES
                .iter()
                .map(|prefix| format!("{prefix}{container_id}{SCOPE}"))
                .collect(),
        }
    }

    /// The container id in the name of a directory below a pod's cgroup; `None` for what is
    /// no container's (with systemd: anything but a runtime's scope, e.g. CRI-O's
    /// `crio-conmon-<id>.scope`).
    pub fn container_id_of_dir(&self, name: &str) -> Option<String> {
        let id = match self.driver {
            CgroupDriver::Cgroupfs => name,
            CgroupDriver::Systemd => {
                let scope = name.strip_suffix(SCOPE)?;
                let id = SCOPE_PREFIXES
                    .iter()
                    .find_map(|prefix| scope.strip_prefix(prefix))?;
                if id.starts_with("conmon-") {
                    return None;
                }
                id
            }
        };
        (!id.is_empty() && !id.contains('/')).then(|| id.to_owned())
    }

    /// The UID of the pod whose cgroup `name` is, directly below `parent` (one of
    /// [`PodCgroupLayout::pod_parents`]); `None` for any other name.
    pub fn uid_of_pod_dir_in(&self, parent: &str, name: &str) -> Option<PodUid> {
        match self.driver {
            CgroupDriver::Cgroupfs => uid_of_pod_dir(name),
            CgroupDriver::Systemd => {
                let prefix = slice_prefix(parent);
                let unit = name.strip_suffix(SLICE)?;
                let pod = if prefix.is_empty() {
                    unit
                } else {
                    unit.strip_prefix(prefix.as_str())?.strip_prefix('-')?
                };
                let uid = pod.strip_prefix("pod").filter(|uid| !uid.is_empty())?;
                if uid.contains('-') {
                    return None;
                }
                Some(PodUid(unescape(uid)))
            }
        }
    }

    /// `(pod uid, container id)` of a container's cgroup, given relative to the cgroup root
    /// (a leading `/` is ignored), or of crun's sub-cgroup in a container's scope (systemd
    /// driver); `None` for any other cgroup: a QoS level, a pod's own cgroup, anything deeper or
    /// outside where pods live.
    pub fn parse_container(&self, path: &str) -> Option<(PodUid, String)> {
        let path = path.trim_start_matches('/');
        self.pod_parents().iter().find_map(|parent| {
            let rest = if parent.is_empty() {
                path
            } else {
                path.strip_prefix(parent.as_str())?.strip_prefix('/')?
            };
            let (pod, container) = rest.split_once('/')?;
            let container = match container.split_once('/') {
                None => container,
                Some((scope, CRUN_SUBGROUP)) if self.driver == CgroupDriver::Systemd => scope,
                Some(_) => return None,
            };
            let uid = self.uid_of_pod_dir_in(parent, pod)?;
            let id = self.container_id_of_dir(container)?;
            Some((uid, id))
        })
    }
}

/// `pod<uid>`, the name of a pod's cgroup with the cgroupfs driver.
pub fn pod_dir_name(uid: &str) -> String {
    format!("pod{uid}")
}

/// The UID in a cgroupfs pod cgroup's name (`pod<uid>`); `None` for any other name.
pub fn uid_of_pod_dir(name: &str) -> Option<PodUid> {
    name.strip_prefix("pod")
        .filter(|uid| !uid.is_empty())
        .map(|uid| PodUid(uid.to_owned()))
}

impl PodCgroupLayout {
    fn level_name(&self, level: Option<&str>) -> Vec<String> {
        let mut name = self.kubepods.clone();
        name.extend(level.map(str::to_owned));
        name
    }

    fn qos_name(&self, class: QosClass) -> Vec<String> {
        self.level_name(match class {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        })
    }

    fn pod_name(&self, class: QosClass, uid: &str) -> Vec<String> {
        let mut name = if self.per_qos {
            self.qos_name(class)
        } else {
            self.root.clone()
        };
        name.push(format!("pod{uid}"));
        name
    }

    /// A `CgroupName` as a path below the cgroup root: upstream `ToCgroupfs`, or `ToSystemd`
    /// (every prefix of the escaped, `-`-joined components is one nested slice), without the
    /// leading `/`; `""` for the root.
    fn render(&self, name: &[String]) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => name.join("/"),
            CgroupDriver::Systemd => {
                let escaped: Vec<String> = name.iter().map(|part| escape(part)).collect();
                (1..=escaped.len())
                    .map(|n| format!("{}{SLICE}", escaped[..n].join("-")))
                    .collect::<Vec<_>>()
                    .join("/")
            }
        }
    }
}

/// The directory, relative to the root of every hierarchy, of an existing cgroup the operator
/// names (`systemReservedCgroup`): upstream's `cgroupManager.CgroupName` then `Name` — with
/// cgroupfs the path itself; with systemd its last component read as a slice
/// (`ParseSystemdToCgroupName`) and expanded into its parents (`ToSystemd`), so
/// `/system.slice` is `system.slice` and `/a.slice/a-b.slice` is `a.slice/a-b.slice`. `""` is
/// the root.
pub fn existing_cgroup_dir(driver: CgroupDriver, name: &str) -> String {
    let layout = PodCgroupLayout {
        driver,
        root: Vec::new(),
        kubepods: Vec::new(),
        per_qos: false,
    };
    match driver {
        CgroupDriver::Cgroupfs => layout.render(&components(name)),
        CgroupDriver::Systemd => layout.render(&slice_components(name)),
    }
}

fn components(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|part| !part.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Upstream `escapeSystemdCgroupName`: `-` is systemd's nesting separator.
fn escape(part: &str) -> String {
    part.replace('-', "_")
}

/// Upstream `unescapeSystemdCgroupName`.
fn unescape(part: &str) -> String {
    part.replace('_', "-")
}

/// The unit name without `.slice` of a slice's directory (its last component), which its
/// children's names begin with; `""` for the root.
fn slice_prefix(dir: &str) -> String {
    let last = dir.rsplit('/').next().unwrap_or_default();
    last.strip_suffix(SLICE).unwrap_or(last).to_owned()
}

/// Upstream `ParseSystemdToCgroupName`: the last component without `.slice`, split at `-`,
/// each part unescaped; none for the root (and for `-.slice`, systemd's name of it).
fn slice_components(root: &str) -> Vec<String> {
    let last = root
        .trim_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    let unit = last.strip_suffix(SLICE).unwrap_or(last);
    if unit.is_empty() || unit == "-" {
        return Vec::new();
    }
    unit.split('-').map(unescape).collect()
}

/// Whether the systemd driver can use `cgroupRoot`: `/`, or the expanded path of a slice
/// (runc's `ExpandSlice` of its last component must give the path back, so the slice's parents
/// are the ones systemd nests it in).
pub fn validate_slice_root(root: &Path) -> Result<(), SliceRootError> {
    let root = root.to_string_lossy();
    let bad = |reason| SliceRootError {
        root: root.clone().into_owned(),
        reason,
    };
    let trimmed = root.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(());
    }
    if !root.starts_with('/') {
        return Err(bad("not absolute"));
    }
    let last = trimmed.rsplit('/').next().unwrap_or_default();
    let unit = last.strip_suffix(SLICE).ok_or_else(|| bad("not a slice"))?;
    if unit.is_empty() || unit == "-" {
        return Err(bad("not a slice below the root slice"));
    }
    // runc's ExpandSlice refuses what systemd would: empty components and `-` at either end.
    if unit.starts_with('-') || unit.ends_with('-') || unit.contains("--") {
        return Err(bad("its name has an empty component"));
    }
    let parts: Vec<&str> = unit.split('-').collect();
    let expanded = (1..=parts.len())
        .map(|n| format!("{}{SLICE}", parts[..n].join("-")))
        .collect::<Vec<_>>()
        .join("/");
    if expanded != trimmed {
        return Err(bad("not where systemd nests that slice"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_cgroup_is_named_as_the_driver_names_it() {
        let cgroupfs = |name| existing_cgroup_dir(CgroupDriver::Cgroupfs, name);
        let systemd = |name| existing_cgroup_dir(CgroupDriver::Systemd, name);
        assert_eq!(cgroupfs("/system.slice"), "system.slice");
        assert_eq!(cgroupfs("/kube/daemons/"), "kube/daemons");
        assert_eq!(cgroupfs("/"), "");
        assert_eq!(systemd("/system.slice"), "system.slice");
        assert_eq!(systemd("/a.slice/a-b.slice"), "a.slice/a-b.slice");
        assert_eq!(systemd("/kube_reserved.slice"), "kube_reserved.slice");
        assert_eq!(systemd("/-.slice"), "");
    }

    #[test]
    fn pod_cgroups_follow_the_qos_class_below_cgroup_root() {
        let layout = PodCgroupLayout::new(Path::new("/"), true);
        assert_eq!(layout.kubepods(), "kubepods");
        assert_eq!(layout.pod_dir(QosClass::Guaranteed, "u1"), "kubepods/podu1");
        assert_eq!(
            layout.pod_dir(QosClass::Burstable, "u1"),
            "kubepods/burstable/podu1"
        );
        assert_eq!(
            layout.pod_dir(QosClass::BestEffort, "u1"),
            "kubepods/besteffort/podu1"
        );
        let nested = PodCgroupLayout::new(Path::new("/node-a"), true);
        assert_eq!(
            nested.qos_dirs(),
            [
                "node-a/kubepods",
                "node-a/kubepods/burstable",
                "node-a/kubepods/besteffort"
            ]
        );
        assert_eq!(nested.pod_parents(), nested.qos_dirs().to_vec());
    }

    #[test]
    fn without_qos_cgroups_pods_are_at_the_root() {
        let layout = PodCgroupLayout::with_kubepods("kubepods", false);
        assert_eq!(layout.pod_dir(QosClass::Burstable, "u1"), "podu1");
        assert_eq!(layout.pod_parents(), [""]);
        assert_eq!(
            layout.parse_container("/podu1/abc"),
            Some((PodUid::from("u1"), "abc".to_owned()))
        );
        assert_eq!(layout.parse_container("/kubepods/podu1/abc"), None);
        assert_eq!(layout.pods_parent(), "");
    }

    #[test]
    fn without_qos_cgroups_pods_are_in_cgroup_root() {
        let layout = PodCgroupLayout::new(Path::new("/node-a"), false);
        assert_eq!(layout.pods_parent(), "node-a");
        assert_eq!(layout.pod_dir(QosClass::Burstable, "u1"), "node-a/podu1");
        assert_eq!(layout.pod_parents(), ["node-a"]);
        assert_eq!(
            layout.parse_container("/node-a/podu1/abc"),
            Some((PodUid::from("u1"), "abc".to_owned()))
        );
        assert_eq!(layout.parse_container("/podu1/abc"), None);
        assert_eq!(layout.parse_container("/node-ab/podu1/abc"), None);
        assert_eq!(
            PodCgroupLayout::new(Path::new("/node-a"), true).pods_parent(),
            "node-a/kubepods"
        );
    }

    #[test]
    fn container_cgroups_parse_back_to_their_pod() {
        let layout = PodCgroupLayout::with_kubepods("/node-a/kubepods", true);
        let parsed = |path| layout.parse_container(path);
        let some = |uid: &str, id: &str| Some((PodUid::from(uid), id.to_owned()));
        assert_eq!(
            parsed("/node-a/kubepods/burstable/podu1/abc"),
            some("u1", "abc")
        );
        assert_eq!(parsed("node-a/kubepods/podu2/def"), some("u2", "def"));
        assert_eq!(
            parsed("/node-a/kubepods/besteffort/podu3/x"),
            some("u3", "x")
        );
        for other in [
            "/kubepods/podu1/abc",
            "/node-a/kubepodsx/podu1/abc",
            "/node-a/kubepods",
            "/node-a/kubepods/burstable",
            "/node-a/kubepods/burstable/podu1",
            "/node-a/kubepods/podu1/abc/deeper",
            "/node-a/kubepods/pod/abc",
            "/node-a/kubepods/burstable/notapod/abc",
        ] {
            assert_eq!(parsed(other), None, "{other}");
        }
    }

    #[test]
    fn pod_dir_names_round_trip() {
        assert_eq!(
            uid_of_pod_dir(&pod_dir_name("u1")),
            Some(PodUid::from("u1"))
        );
        assert_eq!(uid_of_pod_dir("pod"), None);
        assert_eq!(uid_of_pod_dir("burstable"), None);
    }

    const UID: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
    const UID_: &str = "1b4e28ba_2fa1_11d2_883f_0016d3cca427";

    fn systemd(root: &str, per_qos: bool) -> PodCgroupLayout {
        PodCgroupLayout::for_driver(CgroupDriver::Systemd, Path::new(root), per_qos)
    }

    #[test]
    fn systemd_pod_cgroups_are_nested_slices() {
        let layout = systemd("/", true);
        assert_eq!(layout.kubepods(), "kubepods.slice");
        assert_eq!(
            layout.qos_dirs(),
            [
                "kubepods.slice",
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods.slice/kubepods-besteffort.slice",
            ]
        );
        let table = [
            (
                QosClass::Guaranteed,
                format!("kubepods.slice/kubepods-pod{UID_}.slice"),
                format!("kubepods-pod{UID_}.slice"),
            ),
            (
                QosClass::Burstable,
                format!(
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
                ),
                format!("kubepods-burstable-pod{UID_}.slice"),
            ),
            (
                QosClass::BestEffort,
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
                ),
                format!("kubepods-besteffort-pod{UID_}.slice"),
            ),
        ];
        for (class, dir, parent) in table {
            assert_eq!(layout.pod_dir(class, UID), dir, "{class:?}");
            assert_eq!(layout.cgroup_parent(class, UID), parent, "{class:?}");
            assert_eq!(
                layout.pod_dir_in(&layout.qos_dir(class), UID),
                dir,
                "{class:?}"
            );
        }
        assert_eq!(
            PodCgroupLayout::new(Path::new("/"), true).cgroup_parent(QosClass::Burstable, "u1"),
            "/kubepods/burstable/podu1"
        );
    }

    #[test]
    fn systemd_cgroup_root_is_the_slice_in_front() {
        let layout = systemd("/kube.slice/kube-nodes.slice", true);
        assert_eq!(
            layout.qos_dir(QosClass::Burstable),
            "kube.slice/kube-nodes.slice/kube-nodes-kubepods.slice/kube-nodes-kubepods-burstable.slice"
        );
        let flat = systemd("/kube.slice", false);
        assert_eq!(flat.pods_parent(), "kube.slice");
        assert_eq!(
            flat.pod_dir(QosClass::Burstable, UID),
            format!("kube.slice/kube-pod{UID_}.slice")
        );
        let at_root = systemd("/", false);
        assert_eq!(at_root.pods_parent(), "");
        assert_eq!(at_root.pod_dir(QosClass::Guaranteed, "u-1"), "podu_1.slice");
        assert_eq!(
            at_root.cgroup_parent(QosClass::Guaranteed, "u-1"),
            "podu_1.slice"
        );
        assert_eq!(
            at_root.parse_container("/podu_1.slice/cri-containerd-abc.scope"),
            Some((PodUid::from("u-1"), "abc".to_owned()))
        );
    }

    #[test]
    fn systemd_cgroup_roots_are_slices_where_systemd_nests_them() {
        for good in [
            "/",
            "/kube.slice",
            "/kube.slice/kube-nodes.slice",
            "/my_root.slice",
        ] {
            assert_eq!(validate_slice_root(Path::new(good)), Ok(()), "{good}");
        }
        for (bad, reason) in [
            ("/kubepods", "not a slice"),
            ("kube.slice", "not absolute"),
            ("/-.slice", "not a slice below the root slice"),
            ("/kube-.slice", "its name has an empty component"),
            ("/kube--a.slice", "its name has an empty component"),
            ("/kube-nodes.slice", "not where systemd nests that slice"),
            (
                "/other.slice/kube.slice",
                "not where systemd nests that slice",
            ),
        ] {
            let err = validate_slice_root(Path::new(bad)).expect_err(bad);
            assert_eq!(err.reason, reason, "{bad}");
            assert!(err.to_string().contains("cgroupDriver: systemd"), "{err}");
        }
    }

    #[test]
    fn systemd_container_scopes_parse_back_to_their_pod() {
        let layout = systemd("/", true);
        let some = |id: &str| Some((PodUid::from(UID), id.to_owned()));
        let burstable =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        let guaranteed = format!("/kubepods.slice/kubepods-pod{UID_}.slice");
        let table = [
            (format!("{burstable}/cri-containerd-abc.scope"), some("abc")),
            (format!("{burstable}/crio-def.scope"), some("def")),
            (format!("{guaranteed}/cri-containerd-x1.scope"), some("x1")),
            (
                format!(
                    "{}/cri-containerd-e.scope",
                    guaranteed.trim_start_matches('/')
                ),
                some("e"),
            ),
            (format!("{burstable}/crio-conmon-def.scope"), None),
            (format!("{burstable}/abc"), None),
            (format!("{burstable}/cri-containerd-.scope"), None),
            (format!("{burstable}/cri-containerd-abc.scope/sub"), None),
            // crun's sub-cgroup in the scope is the container's; nothing deeper is.
            (
                format!("{burstable}/cri-containerd-abc.scope/container"),
                some("abc"),
            ),
            (
                format!("{guaranteed}/cri-containerd-x1.scope/container"),
                some("x1"),
            ),
            (
                format!("{burstable}/cri-containerd-abc.scope/container/sub"),
                None,
            ),
            (
                format!("{burstable}/cri-containerd-abc.scope/container2"),
                None,
            ),
            (format!("{burstable}/crio-conmon-def.scope/container"), None),
            (format!("{burstable}/container"), None),
            (burstable.clone(), None),
            ("/kubepods.slice/kubepods-burstable.slice".to_owned(), None),
            // A pod slice below the wrong level is none of the layout's.
            (
                format!("/kubepods.slice/kubepods-burstable-pod{UID_}.slice/crio-a.scope"),
                None,
            ),
            (format!("/kubepods/burstable/pod{UID}/abc"), None),
            (
                format!("/kubepods.slice/kubepods-pod{UID}.slice/crio-a.scope"),
                None,
            ),
            (format!("/system.slice/pod{UID_}.slice/crio-a.scope"), None),
        ];
        for (path, want) in table {
            assert_eq!(layout.parse_container(&path), want, "{path}");
        }
        assert_eq!(
            layout.container_dir_names("abc"),
            ["cri-containerd-abc.scope", "crio-abc.scope"]
        );
        let cgroupfs = PodCgroupLayout::new(Path::new("/"), true);
        assert_eq!(cgroupfs.container_dir_names("abc"), ["abc"]);
        assert_eq!(
            cgroupfs.parse_container(&format!("{burstable}/crio-def.scope")),
            None
        );
        // crun makes its sub-cgroup only in systemd scopes.
        assert_eq!(
            cgroupfs.parse_container(&format!("/kubepods/burstable/pod{UID}/abc/container")),
            None
        );
    }

    #[test]
    fn pod_dirs_name_the_pod_in_each_parent_for_both_drivers() {
        let cgroupfs = PodCgroupLayout::new(Path::new("/"), true);
        let systemd = systemd("/", true);
        let table = [
            (
                &cgroupfs,
                "kubepods/burstable",
                "kubepods/burstable/podu-1",
                "podu-1",
            ),
            (
                &systemd,
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice",
                "kubepods-burstable-podu_1.slice",
            ),
            (
                &systemd,
                "kubepods.slice",
                "kubepods.slice/kubepods-podu_1.slice",
                "kubepods-podu_1.slice",
            ),
        ];
        for (layout, parent, dir, name) in table {
            assert_eq!(layout.pod_dir_in(parent, "u-1"), dir);
            assert_eq!(
                layout.uid_of_pod_dir_in(parent, name),
                Some(PodUid::from("u-1")),
                "{name}"
            );
        }
        // A burstable pod's slice is not a guaranteed pod's name, nor is an unescaped UID.
        for other in [
            "kubepods-burstable-podu_1.slice",
            "kubepods-burstable.slice",
            "kubepods-podu-1.slice",
            "kubepods-pod.slice",
            "kubepods-podu_1.scope",
        ] {
            assert_eq!(
                systemd.uid_of_pod_dir_in("kubepods.slice", other),
                None,
                "{other}"
            );
        }
    }
}
