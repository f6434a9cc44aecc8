//! [`ImageService`] over gRPC (upstream `remote_image.go`), on the same channel as the runtime
//! service: containerd serves both on one socket, and the kubelet's `imageServiceEndpoint`
//! defaults to the runtime's.

use k8s_cri::v1 as cri;

use super::{GrpcRuntime, request};
use crate::cri::{ImageService, Operation, Result};

#[tonic::async_trait]
impl ImageService for GrpcRuntime {
    async fn list_images(&self, filter: Option<cri::ImageFilter>) -> Result<Vec<cri::Image>> {
        let timeout = Some(self.request_timeout);
        let message = cri::ListImagesRequest { filter };
        let mut client = self.images.clone();
        let exchange = client.list_images(request(message, timeout));
        self.call(Operation::ListImages, "", timeout, exchange, |r| {
            Ok(r.images)
        })
        .await
    }

    async fn image_status(&self, image: cri::ImageSpec) -> Result<Option<cri::Image>> {
        let timeout = Some(self.request_timeout);
        let id = image.image.clone();
        let message = cri::ImageStatusRequest {
            image: Some(image),
            verbose: false,
        };
        let mut client = self.images.clone();
        let exchange = client.image_status(request(message, timeout));
        self.call(Operation::ImageStatus, &id, timeout, exchange, |r| {
            // No image in the answer means the runtime does not have it.
            match r.image {
                Some(found) if found.id.is_empty() || found.size == 0 => {
                    Err("Id or size of image is not set")
                }
                found => Ok(found),
            }
        })
        .await
    }

    async fn pull_image(
        &self,
        image: cri::ImageSpec,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String> {
        let timeout = self.pull_image_timeout;
        let id = image.image.clone();
        let message = cri::PullImageRequest {
            image: Some(image),
            auth,
            sandbox_config,
        };
        let mut client = self.images.clone();
        let exchange = client.pull_image(request(message, timeout));
        self.call(Operation::PullImage, &id, timeout, exchange, |r| {
            if r.image_ref.is_empty() {
                Err("imageRef of image is not set")
            } else {
                Ok(r.image_ref)
            }
        })
        .await
    }

    async fn remove_image(&self, image: cri::ImageSpec) -> Result<()> {
        let timeout = Some(self.request_timeout);
        let id = image.image.clone();
        let message = cri::RemoveImageRequest { image: Some(image) };
        let mut client = self.images.clone();
        let exchange = client.remove_image(request(message, timeout));
        self.call(Operation::RemoveImage, &id, timeout, exchange, |_| Ok(()))
            .await
    }

    async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse> {
        let timeout = Some(self.request_timeout);
        let mut client = self.images.clone();
        let exchange = client.image_fs_info(request(cri::ImageFsInfoRequest {}, timeout));
        self.call(Operation::ImageFsInfo, "", timeout, exchange, Ok)
            .await
    }
}
