//! A pod's RuntimeClass through `KubeRuntimeManager` against the CRI fake: its handler reaches
//! `RunPodSandbox`, and a sandbox that cannot be made (a missing RuntimeClass, the runtime
//! refusing) leaves the containers waiting as `ContainerCreating` with upstream's
//! `FailedCreatePodSandBox` text, retried on the next sync.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::{IMAGE, container, manager, status_of};
use crate::{
    container::PodUid,
    cri::{
        Operation,
        fake::{Call, FakeRuntime},
    },
    kuberuntime::{
        NoProbes,
        manager::{KubeRuntimeManager, SyncError},
        runtime_class::{RuntimeClassError, RuntimeClasses},
    },
    status::{ReasonCache, StartFailureReason},
};

/// RuntimeClasses by name; a name not listed does not exist.
struct Classes(BTreeMap<&'static str, &'static str>);

#[tonic::async_trait]
impl RuntimeClasses for Classes {
    async fn handler(&self, name: &str) -> Result<String, RuntimeClassError> {
        self.0
            .get(name)
            .map(|h| (*h).to_owned())
            .ok_or_else(|| RuntimeClassError::NotFound {
                name: name.to_owned(),
            })
    }
}

fn with_classes(fake: &Arc<FakeRuntime>) -> (KubeRuntimeManager, Arc<Mutex<ReasonCache>>) {
    let (m, reasons) = manager(fake);
    let classes = Classes([("kata", "kata-qemu")].into());
    (m.with_runtime_classes(Arc::new(classes)), reasons)
}

fn pod(class: &str) -> Pod {
    crate::testing::pod()
        .named("default", "web", "uid-1")
        .host_network(true)
        .restart_policy("Always")
        .container(container("app", "IfNotPresent"))
        .spec(|s| s.runtime_class_name = Some(class.into()))
        .build()
}

fn handlers(calls: Vec<Call>) -> Vec<String> {
    calls
        .into_iter()
        .filter_map(|c| match c {
            Call::RunPodSandbox {
                runtime_handler, ..
            } => Some(runtime_handler),
            _ => None,
        })
        .collect()
}

fn waiting(reasons: &Mutex<ReasonCache>) -> Option<(StartFailureReason, String)> {
    let reasons = reasons.lock().unwrap_or_else(|p| p.into_inner());
    reasons
        .get(&PodUid::from("uid-1"), "app")
        .map(|f| (f.reason, f.message.clone()))
}

#[tokio::test]
async fn the_runtime_class_handler_runs_the_sandbox() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = with_classes(&fake);
    let cancel = CancellationToken::new();
    let outcome = m
        .sync_pod(
            &pod("kata"),
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(handlers(fake.take_calls()), ["kata-qemu"]);
    assert_eq!(waiting(&reasons), None);
    // A sync with the sandbox running reads no RuntimeClass and makes no sandbox.
    let again = m
        .sync_pod(
            &pod("kata"),
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert!(handlers(fake.take_calls()).is_empty());
}

#[tokio::test]
async fn a_missing_runtime_class_leaves_the_pod_waiting_with_the_reason() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = with_classes(&fake);
    let cancel = CancellationToken::new();
    let outcome = m
        .sync_pod(
            &pod("absent"),
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(
        matches!(outcome.errors.as_slice(), [SyncError::RuntimeClass { .. }]),
        "{:?}",
        outcome.errors
    );
    assert!(handlers(fake.take_calls()).is_empty(), "no sandbox is run");
    assert_eq!(
        waiting(&reasons),
        Some((
            StartFailureReason::ContainerCreating,
            "Failed to create pod sandbox: runtimeclasses.node.k8s.io \"absent\" not found"
                .to_owned()
        ))
    );
}

#[tokio::test]
async fn a_handler_the_runtime_refuses_fails_the_sandbox_with_its_error() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, reasons) = with_classes(&fake);
    fake.fail_next(Operation::RunPodSandbox, tonic::Code::Unknown);
    let cancel = CancellationToken::new();
    let outcome = m
        .sync_pod(
            &pod("kata"),
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(
        matches!(outcome.errors.as_slice(), [SyncError::CreateSandbox { .. }]),
        "{:?}",
        outcome.errors
    );
    let (reason, message) =
        waiting(&reasons).unwrap_or((StartFailureReason::ErrImagePull, String::new()));
    assert_eq!(reason, StartFailureReason::ContainerCreating);
    assert!(
        message.starts_with("Failed to create pod sandbox: "),
        "{message}"
    );
    // The next sync tries again, and runs it.
    let retried = m
        .sync_pod(
            &pod("kata"),
            &status_of(&fake).await,
            "/kubepods/podx",
            &NoProbes,
            &cancel,
        )
        .await;
    assert!(retried.errors.is_empty(), "{:?}", retried.errors);
    assert_eq!(handlers(fake.take_calls()), ["kata-qemu", "kata-qemu"]);
}
