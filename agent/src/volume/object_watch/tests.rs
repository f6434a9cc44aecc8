//! The watch-based object source against the scripted API server: one list and watch per
//! referenced object with the `metadata.name` field selector, reads served from what the watch
//! delivered, no more watching once the object is immutable or nobody references it.

use std::collections::BTreeSet;

use http::Method;
use serde_json::{Value, json};

use super::*;
use crate::testing::fake_api::{FakeApi, fake_api};

const CONFIG_MAPS: &str = "/api/v1/namespaces/prod/configmaps";

fn config_map(version: &str, value: &str, immutable: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "web", "namespace": "prod", "resourceVersion": version},
        "data": {"app.conf": value},
        "immutable": immutable,
    })
}

fn list(version: &str, items: &[Value]) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": version}, "items": items})
}

fn web() -> BTreeSet<ObjectRef> {
    [ObjectRef {
        kind: ObjectKind::ConfigMap,
        namespace: "prod".into(),
        name: "web".into(),
    }]
    .into()
}

async fn read(objects: &WatchedObjects) -> Result<Option<Vec<u8>>, String> {
    objects
        .get(ObjectKind::ConfigMap, "prod", "web")
        .await
        .map(|found| found.and_then(|d| d.get("app.conf").cloned()))
}

/// Answers the list of the object's watch with `items`, asserting its field selector.
async fn answer_list(api: &mut FakeApi, items: &[Value]) {
    let call = api.expect(Method::GET, CONFIG_MAPS).await;
    assert_eq!(call.param("fieldSelector"), Some("metadata.name=web"));
    assert_eq!(call.param("watch"), None);
    call.reply(200, &list("10", items));
}

#[tokio::test(start_paused = true)]
async fn reads_follow_the_watch_until_nobody_references_the_object() {
    let (client, mut api) = fake_api();
    let objects = WatchedObjects::new(client, CancellationToken::new());
    let pod = PodUid::from("u1");
    objects.register_pod(&pod, &web());
    // A second registration of the same references changes nothing.
    objects.register_pod(&pod, &web());
    assert_eq!(objects.watched(), 1);

    let server = async {
        answer_list(&mut api, &[config_map("9", "v1", false)]).await;
    };
    let ((), first) = tokio::join!(server, read(&objects));
    assert_eq!(first, Ok(Some(b"v1".to_vec())));

    let watch = api.expect(Method::GET, CONFIG_MAPS).await;
    assert_eq!(watch.param("watch"), Some("true"));
    assert_eq!(watch.param("fieldSelector"), Some("metadata.name=web"));
    watch.reply_events(&[json!({"type": "MODIFIED", "object": config_map("11", "v2", false)})]);
    let resumed = api.expect(Method::GET, CONFIG_MAPS).await;
    assert_eq!(resumed.param("resourceVersion"), Some("11"));
    assert_eq!(read(&objects).await, Ok(Some(b"v2".to_vec())));

    // Deleted: no object, so a volume keeps its files unless it is optional.
    resumed.reply_events(&[json!({"type": "DELETED", "object": config_map("12", "v2", false)})]);
    let _open = api.expect(Method::GET, CONFIG_MAPS).await.hold();
    assert_eq!(read(&objects).await, Ok(None));

    objects.unregister_pod(&pod);
    assert_eq!(objects.watched(), 0);
    api.assert_no_request(Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn an_immutable_object_is_not_watched_after_it_is_read() {
    let (client, mut api) = fake_api();
    let objects = WatchedObjects::new(client, CancellationToken::new());
    objects.register_pod(&PodUid::from("u1"), &web());
    let server = async {
        answer_list(&mut api, &[config_map("9", "frozen", true)]).await;
    };
    let ((), first) = tokio::join!(server, read(&objects));
    assert_eq!(first, Ok(Some(b"frozen".to_vec())));
    // No watch follows the list, and the content is still served.
    api.assert_no_request(Duration::from_secs(60)).await;
    assert_eq!(read(&objects).await, Ok(Some(b"frozen".to_vec())));
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_never_lists_fails_the_read_after_a_second() {
    let (client, mut api) = fake_api();
    let objects = WatchedObjects::new(client, CancellationToken::new());
    objects.register_pod(&PodUid::from("u1"), &web());
    let server = async {
        // The list is taken and never answered.
        api.expect(Method::GET, CONFIG_MAPS).await.hold()
    };
    let (_held, read) = tokio::join!(server, read(&objects));
    assert_eq!(
        read,
        Err("failed to sync configmaps cache: timed out waiting for the condition".into())
    );
}

#[tokio::test(start_paused = true)]
async fn an_object_larger_than_upstreams_limit_is_not_kept() {
    let (client, mut api) = fake_api();
    let objects = WatchedObjects::new(client, CancellationToken::new());
    objects.register_pod(&PodUid::from("u1"), &web());
    let big = "x".repeat(MAX_OBJECT_BYTES);
    let server = async {
        answer_list(&mut api, &[config_map("9", &big, false)]).await;
    };
    let ((), read) = tokio::join!(server, read(&objects));
    let error = read.expect_err("too large");
    assert!(
        error.contains("more than the 1048576 the node keeps"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_object_no_pod_registered_is_read_directly() {
    let (client, mut api) = fake_api();
    let objects = WatchedObjects::new(client, CancellationToken::new());
    let server = async {
        api.expect(Method::GET, "/api/v1/namespaces/prod/configmaps/web")
            .await
            .reply(200, &config_map("9", "direct", false));
    };
    let ((), read) = tokio::join!(server, read(&objects));
    assert_eq!(read, Ok(Some(b"direct".to_vec())));
    assert_eq!(objects.watched(), 0);
}
