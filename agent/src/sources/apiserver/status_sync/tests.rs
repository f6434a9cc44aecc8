//! The status syncer against the scripted API server: which pods get a PATCH, its exact body, one
//! PATCH per change, and how errors are taken.

use crate::testing;
use std::{sync::Arc, time::Duration};

use http::Method;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodStatus as ApiPodStatus,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::testing::fake_api::{FakeApi, fake_api, status_error};

const STRATEGIC: &str = "application/strategic-merge-patch+json";
const WEB_STATUS: &str = "/api/v1/namespaces/default/pods/web/status";

fn pod(name: &str, uid: &str, source: &str) -> Arc<Pod> {
    testing::pod()
        .named("default", name, uid)
        .annotation(CONFIG_SOURCE_ANNOTATION, source)
        .arc()
}

fn running(message: Option<&str>) -> ApiPodStatus {
    ApiPodStatus {
        phase: Some("Running".into()),
        message: message.map(str::to_owned),
        container_statuses: Some(vec![ContainerStatus {
            name: "main".into(),
            image: "busybox".into(),
            image_id: "sha256:abc".into(),
            container_id: Some("containerd://c1".into()),
            ready: true,
            restart_count: 0,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning { started_at: None }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..ApiPodStatus::default()
    }
}

fn start(status: &Arc<StatusManager>) -> (FakeApi, CancellationToken) {
    let (api, cancel, _) = start_with_mirrors(status);
    (api, cancel)
}

/// The syncer with the mirror pods a test sets.
fn start_with_mirrors(
    status: &Arc<StatusManager>,
) -> (
    FakeApi,
    CancellationToken,
    tokio::sync::watch::Sender<super::super::mirror_pods::MirrorPods>,
) {
    let (client, api) = fake_api();
    let cancel = CancellationToken::new();
    let (mirrors, watched) = tokio::sync::watch::channel(Some(Default::default()));
    let sync = StatusSync::new(client, status.clone(), Duration::from_secs(10), watched);
    tokio::spawn(sync.run(cancel.clone()));
    (api, cancel, mirrors)
}

fn ok_pod() -> serde_json::Value {
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "web", "namespace": "default" } })
}

#[tokio::test(start_paused = true)]
async fn patches_api_pods_once_per_change_and_never_static_ones() {
    let status = Arc::new(StatusManager::default());
    let web = pod("web", "u-web", "api");
    status.set_pod_status(&pod("etcd-n1", "u-etcd", "file"), running(None));
    // Two changes before the syncer runs: one PATCH, with the latest.
    status.set_pod_status(
        &web,
        ApiPodStatus {
            phase: Some("Pending".into()),
            ..ApiPodStatus::default()
        },
    );
    status.set_pod_status(&web, running(Some("started")));
    let (mut api, cancel) = start(&status);

    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    assert_eq!(patch.content_type.as_deref(), Some(STRATEGIC));
    assert_eq!(
        patch.body,
        json!({
            "metadata": { "uid": "u-web" },
            "status": {
                "phase": "Running",
                "message": "started",
                "containerStatuses": [{
                    "name": "main",
                    "image": "busybox",
                    "imageID": "sha256:abc",
                    "containerID": "containerd://c1",
                    "ready": true,
                    "restartCount": 0,
                    "started": true,
                    "state": { "running": {} },
                }],
            },
        })
    );
    patch.reply(200, &ok_pod());
    // Nothing for the static pod, and nothing again for an unchanged status (resyncs included).
    api.assert_no_request(Duration::from_secs(35)).await;

    // A change: one more PATCH; the message the agent no longer sets is deleted.
    let mut done = running(None);
    done.phase = Some("Succeeded".into());
    status.set_pod_status(&web, done);
    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    assert_eq!(patch.body["status"]["phase"], "Succeeded");
    assert_eq!(patch.body["status"]["message"], json!(null));
    assert_eq!(patch.body["metadata"]["uid"], "u-web");
    patch.reply(200, &ok_pod());
    api.assert_no_request(Duration::from_secs(35)).await;
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_deleted_pod_is_not_an_error_and_other_failures_are_retried() {
    let status = Arc::new(StatusManager::default());
    let web = pod("web", "u-web", "api");
    status.set_pod_status(&web, running(None));
    let (mut api, cancel) = start(&status);

    // 404: the pod is gone; the status counts as delivered and is not sent again.
    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    patch.reply(404, &status_error(404, "NotFound"));
    api.assert_no_request(Duration::from_secs(35)).await;

    // A server error: sent again at the next sync period, without a new change.
    status.set_pod_status(&web, running(Some("again")));
    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    patch.reply(500, &status_error(500, "InternalError"));
    let retry = api.expect(Method::PATCH, WEB_STATUS).await;
    assert_eq!(retry.body["status"]["message"], "again");
    retry.reply(200, &ok_pod());
    api.assert_no_request(Duration::from_secs(35)).await;
    cancel.cancel();
}

/// A pod recreated under the same name refuses the patch (its `metadata.uid` is immutable: 422):
/// the same patch is not sent again at every sync period, only after the next change.
#[tokio::test(start_paused = true)]
async fn a_refused_patch_waits_for_the_next_change() {
    let status = Arc::new(StatusManager::default());
    let web = pod("web", "u-web", "api");
    status.set_pod_status(&web, running(None));
    let (mut api, cancel) = start(&status);

    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    patch.reply(422, &status_error(422, "Invalid"));
    api.assert_no_request(Duration::from_secs(35)).await;

    status.set_pod_status(&web, running(Some("changed")));
    let patch = api.expect(Method::PATCH, WEB_STATUS).await;
    assert_eq!(patch.body["status"]["message"], "changed");
    patch.reply(200, &ok_pod());
    api.assert_no_request(Duration::from_secs(35)).await;
    cancel.cancel();
}

/// The two-way patch (upstream `CreateTwoWayMergePatch` on a pod status): a state the container
/// left is nulled, a condition's reason it no longer has is nulled, a container status gone is a
/// `$patch: delete`, and what did not change is not sent.
#[test]
fn the_patch_removes_what_the_new_status_no_longer_has_at_any_depth() {
    let held = json!({
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [main]"},
            {"type": "PodScheduled", "status": "True"},
        ],
        "containerStatuses": [
            {"name": "main", "ready": false, "state": {"waiting": {"reason": "ContainerCreating"}}},
            {"name": "old", "ready": false, "state": {"terminated": {"exitCode": 0}}},
        ],
        "podIPs": [{"ip": "10.0.0.5"}],
    });
    let now = json!({
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True"},
        ],
        "containerStatuses": [
            {"name": "main", "ready": true, "state": {"running": {"startedAt": "2026-11-25T11:00:00Z"}}},
        ],
        "podIPs": [{"ip": "10.0.0.5"}],
    });
    let (Value::Object(held), Value::Object(now)) = (held, now) else {
        panic!("objects");
    };
    assert_eq!(
        patch_body("u1", &now, &held),
        json!({
            "metadata": {"uid": "u1"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": null, "message": null}],
                "containerStatuses": [
                    {"name": "main", "ready": true, "state": {"waiting": null, "running": {"startedAt": "2026-11-25T11:00:00Z"}}},
                    {"$patch": "delete", "name": "old"},
                ],
            },
        })
    );
    // Nothing changed: an empty status patch.
    assert_eq!(
        patch_body("u1", &now, &now),
        json!({"metadata": {"uid": "u1"}, "status": {}})
    );
}

/// A held status with a long list (a client with write access to the pod's status made it): the
/// patch is still exact — every stranger deleted, the agent's own kept — with each side indexed
/// once rather than scanned per element.
#[test]
fn a_long_held_list_is_patched_element_by_element() {
    let strangers: Vec<Value> = (0..20_000)
        .map(|i| json!({"type": format!("x{i}"), "status": "True"}))
        .collect();
    let mut held_conditions = strangers.clone();
    held_conditions.push(json!({"type": "Ready", "status": "False"}));
    let held = json!({"conditions": held_conditions});
    let now = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    let (Value::Object(held), Value::Object(now)) = (held, now) else {
        panic!("objects");
    };
    let body = patch_body("u1", &now, &held);
    let patch = body["status"]["conditions"].as_array().expect("a list");
    assert_eq!(patch.len(), 20_001);
    assert_eq!(patch[0], json!({"type": "Ready", "status": "True"}));
    assert!(
        patch[1..]
            .iter()
            .all(|c| c["$patch"] == "delete" && c.get("status").is_none())
    );
}

/// A static pod's status goes to its mirror pod, with the mirror's UID, only to one made from
/// the static pod's hash; a recreated mirror pod gets it again.
#[tokio::test(start_paused = true)]
async fn a_static_pods_status_goes_to_its_mirror_pod_of_the_same_hash() {
    use super::super::mirror_pods::MirrorPod;
    const ETCD_STATUS: &str = "/api/v1/namespaces/default/pods/etcd-n1/status";
    let status = Arc::new(StatusManager::default());
    let etcd = Arc::new(
        testing::pod()
            .named("default", "etcd-n1", "h1")
            .annotation(CONFIG_SOURCE_ANNOTATION, "file")
            .annotation(crate::sources::CONFIG_HASH_ANNOTATION, "h1")
            .build(),
    );
    status.set_pod_status(&etcd, running(None));
    let (mut api, cancel, mirrors) = start_with_mirrors(&status);
    let mirror = |uid: &str, hash: &str, deleting: bool| MirrorPod {
        uid: uid.into(),
        namespace: "default".into(),
        name: "etcd-n1".into(),
        hash: hash.into(),
        deleting,
        status: Some(ApiPodStatus {
            phase: Some("Pending".into()),
            ..ApiPodStatus::default()
        }),
    };
    let set = |m: Option<MirrorPod>| {
        mirrors.send_replace(Some(
            m.into_iter()
                .map(|m| ("etcd-n1_default".to_owned(), m))
                .collect(),
        ));
    };
    // No mirror pod, one of an older manifest, one being deleted: nothing is sent.
    api.assert_no_request(Duration::from_secs(15)).await;
    set(Some(mirror("m-1", "h0", false)));
    api.assert_no_request(Duration::from_secs(15)).await;
    set(Some(mirror("m-2", "h1", true)));
    api.assert_no_request(Duration::from_secs(15)).await;

    set(Some(mirror("m-2", "h1", false)));
    let patch = api.expect(Method::PATCH, ETCD_STATUS).await;
    assert_eq!(patch.body["metadata"]["uid"], "m-2");
    assert_eq!(patch.body["status"]["phase"], "Running");
    assert!(patch.body["status"]["containerStatuses"].is_array());
    patch.reply(200, &ok_pod());
    api.assert_no_request(Duration::from_secs(15)).await;

    // Deleted and made again: the new mirror pod gets the status, from its own.
    set(Some(mirror("m-3", "h1", false)));
    let patch = api.expect(Method::PATCH, ETCD_STATUS).await;
    assert_eq!(patch.body["metadata"]["uid"], "m-3");
    assert_eq!(patch.body["status"]["phase"], "Running");
    patch.reply(200, &ok_pod());
    api.assert_no_request(Duration::from_secs(15)).await;
    cancel.cancel();
}
