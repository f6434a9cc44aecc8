//! Making sure a container's image is on the node before it is created (upstream
//! `pkg/kubelet/images/image_manager.go` `EnsureImageExists`): the pull policy decides whether to
//! pull, a failed pull backs off (`ErrImagePull`, then `ImagePullBackOff`), and `Never` with a
//! missing image is `ErrImageNeverPull`. Everything goes through the CRI ImageService. Each
//! outcome is also an event about the container, with upstream's reasons and messages
//! (`Pulling`, `Pulled`, `Failed`, `BackOff`, `InspectFailed`, `ErrImageNeverPull`).

use crate::lock::MutexExt as _;
use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    backoff::{ImageBackoffKey, ImagePullBackoff},
    security_context::ImageUser,
};
use crate::{
    cri::ImageService,
    events::{Action, Event, EventRecorder, container_ref, go_duration_millis, reasons},
    pod::pod_uid,
    status::{StartFailure, StartFailureReason},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy, defaulted as the API server defaults it: `Always` for `:latest`
    /// or an untagged image, else `IfNotPresent`.
    pub fn of(container: &Container) -> PullPolicy {
        match container.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ => {
                let image = container.image.as_deref().unwrap_or_default();
                if has_digest(image) {
                    PullPolicy::IfNotPresent
                } else {
                    match tag_of(image) {
                        None | Some("latest") => PullPolicy::Always,
                        Some(_) => PullPolicy::IfNotPresent,
                    }
                }
            }
        }
    }
}

fn has_digest(image: &str) -> bool {
    image.contains('@')
}

/// The tag of an image reference, if any (a `:` after the last `/`).
fn tag_of(image: &str) -> Option<&str> {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split_once(':').map(|(_, tag)| tag)
}

pub struct ImagePuller {
    images: Arc<dyn ImageService>,
    backoff: Mutex<ImagePullBackoff>,
}

impl ImagePuller {
    pub fn new(images: Arc<dyn ImageService>) -> Self {
        ImagePuller {
            images,
            backoff: Mutex::new(ImagePullBackoff::image_pull()),
        }
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, ImagePullBackoff> {
        self.backoff.lock_unpoisoned()
    }

    /// The image reference to create the container from, or why it cannot be had; what
    /// happened is also reported to `events`.
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &cri::PodSandboxConfig,
        now: SystemTime,
        events: &dyn EventRecorder,
    ) -> Result<String, StartFailure> {
        let regarding = container_ref(pod, &container.name);
        let normal = |reason: &str, note: String| {
            events.record(Event::normal(
                regarding.clone(),
                reason,
                Action::PullImage,
                note,
            ));
        };
        let warning = |reason: &str, failure: StartFailure| {
            events.record(Event::warning(
                regarding.clone(),
                reason,
                Action::PullImage,
                failure.message.clone(),
            ));
            failure
        };
        let image = container.image.clone().unwrap_or_default();
        if image.is_empty() || image.chars().any(char::is_whitespace) {
            return Err(warning(
                reasons::FAILED_TO_INSPECT_IMAGE,
                StartFailure::new(
                    StartFailureReason::InvalidImageName,
                    format!(
                        "Failed to apply default image tag {image:?}: invalid reference format"
                    ),
                ),
            ));
        }
        let spec = cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let policy = PullPolicy::of(container);
        let present = match self.images.image_status(spec.clone()).await {
            Ok(found) => found.map(|i| i.id),
            Err(e) => {
                return Err(warning(
                    reasons::FAILED_TO_INSPECT_IMAGE,
                    StartFailure::new(
                        StartFailureReason::ErrImagePull,
                        format!("Failed to inspect image {image:?}: {e}"),
                    ),
                ));
            }
        };
        match (policy, present) {
            (PullPolicy::IfNotPresent | PullPolicy::Never, Some(id)) => {
                normal(
                    reasons::PULLED_IMAGE,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(id);
            }
            (PullPolicy::Never, None) => {
                return Err(warning(
                    reasons::ERR_IMAGE_NEVER_PULL_POLICY,
                    StartFailure::new(
                        StartFailureReason::ErrImageNeverPull,
                        format!(
                            "Container image {image:?} is not present with pull policy of Never"
                        ),
                    ),
                ));
            }
            _ => {}
        }
        let key = ImageBackoffKey {
            pod_uid: pod_uid(pod),
            image: image.clone(),
        };
        if self.backoff().in_backoff_since_update(&key, now).is_some() {
            let message = format!("Back-off pulling image {image:?}");
            // Upstream reports it as Normal.
            normal(reasons::BACK_OFF_START_CONTAINER, message.clone());
            return Err(StartFailure::new(
                StartFailureReason::ImagePullBackOff,
                message,
            ));
        }
        normal(reasons::PULLING_IMAGE, format!("Pulling image {image:?}"));
        let started = std::time::Instant::now();
        match self
            .images
            .pull_image(spec.clone(), None, Some(sandbox.clone()))
            .await
        {
            Ok(reference) => {
                // Upstream asks the size with best effort too (0 when unknown).
                let size = match self.images.image_status(spec).await {
                    Ok(Some(found)) => found.size,
                    _ => 0,
                };
                // Pulls are not queued here: the wait is the pull.
                let took = go_duration_millis(started.elapsed());
                normal(
                    reasons::PULLED_IMAGE,
                    format!(
                        "Successfully pulled image {image:?} in {took} ({took} including \
                         waiting). Image size: {size} bytes."
                    ),
                );
                self.backoff().reset(&key);
                Ok(reference)
            }
            Err(e) => {
                self.backoff().record_failure(&key, now, now);
                Err(warning(
                    reasons::FAILED_TO_CREATE_CONTAINER,
                    StartFailure::new(
                        StartFailureReason::ErrImagePull,
                        format!("Failed to pull image {image:?}: {e}"),
                    ),
                ))
            }
        }
    }

    /// The user the image runs as (upstream `getImageUser`), asked of the runtime by the
    /// reference the container is created from.
    pub async fn image_user(&self, image_ref: &str) -> Result<ImageUser, crate::cri::Error> {
        let status = self
            .images
            .image_status(cri::ImageSpec {
                image: image_ref.to_owned(),
                ..Default::default()
            })
            .await?;
        Ok(ImageUser::of(status.as_ref()))
    }

    /// Drops back-off entries nobody needs any more.
    pub fn gc(&self, now: SystemTime) {
        self.backoff().gc(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_policy_follows_the_tag() {
        let cases = [
            ("busybox", None, PullPolicy::Always),
            ("busybox:latest", None, PullPolicy::Always),
            ("busybox:1.36", None, PullPolicy::IfNotPresent),
            ("localhost:5000/busybox", None, PullPolicy::Always),
            ("localhost:5000/busybox:1", None, PullPolicy::IfNotPresent),
            ("busybox@sha256:abc", None, PullPolicy::IfNotPresent),
            ("busybox", Some("Never"), PullPolicy::Never),
            ("busybox:1", Some("Always"), PullPolicy::Always),
        ];
        for (image, policy, want) in cases {
            assert_eq!(
                PullPolicy::of(&container(image, policy)),
                want,
                "{image} {policy:?}"
            );
        }
    }
}
