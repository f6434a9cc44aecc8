//! One static pod manifest (YAML or JSON) to one `Pod`, as the kubelet's file source decodes it
//! (upstream `pkg/kubelet/config/common.go`: `tryDecodeSinglePod`, `applyDefaults`): decode, check
//! it is a `v1` `Pod` with a name, apply the API defaults, derive the UID, apply the static-pod
//! defaults, validate.
//!
//! Static-pod defaults, as upstream:
//! - UID, when the manifest has none: a 128-bit FNV-1a hash of the decoded pod, then
//!   `host:<node>` and `file:<path>`, in hex. So it is stable across restarts, and changes with
//!   the content, the node or the file's path. (Upstream hashes Go's dump of its own struct, which
//!   no other program can reproduce; swiftlet hashes the pod's JSON, so the values differ from a
//!   kubelet's but follow the same rules.)
//! - name `<name>-<node>`, namespace `default` when empty, `spec.nodeName` = node;
//! - annotation `kubernetes.io/config.hash` = the UID;
//! - the toleration `{operator: Exists, effect: NoExecute}`, so node problems never evict it;
//! - `status.phase: Pending`.
//!
//! Not here: which files are manifests and duplicate names across files (`static_pods.rs`).

use std::{collections::BTreeMap, io, path::Path};

use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};

use super::{
    CONFIG_HASH_ANNOTATION, defaults,
    validation::{ValidationErrors, validate_static_pod},
};

/// Upstream's cap on one manifest (`maxConfigLength`).
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

/// Why a manifest file was not used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read it: {0}")]
    Read(#[source] io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    #[error("the file is empty")]
    Empty,
    #[error("not valid YAML or JSON: {0}")]
    Syntax(#[source] serde_yaml_ng::Error),
    #[error("not a single object: a manifest holds one Pod")]
    NotAnObject,
    #[error("kind is {0:?}, expected \"Pod\"")]
    WrongKind(String),
    #[error("apiVersion is {0:?}, expected \"v1\"")]
    WrongApiVersion(String),
    #[error("not a valid Pod: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("invalid pod: name is needed for the pod")]
    MissingName,
    #[error("invalid pod: {0}")]
    Invalid(#[source] ValidationErrors),
    #[error("duplicate pod name {name:?}: already defined in {}", other.display())]
    Duplicate {
        name: String,
        other: std::path::PathBuf,
    },
}

/// Decodes, defaults and validates the manifest `data` read from `path` on node `node_name`.
pub fn decode_static_pod(path: &Path, data: &[u8], node_name: &str) -> Result<Pod, ManifestError> {
    if data.iter().all(u8::is_ascii_whitespace) {
        return Err(ManifestError::Empty);
    }
    // JSON is YAML, so one parser reads both, as upstream's `utilyaml.ToJSON` does.
    let value: serde_json::Value =
        serde_yaml_ng::from_slice(data).map_err(ManifestError::Syntax)?;
    let object = value.as_object().ok_or(ManifestError::NotAnObject)?;
    let field = |name: &str| {
        object
            .get(name)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    // Upstream's decoder needs both to pick the type; k8s-openapi would accept them missing.
    let kind = field("kind");
    if kind != "Pod" {
        return Err(ManifestError::WrongKind(kind));
    }
    let api_version = field("apiVersion");
    if api_version != "v1" {
        return Err(ManifestError::WrongApiVersion(api_version));
    }
    let mut pod: Pod = serde_json::from_value(value).map_err(ManifestError::Decode)?;
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(ManifestError::MissingName);
    }
    if let Some(spec) = &mut pod.spec {
        defaults::apply(spec);
    }
    apply_static_defaults(&mut pod, path, node_name);
    validate_static_pod(&pod).map_err(ManifestError::Invalid)?;
    Ok(pod)
}

fn apply_static_defaults(pod: &mut Pod, path: &Path, node_name: &str) {
    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => derive_uid(pod, path, node_name),
    };
    let meta = &mut pod.metadata;
    meta.uid = Some(uid.clone());
    let name = meta.name.as_deref().unwrap_or_default();
    meta.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    if meta.namespace.as_deref().unwrap_or_default().is_empty() {
        meta.namespace = Some("default".to_owned());
    }
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_HASH_ANNOTATION.to_owned(), uid);
    if let Some(spec) = &mut pod.spec {
        spec.node_name = Some(node_name.to_owned());
        let tolerate_all = Toleration {
            operator: Some("Exists".to_owned()),
            effect: Some("NoExecute".to_owned()),
            ..Toleration::default()
        };
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        // Upstream `AddOrUpdateTolerationInPod`: one with the same key, operator, value and
        // effect is replaced, else it is added.
        let same = |t: &Toleration| {
            t.key.as_deref().unwrap_or_default().is_empty()
                && t.operator.as_deref() == Some("Exists")
                && t.value.as_deref().unwrap_or_default().is_empty()
                && t.effect.as_deref() == Some("NoExecute")
        };
        match tolerations.iter_mut().find(|t| same(t)) {
            Some(existing) => *existing = tolerate_all,
            None => tolerations.push(tolerate_all),
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_owned());
}

/// The UID of a static pod without one: see the module comment.
pub fn derive_uid(pod: &Pod, path: &Path, node_name: &str) -> String {
    let mut hasher = Fnv128a::new();
    // Serialising a k8s-openapi value cannot fail (string keys only); an empty hash input would
    // still give a stable UID from node and path.
    hasher.write(&serde_json::to_vec(pod).unwrap_or_default());
    hasher.write(b"\n");
    hasher.write(format!("host:{node_name}").as_bytes());
    hasher.write(format!("file:{}", path.display()).as_bytes());
    hex::encode(hasher.finish().to_be_bytes())
}

/// 128-bit FNV-1a, the hash upstream uses for static pod UIDs (`hash/fnv.New128a`).
struct Fnv128a(u128);

impl Fnv128a {
    const OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Self {
        Fnv128a(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u128::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

#[cfg(test)]
mod tests;
