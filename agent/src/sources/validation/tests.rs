//! Tests of static pod validation beyond what the manifest tests cover.

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, PodSpec, SecretKeySelector, Volume, VolumeMount,
};

use super::*;

fn pod(name: &str, namespace: &str, spec: PodSpec) -> Pod {
    crate::testing::pod()
        .name(name)
        .namespace(namespace)
        .spec(|s| *s = spec)
        .build()
}

fn container(name: &str) -> Container {
    Container {
        name: name.to_owned(),
        image: Some("busybox".to_owned()),
        ..Container::default()
    }
}

fn errors(p: &Pod) -> Vec<String> {
    match validate_static_pod(p) {
        Ok(()) => Vec::new(),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_minimal_pod_is_valid() {
    let spec = PodSpec {
        containers: vec![container("a")],
        ..PodSpec::default()
    };
    assert_eq!(
        errors(&pod("web-node-1", "default", spec)),
        Vec::<String>::new()
    );
}

#[test]
fn names_follow_rfc_1123() {
    let spec = PodSpec {
        containers: vec![container("a")],
        ..PodSpec::default()
    };
    let long = "a".repeat(254);
    let errs = errors(&pod(&long, "Bad_NS", spec));
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].starts_with("metadata.name: Invalid value"),
        "{errs:?}"
    );
    assert!(
        errs[0].ends_with("must be no more than 253 characters"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("metadata.namespace: Invalid value: \"Bad_NS\""),
        "{errs:?}"
    );
    // Parts of a subdomain may be longer than a label.
    let spec = PodSpec {
        containers: vec![container("a")],
        ..PodSpec::default()
    };
    assert!(errors(&pod(&format!("{}-node", "b".repeat(70)), "default", spec)).is_empty());
}

#[test]
fn mounts_ports_and_secret_env_are_checked() {
    let mut c = container("a");
    c.volume_mounts = Some(vec![VolumeMount {
        name: "missing".to_owned(),
        mount_path: "/data".to_owned(),
        ..VolumeMount::default()
    }]);
    c.ports = Some(vec![ContainerPort {
        container_port: 70000,
        protocol: Some("HTTP".to_owned()),
        ..ContainerPort::default()
    }]);
    c.env = Some(vec![EnvVar {
        name: "TOKEN".to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: "s".to_owned(),
                key: "k".to_owned(),
                ..SecretKeySelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }]);
    let spec = PodSpec {
        containers: vec![c],
        volumes: Some(vec![Volume {
            name: "data".to_owned(),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    };
    let errs = errors(&pod("p", "default", spec));
    assert_eq!(
        errs,
        vec![
            "spec.containers[0].ports[0].containerPort: Invalid value: \"70000\": must be between 1 and 65535, inclusive",
            "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"TCP\", \"UDP\", \"SCTP\"",
            "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
            "spec.containers[0].env[0].valueFrom: Forbidden: static pods may not reference secrets",
        ]
    );
}

#[test]
fn resource_names_must_be_known_or_qualified() {
    let mut c = container("a");
    c.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some(
            [
                ("cpu", "1"),
                ("hugepages-2Mi", "4Mi"),
                ("example.com/gpu", "1"),
                ("gpu", "1"),
                ("memory", "-1"),
            ]
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_owned()),
                )
            })
            .collect(),
        ),
        ..Default::default()
    });
    let spec = PodSpec {
        containers: vec![c],
        ..PodSpec::default()
    };
    assert_eq!(
        errors(&pod("p", "default", spec)),
        vec![
            "spec.containers[0].resources.limits[gpu]: Invalid value: \"gpu\": must be a standard resource type or fully qualified",
            "spec.containers[0].resources.limits[memory]: Invalid value: \"-1\": must be greater than or equal to 0",
        ]
    );
}

#[test]
fn a_uid_that_is_not_one_plain_name_is_refused() {
    let spec = PodSpec {
        containers: vec![container("a")],
        ..PodSpec::default()
    };
    for bad in [
        "../../etc",
        "/",
        "a/b",
        ".hidden",
        "..",
        "-x",
        &"u".repeat(129),
    ] {
        let mut p = pod("web", "default", spec.clone());
        p.metadata.uid = Some(bad.to_owned());
        let errs = errors(&p);
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert!(
            errs[0].starts_with(&format!(
                "metadata.uid: Invalid value: {bad:?}: must consist of"
            )),
            "{errs:?}"
        );
        assert!(validate_pod_identity(&p).is_err(), "{bad}");
    }
    for good in ["db-uid", "6f1b2c3d-0000-4000-8000-1234567890ab", "a.b_c"] {
        let mut p = pod("web", "default", spec.clone());
        p.metadata.uid = Some(good.to_owned());
        assert_eq!(errors(&p), Vec::<String>::new(), "{good}");
        assert_eq!(validate_pod_identity(&p), Ok(()), "{good}");
    }
}

#[test]
fn identity_names_every_field_a_path_is_built_from() {
    let mut p = pod(
        "web",
        "default",
        PodSpec {
            containers: vec![container("../x")],
            init_containers: Some(vec![container("ok")]),
            volumes: Some(vec![Volume {
                name: "a/b".to_owned(),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        },
    );
    p.metadata.uid = Some("u-1".to_owned());
    let err = validate_pod_identity(&p)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("spec.containers[0].name: Invalid value: \"../x\""),
        "{err}"
    );
    assert!(
        err.contains("spec.volumes[0].name: Invalid value: \"a/b\""),
        "{err}"
    );
    p.metadata.uid = None;
    let err = validate_pod_identity(&p)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("metadata.uid: Required value"), "{err}");
}

#[test]
fn dns_config_is_validated_as_the_api_server_does() {
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption};
    let with = |policy: &str, config: Option<PodDNSConfig>| {
        let mut spec = PodSpec {
            containers: vec![container("c")],
            ..PodSpec::default()
        };
        crate::sources::defaults::apply(&mut spec);
        spec.dns_policy = Some(policy.to_owned());
        spec.dns_config = config;
        errors(&pod("p", "default", spec))
    };
    assert_eq!(with("None", None), ["spec.dnsConfig: Required value"]);
    assert_eq!(
        with("None", Some(PodDNSConfig::default())),
        ["spec.dnsConfig.nameservers: Required value"]
    );
    let strings = |items: &[&str]| Some(items.iter().map(|s| (*s).to_owned()).collect());
    let good = PodDNSConfig {
        nameservers: strings(&["10.0.0.10", "fd00::a"]),
        searches: strings(&["svc.cluster.local.", "example.com"]),
        options: Some(vec![PodDNSConfigOption {
            name: Some("ndots".into()),
            value: Some("2".into()),
        }]),
    };
    assert_eq!(with("None", Some(good.clone())), Vec::<String>::new());
    assert_eq!(with("ClusterFirst", Some(good)), Vec::<String>::new());
    let bad = PodDNSConfig {
        nameservers: strings(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "dns.example"]),
        searches: strings(&["Bad_Domain"]),
        options: Some(vec![PodDNSConfigOption::default()]),
    };
    assert_eq!(
        with("Default", Some(bad)),
        [
            "spec.dnsConfig.nameservers: Invalid value: \"10.0.0.1 10.0.0.2 10.0.0.3 dns.example\": \
             must not have more than 3 nameservers",
            "spec.dnsConfig.nameservers[3]: Invalid value: \"dns.example\": must be a valid IP \
             address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            &format!(
                "spec.dnsConfig.searches[0]: Invalid value: \"Bad_Domain\": {SUBDOMAIN_DETAIL}"
            ),
            "spec.dnsConfig.options[0]: Required value",
        ]
    );
    let many: Vec<String> = (0..33).map(|i| format!("d{i}.example")).collect();
    let errs = with(
        "Default",
        Some(PodDNSConfig {
            searches: Some(many),
            ..Default::default()
        }),
    );
    assert!(
        errs.iter()
            .any(|e| e.ends_with("must not have more than 32 search paths")),
        "{errs:?}"
    );
}

#[test]
fn a_static_pod_with_ephemeral_containers_is_refused() {
    // Upstream validates a static pod as a create, where ephemeral containers are forbidden:
    // they are added to a running pod through the API, never written in a manifest.
    let spec = PodSpec {
        containers: vec![container("a")],
        ephemeral_containers: Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
            name: "debugger".to_owned(),
            image: Some("busybox".to_owned()),
            target_container_name: Some("a".to_owned()),
            ..Default::default()
        }]),
        ..PodSpec::default()
    };
    assert_eq!(
        errors(&pod("web-node-1", "default", spec)),
        vec!["spec.ephemeralContainers: Forbidden: cannot be set on create".to_owned()]
    );
}
