//! The volume manager against a temporary root, unprivileged: disk emptyDirs and hostPath
//! checks through the reconciler, the waits, and the CRI mounts a container gets.

use crate::testing;
use std::{sync::Arc, time::Duration};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, HostPathVolumeSource, Pod, SecurityContext, Volume,
    VolumeMount,
};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{container::PodUid, kuberuntime::ContainerMounts};

/// A manager whose waits give up after 30 s (they end as soon as the condition holds).
fn manager(root: &std::path::Path) -> Arc<VolumeManager> {
    manager_waiting(root, Duration::from_secs(30))
}

fn manager_waiting(root: &std::path::Path, wait_budget: Duration) -> Arc<VolumeManager> {
    manager_reporting(root, wait_budget, crate::events::none())
}

fn manager_reporting(
    root: &std::path::Path,
    wait_budget: Duration,
    events: crate::events::Events,
) -> Arc<VolumeManager> {
    VolumeManager::new(
        VolumeManagerConfig {
            dirs: PodDirs::new(root),
            node_allocatable_memory: 1 << 30,
            node: NodeResources::default(),
            cluster_domain: Some("cluster.local".into()),
            wait_budget,
        },
        VolumeMetrics::register(&prometheus::Registry::new()).expect("metrics"),
        events,
    )
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

fn pod(volumes: Vec<Volume>, mounts: Vec<VolumeMount>) -> Arc<Pod> {
    testing::pod()
        .named("prod", "web", "uid-1")
        .spec(|s| s.subdomain = Some("sub".into()))
        .container(Container {
            volume_mounts: Some(mounts),
            termination_message_path: Some("/dev/termination-log".into()),
            ..testing::container("app")
        })
        .volumes(volumes)
        .arc()
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &str, kind: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(kind.into()),
        }),
        ..Default::default()
    }
}

#[test]
fn upstream_backoff_steps() {
    let steps: Vec<u128> = wait_steps().iter().map(|d| d.as_millis()).collect();
    assert_eq!(steps, vec![1000, 1200, 1440, 1728, 2073]);
    assert_eq!(default_wait_budget().as_millis(), 7441);
}

#[tokio::test]
async fn volumes_are_set_up_mounted_and_torn_down() {
    let root = tempfile::tempdir().expect("tempdir");
    let host = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    let host_dir = host.path().to_string_lossy().into_owned();
    // subPaths are bind mounts: only as root.
    let binds = nix::unistd::geteuid().is_root();
    let mut mounts = vec![
        mount("cache", "/cache"),
        VolumeMount {
            read_only: Some(true),
            mount_propagation: Some("HostToContainer".into()),
            ..mount("data", "/data")
        },
    ];
    if binds {
        mounts.push(VolumeMount {
            sub_path: Some("logs/app".into()),
            ..mount("cache", "/logs")
        });
        mounts.push(VolumeMount {
            sub_path_expr: Some("by-pod/$(POD_NAME)".into()),
            ..mount("cache", "/mine")
        });
    } else {
        eprintln!("subPath part skipped: bind mounts need root");
    }
    let p = pod(
        vec![
            empty_dir("cache"),
            host_path("data", &host_dir, "Directory"),
        ],
        mounts,
    );
    let uid = PodUid::from("uid-1");
    let cancel = CancellationToken::new();
    manager.add_pod(p.clone()).expect("supported");
    manager.reconcile().await;
    manager
        .wait_for_attach_and_mount(p.clone(), &cancel)
        .await
        .expect("mounted");
    let cache = root
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
    assert!(cache.is_dir());

    let mounts = manager
        .mounts(
            &p,
            &p.spec.as_ref().expect("spec").containers[0],
            &["10.0.0.5".into()],
            &[cri::KeyValue {
                key: "POD_NAME".into(),
                value: "web".into(),
            }],
        )
        .expect("mounts");
    let by_path = |path: &str| mount_at(&mounts, path);
    assert_eq!(by_path("/cache").host_path, cache.to_string_lossy());
    assert!(!by_path("/cache").readonly);
    let pod_dir = root.path().join("pods/uid-1");
    if binds {
        assert_sub_paths_are_binds(&mounts, &pod_dir, &cache);
    }
    assert_eq!(mode(&cache), 0o777);
    assert_pod_files(root.path(), &mounts);
    let data = by_path("/data");
    assert_eq!(data.host_path, host_dir);
    assert!(data.readonly);
    assert_eq!(
        data.propagation,
        cri::MountPropagation::PropagationHostToContainer as i32
    );

    // Terminated: the volumes go, then the pod's directory.
    manager.remove_pod(&uid);
    let unmount = {
        let manager = manager.clone();
        let uid = uid.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move { manager.wait_for_unmount(&uid, &cancel).await })
    };
    manager.reconcile().await;
    unmount.await.expect("joined").expect("unmounted");
    assert!(!cache.exists());
    assert!(!pod_dir.join("volume-subpaths/cache").exists());
    assert!(manager.mounted_volumes(&uid).is_empty());
    manager.remove_pod_dir(&uid).expect("removed");
    assert!(!root.path().join("pods/uid-1").exists());
}

fn mount_at(mounts: &[cri::Mount], path: &str) -> cri::Mount {
    mounts
        .iter()
        .find(|m| m.container_path == path)
        .cloned()
        .unwrap_or_else(|| panic!("no mount at {path}: {mounts:?}"))
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// A subPath reaches the runtime as a bind of what was resolved, not as a path into the volume.
fn assert_sub_paths_are_binds(
    mounts: &[cri::Mount],
    pod_dir: &std::path::Path,
    cache: &std::path::Path,
) {
    let logs = mount_at(mounts, "/logs");
    assert_eq!(
        logs.host_path,
        pod_dir
            .join("volume-subpaths/cache/app/2")
            .to_string_lossy()
    );
    assert!(cache.join("logs/app").is_dir());
    std::fs::write(std::path::Path::new(&logs.host_path).join("f"), "x").expect("write");
    assert!(cache.join("logs/app/f").is_file());
    assert_eq!(
        mount_at(mounts, "/mine").host_path,
        pod_dir
            .join("volume-subpaths/cache/app/3")
            .to_string_lossy()
    );
    assert!(cache.join("by-pod/web").is_dir());
}

/// The pod's own directories and files, with their modes.
fn assert_pod_files(root: &std::path::Path, mounts: &[cri::Mount]) {
    let pod_dir = root.join("pods/uid-1");
    // Every directory of the pod is 0750; the hosts file 0644, the termination-message file
    // 0666.
    for dir in [
        root.join("pods"),
        pod_dir.clone(),
        pod_dir.join("volumes"),
        pod_dir.join("volumes/kubernetes.io~empty-dir"),
        pod_dir.join("containers"),
        pod_dir.join("containers/app"),
    ] {
        assert_eq!(mode(&dir), 0o750, "{}", dir.display());
    }
    let hosts = mount_at(mounts, "/etc/hosts");
    assert_eq!(mode(std::path::Path::new(&hosts.host_path)), 0o644);
    let text = std::fs::read_to_string(&hosts.host_path).expect("hosts");
    assert!(text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
    assert!(
        text.ends_with("10.0.0.5\tweb.sub.prod.svc.cluster.local\tweb\n"),
        "{text}"
    );
    let log = mount_at(mounts, "/dev/termination-log");
    assert!(
        log.host_path.starts_with(
            &root
                .join("pods/uid-1/containers/app")
                .to_string_lossy()
                .into_owned()
        )
    );
    assert!(std::path::Path::new(&log.host_path).is_file());
    assert_eq!(mode(std::path::Path::new(&log.host_path)), 0o666);
}

#[tokio::test]
async fn a_failed_host_path_check_is_in_the_wait_error() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let manager = manager_waiting(root.path(), Duration::from_millis(50));
    let p = pod(
        vec![host_path("data", &file.to_string_lossy(), "Directory")],
        vec![mount("data", "/data")],
    );
    manager.add_pod(p.clone()).expect("supported");
    manager.reconcile().await;
    let err = manager
        .wait_for_attach_and_mount(p.clone(), &CancellationToken::new())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        format!(
            "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[]: \
             timed out waiting for the condition; MountVolume.SetUp failed for volume \"data\" : \
             hostPath type check failed: {} is not a directory",
            file.display()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_volume_is_reported_as_often_as_upstream_retries_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let events = crate::events::fake::FakeRecorder::new();
    let manager = manager_reporting(root.path(), Duration::from_millis(50), events.clone());
    let p = pod(
        vec![host_path("data", &file.to_string_lossy(), "Directory")],
        vec![mount("data", "/data")],
    );
    manager.add_pod(p.clone()).expect("supported");
    // Every pass retries; the event repeats after 0.5 s, then 1 s, 2 s, ...
    let mut reported = Vec::new();
    for step_ms in [0, 100, 400, 100, 900, 100, 1900, 100] {
        tokio::time::advance(Duration::from_millis(step_ms)).await;
        manager.reconcile().await;
        reported.push(events.events().len());
    }
    assert_eq!(reported, [1, 1, 2, 2, 3, 3, 4, 4]);
    let event = &events.events()[0];
    assert_eq!(event.reason, "FailedMount");
    assert_eq!(event.type_, crate::events::EventType::Warning);
    assert_eq!(
        event.note,
        format!(
            "MountVolume.SetUp failed for volume \"data\" : hostPath type check failed: {} is \
             not a directory",
            file.display()
        )
    );
    assert_eq!(event.regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(event.regarding.uid.as_deref(), Some("uid-1"));
    assert_eq!(event.regarding.field_path, None);
}

#[tokio::test]
async fn bad_mounts_fail_the_container_with_upstreams_message() {
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    let cases = [
        (
            VolumeMount {
                sub_path: Some("/abs".into()),
                ..mount("cache", "/c")
            },
            "error SubPath `/abs` must not be an absolute path",
        ),
        (
            VolumeMount {
                sub_path: Some("a/../../b".into()),
                ..mount("cache", "/c")
            },
            "unable to provision SubPath `a/../../b`: must not contain '..'",
        ),
        (
            VolumeMount {
                mount_propagation: Some("Bidirectional".into()),
                ..mount("cache", "/c")
            },
            "Bidirectional mount propagation is available only to privileged containers",
        ),
        (
            mount("missing", "/m"),
            "cannot find volume \"missing\" to mount into container \"app\"",
        ),
    ];
    for (m, want) in cases {
        let p = pod(vec![empty_dir("cache")], vec![mount("cache", "/cache"), m]);
        manager.add_pod(p.clone()).expect("supported");
        manager.reconcile().await;
        let err = manager
            .mounts(&p, &p.spec.as_ref().expect("spec").containers[0], &[], &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(err, want);
    }
    // Bidirectional is fine for a privileged container.
    let p = pod(
        vec![empty_dir("cache")],
        vec![VolumeMount {
            mount_propagation: Some("Bidirectional".into()),
            ..mount("cache", "/c")
        }],
    );
    let mut c = p.spec.as_ref().expect("spec").containers[0].clone();
    c.security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let mounts = manager.mounts(&p, &c, &[], &[]).expect("mounts");
    assert_eq!(
        mounts[0].propagation,
        cri::MountPropagation::PropagationBidirectional as i32
    );
}

#[tokio::test]
async fn orphaned_pod_dirs_go_unless_kept() {
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    for uid in ["gone", "kept"] {
        std::fs::create_dir_all(root.path().join(format!("pods/{uid}/volumes/x/y")))
            .expect("mkdir");
    }
    manager.cleanup_orphaned_pod_dirs(|uid| uid.0 == "kept");
    assert!(!root.path().join("pods/gone").exists());
    assert!(root.path().join("pods/kept").exists());
}

#[test]
fn unsupported_sources_are_refused_naming_the_volume() {
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    let p = pod(
        vec![Volume {
            name: "claim".into(),
            persistent_volume_claim: Some(Default::default()),
            ..Default::default()
        }],
        vec![mount("claim", "/data")],
    );
    let err = manager
        .add_pod(p)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        "volume \"claim\": persistentVolumeClaim volumes are not supported by swiftlet"
    );
}

#[tokio::test]
async fn totals_and_operations_are_counted_per_plugin() {
    let root = tempfile::tempdir().expect("tempdir");
    let registry = prometheus::Registry::new();
    let metrics = VolumeMetrics::register(&registry).expect("metrics");
    let manager = VolumeManager::new(
        VolumeManagerConfig {
            dirs: PodDirs::new(root.path()),
            node_allocatable_memory: 1 << 30,
            node: NodeResources::default(),
            cluster_domain: None,
            wait_budget: Duration::from_millis(50),
        },
        metrics.clone(),
        crate::events::none(),
    );
    manager
        .add_pod(pod(
            vec![empty_dir("cache")],
            vec![mount("cache", "/cache")],
        ))
        .expect("supported");
    manager.reconcile().await;
    let total = |state: &str| {
        metrics
            .total_volumes
            .with_label_values(&["kubernetes.io/empty-dir", state])
            .get()
    };
    assert_eq!(total("desired_state_of_world"), 1);
    assert_eq!(total("actual_state_of_world"), 1);
    let mounts = metrics
        .operation_duration
        .with_label_values(&["volume_mount", "kubernetes.io/empty-dir", "success"])
        .get_sample_count();
    assert_eq!(mounts, 1);
    manager.remove_pod(&PodUid::from("uid-1"));
    manager.reconcile().await;
    assert_eq!(total("desired_state_of_world"), 0);
    assert_eq!(total("actual_state_of_world"), 0);
}

#[tokio::test(start_paused = true)]
async fn config_maps_and_secrets_are_read_from_the_api_server() {
    use crate::testing::fake_api::{fake_api, status_error};
    use http::Method;
    use serde_json::json;

    let (client, mut api) = fake_api();
    let objects = KubeObjects(client);
    let server = async {
        api.expect(Method::GET, "/api/v1/namespaces/prod/configmaps/web")
            .await
            .reply(
                200,
                &json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "web", "namespace": "prod"},
                    "data": {"app.conf": "port=80"},
                    "binaryData": {"logo": "AAE="},
                }),
            );
        api.expect(Method::GET, "/api/v1/namespaces/prod/secrets/db")
            .await
            .reply(
                200,
                &json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "db", "namespace": "prod"},
                    "data": {"password": "aHVudGVyMg=="},
                }),
            );
        api.expect(Method::GET, "/api/v1/namespaces/prod/secrets/gone")
            .await
            .reply(404, &status_error(404, "NotFound"));
    };
    let client = async {
        let config = objects
            .get(ObjectKind::ConfigMap, "prod", "web")
            .await
            .expect("read");
        let secret = objects
            .get(ObjectKind::Secret, "prod", "db")
            .await
            .expect("read");
        let gone = objects
            .get(ObjectKind::Secret, "prod", "gone")
            .await
            .expect("a 404 is no object, not an error");
        (config, secret, gone)
    };
    let ((), (config, secret, gone)) = tokio::join!(server, client);
    let config = config.expect("found");
    assert_eq!(
        config.get("app.conf").map(Vec::as_slice),
        Some(&b"port=80"[..])
    );
    assert_eq!(config.get("logo").map(Vec::as_slice), Some(&[0u8, 1][..]));
    assert_eq!(
        secret.expect("found").get("password").map(Vec::as_slice),
        Some(&b"hunter2"[..])
    );
    assert_eq!(gone, None);
}

#[test]
fn object_volumes_are_read_only_in_every_container() {
    assert!(Plugin::ConfigMap.read_only());
    assert!(Plugin::Secret.read_only());
    assert!(Plugin::DownwardApi.read_only());
    assert!(!Plugin::EmptyDir.read_only());
    assert!(!Plugin::HostPath.read_only());
    let volumes = pod_volumes(&pod(
        vec![Volume {
            name: "cfg".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: "web".into(),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }],
        vec![mount("cfg", "/cfg")],
    ))
    .expect("supported");
    assert_eq!(volumes[0].source.plugin(), Plugin::ConfigMap);
    assert!(matches!(
        &volumes[0].source,
        Source::Object { name, optional: true, default_mode: 0o644, .. } if name == "web"
    ));
}

#[tokio::test(start_paused = true)]
async fn a_token_is_requested_bound_to_the_pod() {
    use crate::testing::fake_api::fake_api;
    use http::Method;
    use serde_json::json;

    let (client, mut api) = fake_api();
    let objects = KubeObjects(client);
    let spec = TokenSpec {
        namespace: "prod".into(),
        service_account: "builder".into(),
        audience: Some("vault".into()),
        expiration_seconds: 3607,
        pod_name: "web".into(),
        pod_uid: "u-1".into(),
    };
    let server = async {
        let call = api
            .expect(
                Method::POST,
                "/api/v1/namespaces/prod/serviceaccounts/builder/token",
            )
            .await;
        assert_eq!(
            call.body,
            json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {},
                "spec": {
                    "audiences": ["vault"],
                    "expirationSeconds": 3607,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "web",
                        "uid": "u-1",
                    },
                },
            })
        );
        call.reply(
            201,
            &json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {},
                "spec": {"audiences": ["vault"], "expirationSeconds": 3600},
                "status": {"token": "eyJhbGciOi", "expirationTimestamp": "2030-01-01T00:00:00Z"},
            }),
        );
    };
    let ((), token) = tokio::join!(server, objects.token(&spec));
    // The lifetime and its end are the API server's answer (it shortened the request).
    assert_eq!(
        token,
        Ok(IssuedToken {
            token: "eyJhbGciOi".into(),
            expires: std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000),
            lifetime_seconds: Some(3600),
        })
    );
}

/// upstream's secret plugin with an fsGroup: read from the API server (the scripted transport),
/// written on a real tmpfs below a real root, owned by the group with read bits and setgid.
#[tokio::test]
async fn an_fs_group_owns_a_secret_volumes_files() {
    use crate::testing::fake_api::fake_api;
    use http::Method;
    use k8s_openapi::api::core::v1::{KeyToPath, PodSecurityContext, SecretVolumeSource};
    use serde_json::json;
    use std::os::unix::fs::MetadataExt as _;

    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a secret volume is a tmpfs, and chown to a group needs root");
        return;
    }
    let (client, mut api) = fake_api();
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    manager.set_object_source(Arc::new(KubeObjects(client)));
    let mut p = (*pod(
        vec![Volume {
            name: "creds".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("db".into()),
                default_mode: Some(0o400),
                items: Some(vec![
                    KeyToPath {
                        key: "password".into(),
                        path: "password".into(),
                        mode: None,
                    },
                    KeyToPath {
                        key: "cert".into(),
                        path: "tls/cert".into(),
                        mode: Some(0o644),
                    },
                ]),
                optional: None,
            }),
            ..Default::default()
        }],
        vec![mount("creds", "/creds")],
    ))
    .clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            fs_group: Some(3000),
            ..Default::default()
        });
    }
    let p = Arc::new(p);
    manager.add_pod(p.clone()).expect("supported");
    let server = async {
        api.expect(Method::GET, "/api/v1/namespaces/prod/secrets/db")
            .await
            .reply(
                200,
                &json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "db", "namespace": "prod"},
                    "data": {"password": "aHVudGVyMg==", "cert": "Y2VydA=="},
                }),
            );
    };
    tokio::join!(server, manager.reconcile());
    let volume = root
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~secret/creds");
    let uid = PodUid::from("uid-1");
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(
            manager.mounted_volumes(&uid).keys().collect::<Vec<_>>(),
            vec!["creds"]
        );
        let meta = |p: &str| std::fs::metadata(volume.join(p)).expect("stat");
        let password = meta("password");
        assert_eq!(
            std::fs::read_to_string(volume.join("password")).expect("read"),
            "hunter2"
        );
        // 0400 + the group's read (upstream roMask); 0644 keeps what it has.
        assert_eq!((password.gid(), password.mode() & 0o7777), (3000, 0o440));
        let cert = meta("tls/cert");
        assert_eq!((cert.gid(), cert.mode() & 0o7777), (3000, 0o644));
        // Directories: the group, its read and search bits, and setgid.
        let tls = meta("tls");
        assert_eq!((tls.gid(), tls.mode() & 0o7777), (3000, 0o2755));
        let top = meta(".");
        assert_eq!(top.gid(), 3000);
        assert_eq!(top.mode() & 0o2550, 0o2550);
        // Only root and its group reach it from the node: the pod's directories are 0750.
        let pod_dir = std::fs::metadata(root.path().join("pods/uid-1")).expect("stat");
        assert_eq!(pod_dir.mode() & 0o777, 0o750);
    }));
    // Torn down whatever the checks said: the tmpfs must not outlive the test.
    manager.remove_pod(&uid);
    manager.reconcile().await;
    assert!(!volume.exists(), "torn down");
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
}

/// A downwardAPI volume is a tmpfs written again when the pod's labels change: the second write
/// opens the volume that is now a mount point.
#[tokio::test]
async fn a_downward_api_volume_on_its_tmpfs_is_rewritten_when_labels_change() {
    use k8s_openapi::api::core::v1::{
        DownwardAPIVolumeFile, DownwardAPIVolumeSource, ObjectFieldSelector,
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a downwardAPI volume is a tmpfs, mounting one needs root");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    let labelled = |round: &str| {
        let mut p = (*pod(
            vec![Volume {
                name: "info".into(),
                downward_api: Some(DownwardAPIVolumeSource {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "labels".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.labels".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }]),
                    default_mode: None,
                }),
                ..Default::default()
            }],
            vec![mount("info", "/info")],
        ))
        .clone();
        p.metadata.labels = Some([("round".to_owned(), round.to_owned())].into());
        Arc::new(p)
    };
    let volume = root
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~downward-api/info");
    manager.add_pod(labelled("1")).expect("supported");
    manager.reconcile().await;
    let first = std::fs::read_to_string(volume.join("labels"));
    manager.add_pod(labelled("2")).expect("supported");
    manager.reconcile().await;
    let second = std::fs::read_to_string(volume.join("labels"));
    let uid = PodUid::from("uid-1");
    manager.remove_pod(&uid);
    manager.reconcile().await;
    assert!(!volume.exists(), "torn down");
    assert_eq!(first.expect("first write"), "round=\"1\"");
    assert_eq!(second.expect("second write"), "round=\"2\"");
}

/// An in-memory object source that records what pods register.
#[derive(Default)]
struct MemoryObjects {
    objects: std::sync::Mutex<std::collections::HashMap<String, ObjectData>>,
    registered:
        std::sync::Mutex<std::collections::HashMap<PodUid, std::collections::BTreeSet<ObjectRef>>>,
}

impl MemoryObjects {
    fn put(&self, name: &str, value: Option<&str>) {
        let mut objects = self.objects.lock().expect("lock");
        match value {
            Some(v) => objects.insert(
                name.into(),
                [("key".to_owned(), v.as_bytes().to_vec())].into(),
            ),
            None => objects.remove(name),
        };
    }
}

#[tonic::async_trait]
impl ObjectSource for MemoryObjects {
    async fn get(
        &self,
        _: ObjectKind,
        _: &str,
        name: &str,
    ) -> std::result::Result<Option<ObjectData>, String> {
        Ok(self.objects.lock().expect("lock").get(name).cloned())
    }

    async fn token(&self, _: &TokenSpec) -> std::result::Result<IssuedToken, String> {
        Err("no tokens here".into())
    }

    fn register_pod(&self, pod: &PodUid, objects: &std::collections::BTreeSet<ObjectRef>) {
        self.registered
            .lock()
            .expect("lock")
            .insert(pod.clone(), objects.clone());
    }

    fn unregister_pod(&self, pod: &PodUid) {
        self.registered.lock().expect("lock").remove(pod);
    }
}

/// Upstream's remount: a configMap volume is set up again at each sync of its pod (not
/// between syncs), a changed object changes the file through a new `..data`, a deleted one
/// leaves the last files of a volume that is not optional and empties an optional one.
#[tokio::test]
async fn object_volumes_follow_their_objects_at_each_sync() {
    use k8s_openapi::api::core::v1::ConfigMapVolumeSource;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a configMap volume is a tmpfs, mounting one needs root");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let manager = manager(root.path());
    let objects = Arc::new(MemoryObjects::default());
    manager.set_object_source(objects.clone());
    let volume = |name: &str, optional: bool| Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: name.into(),
            optional: Some(optional),
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = pod(
        vec![volume("web", false), volume("extra", true)],
        vec![mount("web", "/web"), mount("extra", "/extra")],
    );
    let uid = PodUid::from("uid-1");
    let dir = |name: &str| {
        root.path()
            .join("pods/uid-1/volumes/kubernetes.io~configmap")
            .join(name)
    };
    let read = |name: &str| std::fs::read_to_string(dir(name).join("key")).ok();
    let data_link = || std::fs::read_link(dir("web").join("..data")).ok();
    objects.put("web", Some("v1"));
    objects.put("extra", Some("x1"));

    let checked = async {
        manager.add_pod(p.clone()).expect("supported");
        manager.reconcile().await;
        assert_eq!(read("web").as_deref(), Some("v1"));
        assert_eq!(read("extra").as_deref(), Some("x1"));
        assert_eq!(
            objects
                .registered
                .lock()
                .expect("lock")
                .get(&uid)
                .map(|r| r.len()),
            Some(2),
            "both objects registered with the source"
        );
        let first = data_link();

        // Unchanged: a sync remounts, and the writer leaves `..data` where it was.
        manager.add_pod(p.clone()).expect("supported");
        assert_eq!(manager.remount_pending(&uid), vec!["extra", "web"]);
        manager.reconcile().await;
        assert!(manager.remount_pending(&uid).is_empty());
        assert_eq!(data_link(), first);

        // Changed: nothing happens until the pod's next sync.
        objects.put("web", Some("v2"));
        manager.reconcile().await;
        assert_eq!(read("web").as_deref(), Some("v1"));
        manager.add_pod(p.clone()).expect("supported");
        manager.reconcile().await;
        assert_eq!(read("web").as_deref(), Some("v2"));
        assert_ne!(data_link(), first, "a new payload directory");

        // Deleted: the required volume keeps its files, the optional one is emptied.
        objects.put("web", None);
        objects.put("extra", None);
        manager.add_pod(p.clone()).expect("supported");
        manager.reconcile().await;
        assert_eq!(read("web").as_deref(), Some("v2"));
        assert_eq!(read("extra"), None);
        assert_eq!(
            manager.mounted_volumes(&uid).len(),
            2,
            "a failed remount leaves the volume set up"
        );
    };
    let outcome = {
        use futures::FutureExt as _;
        std::panic::AssertUnwindSafe(checked).catch_unwind().await
    };
    // Torn down whatever the checks said: the tmpfs must not outlive the test.
    manager.remove_pod(&uid);
    manager.reconcile().await;
    assert!(!dir("web").exists(), "torn down");
    assert!(
        objects.registered.lock().expect("lock").is_empty(),
        "the references dropped with the pod"
    );
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
