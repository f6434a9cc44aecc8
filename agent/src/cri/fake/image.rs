//! [`ImageService`] of the fake: a set of images keyed by the exact name they were pulled or
//! added under, each with a stable id derived from that name.

use k8s_cri::v1 as cri;

use super::{Call, FakeRuntime, State};
use crate::cri::{ImageService, Result};

/// Every fake image weighs 1 MiB.
const IMAGE_SIZE: u64 = 1024 * 1024;

/// Adds `name` (if absent); returns its id.
pub(super) fn insert(state: &mut State, name: &str) -> String {
    let image = state
        .images
        .entry(name.to_owned())
        .or_insert_with(|| cri::Image {
            id: image_id(name),
            repo_tags: vec![name.to_owned()],
            size: IMAGE_SIZE,
            spec: Some(cri::ImageSpec {
                image: name.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        });
    image.id.clone()
}

/// A stable id of the form containerd reports: the sha256 of the name stands in for the
/// digest of a config blob.
fn image_id(name: &str) -> String {
    use sha2::Digest as _;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(name.as_bytes()))
    )
}

#[tonic::async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self, filter: Option<cri::ImageFilter>) -> Result<Vec<cri::Image>> {
        let state = self.begin(Call::ListImages)?;
        let wanted = filter.and_then(|f| f.image).map(|spec| spec.image);
        Ok(state
            .images
            .iter()
            .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w == *name))
            .map(|(_, image)| image.clone())
            .collect())
    }

    async fn image_status(&self, image: cri::ImageSpec) -> Result<Option<cri::Image>> {
        let state = self.begin(Call::ImageStatus {
            image: image.image.clone(),
        })?;
        // By the name it was pulled under, or by its id, as containerd resolves it.
        Ok(state
            .images
            .get(&image.image)
            .or_else(|| state.images.values().find(|i| i.id == image.image))
            .cloned())
    }

    async fn pull_image(
        &self,
        image: cri::ImageSpec,
        _auth: Option<cri::AuthConfig>,
        _sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String> {
        let mut state = self.begin(Call::PullImage {
            image: image.image.clone(),
        })?;
        Ok(insert(&mut state, &image.image))
    }

    async fn remove_image(&self, image: cri::ImageSpec) -> Result<()> {
        let mut state = self.begin(Call::RemoveImage {
            image: image.image.clone(),
        })?;
        // By the name it was pulled under, or by id (every name of it), as containerd.
        let wanted = image.image;
        state
            .images
            .retain(|name, i| *name != wanted && i.id != wanted);
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse> {
        let mut state = self.begin(Call::ImageFsInfo)?;
        let timestamp = state.tick();
        let used: u64 = state.images.values().map(|i| i.size).sum();
        Ok(cri::ImageFsInfoResponse {
            image_filesystems: vec![cri::FilesystemUsage {
                timestamp,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
                        .to_owned(),
                }),
                used_bytes: Some(cri::UInt64Value { value: used }),
                inodes_used: Some(cri::UInt64Value {
                    value: state.images.len() as u64,
                }),
            }],
            container_filesystems: Vec::new(),
        })
    }
}
