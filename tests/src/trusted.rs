//! A directory only root may write, every directory above it too (under `/run`), for files the
//! agent refuses anywhere else: the image credential provider config, bin dir and plugins
//! (`agent/src/kuberuntime/credentials/provider/trust.rs` refuses a sticky `/tmp`). Removed
//! on drop.

use std::{
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Where the directories go: `/run` is root's, mode 0755, on every systemd or container host.
const PARENT: &str = "/run/swiftlet-tests";

pub struct TrustedDir {
    path: PathBuf,
}

impl TrustedDir {
    /// A fresh `/run/swiftlet-tests/<name>-<pid>`, mode 0755, owned by root; `None` (skipping,
    /// or failing in CI) when not root, as [`crate::privileged`].
    pub fn new(test: &str, name: &str) -> Option<TrustedDir> {
        if !crate::privileged(test) {
            return None;
        }
        let parent = Path::new(PARENT);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .expect("the parent of trusted test dirs");
        // Made by someone else before with another mode: made right.
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the parent");
        let path = parent.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&path)
            .expect("a trusted test dir");
        Some(TrustedDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TrustedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
