//! Builders of the CRI configs the kubelet sends — with its pod and container labels and
//! annotations — so tests of PLEG, pod workers or status can put pods into the fake in a line
//! or two. They carry only what the fake and [`crate::cri::convert`] read; the real configs are
//! `kuberuntime`'s to build.

use std::collections::HashMap;

use k8s_cri::v1 as cri;

use super::FakeRuntime;
use crate::container::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_RESTART_COUNT, LABEL_CONTAINER_NAME, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID,
};
use crate::cri::{ImageService as _, Result, RuntimeService as _, convert};

/// The image [`FakeRuntime::start_pod`] uses.
pub const IMAGE: &str = "registry.local/busybox:1.36";

/// A pod-network sandbox config for the pod, with the kubelet's pod labels.
pub fn pod_sandbox_config(
    uid: &str,
    name: &str,
    namespace: &str,
    attempt: u32,
) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            attempt,
        }),
        labels: HashMap::from([
            (LABEL_POD_NAME.to_owned(), name.to_owned()),
            (LABEL_POD_NAMESPACE.to_owned(), namespace.to_owned()),
            (LABEL_POD_UID.to_owned(), uid.to_owned()),
        ]),
        log_directory: format!("/var/log/pods/{namespace}_{name}_{uid}"),
        ..Default::default()
    }
}

/// The same sandbox in the node's network namespace (`hostNetwork: true`).
pub fn host_network(mut config: cri::PodSandboxConfig) -> cri::PodSandboxConfig {
    let linux = config.linux.get_or_insert_with(Default::default);
    let security = linux.security_context.get_or_insert_with(Default::default);
    let namespaces = security
        .namespace_options
        .get_or_insert_with(Default::default);
    namespaces.set_network(cri::NamespaceMode::Node);
    config
}

/// A container config for the spec container `name` in the pod of `sandbox`, with the
/// kubelet's container labels and the restart-count (= `attempt`) and hash annotations.
pub fn container_config(
    sandbox: &cri::PodSandboxConfig,
    name: &str,
    image: &str,
    attempt: u32,
    hash: u64,
) -> cri::ContainerConfig {
    let mut labels: HashMap<String, String> = [LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID]
        .into_iter()
        .filter_map(|key| Some((key.to_owned(), sandbox.labels.get(key)?.clone())))
        .collect();
    labels.insert(LABEL_CONTAINER_NAME.to_owned(), name.to_owned());
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.to_owned(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        }),
        labels,
        annotations: HashMap::from([
            (ANNOTATION_RESTART_COUNT.to_owned(), attempt.to_string()),
            (
                ANNOTATION_CONTAINER_HASH.to_owned(),
                convert::hash_annotation(hash),
            ),
        ]),
        log_path: format!("{name}/{attempt}.log"),
        ..Default::default()
    }
}

impl FakeRuntime {
    /// Runs a pod-network sandbox for the pod and creates and starts one container per name
    /// (image [`IMAGE`], attempt 0, hash 0), through the ordinary calls (they are logged; take
    /// them with [`FakeRuntime::take_calls`] if the test asserts on later ones). Returns the
    /// sandbox id and the container ids in the order of `containers`.
    pub async fn start_pod(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
        containers: &[&str],
    ) -> Result<(String, Vec<String>)> {
        let sandbox_config = pod_sandbox_config(uid, name, namespace, 0);
        let sandbox_id = self.run_pod_sandbox(sandbox_config.clone(), "").await?;
        if self.image_status(image_spec(IMAGE)).await?.is_none() {
            self.pull_image(image_spec(IMAGE), None, None).await?;
        }
        let mut ids = Vec::with_capacity(containers.len());
        for container in containers {
            let config = container_config(&sandbox_config, container, IMAGE, 0, 0);
            let id = self
                .create_container(&sandbox_id, config, sandbox_config.clone())
                .await?;
            self.start_container(&id).await?;
            ids.push(id);
        }
        Ok((sandbox_id, ids))
    }
}

pub fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}
