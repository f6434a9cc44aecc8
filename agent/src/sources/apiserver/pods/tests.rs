//! The API-server pod source against the scripted API server, through the real merge: the list
//! and watch requests it makes, and the updates the sync loop then sees.

use std::time::{Duration, SystemTime};

use http::Method;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{
    sources::{CONFIG_SOURCE_ANNOTATION, Op, PodConfig, PodUpdate, Source},
    testing::fake_api::{FakeApi, fake_api, status_error},
};

const PODS: &str = "/api/v1/pods";
const LIST_QUERY: &str = "&fieldSelector=spec.nodeName%3Dn1&limit=500";

fn pod(name: &str, uid: &str, version: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "uid": uid, "resourceVersion": version },
        "spec": { "nodeName": "n1", "containers": [{ "name": "main", "image": "busybox" }] },
    })
}

fn pod_list(version: &str, items: &[Value]) -> Value {
    json!({ "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": version }, "items": items })
}

fn watch_query(version: &str) -> String {
    format!(
        "&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dn1&allowWatchBookmarks=true&resourceVersion={version}"
    )
}

struct Harness {
    api: FakeApi,
    updates: mpsc::Receiver<PodUpdate>,
    mirrors: tokio::sync::watch::Receiver<super::super::mirror_pods::MirrorPods>,
    cancel: CancellationToken,
}

fn start() -> Harness {
    let (client, api) = fake_api();
    let (mut config, updates) = PodConfig::new(Box::new(|| SystemTime::UNIX_EPOCH));
    let sender = config.channel(Source::Api);
    let cancel = CancellationToken::new();
    tokio::spawn(config.run(cancel.clone()));
    let (mirrors_tx, mirrors) = tokio::sync::watch::channel(None);
    tokio::spawn(run(client, "n1".into(), sender, mirrors_tx, cancel.clone()));
    Harness {
        api,
        updates,
        mirrors,
        cancel,
    }
}

impl Harness {
    async fn next_update(&mut self) -> (Op, Vec<String>) {
        let update = tokio::time::timeout(Duration::from_secs(60), self.updates.recv())
            .await
            .expect("an update")
            .expect("merge running");
        assert_eq!(update.source, Source::Api);
        for pod in &update.pods {
            let source = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION));
            assert_eq!(source.map(String::as_str), Some("api"));
        }
        let names = update
            .pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (update.op, names)
    }
}

#[tokio::test(start_paused = true)]
async fn lists_then_watches_the_pods_bound_to_this_node() {
    let mut h = start();

    let list = h.api.expect(Method::GET, PODS).await;
    assert_eq!(list.raw_query, LIST_QUERY);
    assert_eq!(list.param("fieldSelector"), Some("spec.nodeName=n1"));
    list.reply(
        200,
        &pod_list("10", &[pod("web", "u-web", "8"), pod("db", "u-db", "9")]),
    );

    // The complete list is one SET; the merge makes it the first ADD.
    assert_eq!(
        h.next_update().await,
        (Op::Add, vec!["db".into(), "web".into()])
    );

    let watch = h.api.expect(Method::GET, PODS).await;
    assert_eq!(watch.raw_query, watch_query("10"));
    let mut deleting = pod("web", "u-web", "12");
    deleting["metadata"]["deletionTimestamp"] = json!("2023-11-14T22:13:20Z");
    deleting["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    watch.reply_events(&[
        json!({ "type": "ADDED", "object": pod("cache", "u-cache", "11") }),
        json!({ "type": "MODIFIED", "object": deleting }),
        json!({ "type": "DELETED", "object": pod("db", "u-db", "13") }),
    ]);

    assert_eq!(h.next_update().await, (Op::Add, vec!["cache".into()]));
    assert_eq!(h.next_update().await, (Op::Delete, vec!["web".into()]));
    assert_eq!(h.next_update().await, (Op::Remove, vec!["db".into()]));

    // The watch ended; it resumes from the last version seen, without listing again.
    let resumed = h.api.expect(Method::GET, PODS).await;
    assert_eq!(resumed.raw_query, watch_query("13"));
    let _open = resumed.hold();
    h.api.assert_no_request(Duration::from_secs(60)).await;
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_list_is_retried_with_backoff() {
    let mut h = start();
    let list = h.api.expect(Method::GET, PODS).await;
    list.reply(500, &status_error(500, "InternalError"));
    // Nothing reaches the merge until a list succeeds (no partial or empty set).
    let list = h.api.expect(Method::GET, PODS).await;
    assert_eq!(list.raw_query, LIST_QUERY);
    assert!(h.updates.try_recv().is_err());
    list.reply(200, &pod_list("20", &[]));
    assert_eq!(h.next_update().await, (Op::Add, vec![]));
    let watch = h.api.expect(Method::GET, PODS).await;
    assert_eq!(watch.raw_query, watch_query("20"));
    let _open = watch.hold();
    h.cancel.cancel();
}

#[test]
fn the_store_sends_complete_sets_only() {
    let typed = |name: &str| -> Pod {
        serde_json::from_value(pod(name, &format!("u-{name}"), "1")).expect("pod")
    };
    let mut store = PodStore::default();
    assert_eq!(store.apply(watcher::Event::Init), None);
    assert_eq!(store.apply(watcher::Event::InitApply(typed("a"))), None);
    assert_eq!(store.apply(watcher::Event::InitApply(typed("b"))), None);
    assert_eq!(
        store.apply(watcher::Event::InitDone),
        Some(vec![typed("a"), typed("b")])
    );
    // A re-list replaces the store at once: "a" is gone only when the new list is complete.
    assert_eq!(store.apply(watcher::Event::Init), None);
    assert_eq!(store.apply(watcher::Event::InitApply(typed("b"))), None);
    assert_eq!(
        store.apply(watcher::Event::InitDone),
        Some(vec![typed("b")])
    );
    assert_eq!(
        store.apply(watcher::Event::Apply(typed("c"))),
        Some(vec![typed("b"), typed("c")])
    );
    assert_eq!(
        store.apply(watcher::Event::Delete(typed("b"))),
        Some(vec![typed("c")])
    );
}

#[test]
fn a_pod_whose_identity_could_name_a_path_outside_its_own_is_left_out() {
    let typed = |name: &str, uid: &str| -> Pod {
        serde_json::from_value(pod(name, uid, "1")).expect("pod")
    };
    let mut store = PodStore::default();
    assert_eq!(store.apply(watcher::Event::Init), None);
    assert_eq!(
        store.apply(watcher::Event::InitApply(typed("a", "u-a"))),
        None
    );
    assert_eq!(
        store.apply(watcher::Event::InitApply(typed("b", "../../etc"))),
        None
    );
    assert_eq!(
        store.apply(watcher::Event::InitDone),
        Some(vec![typed("a", "u-a")])
    );
    // A pod that turns bad goes; the others stay.
    assert_eq!(
        store.apply(watcher::Event::Apply(typed("a", "/"))),
        Some(Vec::new())
    );
    assert_eq!(
        store.apply(watcher::Event::Apply(typed("c", "u-c"))),
        Some(vec![typed("c", "u-c")])
    );
}

fn status(code: u16, message: &str, cause: Option<&str>) -> Box<kube::core::Status> {
    let mut status = kube::core::Status::failure(message, "Timeout");
    status.code = code;
    status.details = cause.map(|reason| {
        serde_json::from_value(json!({"causes": [{"reason": reason, "message": message}]}))
            .unwrap_or_else(|e| panic!("status details: {e}"))
    });
    Box::new(status)
}

#[test]
fn a_watch_ahead_of_the_api_server_lists_again_and_other_errors_retry() {
    let too_large = || {
        status(
            504,
            "Too large resource version",
            Some("ResourceVersionTooLarge"),
        )
    };
    assert!(is_too_large_resource_version(
        &watcher::Error::WatchStartFailed(kube::Error::Api(too_large()))
    ));
    assert!(is_too_large_resource_version(&watcher::Error::WatchError(
        too_large()
    )));
    // A server older than the cause says it in the message only.
    assert!(is_too_large_resource_version(&watcher::Error::WatchFailed(
        kube::Error::Api(status(
            504,
            "Timeout: Too large resource version: 9, current: 3",
            None
        ))
    )));
    assert!(!is_too_large_resource_version(
        &watcher::Error::WatchStartFailed(kube::Error::Api(status(
            504,
            "the server was unable to return a response",
            None
        )))
    ));
    assert!(!is_too_large_resource_version(&watcher::Error::WatchError(
        status(410, "too old resource version", None)
    )));
}

#[tokio::test(start_paused = true)]
async fn mirror_pods_are_set_apart_never_run() {
    let mut h = start();
    let list = h.api.expect(Method::GET, PODS).await;
    let mut mirror = pod("etcd-n1", "m-1", "8");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "h1"});
    list.reply(200, &pod_list("10", &[pod("web", "u-web", "9"), mirror]));
    assert_eq!(h.next_update().await, (Op::Add, vec!["web".into()]));
    let mirrors = h.mirrors.borrow().clone().expect("listed");
    let etcd = mirrors.get("etcd-n1_default").expect("the mirror pod");
    assert_eq!((etcd.uid.as_str(), etcd.hash.as_str()), ("m-1", "h1"));
    assert_eq!(mirrors.len(), 1);
    let _open = h.api.expect(Method::GET, PODS).await.hold();
    h.cancel.cancel();
}
