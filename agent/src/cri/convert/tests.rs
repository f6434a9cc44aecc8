//! Tests of the conversions: the pure functions here, `get_pods` and `get_pod_status` against
//! the fake runtime in the submodules.

mod pods;
mod status;

use std::{collections::HashMap, time::Duration};

use k8s_cri::v1 as cri;
use tonic::Code;

use super::*;
use crate::cri::{
    Error, ImageService as _, Operation,
    fake::{
        Call, FakeRuntime,
        fixtures::{IMAGE, container_config, host_network, image_spec, pod_sandbox_config},
    },
};

fn uid(s: &str) -> PodUid {
    PodUid::from(s)
}

/// Starts attempt `attempt` of container `name` (restart count = attempt, hash `hash`) in
/// the sandbox.
async fn start(
    fake: &FakeRuntime,
    sandbox: &str,
    config: &cri::PodSandboxConfig,
    name: &str,
    attempt: u32,
    hash: u64,
) -> String {
    let c = container_config(config, name, IMAGE, attempt, hash);
    let id = fake
        .create_container(sandbox, c, config.clone())
        .await
        .unwrap();
    fake.start_container(&id).await.unwrap();
    id
}

async fn pod_with_restarts(fake: &FakeRuntime) -> (String, Vec<String>) {
    fake.add_image(IMAGE);
    let config = pod_sandbox_config("u1", "web", "prod", 0);
    let sandbox = fake.run_pod_sandbox(config.clone(), "").await.unwrap();
    let first = start(fake, &sandbox, &config, "app", 0, 0xabc).await;
    fake.exit_container(&first, 1);
    let second = start(fake, &sandbox, &config, "app", 1, 0xabc).await;
    let sidecar = start(fake, &sandbox, &config, "log", 0, 0xdef).await;
    (sandbox, vec![first, second, sidecar])
}

#[test]
fn timestamps_are_nanoseconds_since_the_epoch_and_zero_is_unset() {
    assert_eq!(time_from_nanos(0), None);
    assert_eq!(time_from_nanos(-5), None);
    assert_eq!(
        time_from_nanos(1_700_000_000_123_456_789),
        Some(SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789))
    );
}

#[test]
fn sandbox_ips_take_primary_then_additional_and_none_if_one_is_bad() {
    let net = |ip: &str, extra: &[&str]| cri::PodSandboxNetworkStatus {
        ip: ip.to_owned(),
        additional_ips: extra
            .iter()
            .map(|i| cri::PodIp {
                ip: (*i).to_owned(),
            })
            .collect(),
    };
    assert_eq!(
        sandbox_ips(&net("10.0.0.5", &["fd00::5"])),
        vec!["10.0.0.5", "fd00::5"]
    );
    assert_eq!(sandbox_ips(&net("", &[])), Vec::<String>::new());
    assert_eq!(
        sandbox_ips(&net("10.0.0.5", &["not-an-ip"])),
        Vec::<String>::new()
    );
    assert_eq!(sandbox_ips(&net("999.1.1.1", &[])), Vec::<String>::new());
}

#[test]
fn annotations_decode_as_upstream_writes_them_and_default_to_zero() {
    let annotations = |hash: &str, restarts: &str| {
        HashMap::from([
            (ANNOTATION_CONTAINER_HASH.to_owned(), hash.to_owned()),
            (ANNOTATION_RESTART_COUNT.to_owned(), restarts.to_owned()),
        ])
    };
    let a = annotations(&hash_annotation(0xdead_beef_0000_0001), "4");
    assert_eq!(a[ANNOTATION_CONTAINER_HASH], "deadbeef00000001");
    assert_eq!(
        (container_hash_of(&a), restart_count(&a)),
        (0xdead_beef_0000_0001, 4)
    );
    let bad = annotations("xyz", "-1");
    assert_eq!((container_hash_of(&bad), restart_count(&bad)), (0, 0));
    assert_eq!(
        (
            container_hash_of(&HashMap::new()),
            restart_count(&HashMap::new())
        ),
        (0, 0)
    );
}

#[test]
fn image_id_is_preferred_and_unknown_states_are_unknown() {
    let status = cri::ContainerStatus {
        id: "c1".into(),
        metadata: Some(cri::ContainerMetadata {
            name: "meta-name".into(),
            attempt: 0,
        }),
        state: 42,
        created_at: 1,
        image: Some(image_spec("img")),
        image_ref: "docker.io/library/img@sha256:aa".into(),
        image_id: "sha256:bb".into(),
        ..Default::default()
    };
    let converted = to_container_status(status.clone(), "s1", "cri-o");
    assert_eq!(converted.image_ref, "sha256:bb");
    assert_eq!(converted.state, ContainerState::Unknown);
    assert_eq!(
        converted.name, "meta-name",
        "no label: the CRI metadata name"
    );
    assert_eq!(converted.id.to_string(), "cri-o://c1");
    let older = cri::ContainerStatus {
        image_id: String::new(),
        ..status
    };
    assert_eq!(
        to_container_status(older, "s1", "cri-o").image_ref,
        "docker.io/library/img@sha256:aa"
    );
    assert_eq!(to_sandbox_state(7), SandboxState::NotReady);
}

#[test]
fn runtime_features_from_status() {
    // containerd 1.6 answers without features or handlers.
    assert_eq!(
        runtime_features(&cri::StatusResponse::default()),
        RuntimeFeatures::default()
    );
    let status = cri::StatusResponse {
        runtime_handlers: vec![
            cri::RuntimeHandler {
                name: String::new(),
                features: Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            },
            cri::RuntimeHandler {
                name: "runsc".into(),
                features: None,
            },
        ],
        features: Some(cri::RuntimeFeatures {
            supplemental_groups_policy: true,
        }),
        ..Default::default()
    };
    let features = runtime_features(&status);
    assert!(features.supplemental_groups_policy);
    assert!(features.handler_supports_user_namespaces(""));
    assert!(!features.handler_supports_user_namespaces("runsc"));
    assert_eq!(features.handlers.len(), 2);
}
