//! projected volumes (upstream `pkg/volume/projected/projected.go` `collectData`): configMap,
//! secret, downwardAPI and serviceAccountToken sources merged into one directory, each source
//! with its own rules, later sources overwriting earlier paths. This is what the API server's
//! admission puts in every pod (`kube-api-access-*`). The volume is set up again at every sync
//! of its pod (the manager's remount), with the objects read again and the token the token
//! manager holds, renewed at 80 % of its lifetime (`token_manager.rs`).

use k8s_openapi::api::core::v1::{Pod, VolumeProjection};

use super::{
    Error, Result,
    api_objects::{self, Fetch, TokenSpec},
    atomic_writer::{FileProjection, Payload, validate_path},
    downward_api::{self, NodeResources},
    spec::ObjectKind,
};

/// Upstream's default token lifetime (1 h) when the projection sets none.
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// What the reconciler must read for each source of the volume, in order.
pub fn wanted(pod: &Pod, sources: &[VolumeProjection]) -> Vec<Want> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    sources
        .iter()
        .map(|s| {
            if let Some(c) = &s.config_map {
                Want::Object(ObjectKind::ConfigMap, namespace.clone(), c.name.clone())
            } else if let Some(sec) = &s.secret {
                Want::Object(ObjectKind::Secret, namespace.clone(), sec.name.clone())
            } else if let Some(t) = &s.service_account_token {
                Want::Token(TokenSpec {
                    namespace: namespace.clone(),
                    service_account: pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.service_account_name.clone())
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| "default".into()),
                    audience: t.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                    pod_name: pod.metadata.name.clone().unwrap_or_default(),
                    pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                })
            } else {
                Want::Nothing
            }
        })
        .collect()
}

/// One read a projected source needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    Object(ObjectKind, String, String),
    Token(TokenSpec),
    Nothing,
}

/// The merged files of projected volume `volume`; `fetched` holds one read per source.
pub fn payload(
    volume: &str,
    pod: &Pod,
    sources: &[VolumeProjection],
    fetched: &[Fetch],
    default_mode: i32,
    node: NodeResources,
    fs_group: bool,
) -> Result<Payload> {
    let mut out = Payload::new();
    for (i, source) in sources.iter().enumerate() {
        let fetch = fetched.get(i).unwrap_or(&Fetch::Nothing);
        let not_read = Err("not read".to_owned());
        let object = match fetch {
            Fetch::Object(f) => f,
            _ => &not_read,
        };
        if let Some(c) = &source.config_map {
            out.extend(api_objects::payload(
                volume,
                ObjectKind::ConfigMap,
                &c.name,
                object,
                c.items.as_deref().unwrap_or_default(),
                default_mode,
                c.optional.unwrap_or(false),
            )?);
        } else if let Some(s) = &source.secret {
            out.extend(api_objects::payload(
                volume,
                ObjectKind::Secret,
                &s.name,
                object,
                s.items.as_deref().unwrap_or_default(),
                default_mode,
                s.optional.unwrap_or(false),
            )?);
        } else if let Some(d) = &source.downward_api {
            out.extend(downward_api::payload(
                volume,
                pod,
                d.items.as_deref().unwrap_or_default(),
                default_mode,
                node,
            )?);
        } else if let Some(t) = &source.service_account_token {
            validate_path(&t.path).map_err(|r| Error::Object {
                volume: volume.to_owned(),
                reason: format!("path {:?}: {r}", t.path),
            })?;
            let token = match fetch {
                Fetch::Token(Ok(token)) => token.clone(),
                // The token manager's text (upstream's "failed to fetch token: ...").
                Fetch::Token(Err(e)) => {
                    return Err(Error::Object {
                        volume: volume.to_owned(),
                        reason: e.clone(),
                    });
                }
                _ => {
                    return Err(Error::Object {
                        volume: volume.to_owned(),
                        reason: "failed to fetch token: not read".into(),
                    });
                }
            };
            // Upstream: with an fsGroup the token is 0600, and the ownership change makes it
            // 0640 for the group; without, the volume's default mode.
            let mode = if fs_group {
                0o600
            } else {
                u32::try_from(default_mode & 0o777).unwrap_or(0o644)
            };
            out.insert(
                t.path.clone(),
                FileProjection {
                    data: token.into_bytes(),
                    mode,
                },
            );
        } else {
            return Err(Error::Unsupported {
                volume: volume.to_owned(),
                kind: "this projected source".into(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
        ObjectFieldSelector, ServiceAccountTokenProjection,
    };

    /// The sources admission injects as `kube-api-access-*`.
    fn kube_api_access() -> Vec<VolumeProjection> {
        vec![
            VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    expiration_seconds: Some(3607),
                    path: "token".into(),
                    audience: None,
                }),
                ..Default::default()
            },
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: "kube-root-ca.crt".into(),
                    items: Some(vec![KeyToPath {
                        key: "ca.crt".into(),
                        path: "ca.crt".into(),
                        mode: None,
                    }]),
                    optional: None,
                }),
                ..Default::default()
            },
            VolumeProjection {
                downward_api: Some(DownwardAPIProjection {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "namespace".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.namespace".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            },
        ]
    }

    fn pod() -> Pod {
        crate::testing::pod()
            .named("prod", "web", "u-1")
            .spec(|s| s.service_account_name = Some("builder".into()))
            .build()
    }

    #[test]
    fn kube_api_access_reads_a_bound_token_and_the_root_ca() {
        let wants = wanted(&pod(), &kube_api_access());
        assert_eq!(
            wants,
            vec![
                Want::Token(TokenSpec {
                    namespace: "prod".into(),
                    service_account: "builder".into(),
                    audience: None,
                    expiration_seconds: 3607,
                    pod_name: "web".into(),
                    pod_uid: "u-1".into(),
                }),
                Want::Object(
                    ObjectKind::ConfigMap,
                    "prod".into(),
                    "kube-root-ca.crt".into()
                ),
                Want::Nothing,
            ]
        );
        let fetched = vec![
            Fetch::Token(Ok("eyJhbGciOi".into())),
            Fetch::Object(Ok(Some(
                [("ca.crt".to_owned(), b"-----BEGIN CERTIFICATE-----".to_vec())].into(),
            ))),
            Fetch::Nothing,
        ];
        let files = payload(
            "kube-api-access-x",
            &pod(),
            &kube_api_access(),
            &fetched,
            0o644,
            NodeResources::default(),
            false,
        )
        .expect("payload");
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            vec!["ca.crt", "namespace", "token"]
        );
        assert_eq!(files["token"].data, b"eyJhbGciOi");
        assert_eq!(files["token"].mode, 0o644);
        assert_eq!(files["namespace"].data, b"prod");
        // With an fsGroup the token is the owner's alone until the group is given read.
        let grouped = payload(
            "kube-api-access-x",
            &pod(),
            &kube_api_access(),
            &fetched,
            0o644,
            NodeResources::default(),
            true,
        )
        .expect("payload");
        assert_eq!(grouped["token"].mode, 0o600);
        assert_eq!(grouped["ca.crt"].mode, 0o644);
    }

    #[test]
    fn a_failed_token_request_fails_the_volume() {
        let fetched = vec![Fetch::Token(Err("failed to fetch token: forbidden".into()))];
        let err = payload(
            "v",
            &pod(),
            &kube_api_access()[..1],
            &fetched,
            0o644,
            NodeResources::default(),
            false,
        )
        .err()
        .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("volume \"v\": failed to fetch token: forbidden")
        );
    }
}
