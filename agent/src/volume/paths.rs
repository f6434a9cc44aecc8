//! Where a pod's files live on the node (upstream `kubelet_getters.go`: `getPodDir`,
//! `getPodVolumeDir`, `getPodContainerDir`, and `utilstrings.EscapeQualifiedName`):
//! `<rootDir>/pods/<uid>/volumes/<plugin with / as ~>/<volume>`.

use std::path::{Path, PathBuf};

use crate::container::PodUid;

/// The volume plugins swiftlet has, named as upstream's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plugin {
    EmptyDir,
    HostPath,
    DownwardApi,
    ConfigMap,
    Secret,
    Projected,
}

impl Plugin {
    pub const ALL: [Plugin; 6] = [
        Plugin::EmptyDir,
        Plugin::HostPath,
        Plugin::DownwardApi,
        Plugin::ConfigMap,
        Plugin::Secret,
        Plugin::Projected,
    ];

    /// Upstream's plugin name.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io/empty-dir",
            Plugin::HostPath => "kubernetes.io/host-path",
            Plugin::DownwardApi => "kubernetes.io/downward-api",
            Plugin::ConfigMap => "kubernetes.io/configmap",
            Plugin::Secret => "kubernetes.io/secret",
            Plugin::Projected => "kubernetes.io/projected",
        }
    }

    /// The name as a directory (upstream `EscapeQualifiedName`: `/` becomes `~`).
    pub fn dir_name(self) -> String {
        self.name().replace('/', "~")
    }

    /// Whether containers only ever read it (upstream's `ReadOnly` volume attribute).
    pub fn read_only(self) -> bool {
        matches!(
            self,
            Plugin::DownwardApi | Plugin::ConfigMap | Plugin::Secret | Plugin::Projected
        )
    }
}

/// The node's pod directories below `rootDir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDirs {
    root: PathBuf,
}

impl PodDirs {
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        PodDirs {
            root: root_dir.into(),
        }
    }

    /// `<rootDir>/pods`.
    pub fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// `<rootDir>/pods/<uid>`.
    pub fn pod(&self, uid: &PodUid) -> PathBuf {
        self.pods().join(&uid.0)
    }

    /// `<rootDir>/pods/<uid>/volumes`.
    pub fn volumes(&self, uid: &PodUid) -> PathBuf {
        self.pod(uid).join("volumes")
    }

    /// `<rootDir>/pods/<uid>/volumes/<plugin>/<volume>`.
    pub fn volume(&self, uid: &PodUid, plugin: Plugin, volume: &str) -> PathBuf {
        self.volumes(uid).join(plugin.dir_name()).join(volume)
    }

    /// `<rootDir>/pods/<uid>/containers/<container>` (termination-message files).
    pub fn container(&self, uid: &PodUid, container: &str) -> PathBuf {
        self.pod(uid).join("containers").join(container)
    }

    /// `<rootDir>/pods/<uid>/etc-hosts`.
    pub fn etc_hosts(&self, uid: &PodUid) -> PathBuf {
        self.pod(uid).join("etc-hosts")
    }

    /// The UIDs that have a pod directory.
    pub fn existing_pods(&self) -> Vec<PodUid> {
        let Ok(entries) = std::fs::read_dir(self.pods()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| PodUid(e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_dirs_are_upstreams() {
        let dirs = PodDirs::new("/var/lib/swiftlet");
        let uid = PodUid::from("u-1");
        assert_eq!(
            dirs.volume(&uid, Plugin::EmptyDir, "cache"),
            PathBuf::from("/var/lib/swiftlet/pods/u-1/volumes/kubernetes.io~empty-dir/cache")
        );
        assert_eq!(
            dirs.volume(&uid, Plugin::DownwardApi, "info"),
            PathBuf::from("/var/lib/swiftlet/pods/u-1/volumes/kubernetes.io~downward-api/info")
        );
        assert_eq!(
            dirs.container(&uid, "app"),
            PathBuf::from("/var/lib/swiftlet/pods/u-1/containers/app")
        );
        assert_eq!(
            dirs.etc_hosts(&uid),
            PathBuf::from("/var/lib/swiftlet/pods/u-1/etc-hosts")
        );
    }
}
