//! What a pod's volumes ask for, read from its spec once (upstream `volume.Spec` and the desired
//! state of world populator's `GetPodVolumeNames`): only volumes some container mounts are set
//! up, as upstream.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume, VolumeProjection};

use super::{Error, paths::Plugin};
use crate::cm::quantity;

/// Where an emptyDir keeps its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// A directory on the node's disk (`medium: ""`).
    Disk,
    /// A tmpfs (`medium: Memory`).
    Memory,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    EmptyDir {
        medium: Medium,
        /// `sizeLimit` in bytes, when set.
        size_limit: Option<i64>,
    },
    HostPath {
        path: String,
        /// `type`, `""` for no check.
        kind: String,
    },
    DownwardApi {
        items: Vec<DownwardAPIVolumeFile>,
        default_mode: i32,
    },
    /// A ConfigMap or Secret of the pod's namespace (needs an API server).
    Object {
        kind: ObjectKind,
        name: String,
        items: Vec<KeyToPath>,
        default_mode: i32,
        optional: bool,
    },
    Projected {
        sources: Vec<VolumeProjection>,
        default_mode: i32,
    },
}

/// The API objects a volume can project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl Source {
    pub fn plugin(&self) -> Plugin {
        match self {
            Source::EmptyDir { .. } => Plugin::EmptyDir,
            Source::HostPath { .. } => Plugin::HostPath,
            Source::DownwardApi { .. } => Plugin::DownwardApi,
            Source::Object {
                kind: ObjectKind::ConfigMap,
                ..
            } => Plugin::ConfigMap,
            Source::Object {
                kind: ObjectKind::Secret,
                ..
            } => Plugin::Secret,
            Source::Projected { .. } => Plugin::Projected,
        }
    }
}

/// One volume of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeSpec {
    pub name: String,
    pub source: Source,
}

/// Upstream's default file mode of downward API files (0644).
pub const DEFAULT_FILE_MODE: i32 = 0o644;

/// The volumes of `pod` that some container (init, sidecar or regular) mounts, in spec order.
pub fn pod_volumes(pod: &Pod) -> Result<Vec<VolumeSpec>, Error> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let mounted: HashSet<&str> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str())
        .collect();
    spec.volumes
        .iter()
        .flatten()
        .filter(|v| mounted.contains(v.name.as_str()))
        .map(volume_spec)
        .collect()
}

fn volume_spec(v: &Volume) -> Result<VolumeSpec, Error> {
    let unsupported = |kind: &str| Error::Unsupported {
        volume: v.name.clone(),
        kind: kind.to_owned(),
    };
    let source = if let Some(e) = &v.empty_dir {
        let medium = match e.medium.as_deref().unwrap_or_default() {
            "" => Medium::Disk,
            "Memory" => Medium::Memory,
            other => return Err(unsupported(&format!("emptyDir medium {other:?}"))),
        };
        let size_limit = e
            .size_limit
            .as_ref()
            .map(|q| quantity::memory_bytes(&q.0))
            .transpose()
            .map_err(|err| Error::BadSpec {
                volume: v.name.clone(),
                field: "emptyDir.sizeLimit",
                reason: err.to_string(),
            })?;
        Source::EmptyDir { medium, size_limit }
    } else if let Some(h) = &v.host_path {
        Source::HostPath {
            path: h.path.clone(),
            kind: h.type_.clone().unwrap_or_default(),
        }
    } else if let Some(d) = &v.downward_api {
        Source::DownwardApi {
            items: d.items.clone().unwrap_or_default(),
            default_mode: d.default_mode.unwrap_or(DEFAULT_FILE_MODE),
        }
    } else if let Some(c) = &v.config_map {
        Source::Object {
            kind: ObjectKind::ConfigMap,
            name: c.name.clone(),
            items: c.items.clone().unwrap_or_default(),
            default_mode: c.default_mode.unwrap_or(DEFAULT_FILE_MODE),
            optional: c.optional.unwrap_or(false),
        }
    } else if let Some(s) = &v.secret {
        Source::Object {
            kind: ObjectKind::Secret,
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone().unwrap_or_default(),
            default_mode: s.default_mode.unwrap_or(DEFAULT_FILE_MODE),
            optional: s.optional.unwrap_or(false),
        }
    } else if let Some(p) = &v.projected {
        Source::Projected {
            sources: p.sources.clone().unwrap_or_default(),
            default_mode: p.default_mode.unwrap_or(DEFAULT_FILE_MODE),
        }
    } else if v.persistent_volume_claim.is_some() {
        return Err(unsupported("persistentVolumeClaim"));
    } else {
        return Err(unsupported("this volume source"));
    };
    Ok(VolumeSpec {
        name: v.name.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, EmptyDirVolumeSource, HostPathVolumeSource, VolumeMount},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(volumes: Vec<Volume>, mounted: &[&str]) -> Pod {
        crate::testing::pod()
            .container(Container {
                volume_mounts: Some(
                    mounted
                        .iter()
                        .map(|n| VolumeMount {
                            name: (*n).into(),
                            mount_path: format!("/{n}"),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..crate::testing::container("c")
            })
            .volumes(volumes)
            .build()
    }

    #[test]
    fn only_mounted_volumes_with_their_sources() {
        let volumes = vec![
            Volume {
                name: "mem".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(Quantity("64Mi".into())),
                }),
                ..Default::default()
            },
            Volume {
                name: "host".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/data".into(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            },
            Volume {
                name: "unused".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            },
        ];
        let got = pod_volumes(&pod(volumes, &["mem", "host"])).expect("valid");
        assert_eq!(
            got,
            vec![
                VolumeSpec {
                    name: "mem".into(),
                    source: Source::EmptyDir {
                        medium: Medium::Memory,
                        size_limit: Some(64 << 20)
                    }
                },
                VolumeSpec {
                    name: "host".into(),
                    source: Source::HostPath {
                        path: "/data".into(),
                        kind: "Directory".into()
                    }
                },
            ]
        );
    }

    #[test]
    fn unknown_medium_and_sources_name_the_volume() {
        let volumes = vec![Volume {
            name: "huge".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("HugePages".into()),
                size_limit: None,
            }),
            ..Default::default()
        }];
        let err = pod_volumes(&pod(volumes, &["huge"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("volume \"huge\""), "{err}");
        assert!(err.contains("HugePages"), "{err}");
    }
}
