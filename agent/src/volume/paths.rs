//! Where a pod's files live on the node (upstream `kubelet_getters.go`: `getPodDir`,
//! `getPodVolumeDir`, `getPodContainerDir`, and `utilstrings.EscapeQualifiedName`):
//! `<rootDir>/pods/<uid>/volumes/<plugin with / as ~>/<volume>`, and how they are opened.
//!
//! Every directory swiftlet makes here is [`DIR_MODE`] (upstream `setupDataDirs` and the pod
//! directories: 0750), so no local account but root (and root's group) reaches a pod's volumes,
//! whatever the volume roots' own modes; an existing one with a wider mode is narrowed. They are
//! opened from the root dir one component at a time, no link followed ([`crate::hostfs`]).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use crate::{
    container::PodUid,
    hostfs::{self, Dir},
};

/// The mode of the root dir, `pods`, each pod's directory and every directory swiftlet makes in
/// it (upstream 0750).
pub const DIR_MODE: u32 = 0o750;
/// Upstream's `volume-subpaths` directory of a pod (`config.DefaultKubeletVolumeSubpathsDirName`).
pub const VOLUME_SUBPATHS: &str = "volume-subpaths";

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

    /// `<rootDir>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
    pub fn sub_path(&self, uid: &PodUid, volume: &str, container: &str, index: usize) -> PathBuf {
        self.pod(uid)
            .join(VOLUME_SUBPATHS)
            .join(volume)
            .join(container)
            .join(index.to_string())
    }

    /// Makes the root dir and `pods` with [`DIR_MODE`] (upstream `setupDataDirs`), and narrows
    /// the pod directories an older agent left wider (each pod's directory, its `volumes`,
    /// their plugin directories, `containers` and `volume-subpaths`).
    pub fn setup(&self) -> hostfs::Result<()> {
        let root = hostfs::ensure_dir(&self.root, DIR_MODE)?;
        let pods = root.ensure_dir(OsStr::new("pods"), DIR_MODE)?;
        for uid in self.existing_pods() {
            let Ok(pod) = pods.ensure_dir(OsStr::new(&uid.0), DIR_MODE) else {
                continue;
            };
            for sub in ["volumes", "containers", "plugins", VOLUME_SUBPATHS] {
                if pod.stat_at(OsStr::new(sub))?.is_none() {
                    continue;
                }
                let dir = pod.ensure_dir(OsStr::new(sub), DIR_MODE)?;
                if sub == "volumes" {
                    for plugin in dir.entries(64)? {
                        let _ = dir.ensure_dir(&plugin, DIR_MODE);
                    }
                }
            }
        }
        Ok(())
    }

    /// `<rootDir>/pods`, opened (made when missing, with [`DIR_MODE`]).
    pub fn open_pods(&self) -> hostfs::Result<Dir> {
        hostfs::ensure_dir(&self.root, DIR_MODE)?.ensure_dir(OsStr::new("pods"), DIR_MODE)
    }

    /// `<rootDir>/pods/<uid>/<relative...>`, each level made with [`DIR_MODE`] when missing and
    /// opened without following a link.
    pub fn ensure_in_pod(&self, uid: &PodUid, relative: &[&str]) -> hostfs::Result<Dir> {
        let mut dir = self.open_pods()?.ensure_dir(OsStr::new(&uid.0), DIR_MODE)?;
        for part in relative {
            dir = dir.ensure_dir(OsStr::new(part), DIR_MODE)?;
        }
        Ok(dir)
    }

    /// `<rootDir>/pods/<uid>/<relative...>` as it is (nothing made), opened without following a
    /// link; mounts on the way are crossed (a volume may be one).
    pub fn open_in_pod(&self, uid: &PodUid, relative: &[&str]) -> hostfs::Result<Dir> {
        hostfs::check_component(OsStr::new(&uid.0))?;
        let mut path = PathBuf::from("pods").join(&uid.0);
        for part in relative {
            hostfs::check_component(OsStr::new(part))?;
            path.push(part);
        }
        Dir::open(&self.root)?.open_path(&path, true)
    }

    /// The directory holding the volumes of `plugin` of pod `uid` (made when missing).
    pub fn plugin_dir(&self, uid: &PodUid, plugin: Plugin) -> hostfs::Result<Dir> {
        self.ensure_in_pod(uid, &["volumes", &plugin.dir_name()])
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
