//! The securityContext through `KubeRuntimeManager` against the CRI fake: what the runtime is
//! asked for, and the `CreateContainerConfigError` a container that must not run gets (in the
//! reason cache, so its status shows it, retried on the next sync).

use crate::testing;
use std::sync::{Arc, Mutex};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kuberuntime::{
    NoProbes,
    manager::KubeRuntimeManager,
    userns::{FIRST_HOST_ID, USERNS_LENGTH, UsernsManager},
};
use crate::{
    container::{PodUid, RuntimeFeatures, RuntimeHandler},
    cri::{convert::get_pod_status, fake::FakeRuntime},
    status::{ReasonCache, StartFailureReason},
};

const IMAGE: &str = "localhost/swiftlet/busybox:latest";

fn manager(
    fake: &Arc<FakeRuntime>,
    seccomp_default: bool,
) -> (KubeRuntimeManager, Arc<Mutex<ReasonCache>>) {
    crate::kuberuntime::fixtures::runtime_manager(
        fake,
        "swiftlet-manager-security-tests",
        seccomp_default,
    )
}

fn pod(sc: Option<PodSecurityContext>, containers: Vec<Container>) -> Pod {
    testing::pod()
        .named("default", "web", "uid-1")
        .host_network(true)
        .security_context(sc)
        .containers(containers)
        .build()
}

fn container(name: &str, sc: Option<SecurityContext>) -> Container {
    Container {
        name: name.into(),
        image: Some(IMAGE.into()),
        image_pull_policy: Some("Never".into()),
        security_context: sc,
        ..Default::default()
    }
}

/// A container that asks for `runAsNonRoot` and nothing else.
fn non_root_container(name: &str) -> Container {
    container(
        name,
        Some(SecurityContext {
            run_as_non_root: Some(true),
            ..Default::default()
        }),
    )
}

async fn sync(
    m: &KubeRuntimeManager,
    fake: &FakeRuntime,
    p: &Pod,
) -> crate::kuberuntime::manager::SyncOutcome {
    let status = get_pod_status(fake, &PodUid::from("uid-1"), "web", "default")
        .await
        .expect("status");
    m.sync_pod(
        p,
        &status,
        "/kubepods/podx",
        &NoProbes,
        &CancellationToken::new(),
    )
    .await
}

fn container_security(
    fake: &FakeRuntime,
    name: &str,
) -> Option<cri::LinuxContainerSecurityContext> {
    fake.container_ids()
        .iter()
        .filter_map(|id| fake.container_config(id))
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .and_then(|c| c.linux?.security_context)
}

#[tokio::test]
async fn run_as_non_root_with_a_root_image_is_create_container_config_error_and_retried() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = manager(&fake, false);
    let p = pod(
        None,
        vec![non_root_container("app"), container("other", None)],
    );
    for _ in 0..2 {
        let outcome = sync(&m, &fake, &p).await;
        assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
        let failure = reasons
            .lock()
            .expect("lock")
            .get(&PodUid::from("uid-1"), "app")
            .cloned()
            .expect("a reason");
        assert_eq!(
            failure.reason,
            StartFailureReason::CreateContainerConfigError
        );
        assert_eq!(
            failure.message,
            "container has runAsNonRoot and image will run as root (pod: \"web_default(uid-1)\", \
             container: app)"
        );
    }
    // It is never created; its sibling is, once.
    assert!(container_security(&fake, "app").is_none());
    assert!(container_security(&fake, "other").is_some());
    assert_eq!(fake.container_ids().len(), 1);
}

#[tokio::test]
async fn the_images_user_is_checked_and_used() {
    let fake = Arc::new(FakeRuntime::new());
    fake.set_image_user(IMAGE, None, "nginx");
    let (m, reasons) = manager(&fake, false);
    sync(&m, &fake, &pod(None, vec![non_root_container("app")])).await;
    let message = reasons
        .lock()
        .expect("lock")
        .get(&PodUid::from("uid-1"), "app")
        .map(|f| f.message.clone());
    assert!(
        message.as_deref().is_some_and(|m| m.starts_with(
            "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root"
        )),
        "{message:?}"
    );
    // Without runAsNonRoot the runtime resolves the name.
    let fake = Arc::new(FakeRuntime::new());
    fake.set_image_user(IMAGE, None, "nginx");
    let (m, _) = manager(&fake, false);
    sync(&m, &fake, &pod(None, vec![container("app", None)])).await;
    let sc = container_security(&fake, "app").expect("created");
    assert_eq!(
        (sc.run_as_user, sc.run_as_username.as_str()),
        (None, "nginx")
    );
    // A numeric image user satisfies runAsNonRoot and becomes the user.
    let fake = Arc::new(FakeRuntime::new());
    fake.set_image_user(IMAGE, Some(1000), "");
    let (m, _) = manager(&fake, false);
    sync(&m, &fake, &pod(None, vec![non_root_container("app")])).await;
    let sc = container_security(&fake, "app").expect("created");
    assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
}

#[tokio::test]
async fn sandbox_and_container_get_the_whole_context() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = manager(&fake, true);
    let privileged = SecurityContext {
        privileged: Some(true),
        ..Default::default()
    };
    let p = pod(
        Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000]),
            ..Default::default()
        }),
        vec![container("app", None), container("tool", Some(privileged))],
    );
    let outcome = sync(&m, &fake, &p).await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    let sandbox = fake
        .sandbox_config(&fake.sandbox_ids()[0])
        .and_then(|c| c.linux?.security_context)
        .expect("sandbox context");
    assert!(
        sandbox.privileged,
        "a privileged container needs a privileged sandbox"
    );
    assert_eq!(sandbox.run_as_user.map(|u| u.value), Some(1000));
    assert_eq!(sandbox.supplemental_groups, vec![2000, 3000]);
    let app = container_security(&fake, "app").expect("app");
    assert_eq!(app.run_as_user.map(|u| u.value), Some(1000));
    assert_eq!(app.supplemental_groups, vec![2000, 3000]);
    // seccompDefault: RuntimeDefault without a profile asked for.
    assert_eq!(
        app.seccomp.map(|s| s.profile_type),
        Some(cri::security_profile::ProfileType::RuntimeDefault as i32)
    );
    assert!(!app.masked_paths.is_empty());
    let tool = container_security(&fake, "tool").expect("tool");
    assert!(tool.privileged && tool.masked_paths.is_empty());
    // Every pod is told to use the node's user namespace unless it asks otherwise.
    assert_eq!(
        app.namespace_options
            .and_then(|n| n.userns_options)
            .map(|u| u.mode),
        Some(cri::NamespaceMode::Node as i32)
    );
}

#[tokio::test]
async fn a_bad_seccomp_profile_is_create_container_config_error() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = manager(&fake, false);
    let escape = SecurityContext {
        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some("../../../etc/shadow".into()),
        }),
        ..Default::default()
    };
    sync(&m, &fake, &pod(None, vec![container("app", Some(escape))])).await;
    let failure = reasons
        .lock()
        .expect("lock")
        .get(&PodUid::from("uid-1"), "app")
        .cloned()
        .expect("a reason");
    assert_eq!(
        failure.reason,
        StartFailureReason::CreateContainerConfigError
    );
    assert!(
        failure.message.contains("must not contain '..'"),
        "{}",
        failure.message
    );
    assert!(fake.container_ids().is_empty());
}

#[tokio::test]
async fn host_users_false_gets_its_own_range_where_the_runtime_supports_it() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let dir = tempfile::tempdir().expect("tempdir");
    let (features_tx, features) = watch::channel(Some(RuntimeFeatures {
        supplemental_groups_policy: true,
        handlers: vec![RuntimeHandler {
            name: String::new(),
            user_namespaces: true,
            recursive_read_only_mounts: true,
        }],
    }));
    let userns = Arc::new(UsernsManager::load(dir.path(), features).expect("load"));
    let (m, _) = manager(&fake, false);
    let m = m.with_userns(userns.clone());
    let mut p = pod(None, vec![container("app", None)]);
    if let Some(spec) = p.spec.as_mut() {
        spec.host_users = Some(false);
    }
    let outcome = sync(&m, &fake, &p).await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    let sandbox_userns = fake
        .sandbox_config(&fake.sandbox_ids()[0])
        .and_then(|c| c.linux?.security_context?.namespace_options?.userns_options)
        .expect("userns");
    assert_eq!(sandbox_userns.mode, cri::NamespaceMode::Pod as i32);
    assert_eq!(
        sandbox_userns
            .uids
            .first()
            .map(|u| (u.host_id, u.container_id, u.length)),
        Some((FIRST_HOST_ID, 0, USERNS_LENGTH))
    );
    let container_userns = container_security(&fake, "app")
        .and_then(|s| s.namespace_options?.userns_options)
        .expect("container userns");
    assert_eq!(container_userns, sandbox_userns);
    // Once the runtime loses the feature, a new sandbox is refused with upstream's words.
    features_tx.send_replace(Some(RuntimeFeatures::default()));
    let fresh = Arc::new(FakeRuntime::new());
    fresh.add_image(IMAGE);
    let (m, _) = manager(&fresh, false);
    let m = m.with_userns(userns);
    let outcome = sync(&m, &fresh, &p).await;
    assert!(
        outcome.errors.iter().any(|e| e
            .to_string()
            .contains("RuntimeClass handler \"\" does not support user namespaces")),
        "{:?}",
        outcome.errors
    );
    assert!(fresh.sandbox_ids().is_empty());
}
