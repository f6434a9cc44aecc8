//! Making sure a container's image is on the node before it is created (upstream
//! `pkg/kubelet/images/image_manager.go` `EnsureImageExists`): the pull policy decides whether to
//! pull, a failed pull backs off (`ErrImagePull`, then `ImagePullBackOff`), and `Never` with a
//! missing image is `ErrImageNeverPull`. Everything goes through the CRI ImageService. Each
//! outcome is also an event about the container, with upstream's reasons and messages
//! (`Pulling`, `Pulled`, `Failed`, `BackOff`, `InspectFailed`, `ErrImageNeverPull`).
//!
//! A pull presents the credentials of the pod's `imagePullSecrets` that match the image
//! (`credentials/`), each in turn until one works (upstream `PullImage` in
//! `kuberuntime_image.go`), then those of the node's credential provider plugins
//! (`credentials/provider/`; upstream's `MakeDockerKeyring` puts the pull secrets' keyring
//! before the node's); without any it pulls anonymously, and a failed pull then says which
//! plugins failed. A failed pull's message is the
//! runtime's error as upstream words a gRPC error (`rpc error: code = … desc = …`), and the
//! back-off that follows carries it (`Back-off pulling image "…": ErrImagePull: …`, upstream's
//! `prevPullErrMsg`).
//!
//! Pulls wait for the node-wide limits (`image_pulls.rs`) after the `Pulling` event, as
//! upstream's pullers queue them after it; the `Pulled` event and
//! `kubelet_image_pull_duration_seconds` count from the decision to pull, waiting included.

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    backoff::{ImageBackoffKey, ImagePullBackoff},
    credentials::{
        Credential, CredentialProviders, Keyring, NoPullSecrets, PullSecrets, provider::Provided,
        pull_secrets_for_pod, repository_of,
    },
    image_pulls::PullGate,
    security_context::ImageUser,
};
use crate::{
    cri::ImageService,
    events::{Action, Event, EventRecorder, container_ref, go_duration_millis, pod_ref, reasons},
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

/// Upstream's event reason when some of a pod's pull secrets cannot be read.
pub const FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";

pub struct ImagePuller {
    images: Arc<dyn ImageService>,
    backoff: Mutex<ImagePullBackoff>,
    secrets: Arc<dyn PullSecrets>,
    providers: Arc<CredentialProviders>,
    /// The last failed pull's message per back-off entry (upstream `prevPullErrMsg`); an entry
    /// goes with its back-off entry, so this is bounded as the back-off is.
    last_errors: Mutex<HashMap<ImageBackoffKey, String>>,
    /// The node-wide limits every pull waits for.
    gate: PullGate,
}

impl ImagePuller {
    pub fn new(images: Arc<dyn ImageService>) -> Self {
        ImagePuller {
            images,
            backoff: Mutex::new(ImagePullBackoff::image_pull()),
            secrets: Arc::new(NoPullSecrets),
            providers: Arc::new(CredentialProviders::none()),
            last_errors: Mutex::new(HashMap::new()),
            gate: PullGate::unlimited(),
        }
    }

    /// Lets pulls start only as `gate` allows (serial, parallel up to a limit, rate-limited).
    pub fn with_gate(mut self, gate: PullGate) -> Self {
        self.gate = gate;
        self
    }

    /// Reads pods' `imagePullSecrets` from `secrets`.
    pub fn with_pull_secrets(mut self, secrets: Arc<dyn PullSecrets>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Asks `providers` for credentials too.
    pub fn with_credential_providers(mut self, providers: Arc<CredentialProviders>) -> Self {
        self.providers = providers;
        self
    }

    fn last_errors(&self) -> std::sync::MutexGuard<'_, HashMap<ImageBackoffKey, String>> {
        self.last_errors.lock_unpoisoned()
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
            let message = match self.last_errors().get(&key) {
                Some(last) => format!("{message}: {last}"),
                None => message,
            };
            return Err(StartFailure::new(
                StartFailureReason::ImagePullBackOff,
                message,
            ));
        }
        self.last_errors().remove(&key);
        let (secrets, unreadable) = pull_secrets_for_pod(self.secrets.as_ref(), pod).await;
        if !unreadable.is_empty() {
            events.record(Event::warning(
                pod_ref(pod),
                FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET,
                Action::PullImage,
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the \
                     image may not succeed.",
                    unreadable.join(", ")
                ),
            ));
        }
        normal(reasons::PULLING_IMAGE, format!("Pulling image {image:?}"));
        let started = std::time::Instant::now();
        match self.pull_when_allowed(&spec, &secrets, sandbox).await {
            Ok((reference, size, pulling)) => {
                let took = started.elapsed();
                self.gate.observe(took, size);
                normal(
                    reasons::PULLED_IMAGE,
                    format!(
                        "Successfully pulled image {image:?} in {} ({} including waiting). \
                         Image size: {size} bytes.",
                        go_duration_millis(pulling),
                        go_duration_millis(took),
                    ),
                );
                self.backoff().reset(&key);
                Ok(reference)
            }
            Err(message) => {
                events.record(Event::warning(
                    regarding.clone(),
                    reasons::FAILED_TO_CREATE_CONTAINER,
                    Action::PullImage,
                    format!("Failed to pull image {image:?}: {message}"),
                ));
                self.backoff().record_failure(&key, now, now);
                let reason = StartFailureReason::ErrImagePull;
                self.last_errors()
                    .insert(key, format!("{}: {message}", reason.as_str()));
                Err(StartFailure::new(reason, message))
            }
        }
    }

    /// Gathers the credentials, waits for the node-wide limits, then pulls (upstream's pullers:
    /// the slot is held until the image's size is known). The image reference, its size (0 when
    /// unknown: upstream asks it with best effort too) and how long the pull itself took.
    async fn pull_when_allowed(
        &self,
        spec: &cri::ImageSpec,
        secrets: &[k8s_openapi::api::core::v1::Secret],
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<(String, u64, std::time::Duration), String> {
        // Before the slot, as upstream looks the keyring up before it queues the pull: a
        // provider plugin may take up to a minute, and must not hold the node's pulls meanwhile.
        let (credentials, provided) = self.credentials(spec, secrets).await?;
        let _slot = self.gate.admit().await.map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        let reference = self
            .pull_with(spec, credentials, sandbox)
            .await
            .map_err(|message| provided.explain(message))?;
        let size = match self.images.image_status(spec.clone()).await {
            Ok(Some(found)) => found.size,
            _ => 0,
        };
        Ok((reference, size, started.elapsed()))
    }

    /// The credentials to pull `spec` with: each of the pod's secrets' that matches it, then the
    /// credential provider plugins' (upstream's keyring union, pull secrets first), with what
    /// the plugins said for the error of a pull that fails.
    async fn credentials(
        &self,
        spec: &cri::ImageSpec,
        secrets: &[k8s_openapi::api::core::v1::Secret],
    ) -> Result<(Vec<Credential>, Provided), String> {
        let keyring = Keyring::from_secrets(secrets).map_err(|e| e.to_string())?;
        let repository = repository_of(&spec.image);
        let mut credentials = keyring.lookup(&repository);
        let provided = self.providers.lookup(&repository).await;
        credentials.extend(provided.credentials.iter().cloned());
        Ok((credentials, provided))
    }

    /// Pulls `spec` with each of `credentials` in turn, anonymously without any.
    async fn pull_with(
        &self,
        spec: &cri::ImageSpec,
        credentials: Vec<Credential>,
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<String, String> {
        if credentials.is_empty() {
            return self
                .images
                .pull_image(spec.clone(), None, Some(sandbox.clone()))
                .await
                .map_err(|e| go_error_text(&e));
        }
        let mut failures: Vec<String> = Vec::new();
        for credential in credentials {
            let auth = cri::AuthConfig {
                username: credential.username.clone(),
                password: credential.password.clone(),
                ..Default::default()
            };
            match self
                .images
                .pull_image(spec.clone(), Some(auth), Some(sandbox.clone()))
                .await
            {
                Ok(reference) => return Ok(reference),
                Err(e) => {
                    tracing::debug!(
                        image = %spec.image,
                        secret = %credential.source,
                        error = %e,
                        "pull with a pull secret's or credential provider's credentials failed"
                    );
                    let text = go_error_text(&e);
                    if !failures.contains(&text) {
                        failures.push(text);
                    }
                }
            }
        }
        Err(match failures.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        })
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

    /// Drops back-off entries nobody needs any more, and their last errors.
    pub fn gc(&self, now: SystemTime) {
        let mut backoff = self.backoff();
        backoff.gc(now);
        self.last_errors()
            .retain(|key, _| backoff.window(key).is_some());
    }
}

/// A CRI error as upstream's kubelet prints the gRPC error it got (`status.Error`'s text), so
/// that messages read as they do on a kubelet.
fn go_error_text(error: &crate::cri::Error) -> String {
    match error {
        crate::cri::Error::Runtime { code, message, .. } => {
            format!("rpc error: code = {} desc = {message}", go_code_name(*code))
        }
        other => other.to_string(),
    }
}

/// grpc-go's name of a status code (`codes.Code.String`); tonic's differ in two spellings.
fn go_code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".to_owned(),
        tonic::Code::Cancelled => "Canceled".to_owned(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        ByteString,
        api::core::v1::{LocalObjectReference, Secret},
    };

    use super::*;
    use crate::{
        cri::Operation,
        events::fake::FakeRecorder,
        kuberuntime::credentials::{PullSecretError, keyring},
    };

    const IMAGE: &str = "127.0.0.1:5000/swiftlet/busybox:latest";

    /// A registry that lets one user in (none: nobody), recording who each pull came as.
    struct Registry {
        accepts: Option<&'static str>,
        pulls: Mutex<Vec<Option<String>>>,
    }

    impl Registry {
        fn new(accepts: Option<&'static str>) -> Arc<Registry> {
            Arc::new(Registry {
                accepts,
                pulls: Mutex::new(Vec::new()),
            })
        }

        fn pulls(&self) -> Vec<Option<String>> {
            self.pulls.lock_unpoisoned().clone()
        }
    }

    #[tonic::async_trait]
    impl ImageService for Registry {
        async fn list_images(
            &self,
            _filter: Option<cri::ImageFilter>,
        ) -> crate::cri::Result<Vec<cri::Image>> {
            Ok(Vec::new())
        }

        async fn image_status(
            &self,
            _image: cri::ImageSpec,
        ) -> crate::cri::Result<Option<cri::Image>> {
            Ok(None)
        }

        async fn pull_image(
            &self,
            image: cri::ImageSpec,
            auth: Option<cri::AuthConfig>,
            _sandbox_config: Option<cri::PodSandboxConfig>,
        ) -> crate::cri::Result<String> {
            let user = auth.map(|a| a.username);
            self.pulls.lock_unpoisoned().push(user.clone());
            if user.is_some() && user.as_deref() == self.accepts {
                return Ok("sha256:pulled".to_owned());
            }
            Err(crate::cri::Error::Runtime {
                operation: Operation::PullImage,
                id: image.image,
                code: tonic::Code::Unknown,
                message: format!("401 Unauthorized as {}", user.unwrap_or_default()),
            })
        }

        async fn remove_image(&self, _image: cri::ImageSpec) -> crate::cri::Result<()> {
            Ok(())
        }

        async fn image_fs_info(&self) -> crate::cri::Result<cri::ImageFsInfoResponse> {
            Ok(cri::ImageFsInfoResponse::default())
        }
    }

    /// Secrets named after their user, each a `.dockerconfigjson` for `host`.
    struct Secrets {
        host: &'static str,
    }

    #[tonic::async_trait]
    impl PullSecrets for Secrets {
        async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError> {
            if name.starts_with("missing") {
                return Err(PullSecretError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                });
            }
            let config = format!(
                r#"{{"auths": {{"{}": {{"username": "{name}", "password": "pw"}}}}}}"#,
                self.host
            );
            Ok(Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..Default::default()
                },
                type_: Some(keyring::DOCKER_CONFIG_JSON_TYPE.to_owned()),
                data: Some(BTreeMap::from([(
                    keyring::DOCKER_CONFIG_JSON_KEY.to_owned(),
                    ByteString(config.into_bytes()),
                )])),
                ..Default::default()
            })
        }
    }

    fn pod_with_secrets(secrets: &[&str]) -> Pod {
        crate::testing::pod()
            .name("p")
            .namespace("ns")
            .uid("uid-1")
            .spec(|s| {
                s.image_pull_secrets = Some(
                    secrets
                        .iter()
                        .map(|n| LocalObjectReference {
                            name: (*n).to_owned(),
                        })
                        .collect(),
                );
                s.containers = vec![container(IMAGE, Some("Always"))];
            })
            .build()
    }

    async fn ensure(
        puller: &ImagePuller,
        pod: &Pod,
        now: SystemTime,
        events: &FakeRecorder,
    ) -> Result<String, StartFailure> {
        let container = container(IMAGE, Some("Always"));
        puller
            .ensure_image(
                pod,
                &container,
                &cri::PodSandboxConfig::default(),
                now,
                events,
            )
            .await
    }

    #[tokio::test]
    async fn each_matching_credential_is_tried_in_turn_until_one_works() {
        let registry = Registry::new(Some("right"));
        let puller = ImagePuller::new(registry.clone()).with_pull_secrets(Arc::new(Secrets {
            host: "127.0.0.1:5000",
        }));
        let events = FakeRecorder::new();
        let pod = pod_with_secrets(&["wrong", "right", "never-needed"]);
        let pulled = ensure(&puller, &pod, SystemTime::UNIX_EPOCH, &events).await;
        assert_eq!(pulled.ok().as_deref(), Some("sha256:pulled"));
        assert_eq!(
            registry.pulls(),
            [Some("wrong".to_owned()), Some("right".to_owned())]
        );
        assert_eq!(events.reasons(), ["Pulling", "Pulled"]);
    }

    /// The node's credential provider plugins' credentials come after the pod's pull
    /// secrets' (upstream's keyring union: the secrets', then the node's); a plugin that fails
    /// gives none, and the failed pull's message ends with why.
    #[tokio::test]
    async fn credential_provider_credentials_follow_the_pull_secrets() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("bin dir");
        let plugins = [
            (
                "node",
                "127.0.0.1:5000/swiftlet",
                r#"printf '{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","auth":{"127.0.0.1:5000":{"username":"from-plugin","password":"pw"}}}'"#,
            ),
            (
                "broken",
                "127.0.0.1:5000/other",
                "echo 'token service down' >&2; exit 1",
            ),
        ];
        let mut config = String::from(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n",
        );
        for (name, matches, script) in plugins {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\ncat >/dev/null\n{script}\n"))
                .expect("write plugin");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            config.push_str(&format!(
                "- name: {name}\n  matchImages: [\"{matches}\"]\n  defaultCacheDuration: 1m\n  \
                 apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
            ));
        }
        let config_path = dir.path().join("providers.yaml");
        std::fs::write(&config_path, config).expect("write config");
        let providers = Arc::new(
            CredentialProviders::load(
                &config_path,
                &bin,
                &crate::kuberuntime::credentials::provider::trust::Trust::beneath(dir.path()),
            )
            .expect("providers"),
        );

        let registry = Registry::new(Some("from-plugin"));
        let puller = ImagePuller::new(registry.clone())
            .with_pull_secrets(Arc::new(Secrets {
                host: "127.0.0.1:5000",
            }))
            .with_credential_providers(providers.clone());
        let events = FakeRecorder::new();
        let pulled = ensure(
            &puller,
            &pod_with_secrets(&["wrong"]),
            SystemTime::UNIX_EPOCH,
            &events,
        )
        .await;
        assert_eq!(pulled.ok().as_deref(), Some("sha256:pulled"));
        assert_eq!(
            registry.pulls(),
            [Some("wrong".to_owned()), Some("from-plugin".to_owned())]
        );

        let registry = Registry::new(None);
        let puller = ImagePuller::new(registry.clone()).with_credential_providers(providers);
        let image = "127.0.0.1:5000/other/app:1";
        let failed = puller
            .ensure_image(
                &pod_with_secrets(&[]),
                &container(image, Some("Always")),
                &cri::PodSandboxConfig::default(),
                SystemTime::UNIX_EPOCH,
                events.as_ref(),
            )
            .await
            .expect_err("no credentials");
        assert_eq!(registry.pulls(), [None]);
        assert!(
            failed.message.contains("401 Unauthorized")
                && failed.message.contains("credential provider plugin broken")
                && failed.message.contains("token service down"),
            "{}",
            failed.message
        );
    }

    #[tokio::test]
    async fn credentials_for_another_registry_are_not_presented() {
        let registry = Registry::new(None);
        let puller = ImagePuller::new(registry.clone()).with_pull_secrets(Arc::new(Secrets {
            host: "127.0.0.1:5001",
        }));
        let events = FakeRecorder::new();
        let failed = ensure(
            &puller,
            &pod_with_secrets(&["other"]),
            SystemTime::UNIX_EPOCH,
            &events,
        )
        .await
        .expect_err("an anonymous pull fails here");
        assert_eq!(registry.pulls(), [None]);
        assert_eq!(failed.reason, StartFailureReason::ErrImagePull);
    }

    #[tokio::test]
    async fn wrong_credentials_fail_with_upstreams_messages_then_back_off() {
        let registry = Registry::new(Some("nobody-has-this"));
        let puller = ImagePuller::new(registry.clone()).with_pull_secrets(Arc::new(Secrets {
            host: "127.0.0.1:5000",
        }));
        let events = FakeRecorder::new();
        let pod = pod_with_secrets(&["first", "missing-one", "second"]);
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let failed = ensure(&puller, &pod, start, &events)
            .await
            .expect_err("no credential works");
        assert_eq!(failed.reason, StartFailureReason::ErrImagePull);
        assert_eq!(
            failed.message,
            "[rpc error: code = Unknown desc = 401 Unauthorized as first, rpc error: code = \
             Unknown desc = 401 Unauthorized as second]"
        );
        let summary = events.summary();
        assert_eq!(
            summary[0],
            (
                "Warning",
                FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET.to_owned(),
                "Unable to retrieve some image pull secrets (missing-one); attempting to pull \
                 the image may not succeed."
                    .to_owned()
            )
        );
        assert_eq!(summary[1].1, "Pulling");
        assert_eq!((summary[2].0, summary[2].1.as_str()), ("Warning", "Failed"));
        assert_eq!(
            summary[2].2,
            format!("Failed to pull image {IMAGE:?}: {}", failed.message)
        );

        // Within the back-off: no pull, the last error in the message.
        let pulls = registry.pulls().len();
        let waiting = ensure(
            &puller,
            &pod,
            start + std::time::Duration::from_secs(1),
            &events,
        )
        .await
        .expect_err("backing off");
        assert_eq!(waiting.reason, StartFailureReason::ImagePullBackOff);
        assert_eq!(
            waiting.message,
            format!(
                "Back-off pulling image {IMAGE:?}: ErrImagePull: {}",
                failed.message
            )
        );
        assert_eq!(registry.pulls().len(), pulls);
        // After it, a pull again; the back-off entry and its error stay until collected.
        let again = ensure(
            &puller,
            &pod,
            start + std::time::Duration::from_secs(11),
            &events,
        )
        .await
        .expect_err("still no credential works");
        assert_eq!(again.reason, StartFailureReason::ErrImagePull);
        assert_eq!(registry.pulls().len(), pulls * 2);
        puller.gc(start + std::time::Duration::from_secs(24 * 3600));
        assert!(puller.last_errors().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_without_a_qps_token_fails_with_upstreams_message_then_backs_off() {
        use crate::kuberuntime::image_pulls::{PULL_QPS_EXCEEDED, PullGate, PullLimits};
        let registry = Registry::new(Some("right"));
        let puller = ImagePuller::new(registry.clone())
            .with_pull_secrets(Arc::new(Secrets {
                host: "127.0.0.1:5000",
            }))
            .with_gate(PullGate::new(PullLimits {
                qps: 1,
                burst: 1,
                ..PullLimits::default()
            }));
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let events = FakeRecorder::new();
        let first = ensure(&puller, &pod_with_secrets(&["right"]), start, &events).await;
        assert!(first.is_ok(), "{first:?}");

        let events = FakeRecorder::new();
        let mut second = pod_with_secrets(&["right"]);
        second.metadata.uid = Some("uid-2".to_owned());
        let failed = ensure(&puller, &second, start, &events)
            .await
            .expect_err("no token left");
        assert_eq!(failed.reason, StartFailureReason::ErrImagePull);
        assert_eq!(failed.message, PULL_QPS_EXCEEDED);
        assert_eq!(
            events.summary()[1],
            (
                "Warning",
                "Failed".to_owned(),
                format!("Failed to pull image {IMAGE:?}: pull QPS exceeded.")
            )
        );
        assert_eq!(registry.pulls().len(), 1, "the runtime was not asked");

        // After the back-off (and the bucket's refill) the pull goes through.
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        let waiting = ensure(
            &puller,
            &second,
            start + std::time::Duration::from_secs(1),
            &events,
        )
        .await
        .expect_err("backing off");
        assert_eq!(waiting.reason, StartFailureReason::ImagePullBackOff);
        let again = ensure(
            &puller,
            &second,
            start + std::time::Duration::from_secs(11),
            &events,
        )
        .await;
        assert!(again.is_ok(), "{again:?}");
        assert_eq!(registry.pulls().len(), 2);
    }

    #[test]
    fn grpc_errors_read_as_upstream_prints_them() {
        let error = crate::cri::Error::Runtime {
            operation: Operation::PullImage,
            id: IMAGE.to_owned(),
            code: tonic::Code::Cancelled,
            message: "context canceled".to_owned(),
        };
        assert_eq!(
            go_error_text(&error),
            "rpc error: code = Canceled desc = context canceled"
        );
        assert_eq!(
            go_code_name(tonic::Code::Unauthenticated),
            "Unauthenticated"
        );
    }

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
