//! downwardAPI volumes (upstream `pkg/volume/downwardapi/downwardapi.go`): one file per item,
//! from the pod's metadata (`fieldRef`) or a container's resources (`resourceFieldRef`), written
//! with the [atomic writer](super::atomic_writer). Labels and annotations are `key="value"`
//! lines sorted by key (upstream `fieldpath.FormatMap`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod};

use super::{
    Error, Result,
    atomic_writer::{FileProjection, Payload, validate_path},
};
use crate::kuberuntime::env::{self, EnvContext};

/// The node's capacity, for resource items of containers without a limit (upstream uses node
/// allocatable).
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeResources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
}

/// The files of downwardAPI volume `volume`.
pub fn payload(
    volume: &str,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    node: NodeResources,
) -> Result<Payload> {
    let bad = |path: &str, reason: String| Error::DownwardApi {
        volume: volume.to_owned(),
        path: path.to_owned(),
        reason,
    };
    let mut out = Payload::new();
    for item in items {
        validate_path(&item.path).map_err(|r| bad(&item.path, r.to_owned()))?;
        let mode = u32::try_from(item.mode.unwrap_or(default_mode) & 0o777).unwrap_or(0o644);
        let data = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path).ok_or_else(|| {
                bad(
                    &item.path,
                    format!("field path {:?} is not supported", field.field_path),
                )
            })?
        } else if let Some(resource) = &item.resource_field_ref {
            let name = resource.container_name.as_deref().unwrap_or_default();
            let container = pod
                .spec
                .iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .find(|c| c.name == name)
                .ok_or_else(|| bad(&item.path, format!("container {name:?} not found")))?;
            let ctx = EnvContext {
                node_cpu_millis: node.cpu_millis,
                node_memory_bytes: node.memory_bytes,
                ..EnvContext::default()
            };
            env::resource_value(
                container,
                &item.path,
                &resource.resource,
                resource.divisor.as_ref().map(|d| d.0.as_str()),
                &ctx,
            )
            .map_err(|e| bad(&item.path, e.to_string()))?
        } else {
            return Err(bad(
                &item.path,
                "needs a fieldRef or a resourceFieldRef".into(),
            ));
        };
        out.insert(
            item.path.clone(),
            FileProjection {
                data: data.into_bytes(),
                mode,
            },
        );
    }
    Ok(out)
}

fn field_value(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    match path {
        "metadata.labels" => Some(format_map(meta.labels.as_ref())),
        "metadata.annotations" => Some(format_map(meta.annotations.as_ref())),
        "metadata.name" | "metadata.namespace" | "metadata.uid" => {
            env::field_value(pod, path, path, &EnvContext::default()).ok()
        }
        _ if path.starts_with("metadata.labels['")
            || path.starts_with("metadata.annotations['") =>
        {
            env::field_value(pod, path, path, &EnvContext::default()).ok()
        }
        _ => None,
    }
}

/// Upstream `fieldpath.FormatMap`: `key="value"` lines in key order, no trailing newline.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{
            Container, ObjectFieldSelector, ResourceFieldSelector, ResourceRequirements,
        },
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod() -> Pod {
        crate::testing::pod()
            .named("prod", "web", "u-1")
            .label("tier", "front")
            .label("app", "x")
            .container(Container {
                resources: Some(ResourceRequirements {
                    limits: Some([("memory".to_owned(), Quantity("64Mi".into()))].into()),
                    ..Default::default()
                }),
                ..crate::testing::container("app")
            })
            .build()
    }

    fn field(path: &str, field_path: &str) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn files_from_metadata_and_resources() {
        let items = vec![
            field("name", "metadata.name"),
            field("ns", "metadata.namespace"),
            field("uid", "metadata.uid"),
            field("labels", "metadata.labels"),
            field("tier", "metadata.labels['tier']"),
            DownwardAPIVolumeFile {
                path: "mem".into(),
                mode: Some(0o600),
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: Some("app".into()),
                    resource: "limits.memory".into(),
                    divisor: Some(Quantity("1Mi".into())),
                }),
                ..Default::default()
            },
        ];
        let got =
            payload("info", &pod(), &items, 0o644, NodeResources::default()).expect("payload");
        let text = |p: &str| String::from_utf8(got[p].data.clone()).expect("utf8");
        assert_eq!(text("name"), "web");
        assert_eq!(text("ns"), "prod");
        assert_eq!(text("uid"), "u-1");
        assert_eq!(text("labels"), "app=\"x\"\ntier=\"front\"");
        assert_eq!(text("tier"), "front");
        assert_eq!(text("mem"), "64");
        assert_eq!(got["mem"].mode, 0o600);
        assert_eq!(got["name"].mode, 0o644);
    }

    #[test]
    fn bad_items_name_volume_and_path() {
        let err = payload(
            "info",
            &pod(),
            &[field("node", "spec.nodeName")],
            0o644,
            NodeResources::default(),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert_eq!(
            err,
            "downwardAPI volume \"info\": item \"node\": field path \"spec.nodeName\" is not supported"
        );
        let err = payload(
            "info",
            &pod(),
            &[field("../x", "metadata.name")],
            0o644,
            NodeResources::default(),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("must not start with '..'"), "{err}");
    }
}
