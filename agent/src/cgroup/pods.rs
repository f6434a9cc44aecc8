//! Where the pods' cgroups live (cgroupfs driver, upstream `qos_container_manager_linux.go` and
//! `pod_container_manager_linux.go`), relative to the root of every hierarchy:
//!
//! ```text
//! <cgroupRoot>/kubepods/                      Guaranteed pods directly below
//! <cgroupRoot>/kubepods/burstable/pod<uid>/   one per Burstable pod
//! <cgroupRoot>/kubepods/besteffort/pod<uid>/  one per BestEffort pod
//! <cgroupRoot>/pod<uid>/                      every pod, with cgroupsPerQOS: false
//! ```
//!
//! The runtime names each container's cgroup below its pod's by the container's id. One
//! definition for who makes these paths (`cm::pod_cgroups`), who lists them
//! (`cm::pressure_targets`) and who maps a cgroup back to its pod.

use std::path::Path;

use crate::{container::PodUid, pod::qos::QosClass};

/// The QoS levels below `kubepods`, Guaranteed (the top itself) first.
const QOS_LEVELS: [Option<&str>; 3] = [None, Some("burstable"), Some("besteffort")];

/// Where the pods' cgroups are, from `cgroupRoot` and `cgroupsPerQOS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroupLayout {
    /// `kubepods` below `cgroupRoot`, without leading or trailing `/`.
    kubepods: String,
    /// `cgroupRoot` itself, without leading or trailing `/` (empty for `/`).
    root: String,
    per_qos: bool,
}

impl PodCgroupLayout {
    /// The layout below `cgroup_root` (the config's `cgroupRoot`, absolute in the hierarchy).
    pub fn new(cgroup_root: &Path, per_qos: bool) -> Self {
        let kubepods = cgroup_root.join("kubepods");
        let kubepods = kubepods.to_string_lossy();
        PodCgroupLayout::with_kubepods(&kubepods, per_qos)
    }

    /// The layout with its top given directly (`kubepods`, or `<cgroupRoot>/kubepods`).
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
            kubepods: kubepods.to_owned(),
            root: root.to_owned(),
            per_qos,
        }
    }

    /// Where pod cgroups are made, relative to the cgroup root: `kubepods` (whose QoS levels
    /// hold them), or without `cgroupsPerQOS` the `cgroupRoot` itself (`""` for `/`). What the
    /// kernel programs watch for the pods' events.
    pub fn pods_parent(&self) -> &str {
        if self.per_qos {
            &self.kubepods
        } else {
            &self.root
        }
    }

    /// `cgroupsPerQOS`.
    pub fn per_qos(&self) -> bool {
        self.per_qos
    }

    /// The top of the QoS hierarchy, relative to the cgroup root: `kubepods` below `cgroupRoot`.
    pub fn kubepods(&self) -> &str {
        &self.kubepods
    }

    /// The QoS class's level: `kubepods`, `kubepods/burstable` or `kubepods/besteffort`.
    pub fn qos_dir(&self, class: QosClass) -> String {
        let level = match class {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        };
        self.level_dir(level)
    }

    /// The three QoS levels, the top first: what `cgroupsPerQOS` makes, and where a pod's cgroup
    /// can be whatever class it was computed with.
    pub fn qos_dirs(&self) -> [String; 3] {
        QOS_LEVELS.map(|level| self.level_dir(level))
    }

    /// The directories pod cgroups are made in: the QoS levels, or `cgroupRoot` itself (`""` for
    /// `/`) without `cgroupsPerQOS`.
    pub fn pod_parents(&self) -> Vec<String> {
        if self.per_qos {
            self.qos_dirs().to_vec()
        } else {
            vec![self.root.clone()]
        }
    }

    /// The pod's cgroup relative to the cgroup root, e.g. `kubepods/burstable/pod<uid>`.
    pub fn pod_dir(&self, class: QosClass, uid: &str) -> String {
        if self.per_qos {
            format!("{}/{}", self.qos_dir(class), pod_dir_name(uid))
        } else if self.root.is_empty() {
            pod_dir_name(uid)
        } else {
            format!("{}/{}", self.root, pod_dir_name(uid))
        }
    }

    /// `(pod uid, container id)` of a container's cgroup, given relative to the cgroup root
    /// (a leading `/` is ignored); `None` for any other cgroup: a QoS level, a pod's own cgroup,
    /// anything deeper or outside where pods live.
    pub fn parse_container(&self, path: &str) -> Option<(PodUid, String)> {
        let path = path.trim_start_matches('/');
        let rest = if self.per_qos {
            let below = path
                .strip_prefix(self.kubepods.as_str())?
                .strip_prefix('/')?;
            match below.split_once('/') {
                Some(("burstable" | "besteffort", rest)) => rest,
                _ => below,
            }
        } else if self.root.is_empty() {
            path
        } else {
            path.strip_prefix(self.root.as_str())?.strip_prefix('/')?
        };
        let (pod, id) = rest.split_once('/')?;
        let uid = uid_of_pod_dir(pod)?;
        if id.is_empty() || id.contains('/') {
            return None;
        }
        Some((uid, id.to_owned()))
    }
}

/// `pod<uid>`, the name of a pod's cgroup.
pub fn pod_dir_name(uid: &str) -> String {
    format!("pod{uid}")
}

/// The UID in a pod cgroup's name (`pod<uid>`); `None` for any other name.
pub fn uid_of_pod_dir(name: &str) -> Option<PodUid> {
    name.strip_prefix("pod")
        .filter(|uid| !uid.is_empty())
        .map(|uid| PodUid(uid.to_owned()))
}

impl PodCgroupLayout {
    fn level_dir(&self, level: Option<&str>) -> String {
        match level {
            None => self.kubepods.clone(),
            Some(level) => format!("{}/{level}", self.kubepods),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
