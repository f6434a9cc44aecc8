//! configMap and secret volumes (upstream `pkg/volume/configmap` and `pkg/volume/secret`): the
//! object is read through an [`ObjectSource`] each time the volume is set up or remounted, and
//! its keys (all of them, or the listed `items`) become files through the atomic writer, on a
//! tmpfs as upstream. [`KubeObjects`] reads the API server on every call (upstream's `Get`
//! change-detection strategy); `object_watch.rs` serves the same reads from one watch per
//! object (`Watch`, the default), `object_cache.rs` from a TTL cache (`Cache`).
//!
//! A deleted object is `Ok(None)`: a volume that is not `optional` then fails to set up, and one
//! already set up keeps its last files (upstream's SetUp returns the error before writing); an
//! `optional` one becomes empty.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::SystemTime,
};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, KeyToPath, Secret, ServiceAccount},
};
use kube::{Api, Client, api::PostParams};

use super::{
    Error, Result,
    atomic_writer::{FileProjection, Payload, validate_path},
    spec::ObjectKind,
};
use crate::container::PodUid;

/// The keys of a ConfigMap or Secret, as bytes.
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// A service account token for a pod (upstream's bound token request); also the token
/// manager's cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenSpec {
    pub namespace: String,
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
    pub pod_name: String,
    pub pod_uid: String,
}

/// A ConfigMap or Secret a pod references: what one watch is kept for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

/// A token the API server issued (upstream keeps the whole `TokenRequest`; these are the parts
/// its token manager reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    /// `status.expirationTimestamp`: the API server decides it, whatever was asked.
    pub expires: SystemTime,
    /// `spec.expirationSeconds` of the answer (the server may have shortened the request).
    pub lifetime_seconds: Option<i64>,
}

/// Reads ConfigMaps and Secrets and requests tokens (the API server; a fake in tests).
#[tonic::async_trait]
pub trait ObjectSource: Send + Sync {
    /// The object's data, `None` when it does not exist.
    async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> std::result::Result<Option<ObjectData>, String>;

    /// A token of the pod's service account, bound to the pod.
    async fn token(&self, spec: &TokenSpec) -> std::result::Result<IssuedToken, String>;

    /// Pod `pod` references `objects` from now on, in place of what it referenced before
    /// (upstream's manager `RegisterPod`). Sources that keep nothing per object ignore it.
    fn register_pod(&self, pod: &PodUid, objects: &BTreeSet<ObjectRef>) {
        let _ = (pod, objects);
    }

    /// Pod `pod` references nothing any more (upstream `UnregisterPod`).
    fn unregister_pod(&self, pod: &PodUid) {
        let _ = pod;
    }
}

/// The API server through kube's client.
pub struct KubeObjects(pub Client);

#[tonic::async_trait]
impl ObjectSource for KubeObjects {
    async fn token(&self, spec: &TokenSpec) -> std::result::Result<IssuedToken, String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.0.clone(), &spec.namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: spec.audience.iter().cloned().collect(),
                expiration_seconds: Some(spec.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(spec.pod_name.clone()),
                    uid: Some(spec.pod_uid.clone()),
                }),
            },
            ..Default::default()
        };
        let answer = api
            .create_token_request(&spec.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| e.to_string())?;
        let lifetime_seconds = answer.spec.expiration_seconds;
        let status = answer
            .status
            .filter(|s| !s.token.is_empty())
            .ok_or_else(|| "the API server returned no token".to_owned())?;
        Ok(IssuedToken {
            token: status.token,
            expires: SystemTime::from(status.expiration_timestamp.0),
            lifetime_seconds,
        })
    }

    async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> std::result::Result<Option<ObjectData>, String> {
        match kind {
            ObjectKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.0.clone(), namespace);
                let found = api.get_opt(name).await.map_err(|e| e.to_string())?;
                Ok(found.map(|c| config_map_data(c).0))
            }
            ObjectKind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.0.clone(), namespace);
                let found = api.get_opt(name).await.map_err(|e| e.to_string())?;
                Ok(found.map(|s| secret_data(s).0))
            }
        }
    }
}

/// Upstream's size limit of one ConfigMap or Secret (`MaxSecretSize`, and the ConfigMap's
/// validation of its total size): 1 MiB of keys and values. What the node keeps of one object
/// is checked against it, since the node does not depend on the API server's validation.
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024;

/// The size the object's keys and values add up to.
pub fn object_bytes(data: &ObjectData) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A ConfigMap's keys (`binaryData` and `data`), and whether it is `immutable`.
pub fn config_map_data(c: ConfigMap) -> (ObjectData, bool) {
    let mut data: ObjectData = c
        .binary_data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    data.extend(
        c.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes())),
    );
    (data, c.immutable == Some(true))
}

/// A Secret's keys, and whether it is `immutable`.
pub fn secret_data(s: Secret) -> (ObjectData, bool) {
    let mut data: ObjectData = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    // The API server folds stringData into data; a fake may not.
    data.extend(
        s.string_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes())),
    );
    (data, s.immutable == Some(true))
}

/// What a fetch found: the object's data, or why it could not be read.
pub type Fetched = std::result::Result<Option<ObjectData>, String>;

/// What the reconciler read for one source of a volume before its pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    Object(Fetched),
    Token(std::result::Result<String, String>),
    /// Nothing to read (a downwardAPI source).
    Nothing,
}

/// The files of a configMap or secret volume (upstream `MakePayload` of both plugins).
pub fn payload(
    volume: &str,
    kind: ObjectKind,
    name: &str,
    fetched: &Fetched,
    items: &[KeyToPath],
    default_mode: i32,
    optional: bool,
) -> Result<Payload> {
    let what = match kind {
        ObjectKind::ConfigMap => "configmap",
        ObjectKind::Secret => "secret",
    };
    let fail = |reason: String| Error::Object {
        volume: volume.to_owned(),
        reason,
    };
    let data = match fetched {
        Ok(Some(data)) => data,
        Ok(None) if optional => return Ok(Payload::new()),
        Ok(None) => return Err(fail(format!("{what}s {name:?} not found"))),
        Err(e) => return Err(fail(format!("couldn't get {what} {name}: {e}"))),
    };
    let mode = |m: Option<i32>| u32::try_from(m.unwrap_or(default_mode) & 0o777).unwrap_or(0o644);
    let mut out = Payload::new();
    if items.is_empty() {
        for (key, value) in data {
            validate_path(key).map_err(|r| fail(format!("key {key:?}: {r}")))?;
            out.insert(
                key.clone(),
                FileProjection {
                    data: value.clone(),
                    mode: mode(None),
                },
            );
        }
        return Ok(out);
    }
    for item in items {
        let Some(value) = data.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(fail(format!(
                "{what} references non-existent {} key: {}",
                if kind == ObjectKind::ConfigMap {
                    "config"
                } else {
                    "secret"
                },
                item.key
            )));
        };
        validate_path(&item.path).map_err(|r| fail(format!("path {:?}: {r}", item.path)))?;
        out.insert(
            item.path.clone(),
            FileProjection {
                data: value.clone(),
                mode: mode(item.mode),
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Fetched {
        Ok(Some(ObjectData::from([
            ("app.conf".to_owned(), b"port=80".to_vec()),
            ("extra".to_owned(), b"x".to_vec()),
        ])))
    }

    #[test]
    fn every_key_or_the_listed_items() {
        let all = payload(
            "cfg",
            ObjectKind::ConfigMap,
            "web",
            &data(),
            &[],
            0o600,
            false,
        )
        .expect("payload");
        assert_eq!(all.len(), 2);
        assert_eq!(all["app.conf"].data, b"port=80");
        assert_eq!(all["app.conf"].mode, 0o600);
        let items = vec![KeyToPath {
            key: "app.conf".into(),
            path: "conf/app.conf".into(),
            mode: Some(0o400),
        }];
        let some = payload(
            "cfg",
            ObjectKind::Secret,
            "web",
            &data(),
            &items,
            0o644,
            false,
        )
        .expect("payload");
        assert_eq!(some.keys().collect::<Vec<_>>(), vec!["conf/app.conf"]);
        assert_eq!(some["conf/app.conf"].mode, 0o400);
    }

    #[test]
    fn missing_objects_and_keys_fail_unless_optional() {
        let missing_key = vec![KeyToPath {
            key: "nope".into(),
            path: "nope".into(),
            mode: None,
        }];
        let err = |r: Result<Payload>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            err(payload(
                "cfg",
                ObjectKind::ConfigMap,
                "web",
                &data(),
                &missing_key,
                0o644,
                false
            )),
            "volume \"cfg\": configmap references non-existent config key: nope"
        );
        assert_eq!(
            err(payload(
                "s",
                ObjectKind::Secret,
                "db",
                &Ok(None),
                &[],
                0o644,
                false
            )),
            "volume \"s\": secrets \"db\" not found"
        );
        assert!(
            payload("s", ObjectKind::Secret, "db", &Ok(None), &[], 0o644, true)
                .expect("optional")
                .is_empty()
        );
        assert!(
            payload(
                "cfg",
                ObjectKind::ConfigMap,
                "web",
                &data(),
                &missing_key,
                0o644,
                true
            )
            .expect("optional")
            .is_empty()
        );
        assert_eq!(
            err(payload(
                "cfg",
                ObjectKind::ConfigMap,
                "web",
                &Err("connection refused".into()),
                &[],
                0o644,
                false
            )),
            "volume \"cfg\": couldn't get configmap web: connection refused"
        );
    }
}
