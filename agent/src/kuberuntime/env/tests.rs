//! The environment's table tests: expansion, the downward API, the order and precedence of
//! `envFrom`, `env` and the service variables, upstream's messages for what is missing, and the
//! bounds; `gather` against fakes of the API server's objects and services.

use super::*;
use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
    }
}

#[test]
fn expansion_follows_kubernetes_rules() {
    let defined: HashMap<String, String> = [("A".to_owned(), "1".to_owned())].into_iter().collect();
    let cases = [
        ("$(A)", "1"),
        ("x$(A)y", "x1y"),
        ("$(B)", "$(B)"),
        ("$$(A)", "$(A)"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("", ""),
    ];
    for (input, want) in cases {
        assert_eq!(expand(input, &defined).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn downward_api_fields_and_earlier_variables() {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("prod".into()),
            uid: Some("u1".into()),
            labels: Some(
                [("tier".to_owned(), "front".to_owned())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: None,
    };
    let container = Container {
        name: "c".into(),
        env: Some(vec![
            field("POD", "metadata.name"),
            field("NODE", "spec.nodeName"),
            field("TIER", "metadata.labels['tier']"),
            field("IP", "status.podIP"),
            var("GREETING", "hello $(POD) on $(NODE)"),
        ]),
        args: Some(vec!["echo".into(), "$(GREETING)".into()]),
        ..Default::default()
    };
    let ips = vec!["10.88.0.5".to_owned()];
    let ctx = EnvContext {
        node_name: "node-1",
        pod_ips: &ips,
        ..Default::default()
    };
    let env = environment(&pod, &container, &ctx).expect("env");
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("POD"), Some("web"));
    assert_eq!(get("NODE"), Some("node-1"));
    assert_eq!(get("TIER"), Some("front"));
    assert_eq!(get("IP"), Some("10.88.0.5"));
    assert_eq!(get("GREETING"), Some("hello web on node-1"));
    let (_, args) = expand_command(&container, &env).expect("expanded");
    assert_eq!(
        args,
        vec!["echo".to_owned(), "hello web on node-1".to_owned()]
    );
}

#[test]
fn config_map_references_fail_without_an_api_server_unless_optional() {
    let pod = Pod::default();
    let mut reference = EnvVar {
        name: "X".into(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                name: "cm".into(),
                key: "k".into(),
                optional: None,
            }),
            ..Default::default()
        }),
    };
    let container = |v: EnvVar| Container {
        name: "c".into(),
        env: Some(vec![v]),
        ..Default::default()
    };
    let err = environment(&pod, &container(reference.clone()), &EnvContext::default());
    assert!(matches!(err, Err(EnvError::NeedsApi { .. })));
    if let Some(from) = reference.value_from.as_mut()
        && let Some(r) = from.config_map_key_ref.as_mut()
    {
        r.optional = Some(true);
    }
    let env = environment(&pod, &container(reference), &EnvContext::default());
    assert_eq!(env, Ok(vec![]));
}

/// Each variable twice the one before: unbounded, 40 of them would be a terabyte.
fn doubling(count: usize) -> Vec<EnvVar> {
    let mut vars = vec![var("V0", &"x".repeat(1024))];
    for i in 1..count {
        vars.push(var(
            &format!("V{i}"),
            &format!("$(V{})$(V{})", i - 1, i - 1),
        ));
    }
    vars
}

#[test]
fn an_expansion_past_the_bound_is_an_error_naming_the_container_and_field() {
    let container = Container {
        name: "bomb".into(),
        env: Some(doubling(40)),
        ..Default::default()
    };
    let err =
        environment(&Pod::default(), &container, &EnvContext::default()).expect_err("refused");
    // 1 KiB doubled: V0..V11 come to 4 MiB - 1 KiB, so V12 (4 MiB) is past the bound.
    assert_eq!(
        err.to_string(),
        "container \"bomb\": env V12: expanding its $(VAR) references would exceed 4194304 \
         bytes"
    );

    // Within the bound for the environment; the command's expansion is what goes past it.
    let container = Container {
        name: "cmd".into(),
        env: Some(doubling(11)),
        command: Some(vec!["echo".into()]),
        args: Some(vec!["$(V10)".into(), "$(V10)$(V10)$(V10)".into()]),
        ..Default::default()
    };
    let env = environment(&Pod::default(), &container, &EnvContext::default()).expect("env");
    assert_eq!(env.len(), 11);
    let err = expand_command(&container, &env).expect_err("refused");
    assert!(
        matches!(&err, EnvError::TooLong { container, field, .. }
            if container == "cmd" && field == "args[1]"),
        "{err}"
    );
    // One string on its own is bounded too (subPathExpr's path).
    let defined: HashMap<String, String> = env.into_iter().collect();
    assert!(expand("$(V10)$(V10)$(V10)$(V10)$(V10)", &defined).is_err());
    assert_eq!(expand("$(V0)", &defined).map(|s| s.len()), Ok(1024));
}

mod cluster {
    use std::{
        collections::BTreeMap,
        sync::{Arc, Mutex},
    };

    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, SecretEnvSource, SecretKeySelector,
    };

    use super::*;

    fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn config_map_key(name: &str, cm: &str, key: &str, optional: bool) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: cm.into(),
                    key: key.into(),
                    optional: optional.then_some(true),
                }),
                ..Default::default()
            }),
        }
    }

    fn secret_key(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.into(),
                    key: key.into(),
                    optional: optional.then_some(true),
                }),
                ..Default::default()
            }),
        }
    }

    fn from_config_map(name: &str, prefix: Option<&str>, optional: bool) -> EnvFromSource {
        EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: name.into(),
                optional: optional.then_some(true),
            }),
            prefix: prefix.map(str::to_owned),
            secret_ref: None,
        }
    }

    fn from_secret(name: &str, optional: bool) -> EnvFromSource {
        EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.into(),
                optional: optional.then_some(true),
            }),
            config_map_ref: None,
            prefix: None,
        }
    }

    fn pod() -> Pod {
        crate::testing::pod().named("shop", "web", "u1").build()
    }

    fn run(
        container: &Container,
        cluster: &ClusterValues,
    ) -> Result<Vec<(String, String)>, EnvError> {
        let ctx = EnvContext {
            cluster: Some(cluster),
            ..Default::default()
        };
        environment(&pod(), container, &ctx)
    }

    fn values() -> ClusterValues {
        ClusterValues {
            connected: true,
            services: vec![
                ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
                ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
                ("MODE".into(), "from-service".into()),
            ],
            config_maps: [
                (
                    "app".to_owned(),
                    Lookup::Found(strings(&[
                        ("MODE", "from-config"),
                        ("LEVEL", "debug"),
                        ("app.properties", "x=1"),
                        ("bad=key", "no"),
                    ])),
                ),
                ("gone".to_owned(), Lookup::NotFound),
                (
                    "broken".to_owned(),
                    Lookup::Failed("connection refused".into()),
                ),
            ]
            .into_iter()
            .collect(),
            secrets: [(
                "db".to_owned(),
                Lookup::Found(strings(&[("PASSWORD", "s3cret"), ("USER", "admin")])),
            )]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn env_from_first_then_env_then_the_services_no_one_defined() {
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![
                from_config_map("app", None, false),
                from_secret("db", false),
                from_config_map("app", Some("CFG_"), false),
            ]),
            env: Some(vec![
                var("LEVEL", "info"),
                secret_key("DB_PASSWORD", "db", "PASSWORD", false),
                var(
                    "URL",
                    "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)/$(MODE)",
                ),
                config_map_key("FROM_KEY", "app", "MODE", false),
            ]),
            ..Default::default()
        };
        let env = run(&container, &values()).expect("env");
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                // The ConfigMap's keys (sorted), the invalid `bad=key` left out.
                "LEVEL",
                "MODE",
                "app.properties",
                "PASSWORD",
                "USER",
                "CFG_LEVEL",
                "CFG_MODE",
                "CFG_app.properties",
                "DB_PASSWORD",
                "URL",
                "FROM_KEY",
                // MODE is defined already: only the other service variables follow.
                "KUBERNETES_SERVICE_HOST",
                "KUBERNETES_SERVICE_PORT",
            ]
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        // env overrides envFrom in place.
        assert_eq!(get("LEVEL"), Some("info"));
        assert_eq!(get("MODE"), Some("from-config"));
        assert_eq!(get("DB_PASSWORD"), Some("s3cret"));
        // Expansion sees envFrom's variables before the services'.
        assert_eq!(get("URL"), Some("https://10.96.0.1:443/from-config"));
        assert_eq!(get("FROM_KEY"), Some("from-config"));
    }

    #[test]
    fn missing_objects_and_keys_have_upstreams_messages() {
        let message = |var: EnvVar| {
            let container = Container {
                name: "c".into(),
                env: Some(vec![var]),
                ..Default::default()
            };
            run(&container, &values()).map_err(|e| e.to_string())
        };
        assert_eq!(
            message(config_map_key("X", "app", "nope", false)),
            Err("couldn't find key nope in ConfigMap shop/app".into())
        );
        assert_eq!(
            message(secret_key("X", "db", "nope", false)),
            Err("couldn't find key nope in Secret shop/db".into())
        );
        assert_eq!(
            message(config_map_key("X", "gone", "k", false)),
            Err("configmap \"gone\" not found".into())
        );
        assert_eq!(
            message(secret_key("X", "missing", "k", false)),
            Err("secret \"missing\" not found".into())
        );
        assert_eq!(
            message(config_map_key("X", "broken", "k", true)),
            Err("couldn't get configmap shop/broken: connection refused".into()),
            "an unreadable object fails even when optional"
        );
        // Optional: left out, and an envFrom value of that name stays.
        for optional in [
            config_map_key("X", "app", "nope", true),
            config_map_key("X", "gone", "k", true),
            secret_key("X", "missing", "k", true),
        ] {
            let env = message(optional).expect("left out");
            assert!(env.iter().all(|(k, _)| k != "X"), "{env:?}");
        }
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![
                from_config_map("gone", None, true),
                from_config_map("app", None, false),
            ]),
            env: Some(vec![config_map_key("MODE", "gone", "k", true)]),
            ..Default::default()
        };
        let env = run(&container, &values()).expect("env");
        assert!(
            env.contains(&("MODE".into(), "from-config".into())),
            "{env:?}"
        );
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![from_secret("absent", false)]),
            ..Default::default()
        };
        assert_eq!(
            run(&container, &values()).map_err(|e| e.to_string()),
            Err("secret \"absent\" not found".into())
        );
    }

    #[test]
    fn the_bound_covers_env_from_and_the_services() {
        let big = "v".repeat(1 << 20);
        let mut cluster = values();
        cluster.config_maps.insert(
            "big".into(),
            Lookup::Found((0..5).map(|i| (format!("K{i}"), big.clone())).collect()),
        );
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![from_config_map("big", None, false)]),
            ..Default::default()
        };
        assert_eq!(
            run(&container, &cluster).map_err(|e| e.to_string()),
            Err("container \"c\": envFrom[0]: the environment would exceed 4194304 bytes".into())
        );
        // Four values just under 1 MiB fit; the services' variables do not, after them.
        let under = "v".repeat((1 << 20) - 100);
        cluster.config_maps.insert(
            "big".into(),
            Lookup::Found((0..4).map(|i| (format!("K{i}"), under.clone())).collect()),
        );
        cluster.services = (0..100)
            .map(|i| (format!("S{i:03}_SERVICE_HOST"), "10.96.0.1".into()))
            .collect();
        assert_eq!(
            run(&container, &cluster).map_err(|e| e.to_string()),
            Err(
                "container \"c\": service environment variables: the environment would exceed \
                 4194304 bytes"
                    .into()
            )
        );
    }

    /// A fake API server: objects by `namespace/name`, and every read counted.
    #[derive(Default)]
    struct FakeObjects {
        config_maps: BTreeMap<String, BTreeMap<String, String>>,
        secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
        reads: Mutex<Vec<String>>,
    }

    #[tonic::async_trait]
    impl EnvObjects for FakeObjects {
        async fn config_map(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<BTreeMap<String, String>>, ReadError> {
            let key = format!("{namespace}/{name}");
            self.reads.lock().unwrap().push(format!("configmap {key}"));
            if name == "unreachable" {
                return Err(ReadError("connection refused".into()));
            }
            Ok(self.config_maps.get(&key).cloned())
        }

        async fn secret(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<BTreeMap<String, Vec<u8>>>, ReadError> {
            let key = format!("{namespace}/{name}");
            self.reads.lock().unwrap().push(format!("secret {key}"));
            Ok(self.secrets.get(&key).cloned())
        }
    }

    struct FakeServices {
        synced: bool,
    }

    impl ServiceLister for FakeServices {
        fn synced(&self) -> bool {
            self.synced
        }

        fn services(&self, namespace: &str) -> Vec<ServiceInfo> {
            let service = |name: &str, ip: &str| ServiceInfo {
                name: name.into(),
                cluster_ip: ip.into(),
                ports: vec![ServicePort {
                    name: String::new(),
                    port: 443,
                    protocol: "TCP",
                }],
            };
            match namespace {
                "default" => vec![service("kubernetes", "10.96.0.1")],
                "shop" => vec![service("cart", "10.96.0.7")],
                _ => vec![],
            }
        }
    }

    fn fake_objects() -> Arc<FakeObjects> {
        let mut objects = FakeObjects::default();
        objects.config_maps.insert(
            "shop/app".into(),
            strings(&[("MODE", "fast"), ("UNUSED", "x")]),
        );
        objects.secrets.insert(
            "shop/db".into(),
            [
                ("PASSWORD".to_owned(), b"s3cret".to_vec()),
                ("BINARY".to_owned(), vec![0xff, b'a']),
            ]
            .into_iter()
            .collect(),
        );
        Arc::new(objects)
    }

    #[tokio::test]
    async fn gather_reads_each_object_once_keeping_what_is_used() {
        let objects = fake_objects();
        let cluster = ClusterEnv::new(objects.clone(), Arc::new(FakeServices { synced: true }));
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![from_secret("db", false)]),
            env: Some(vec![
                config_map_key("A", "app", "MODE", false),
                config_map_key("B", "app", "MODE", false),
                config_map_key("C", "absent", "k", true),
                config_map_key("D", "unreachable", "k", true),
                // A value is used before valueFrom: nothing to read for it.
                EnvVar {
                    value: Some("literal".into()),
                    ..config_map_key("E", "never-read", "k", false)
                },
            ]),
            ..Default::default()
        };
        let values = cluster.gather(&pod(), &container).await.expect("gathered");
        assert_eq!(
            *objects.reads.lock().unwrap(),
            [
                "configmap shop/absent",
                "configmap shop/app",
                "configmap shop/unreachable",
                "secret shop/db"
            ]
        );
        assert_eq!(
            values.config_maps["app"],
            Lookup::Found(strings(&[("MODE", "fast")]))
        );
        assert_eq!(values.config_maps["absent"], Lookup::NotFound);
        assert_eq!(
            values.config_maps["unreachable"],
            Lookup::Failed("connection refused".into())
        );
        // Every key of an envFrom object; bytes that are not UTF-8 become U+FFFD.
        assert_eq!(
            values.secrets["db"],
            Lookup::Found(strings(&[("BINARY", "\u{fffd}a"), ("PASSWORD", "s3cret")]))
        );
        let names: Vec<&str> = values.services.iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"CART_SERVICE_HOST"), "{names:?}");
        assert!(names.contains(&"KUBERNETES_SERVICE_HOST"), "{names:?}");
    }

    #[tokio::test]
    async fn an_api_pod_waits_for_the_services_a_static_pod_does_not() {
        let cluster = ClusterEnv::new(fake_objects(), Arc::new(FakeServices { synced: false }));
        let container = crate::testing::container("c");
        assert_eq!(
            cluster
                .gather(&pod(), &container)
                .await
                .map_err(|e| e.to_string()),
            Err("services have not yet been read at least once, cannot construct envvars".into())
        );
        let mut static_pod = pod();
        static_pod.metadata.annotations = Some(
            [(
                crate::pod::spec::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            )]
            .into_iter()
            .collect(),
        );
        assert!(cluster.gather(&static_pod, &container).await.is_ok());
        // enableServiceLinks: false keeps only the master services.
        let cluster = ClusterEnv::new(fake_objects(), Arc::new(FakeServices { synced: true }));
        let mut no_links = pod();
        no_links.spec.get_or_insert_default().enable_service_links = Some(false);
        let values = cluster
            .gather(&no_links, &container)
            .await
            .expect("gathered");
        assert!(
            values
                .services
                .iter()
                .all(|(k, _)| k.starts_with("KUBERNETES_"))
        );
        assert!(!values.services.is_empty());
    }

    #[tokio::test]
    async fn what_gather_keeps_is_bounded() {
        let mut objects = FakeObjects::default();
        objects.config_maps.insert(
            "shop/huge".into(),
            (0..5)
                .map(|i| (format!("K{i}"), "v".repeat(1 << 20)))
                .collect(),
        );
        let cluster = ClusterEnv::new(Arc::new(objects), Arc::new(FakeServices { synced: true }));
        let container = Container {
            name: "c".into(),
            env_from: Some(vec![from_config_map("huge", None, false)]),
            ..Default::default()
        };
        assert_eq!(
            cluster
                .gather(&pod(), &container)
                .await
                .map_err(|e| e.to_string()),
            Err(
                "container \"c\": configMap \"huge\": the environment would exceed 4194304 bytes"
                    .into()
            )
        );
        // Only the named key of an object a key reference reads counts.
        let container = Container {
            name: "c".into(),
            env: Some(vec![config_map_key("A", "huge", "K1", false)]),
            ..Default::default()
        };
        let values = cluster.gather(&pod(), &container).await.expect("gathered");
        let Lookup::Found(data) = &values.config_maps["huge"] else {
            panic!("found: {values:?}");
        };
        assert_eq!(data.len(), 1);
    }

    #[test]
    fn env_var_names_follow_the_relaxed_rule() {
        for ok in ["A", "a.b-c", "1abc", "with space", "~"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "A=B", "tab\there", "new\nline", "é"] {
            assert!(!is_env_var_name(bad), "{bad:?}");
        }
    }
}
