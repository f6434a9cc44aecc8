//! The API defaults a decoded pod gets before anything looks at it, so the rest of the agent never
//! has to guess what an unset field means (`restartPolicy`, `imagePullPolicy`, probe periods...).
//! The API server applies the same defaults to API pods; the kubelet's decoder applies them to
//! static manifests. Upstream: `pkg/apis/core/v1/defaults.go` (`SetDefaults_Pod`,
//! `SetDefaults_PodSpec`, `SetDefaults_Container`, `SetDefaults_Probe`, ...).
//!
//! Not here: the static-pod defaults (name suffix, UID, annotations: `manifest.rs`). Only the
//! defaults the node acts on are applied; scheduling-only fields are left as written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, Probe, Volume};

pub const RESTART_POLICY_ALWAYS: &str = "Always";
pub const DNS_CLUSTER_FIRST: &str = "ClusterFirst";
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
pub const TERMINATION_MESSAGE_POLICY: &str = "File";
/// 0644, the default mode of projected files.
const DEFAULT_FILE_MODE: i32 = 0o644;

/// Applies the API defaults to a pod spec.
pub fn apply(spec: &mut PodSpec) {
    spec.restart_policy
        .get_or_insert_with(|| RESTART_POLICY_ALWAYS.to_owned());
    spec.dns_policy
        .get_or_insert_with(|| DNS_CLUSTER_FIRST.to_owned());
    spec.termination_grace_period_seconds
        .get_or_insert(TERMINATION_GRACE_PERIOD_SECONDS);
    spec.scheduler_name
        .get_or_insert_with(|| DEFAULT_SCHEDULER_NAME.to_owned());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context
        .get_or_insert_with(PodSecurityContext::default);

    let host_network = spec.host_network.unwrap_or(false);
    let init = spec.init_containers.iter_mut().flatten();
    for container in spec.containers.iter_mut().chain(init) {
        container_defaults(container, host_network);
    }
    for volume in spec.volumes.iter_mut().flatten() {
        volume_defaults(volume);
    }
}

fn container_defaults(c: &mut Container, host_network: bool) {
    if c.image_pull_policy.is_none() {
        c.image_pull_policy =
            Some(default_pull_policy(c.image.as_deref().unwrap_or_default()).to_owned());
    }
    c.termination_message_path
        .get_or_insert_with(|| TERMINATION_MESSAGE_PATH.to_owned());
    c.termination_message_policy
        .get_or_insert_with(|| TERMINATION_MESSAGE_POLICY.to_owned());
    for port in c.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".to_owned());
        // With host networking the container's port is the host's.
        if host_network && port.host_port.is_none() {
            port.host_port = Some(port.container_port);
        }
    }
    for probe in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        probe_defaults(probe);
    }
    // A limit without a request requests the limit.
    if let Some(resources) = &mut c.resources
        && let Some(limits) = &resources.limits
    {
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        for (name, limit) in limits {
            requests
                .entry(name.clone())
                .or_insert_with(|| limit.clone());
        }
    }
}

/// `Always` for `:latest` or an untagged image without a digest, else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

fn probe_defaults(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(http) = &mut p.http_get {
        http.path.get_or_insert_with(|| "/".to_owned());
        http.scheme.get_or_insert_with(|| "HTTP".to_owned());
    }
}

fn volume_defaults(v: &mut Volume) {
    let has_source = v.host_path.is_some()
        || v.empty_dir.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
        || v.secret.is_some()
        || v.config_map.is_some()
        || v.persistent_volume_claim.is_some()
        || v.ephemeral.is_some()
        || v.csi.is_some()
        || v.image.is_some()
        || v.nfs.is_some()
        || v.iscsi.is_some()
        || v.fc.is_some()
        || v.rbd.is_some()
        || v.cephfs.is_some()
        || v.git_repo.is_some()
        || v.glusterfs.is_some()
        || v.azure_file.is_some()
        || v.azure_disk.is_some()
        || v.aws_elastic_block_store.is_some()
        || v.gce_persistent_disk.is_some()
        || v.cinder.is_some()
        || v.flex_volume.is_some()
        || v.flocker.is_some()
        || v.photon_persistent_disk.is_some()
        || v.portworx_volume.is_some()
        || v.quobyte.is_some()
        || v.scale_io.is_some()
        || v.storageos.is_some()
        || v.vsphere_volume.is_some();
    // A volume with no source is an emptyDir.
    if !has_source {
        v.empty_dir = Some(Default::default());
    }
    if let Some(d) = &mut v.downward_api {
        d.default_mode.get_or_insert(DEFAULT_FILE_MODE);
    }
    if let Some(p) = &mut v.projected {
        p.default_mode.get_or_insert(DEFAULT_FILE_MODE);
    }
    if let Some(h) = &mut v.host_path {
        h.type_.get_or_insert_with(String::new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_follows_the_tag() {
        let cases = [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("registry:5000/team/app", "Always"),
            ("registry:5000/team/app:v2", "IfNotPresent"),
            ("app@sha256:abcd", "IfNotPresent"),
        ];
        for (image, want) in cases {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn fills_what_the_node_acts_on() {
        let mut spec = PodSpec {
            host_network: Some(true),
            containers: vec![Container {
                name: "c".to_owned(),
                image: Some("busybox:1.36".to_owned()),
                ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                    container_port: 8080,
                    ..Default::default()
                }]),
                liveness_probe: Some(Probe::default()),
                resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        "memory".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".to_owned()),
                    )])),
                    ..Default::default()
                }),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "scratch".to_owned(),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        };
        apply(&mut spec);
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        let port = &c.ports.as_ref().expect("ports")[0];
        assert_eq!(
            (port.protocol.as_deref(), port.host_port),
            (Some("TCP"), Some(8080))
        );
        let probe = c.liveness_probe.as_ref().expect("probe");
        assert_eq!(
            (
                probe.timeout_seconds,
                probe.period_seconds,
                probe.failure_threshold
            ),
            (Some(1), Some(10), Some(3))
        );
        let requests = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .expect("requests");
        assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("64Mi"));
        assert!(
            spec.volumes.as_ref().expect("volumes")[0]
                .empty_dir
                .is_some()
        );
    }
}
