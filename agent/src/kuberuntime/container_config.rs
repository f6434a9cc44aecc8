//! The CRI config of one container (upstream `generateContainerConfig` and
//! `generateLinuxContainerResources`): image, command and args expanded, environment, labels and
//! annotations that tie it to its pod, log path, resources (CPU shares/quota, memory limit,
//! oom_score_adj) and security context (`security_context.rs`).

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    env::{self, EnvContext, EnvError},
    security_context::{
        ImageUser, SecurityContextError, SecurityOptions, container_security_context,
        namespace_options, verify_run_as_non_root,
    },
};
pub use crate::cm::helpers::{
    CPU_PERIOD_US, CfsQuota, MIN_QUOTA_US, MIN_SHARES, milli_cpu_to_quota, milli_cpu_to_shares,
};
use crate::{
    cm::{hugepages, quantity},
    container::{
        ANNOTATION_CONTAINER_HASH, ANNOTATION_CONTAINER_TYPE, ANNOTATION_RESTART_COUNT,
        ANNOTATION_TERMINATION_GRACE_PERIOD, ANNOTATION_TERMINATION_MESSAGE_PATH,
        ANNOTATION_TERMINATION_MESSAGE_POLICY, LABEL_CONTAINER_NAME, LABEL_MANAGED, LABEL_POD_NAME,
        LABEL_POD_NAMESPACE, LABEL_POD_UID, container_hash,
    },
};

/// Which list of the spec a container comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    /// An init container with `restartPolicy: Always`.
    Sidecar,
    Regular,
    /// From `spec.ephemeralContainers`.
    Ephemeral,
}

impl ContainerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Sidecar => "sidecar",
            ContainerKind::Regular => "regular",
            ContainerKind::Ephemeral => "ephemeral",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ContainerParams<'a> {
    pub kind: ContainerKind,
    pub restart_count: u32,
    /// What the image resolved to in the runtime (`sha256:…`).
    pub image_ref: &'a str,
    pub env: EnvContext<'a>,
    /// The value to write, already clamped for an unprivileged agent.
    pub oom_score_adj: i64,
    /// Who the image runs as (CRI `ImageStatus`).
    pub image_user: &'a ImageUser,
    pub security: &'a SecurityOptions,
    /// The pod's user namespace, as its sandbox got it.
    pub userns: Option<cri::UserNamespace>,
    /// How limits become the container's cgroup values.
    pub resources: &'a ResourceOptions,
}

/// What the node's configuration and hardware add to a container's resources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceOptions {
    /// `cpuCFSQuota` and `cpuCFSQuotaPeriod`.
    pub cfs_quota: CfsQuota,
    /// The node's huge page sizes in bytes (`/sys/kernel/mm/hugepages`).
    pub hugepage_sizes: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("container {container}: resources: {reason}")]
    Resources { container: String, reason: String },
    #[error(transparent)]
    Security(#[from] SecurityContextError),
}

pub fn container_config(
    pod: &Pod,
    container: &Container,
    params: &ContainerParams<'_>,
) -> Result<cri::ContainerConfig, ConfigError> {
    verify_run_as_non_root(pod, container, params.image_user)?;
    let env = env::environment(pod, container, &params.env)?;
    let (command, args) = env::expand_command(container, &env)?;
    let meta = &pod.metadata;
    let mut labels = HashMap::new();
    labels.insert(
        LABEL_POD_NAME.to_owned(),
        meta.name.clone().unwrap_or_default(),
    );
    labels.insert(
        LABEL_POD_NAMESPACE.to_owned(),
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
    );
    labels.insert(
        LABEL_POD_UID.to_owned(),
        meta.uid.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_CONTAINER_NAME.to_owned(), container.name.clone());
    labels.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let mut annotations = HashMap::new();
    annotations.insert(
        ANNOTATION_CONTAINER_HASH.to_owned(),
        format!("{:x}", container_hash(container)),
    );
    annotations.insert(
        ANNOTATION_RESTART_COUNT.to_owned(),
        params.restart_count.to_string(),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_MESSAGE_PATH.to_owned(),
        container
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_MESSAGE_POLICY.to_owned(),
        container
            .termination_message_policy
            .clone()
            .unwrap_or_else(|| "File".into()),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_GRACE_PERIOD.to_owned(),
        grace.to_string(),
    );
    annotations.insert(
        ANNOTATION_CONTAINER_TYPE.to_owned(),
        params.kind.as_str().to_owned(),
    );
    let security_context = container_security_context(
        pod,
        container,
        params.image_user,
        namespace_options(pod, params.userns.clone()),
        params.security,
    )?;
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: params.restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: params.image_ref.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .into_iter()
            .map(|(key, value)| cri::KeyValue { key, value })
            .collect(),
        labels,
        annotations,
        log_path: format!("{}/{}.log", container.name, params.restart_count),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_resources(
                container,
                params.oom_score_adj,
                params.resources,
            )?),
            security_context: Some(security_context),
        }),
        ..Default::default()
    })
}

/// Puts an ephemeral container into the pid namespace of its target (upstream
/// `generateLinuxContainerConfig` with `nsTarget`: `NamespaceMode_TARGET` and the target's
/// runtime id), so that a debugger sees the target's processes. Only where the container would
/// have a pid namespace of its own: with `shareProcessNamespace` or `hostPID` it already sees
/// them, and the pod's choice stands.
pub fn target_pid_namespace(config: &mut cri::ContainerConfig, target_id: &str) {
    let Some(namespaces) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    else {
        return;
    };
    if namespaces.pid == cri::NamespaceMode::Container as i32 {
        namespaces.pid = cri::NamespaceMode::Target as i32;
        target_id.clone_into(&mut namespaces.target_id);
    }
}

/// CPU shares from the request, CFS quota from the limit in the configured period, memory
/// limit, oom_score_adj (upstream `calculateLinuxResources`: with `cpuCFSQuota` the period is
/// always sent, the quota 0 without a limit; without it neither is, and the runtime leaves the
/// container unthrottled); the hugepage limits as [`hugepage_limits`] makes them.
pub fn linux_resources(
    container: &Container,
    oom_score_adj: i64,
    options: &ResourceOptions,
) -> Result<cri::LinuxContainerResources, ConfigError> {
    let cfs = &options.cfs_quota;
    let resources = container.resources.clone().unwrap_or_default();
    let bad = |e: quantity::QuantityError| ConfigError::Resources {
        container: container.name.clone(),
        reason: e.to_string(),
    };
    let quantity_of = |list: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                       key: &str| {
        list.as_ref().and_then(|l| l.get(key)).map(|q| q.0.clone())
    };
    let cpu_limit = quantity_of(&resources.limits, "cpu")
        .map(|q| quantity::cpu_millis(&q))
        .transpose()
        .map_err(bad)?;
    // A request defaults to the limit, as the API server defaults it.
    let cpu_request = quantity_of(&resources.requests, "cpu")
        .map(|q| quantity::cpu_millis(&q))
        .transpose()
        .map_err(bad)?
        .or(cpu_limit);
    let memory_limit = quantity_of(&resources.limits, "memory")
        .map(|q| quantity::memory_bytes(&q))
        .transpose()
        .map_err(bad)?;
    let (cpu_period, cpu_quota) = match cfs.quota_for(cpu_limit.unwrap_or(0)) {
        Some(quota) => (cfs.period_us, quota),
        None => (0, 0),
    };
    Ok(cri::LinuxContainerResources {
        cpu_period,
        cpu_quota,
        cpu_shares: milli_cpu_to_shares(cpu_request.unwrap_or(0)),
        memory_limit_in_bytes: memory_limit.unwrap_or(0),
        oom_score_adj,
        hugepage_limits: hugepage_limits(container, &options.hugepage_sizes)?,
        ..Default::default()
    })
}

/// Upstream `GetHugepageLimitsFromResources`: every page size the node has, limited to the
/// container's `hugepages-<size>` limit, 0 (none may be used) where it sets none. A limit of a
/// size the node does not have is left out (admission refuses such pods before they start).
pub fn hugepage_limits(
    container: &Container,
    node_sizes: &[u64],
) -> Result<Vec<cri::HugepageLimit>, ConfigError> {
    let limits = hugepages::container_limits(container).map_err(|e| ConfigError::Resources {
        container: container.name.clone(),
        reason: e.to_string(),
    })?;
    Ok(node_sizes
        .iter()
        .filter_map(|size| {
            Some(cri::HugepageLimit {
                page_size: hugepages::unit_size(*size)?,
                limit: limits
                    .get(size)
                    .map_or(0, |bytes| u64::try_from(*bytes).unwrap_or(0)),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{PodSpec, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    };

    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_and_memory_become_shares_quota_and_limit() {
        let cases = [
            // The period goes with cpuCFSQuota even without a limit (quota 0: none).
            (resources(&[], &[]), (2, 0, 100_000, 0)),
            (resources(&[("cpu", "250m")], &[]), (256, 0, 100_000, 0)),
            (
                resources(&[("cpu", "500m")], &[("cpu", "1"), ("memory", "64Mi")]),
                (512, 100_000, 100_000, 64 << 20),
            ),
            // The request defaults to the limit.
            (resources(&[], &[("cpu", "2")]), (2048, 200_000, 100_000, 0)),
            (resources(&[], &[("cpu", "1m")]), (2, 1_000, 100_000, 0)),
        ];
        for (r, (shares, quota, period, memory)) in cases {
            let c = Container {
                name: "c".into(),
                resources: Some(r.clone()),
                ..Default::default()
            };
            let got = linux_resources(&c, 5, &ResourceOptions::default()).expect("valid");
            assert_eq!(
                (
                    got.cpu_shares,
                    got.cpu_quota,
                    got.cpu_period,
                    got.memory_limit_in_bytes
                ),
                (shares, quota, period, memory),
                "{r:?}"
            );
            assert_eq!(got.oom_score_adj, 5);
        }
    }

    #[test]
    fn the_cfs_settings_shape_the_quota_and_period() {
        let c = Container {
            name: "c".into(),
            resources: Some(resources(&[], &[("cpu", "100m")])),
            ..Default::default()
        };
        let at = |enforce, period_us| {
            let options = ResourceOptions {
                cfs_quota: CfsQuota { enforce, period_us },
                hugepage_sizes: Vec::new(),
            };
            linux_resources(&c, 0, &options)
                .map(|r| (r.cpu_quota, r.cpu_period, r.cpu_shares))
                .ok()
        };
        // 100m at 100ms is 10ms (upstream's TestMilliCPUToQuota); at 50ms, 5ms.
        assert_eq!(at(true, 100_000), Some((10_000, 100_000, 102)));
        assert_eq!(at(true, 50_000), Some((5_000, 50_000, 102)));
        // At least 1ms whatever the period.
        assert_eq!(at(true, 5_000), Some((1_000, 5_000, 102)));
        // cpuCFSQuota: false: neither quota nor period, shares as before.
        assert_eq!(at(false, 50_000), Some((0, 0, 102)));
    }

    #[test]
    fn every_node_hugepage_size_is_limited_and_requested_ones_to_their_limit() {
        let c = Container {
            name: "c".into(),
            resources: Some(resources(
                &[("hugepages-2Mi", "4Mi")],
                &[("hugepages-2Mi", "4Mi"), ("memory", "64Mi")],
            )),
            ..Default::default()
        };
        let options = ResourceOptions {
            cfs_quota: CfsQuota::default(),
            hugepage_sizes: vec![2 << 20, 1 << 30],
        };
        let got = linux_resources(&c, 0, &options)
            .map(|r| {
                r.hugepage_limits
                    .into_iter()
                    .map(|l| (l.page_size, l.limit))
                    .collect::<Vec<_>>()
            })
            .ok();
        assert_eq!(
            got,
            Some(vec![("2MB".to_owned(), 4 << 20), ("1GB".to_owned(), 0)])
        );
        // A node without huge pages sends none.
        let none = linux_resources(&c, 0, &ResourceOptions::default())
            .map(|r| r.hugepage_limits.len())
            .ok();
        assert_eq!(none, Some(0));
        let bad = Container {
            name: "web".into(),
            resources: Some(resources(&[], &[("hugepages-2Mi", "lots")])),
            ..Default::default()
        };
        let err = linux_resources(&bad, 0, &options)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("container web") && err.contains("hugepages-2Mi"),
            "{err}"
        );
    }

    /// A negative hugepage limit from a manifest must not wrap into an unlimited one at CRI.
    #[test]
    fn a_negative_hugepage_limit_reaches_cri_as_none_may_be_used() {
        let c = Container {
            name: "c".into(),
            resources: Some(resources(&[], &[("hugepages-2Mi", "-2Mi")])),
            ..Default::default()
        };
        let limits = hugepage_limits(&c, &[2 << 20]).map(|l| {
            l.into_iter()
                .map(|l| (l.page_size, l.limit))
                .collect::<Vec<_>>()
        });
        assert_eq!(limits.ok(), Some(vec![("2MB".to_owned(), 0)]));
    }

    #[test]
    fn a_bad_quantity_names_the_container() {
        let c = Container {
            name: "web".into(),
            resources: Some(resources(&[("cpu", "lots")], &[])),
            ..Default::default()
        };
        let err = linux_resources(&c, 0, &ResourceOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("container web"), "{err}");
    }

    #[test]
    fn the_config_carries_labels_annotations_and_the_expanded_command() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                termination_grace_period_seconds: Some(5),
                ..Default::default()
            }),
            status: None,
        };
        let container = Container {
            name: "app".into(),
            image: Some("localhost/swiftlet/busybox:latest".into()),
            command: Some(vec!["sh".into(), "-c".into()]),
            args: Some(vec!["echo $(WHO)".into()]),
            env: Some(vec![k8s_openapi::api::core::v1::EnvVar {
                name: "WHO".into(),
                value: Some("me".into()),
                value_from: None,
            }]),
            ..Default::default()
        };
        let security = SecurityOptions::new(std::path::Path::new("/var/lib/swiftlet"), false);
        let params = ContainerParams {
            kind: ContainerKind::Regular,
            restart_count: 3,
            image_ref: "sha256:abc",
            env: EnvContext::default(),
            oom_score_adj: 1000,
            image_user: &ImageUser::Uid(0),
            security: &security,
            userns: None,
            resources: &ResourceOptions::default(),
        };
        let c = container_config(&pod, &container, &params).expect("config");
        assert_eq!(c.args, vec!["echo me".to_owned()]);
        assert_eq!(c.log_path, "app/3.log");
        assert_eq!(c.metadata.map(|m| m.attempt), Some(3));
        assert_eq!(c.image.map(|i| i.image), Some("sha256:abc".to_owned()));
        assert_eq!(
            c.labels.get(LABEL_CONTAINER_NAME).map(String::as_str),
            Some("app")
        );
        assert_eq!(
            c.annotations
                .get(ANNOTATION_RESTART_COUNT)
                .map(String::as_str),
            Some("3")
        );
        assert_eq!(
            c.annotations.get(ANNOTATION_CONTAINER_HASH),
            Some(&format!("{:x}", container_hash(&container)))
        );
    }

    #[test]
    fn an_ephemeral_container_joins_its_targets_pid_namespace_unless_the_pod_shares_one() {
        let pod = |share: Option<bool>| Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                share_process_namespace: share,
                ..Default::default()
            }),
            status: None,
        };
        let container = Container {
            name: "debugger".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let security = SecurityOptions::new(std::path::Path::new("/var/lib/swiftlet"), false);
        let params = ContainerParams {
            kind: ContainerKind::Ephemeral,
            restart_count: 0,
            image_ref: "sha256:abc",
            env: EnvContext::default(),
            oom_score_adj: 1000,
            image_user: &ImageUser::Uid(0),
            security: &security,
            userns: None,
            resources: &ResourceOptions::default(),
        };
        let namespaces = |c: cri::ContainerConfig| {
            c.linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .map(|n| (n.pid, n.target_id))
        };
        let mut own = container_config(&pod(None), &container, &params).expect("config");
        assert_eq!(
            own.annotations
                .get(ANNOTATION_CONTAINER_TYPE)
                .map(String::as_str),
            Some("ephemeral")
        );
        target_pid_namespace(&mut own, "main-id");
        assert_eq!(
            namespaces(own),
            Some((cri::NamespaceMode::Target as i32, "main-id".to_owned()))
        );
        let mut shared = container_config(&pod(Some(true)), &container, &params).expect("config");
        target_pid_namespace(&mut shared, "main-id");
        assert_eq!(
            namespaces(shared),
            Some((cri::NamespaceMode::Pod as i32, String::new()))
        );
    }
}
