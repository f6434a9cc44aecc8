//! Images pulled from a real registry, as nodes get them: the test registry
//! (`swiftlet_tests::registry`, Debian's distribution registry on loopback with TLS and htpasswd)
//! holding the local images, and the private containerd pulling them over CRI with the
//! credentials it is given and the CA its `certs.d` names.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use base64::Engine as _;
use k8s_cri::v1::{AuthConfig, ImageSpec};
use k8s_openapi::api::{
    core::v1::{Pod, Secret},
    events::v1::Event as ApiEvent,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use swiftlet::cri::ImageService as _;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::{self, runtime},
    node::{
        BUSYBOX, Node,
        status::{container, init_container, running, terminated},
    },
    registry::{TestRegistry, USER, header},
    runtime_endpoint,
    test_apiserver::TestApiServer,
    trusted::TrustedDir,
    with_cri,
};

/// The agent's count of CRI `PullImage` calls.
const PULLS: &str = r#"kubelet_runtime_operations_total{operation_type="pull_image"}"#;

/// Removes the images a test pulled when it ends, also on a panic: the private containerd is
/// shared, and a pulled name is a new name only for this registry's port.
struct PulledImages(Vec<String>);

impl Drop for PulledImages {
    fn drop(&mut self) {
        let images = std::mem::take(&mut self.0);
        with_cri("PulledImages", |runtime| async move {
            for image in images {
                let _ = runtime.remove_image(spec(&image)).await;
            }
        });
    }
}

fn spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

fn auth(password: &str) -> AuthConfig {
    AuthConfig {
        username: USER.to_owned(),
        password: password.to_owned(),
        ..Default::default()
    }
}

/// The test support itself: the registry lets only its user in, holds what was pushed under
/// the pushed digest, and containerd pulls it over TLS with the right password only; removing
/// the pulled image leaves the imported busybox alone; dropping the registry stops it and
/// removes containerd's `hosts.toml`.
#[test]
fn the_test_registry_serves_pushed_images_to_its_user_over_tls() {
    let test = "the_test_registry_serves_pushed_images_to_its_user_over_tls";
    let Some(registry) = TestRegistry::for_test(test) else {
        return;
    };
    if runtime_endpoint(test).is_none() {
        return;
    }
    let right = (USER, registry.password.as_str());

    let anonymous = registry
        .request("GET", "/v2/", None, &[], None)
        .expect("an answer");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let challenge = header(&anonymous.head, "www-authenticate").expect("a challenge");
    assert!(challenge.starts_with("Basic "), "{challenge}");
    let wrong = registry
        .request("GET", "/v2/", Some((USER, "not-the-password")), &[], None)
        .expect("an answer");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let known = registry
        .request("GET", "/v2/", Some(right), &[], None)
        .expect("an answer");
    assert_eq!(known.status, 200, "{known:?}");

    let pushed = registry.push_local("busybox", "swiftlet/busybox", "latest");
    assert_eq!(
        pushed.reference,
        registry.image("swiftlet/busybox", "latest")
    );
    let manifest = registry
        .request(
            "GET",
            "/v2/swiftlet/busybox/manifests/latest",
            Some(right),
            &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
            None,
        )
        .expect("an answer");
    assert_eq!(manifest.status, 200, "{manifest:?}");
    assert_eq!(
        header(&manifest.head, "docker-content-digest").as_deref(),
        Some(pushed.manifest_digest.as_str())
    );
    // A second push finds the blobs there and gives the same manifest.
    let again = registry.push_local("busybox", "swiftlet/busybox", "latest");
    assert_eq!(again.manifest_digest, pushed.manifest_digest);

    let hosts_dir = registry.hosts_dir().expect("a hosts folder").to_owned();
    let hosts = std::fs::read_to_string(hosts_dir.join("hosts.toml")).expect("hosts.toml");
    assert!(
        hosts.contains(&format!("[host.\"https://{}\"]", registry.host))
            && hosts.contains(&registry.ca_file().display().to_string()),
        "{hosts}"
    );

    let password = registry.password.clone();
    with_cri(test, |runtime| async move {
        let image = spec(&pushed.reference);
        let refused = [None, Some(auth("not-the-password"))];
        for credentials in refused {
            let error = runtime
                .pull_image(image.clone(), credentials.clone(), None)
                .await
                .expect_err("a pull without the right password fails");
            // containerd words it "401 Unauthorized", or, asked for basic auth with none to
            // give, "no basic auth credentials".
            let text = error.to_string().to_lowercase();
            assert!(
                text.contains("unauthorized") || text.contains("no basic auth credentials"),
                "{credentials:?}: {error}"
            );
        }
        assert!(
            runtime
                .image_status(image.clone())
                .await
                .expect("status")
                .is_none(),
            "a refused pull left the image"
        );
        runtime
            .pull_image(image.clone(), Some(auth(&password)), None)
            .await
            .expect("the pull with the password works");
        let pulled = runtime
            .image_status(image.clone())
            .await
            .expect("status")
            .expect("the pulled image");
        assert_eq!(pulled.id, pushed.config_digest);
        assert!(
            pulled
                .repo_digests
                .iter()
                .any(|d| d.ends_with(&pushed.manifest_digest)),
            "{:?}",
            pulled.repo_digests
        );
        let imported = runtime
            .image_status(spec(BUSYBOX))
            .await
            .expect("status")
            .expect("the imported busybox");
        assert_ne!(
            imported.id, pulled.id,
            "the pushed image has an ID of its own"
        );
        runtime
            .remove_image(image.clone())
            .await
            .expect("the pulled image removed");
        assert!(runtime.image_status(image).await.expect("status").is_none());
        // With every name of it, including its ID: nothing of the pull is left.
        assert!(
            runtime
                .image_status(spec(&pulled.id))
                .await
                .expect("status")
                .is_none()
        );
        assert!(
            runtime
                .image_status(spec(BUSYBOX))
                .await
                .expect("status")
                .is_some(),
            "removing the pulled image removed the imported one"
        );
    });

    let port = registry.port;
    drop(registry);
    assert!(!hosts_dir.exists(), "{} is left", hosts_dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the registry still listens"
    );
}

/// A `kubernetes.io/dockerconfigjson` secret for the registry.
fn pull_secret(registry: &TestRegistry, name: &str, password: &str) -> Secret {
    let config = registry.docker_config_json(USER, password);
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {
            ".dockerconfigjson":
                base64::engine::general_purpose::STANDARD.encode(config.as_bytes()),
        },
    }))
    .expect("a secret")
}

/// A pod on `node` whose `main` (and, with `init`, an init container first) runs `image` under
/// `policy`, with the pull secrets named.
fn pull_pod(
    name: &str,
    node: &str,
    image: &str,
    policy: &str,
    init: bool,
    secrets: &[&str],
) -> Pod {
    let init_containers = if init {
        json!([{"name": "init", "image": image, "imagePullPolicy": policy, "command": ["true"]}])
    } else {
        json!([])
    };
    let secrets: Vec<serde_json::Value> = secrets.iter().map(|n| json!({"name": n})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "imagePullSecrets": secrets,
            "initContainers": init_containers,
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": policy,
                "command": ["sleep", "3600"],
            }],
        },
    }))
    .expect("a pod")
}

/// (reason, note, first time) of each Event about pod `name`.
fn events_of(
    rt: &tokio::runtime::Runtime,
    events: &Api<ApiEvent>,
    name: &str,
) -> Vec<(String, String, Option<k8s_openapi::jiff::Timestamp>)> {
    rt.block_on(events.list(&ListParams::default()))
        .expect("the events are listed")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.event_time.map(|t| t.0),
            )
        })
        .collect()
}

fn waiting(pod: &Pod) -> Option<(String, String)> {
    let state = container(pod, "main")?.state.as_ref()?.waiting.as_ref()?;
    Some((
        state.reason.clone().unwrap_or_default(),
        state.message.clone().unwrap_or_default(),
    ))
}

/// Pods pulling from the registry through the agent, their credentials from `imagePullSecrets`
/// read from the API server process: `Always` pulls for every container start (the init
/// container's and main's), `IfNotPresent` once, `Never` refuses an absent image
/// (`ErrImageNeverPull`); a wrong password is `ErrImagePull` with the runtime's error, then
/// `ImagePullBackOff` carrying it, with no pull during the back-off and one after it.
#[test]
fn pods_pull_from_the_registry_with_their_pull_secrets_under_each_policy() {
    let test = "pods_pull_from_the_registry_with_their_pull_secrets_under_each_policy";
    let Some(registry) = TestRegistry::for_test(test) else {
        return;
    };
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let tags = ["always", "if-not-present", "never", "wrong"];
    let pushed: Vec<_> = tags
        .iter()
        .map(|tag| registry.push_local("busybox", "swiftlet/busybox", tag))
        .collect();
    let references: Vec<String> = pushed.iter().map(|p| p.reference.clone()).collect();
    // The tags are one image (one config), whose ID goes with its last name; removing it by
    // ID too is for a test that failed between pulls.
    let mut pulled = references.clone();
    pulled.push(pushed[0].config_digest.clone());
    let _cleanup = PulledImages(pulled);
    let [always, if_not_present, never, wrong] = [0, 1, 2, 3].map(|i| references[i].as_str());

    let server = TestApiServer::start("registry");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    // A failed start waits for the next sync: a short period keeps the test short.
    let node = Node::start_with(
        "registry",
        &endpoint,
        &["--kubeconfig", &kubeconfig, "--sync-frequency", "2s"],
    );
    let rt = runtime();
    let client = rt.block_on(server.client());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let events: Api<ApiEvent> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for (name, password) in [
        ("right", registry.password.as_str()),
        ("wrong", "not-the-password"),
    ] {
        rt.block_on(secrets.create(
            &PostParams::default(),
            &pull_secret(&registry, name, password),
        ))
        .expect("the secret");
    }
    let create = |pod: Pod| {
        rt.block_on(pods.create(&PostParams::default(), &pod))
            .expect("the pod");
    };
    let wait = |name: &str, what: &str, want: &dyn Fn(&Pod) -> bool| -> Pod {
        cluster::wait_for(
            &format!("pod {name} never {what}"),
            EVENT_WAIT * 2,
            || {
                node.pods()
                    .into_iter()
                    .find(|p| p.metadata.name.as_deref() == Some(name))
            },
            |p| p.as_ref().is_some_and(want),
        )
        .expect("the pod")
    };
    // Whole numbers, exact in an f64.
    let pulls = || node.metric(PULLS).round() as i64;

    // Always: a pull for the init container's start and one for main's.
    let before = pulls();
    create(pull_pod(
        "pull-always",
        &node.name,
        always,
        "Always",
        true,
        &["right"],
    ));
    wait("pull-always", "ran main", &|p: &Pod| {
        terminated(init_container(p, "init")).is_some_and(|(_, code)| code == 0)
            && running(container(p, "main"))
    });
    assert_eq!(pulls() - before, 2, "Always pulls at every container start");

    // IfNotPresent: the init container's pull serves main too.
    let before = pulls();
    create(pull_pod(
        "pull-if-present",
        &node.name,
        if_not_present,
        "IfNotPresent",
        true,
        &["right"],
    ));
    wait("pull-if-present", "ran main", &|p: &Pod| {
        running(container(p, "main"))
    });
    assert_eq!(pulls() - before, 1, "IfNotPresent pulls once");

    // Never: the image is in the registry, not on the node.
    let before = pulls();
    create(pull_pod(
        "pull-never",
        &node.name,
        never,
        "Never",
        false,
        &["right"],
    ));
    let refused = wait("pull-never", "was refused", &|p: &Pod| {
        waiting(p).is_some_and(|(reason, _)| reason == "ErrImageNeverPull")
    });
    assert_eq!(
        waiting(&refused).map(|(_, message)| message),
        Some(format!(
            "Container image {never:?} is not present with pull policy of Never"
        ))
    );
    assert_eq!(pulls() - before, 0, "Never never pulls");

    // The wrong password: ErrImagePull with the runtime's error, then the back-off with it.
    let before = pulls();
    create(pull_pod(
        "pull-wrong",
        &node.name,
        wrong,
        "Always",
        false,
        &["wrong"],
    ));
    let backing_off = wait("pull-wrong", "backed off", &|p: &Pod| {
        waiting(p).is_some_and(|(reason, _)| reason == "ImagePullBackOff")
    });
    let (_, message) = waiting(&backing_off).expect("waiting");
    let prefix = format!("Back-off pulling image {wrong:?}: ErrImagePull: rpc error: code = ");
    assert!(
        message.starts_with(&prefix) && message.to_lowercase().contains("unauthorized"),
        "{message}"
    );
    assert_eq!(pulls() - before, 1, "no pull during the back-off");
    // After the first back-off (10 s as upstream) it pulls again, and fails again.
    cluster::wait_for(
        "a second pull after the back-off",
        EVENT_WAIT,
        &pulls,
        |n| *n - before >= 2,
    );
    wait("pull-wrong", "backed off again", &|p: &Pod| {
        waiting(p).is_some_and(|(reason, _)| reason == "ImagePullBackOff")
    });
    assert_eq!(
        pulls() - before,
        2,
        "the back-off doubled: no third pull yet"
    );

    // The Events say the same, in upstream's words: the pulls and their durations, the failed
    // pull with the runtime's error, ErrImagePull before ImagePullBackOff.
    let seen = cluster::wait_for(
        "the pull events",
        EVENT_WAIT,
        || {
            [
                events_of(&rt, &events, "pull-always"),
                events_of(&rt, &events, "pull-wrong"),
            ]
        },
        |[always_events, wrong_events]| {
            always_events
                .iter()
                .any(|(reason, _, _)| reason == "Pulled")
                && wrong_events
                    .iter()
                    .any(|(_, note, _)| note == "Error: ImagePullBackOff")
        },
    );
    let [always_events, wrong_events] = &seen;
    let pulled = format!("Successfully pulled image {always:?} in ");
    assert!(
        always_events
            .iter()
            .any(|(reason, note, _)| reason == "Pulled"
                && note.starts_with(&pulled)
                && note.contains(" including waiting). Image size: ")),
        "{always_events:#?}"
    );
    let failed = format!("Failed to pull image {wrong:?}: rpc error: code = ");
    assert!(
        wrong_events
            .iter()
            .any(|(reason, note, _)| reason == "Failed" && note.starts_with(&failed)),
        "{wrong_events:#?}"
    );
    let first = |wanted: &str| {
        wrong_events
            .iter()
            .find(|(_, note, _)| note == wanted)
            .map(|(_, _, time)| *time)
            .unwrap_or_else(|| panic!("no event {wanted:?}: {wrong_events:#?}"))
    };
    assert!(
        first("Error: ErrImagePull") <= first("Error: ImagePullBackOff"),
        "{wrong_events:#?}"
    );
    assert!(
        wrong_events
            .iter()
            .any(|(reason, note, _)| reason == "BackOff"
                && *note == format!("Back-off pulling image {wrong:?}")),
        "{wrong_events:#?}"
    );

    for name in ["pull-always", "pull-if-present", "pull-never", "pull-wrong"] {
        rt.block_on(pods.delete(name, &DeleteParams::default()))
            .expect("the pod deleted");
    }
    cluster::wait_for(
        "the pods gone from the node",
        EVENT_WAIT * 2,
        || node.pods().len(),
        |n| *n == 0,
    );
}

/// The number in a metrics text's line that starts with `series` and a space, 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// The pull limits at work against the registry, on one node restarted with each setting:
/// serial pulls (the default) never overlap; with `maxParallelImagePulls: 2` at most two do;
/// with `registryPullQPS: 1`, `registryBurst: 1` the second of two pulls at once fails with
/// upstream's "pull QPS exceeded." without reaching the runtime, and succeeds after its
/// back-off. `swiftlet_image_pull_concurrency` counts the pulls running at each pull's start, so
/// its buckets bound the overlap; every successful pull is in
/// `kubelet_image_pull_duration_seconds`, labelled with upstream's size class.
#[test]
fn image_pulls_keep_to_the_node_wide_limits() {
    let test = "image_pulls_keep_to_the_node_wide_limits";
    let Some(registry) = TestRegistry::for_test(test) else {
        return;
    };
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    // A name of its own for each pod: every pull is a pull (Always), none finds another's.
    let tags = [
        "serial-0",
        "serial-1",
        "serial-2",
        "parallel-0",
        "parallel-1",
        "parallel-2",
        "qps-0",
        "qps-1",
    ];
    let pushed: Vec<_> = tags
        .iter()
        .map(|tag| registry.push_local("busybox", "swiftlet/busybox", tag))
        .collect();
    let references: Vec<String> = pushed.iter().map(|p| p.reference.clone()).collect();
    let mut pulled = references.clone();
    pulled.push(pushed[0].config_digest.clone());
    let _cleanup = PulledImages(pulled);

    let server = TestApiServer::start("pull-limits");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let base = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "--sync-frequency",
        "2s",
    ];
    let mut node = Node::start_with("pull-limits", &endpoint, &base);
    let rt = runtime();
    let client = rt.block_on(server.client());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let events: Api<ApiEvent> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    rt.block_on(secrets.create(
        &PostParams::default(),
        &pull_secret(&registry, "right", &registry.password),
    ))
    .expect("the secret");
    // Created back to back, so that their pulls would overlap if let.
    let create_and_run = |node: &Node, names: &[&str], images: &[String]| {
        for (name, image) in names.iter().zip(images) {
            rt.block_on(pods.create(
                &PostParams::default(),
                &pull_pod(name, &node.name, image, "Always", false, &["right"]),
            ))
            .expect("the pod");
        }
        cluster::wait_for(
            &format!("pods {names:?} never all ran"),
            EVENT_WAIT * 2,
            || node.pods(),
            |listed| {
                names.iter().all(|name| {
                    listed.iter().any(|p| {
                        p.metadata.name.as_deref() == Some(*name) && running(container(p, "main"))
                    })
                })
            },
        );
    };
    // Since the agent started: [pulls started, those started with at most `n` running,
    // runtime pulls, pulls timed].
    let counts = |node: &Node, n: u32| {
        let metrics = node.metrics();
        let timed: f64 = metrics
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("kubelet_image_pull_duration_seconds_count{")?;
                let (labels, value) = rest.split_once("} ")?;
                // busybox is below 10 MiB.
                assert_eq!(labels, "image_size_in_bytes=\"0-10MB\"", "{l}");
                value.trim().parse::<f64>().ok()
            })
            .sum();
        [
            sample(&metrics, "swiftlet_image_pull_concurrency_count"),
            sample(
                &metrics,
                &format!("swiftlet_image_pull_concurrency_bucket{{le=\"{n}\"}}"),
            ),
            sample(&metrics, PULLS),
            timed,
        ]
        .map(|v| v.round() as i64)
    };

    // serializeImagePulls (the default): one at a time.
    let serial = ["limit-serial-0", "limit-serial-1", "limit-serial-2"];
    create_and_run(&node, &serial, &references[0..3]);
    assert_eq!(counts(&node, 1), [3, 3, 3, 3], "{}", node.metrics());

    // At most two at once (the running pods are adopted, not pulled for again).
    let config = node.dir().join("pull-limits.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         serializeImagePulls: false\nmaxParallelImagePulls: 2\nregistryPullQPS: 0\n",
    )
    .expect("the config file");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let mut parallel_args = base.to_vec();
    parallel_args.extend(["--config", &config]);
    node.restart_with(&parallel_args);
    let parallel = ["limit-parallel-0", "limit-parallel-1", "limit-parallel-2"];
    create_and_run(&node, &parallel, &references[3..6]);
    assert_eq!(counts(&node, 2), [3, 3, 3, 3], "{}", node.metrics());

    // One pull a second, a burst of one: the second of two pulls at once finds no token.
    let mut throttled_args = base.to_vec();
    throttled_args.extend(["--registry-qps", "1", "--registry-burst", "1"]);
    node.restart_with(&throttled_args);
    let throttled = ["limit-qps-0", "limit-qps-1"];
    create_and_run(&node, &throttled, &references[6..8]);
    assert_eq!(
        counts(&node, 1),
        [2, 2, 2, 2],
        "a refused pull neither starts nor reaches the runtime: {}",
        node.metrics()
    );
    let refused: Vec<_> = throttled
        .iter()
        .zip(&references[6..8])
        .flat_map(|(name, image)| {
            let want = format!("Failed to pull image {image:?}: pull QPS exceeded.");
            events_of(&rt, &events, name)
                .into_iter()
                .filter(move |(reason, note, _)| reason == "Failed" && *note == want)
        })
        .collect();
    assert_eq!(refused.len(), 1, "one of the two pulls found no token");

    for name in serial.iter().chain(&parallel).chain(&throttled) {
        rt.block_on(pods.delete(name, &DeleteParams::default()))
            .expect("the pod deleted");
    }
    cluster::wait_for(
        "the pods gone from the node",
        EVENT_WAIT * 2,
        || node.pods().len(),
        |n| *n == 0,
    );
}

/// A bin dir with the test plugin under each name `names` gives (a copy each: the agent
/// executes no link, nor a file outside a directory only root may write), and a
/// `CredentialProviderConfig` giving each the images under `<registry>/<name>`, with the
/// test registry's user and password in the environment of `answer`.
fn credential_providers(
    dir: &std::path::Path,
    registry: &TestRegistry,
    names: &[&str],
    log: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("the bin dir");
    let providers: Vec<serde_json::Value> = names
        .iter()
        .map(|name| {
            std::fs::copy(swiftlet_tests::test_credential_provider(), bin.join(name))
                .expect("the plugin copy");
            json!({
                "name": name,
                "matchImages": [format!("{}/{name}", registry.host)],
                "defaultCacheDuration": "10m",
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                "args": [name],
                "env": [
                    {"name": "SWIFTLET_TEST_PROVIDER_USERNAME", "value": USER},
                    {"name": "SWIFTLET_TEST_PROVIDER_PASSWORD", "value": registry.password},
                    {"name": "SWIFTLET_TEST_PROVIDER_LOG", "value": log.display().to_string()},
                ],
            })
        })
        .collect();
    let config = dir.join("credential-providers.json");
    std::fs::write(
        &config,
        json!({
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": providers,
        })
        .to_string(),
    )
    .expect("the provider config");
    (config, bin)
}

/// Pods without pull secrets pull from the registry with the credentials of the node's
/// credential provider plugin (the test plugin, run by the agent as upstream's exec plugins):
/// asked once for the registry's images while its answer is cached (`cacheKeyType: Registry`),
/// with the image's repository. Plugins that misbehave — garbage, output without end, an
/// answer of another `apiVersion` — leave their pods in `ErrImagePull`/`ImagePullBackOff` with
/// a message naming the plugin and what was wrong, and the agent and its other pods go on.
#[test]
fn pods_pull_with_the_credentials_of_the_nodes_credential_provider_plugin() {
    let test = "pods_pull_with_the_credentials_of_the_nodes_credential_provider_plugin";
    let Some(registry) = TestRegistry::for_test(test) else {
        return;
    };
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let Some(trusted) = TrustedDir::new(test, "cred") else {
        return;
    };
    let dir = trusted.path().to_owned();
    let log = dir.join("asked");
    let names = ["answer", "garbage", "huge", "wrong-version"];
    let (config, bin) = credential_providers(&dir, &registry, &names, &log);
    let pushed: Vec<_> = [("answer", "one"), ("answer", "two"), ("answer", "three")]
        .into_iter()
        .chain(names[1..].iter().map(|name| (*name, "one")))
        .map(|(name, tag)| registry.push_local("busybox", &format!("{name}/busybox"), tag))
        .collect();
    let mut pulled: Vec<String> = pushed.iter().map(|p| p.reference.clone()).collect();
    pulled.push(pushed[0].config_digest.clone());
    let _cleanup = PulledImages(pulled);

    let server = TestApiServer::start("cred");
    let kubeconfig = server.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let node = Node::start_with(
        "cred",
        &endpoint,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--sync-frequency",
            "2s",
            "--image-credential-provider-config",
            config.to_str().expect("utf-8 path"),
            "--image-credential-provider-bin-dir",
            bin.to_str().expect("utf-8 path"),
        ],
    );
    let rt = runtime();
    let pods: Api<Pod> = Api::namespaced(rt.block_on(server.client()), "default");
    let create = |name: &str, image: &str| {
        rt.block_on(pods.create(
            &PostParams::default(),
            &pull_pod(name, &node.name, image, "Always", false, &[]),
        ))
        .expect("the pod");
    };
    let pod = |name: &str| {
        node.pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    };
    let wait = |name: &str, what: &str, want: &dyn Fn(&Pod) -> bool| -> Pod {
        cluster::wait_for(
            &format!("pod {name} never {what}"),
            EVENT_WAIT * 2,
            || pod(name),
            |p| p.as_ref().is_some_and(want),
        )
        .expect("the pod")
    };
    let asked = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };

    // Two images of the registry: one exec, asked with the repository (no tag).
    create("provided-one", &pushed[0].reference);
    create("provided-two", &pushed[1].reference);
    for name in ["provided-one", "provided-two"] {
        wait(name, "ran main", &|p: &Pod| running(container(p, "main")));
    }
    assert_eq!(
        asked(),
        [format!("answer {}/answer/busybox", registry.host)],
        "one exec for the registry while its answer is cached"
    );

    // The misbehaving plugins: the pull goes without credentials, is refused, and says why.
    let wanted = [
        (
            "garbage",
            "error decoding credential provider plugin response",
        ),
        ("huge", "the response exceeds"),
        ("wrong-version", "did not match expected apiVersion"),
    ];
    for (i, (name, _)) in wanted.iter().enumerate() {
        create(&format!("bad-{name}"), &pushed[3 + i].reference);
    }
    for (name, reason) in wanted {
        let pod = wait(&format!("bad-{name}"), "failed its pull", &|p: &Pod| {
            waiting(p)
                .is_some_and(|(reason, _)| reason == "ErrImagePull" || reason == "ImagePullBackOff")
        });
        let (_, message) = waiting(&pod).expect("waiting");
        let refused = message.to_lowercase().contains("unauthorized")
            || message.contains("no basic auth credentials");
        assert!(
            refused
                && message.contains(&format!("credential provider plugin {name}"))
                && message.contains(reason),
            "{name}: {message}"
        );
    }

    // Upstream's plugin metrics, by plugin name: each exec timed, the failed ones counted (a
    // response that does not decode is not an exec error, upstream's `runPlugin`).
    let metric =
        |name: &str, plugin: &str| node.metric(&format!("{name}{{plugin_name=\"{plugin}\"}}"));
    assert_eq!(
        metric(
            "kubelet_credential_provider_plugin_duration_count",
            "answer"
        ),
        1.0,
        "{}",
        node.metrics()
    );
    assert_eq!(
        metric("kubelet_credential_provider_plugin_errors_total", "answer"),
        0.0
    );
    assert!(metric("kubelet_credential_provider_plugin_errors_total", "huge") >= 1.0);
    assert!(
        metric(
            "kubelet_credential_provider_plugin_duration_count",
            "garbage"
        ) >= 1.0
    );

    // The agent goes on: the pods it ran still run, and a new one pulls with the plugin's
    // cached credentials.
    create("provided-three", &pushed[2].reference);
    wait("provided-three", "ran main", &|p: &Pod| {
        running(container(p, "main"))
    });
    for name in ["provided-one", "provided-two"] {
        let seen = pod(name);
        assert!(
            seen.as_ref().is_some_and(|p| running(container(p, "main"))),
            "{name} stopped running: {:#?}",
            seen.and_then(|p| p.status)
        );
    }
    assert_eq!(
        asked()
            .iter()
            .filter(|line| line.starts_with("answer "))
            .count(),
        1
    );

    for name in [
        "provided-one",
        "provided-two",
        "provided-three",
        "bad-garbage",
        "bad-huge",
        "bad-wrong-version",
    ] {
        rt.block_on(pods.delete(name, &DeleteParams::default()))
            .expect("the pod deleted");
    }
    cluster::wait_for(
        "the pods gone from the node",
        EVENT_WAIT * 2,
        || node.pods().len(),
        |n| *n == 0,
    );
    drop(node);
    drop(trusted);
}
