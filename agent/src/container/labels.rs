//! The labels and annotations the kubelet puts on CRI objects, so that a runtime object can be
//! traced back to its pod and container after a restart (upstream
//! `pkg/kubelet/kuberuntime/labels.go`; the same keys, so tools that read them keep working).

use std::hash::{Hash as _, Hasher as _};

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The kubelet labels sandboxes `io.kubernetes.docker.type=podsandbox`; kept for tooling.
pub const LABEL_MANAGED: &str = "io.swiftlet.managed";

pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
pub const ANNOTATION_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
pub const ANNOTATION_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Which list the container comes from: `init`, `sidecar` (an init container with
/// `restartPolicy: Always`) or `regular`.
pub const ANNOTATION_CONTAINER_TYPE: &str = "io.swiftlet.container.type";

/// A stable hash of a spec container: when it changes, the running instance no longer matches
/// the spec and is replaced (upstream hashes the container's JSON the same way in spirit).
/// Stable across swiftlet restarts and builds: FNV-1a over the JSON serialisation.
pub fn container_hash(container: &k8s_openapi::api::core::v1::Container) -> u64 {
    let json = serde_json::to_vec(container).unwrap_or_default();
    let mut hasher = Fnv1a::default();
    json.hash(&mut hasher);
    hasher.finish()
}

/// 64-bit FNV-1a: small, stable, and enough to detect a changed spec.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    #[test]
    fn the_hash_changes_with_the_spec_and_only_then() {
        let a = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        assert_eq!(container_hash(&a), container_hash(&b));
        b.args = Some(vec!["sleep".into(), "1".into()]);
        assert_ne!(container_hash(&a), container_hash(&b));
    }
}
