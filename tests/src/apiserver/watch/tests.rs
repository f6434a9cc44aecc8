//! Watch events as the watch cache sends them.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::apiserver::{
    deletion::DeleteOptions,
    resources::find,
    strategy::{Target, UidCheck, prepare_create, prepare_update},
};

fn pods() -> &'static Resource {
    find("", "v1", "pods").expect("pods")
}

fn on_node(node: &str, after: Option<u64>) -> WatchRequest {
    WatchRequest {
        resource: pods(),
        namespace: None,
        fields: FieldSelector::parse(pods(), &format!("spec.nodeName={node}")).expect("valid"),
        labels: LabelSelector::default(),
        after,
        send_initial_events: false,
        bookmarks: false,
        timeout: Duration::from_secs(60),
    }
}

fn create(store: &mut Store, name: &str, node: &str) -> Value {
    let pod = json!({"metadata": {"name": name}, "spec": {"nodeName": node}});
    let pod = prepare_create(pods(), Some("ns"), pod, 0).expect("valid");
    store.create(pods(), pod).expect("created")
}

fn relabel(store: &mut Store, name: &str, node: &str) {
    store
        .update(pods(), Some("ns"), name, |old| {
            let mut new = old.clone();
            new["spec"]["nodeName"] = json!(node);
            prepare_update(pods(), Target::Main, UidCheck::Precondition, old, new)
        })
        .expect("updated");
}

fn kinds(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            let name = e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (e["type"].as_str().unwrap_or_default().to_owned(), name)
        })
        .collect()
}

/// The events of `request` for what `store` recorded after `from`.
fn events_after(store: &Store, request: &WatchRequest, from: u64) -> Vec<Value> {
    let (backlog, _) = store.watch_from(from).expect("in the history");
    backlog.iter().filter_map(|c| request.event(c)).collect()
}

#[test]
fn objects_entering_and_leaving_a_field_selector_are_added_and_deleted() {
    let mut store = Store::new(100);
    let start = store.revision();
    create(&mut store, "a", "n1");
    create(&mut store, "b", "n2");
    relabel(&mut store, "b", "n1");
    relabel(&mut store, "b", "n1-other");
    relabel(&mut store, "a", "n1");
    store
        .update(pods(), Some("ns"), "a", |old| {
            let mut new = old.clone();
            new["metadata"]["labels"] = json!({"x": "y"});
            prepare_update(pods(), Target::Main, UidCheck::Precondition, old, new)
        })
        .expect("updated");
    store
        .delete(
            pods(),
            Some("ns"),
            "a",
            &DeleteOptions {
                grace_period_seconds: Some(0),
                ..DeleteOptions::default()
            },
            0,
        )
        .expect("deleted");
    let events = events_after(&store, &on_node("n1", Some(start)), start);
    let want: Vec<(String, String)> = [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("DELETED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    .iter()
    .map(|(t, n)| ((*t).to_owned(), (*n).to_owned()))
    .collect();
    assert_eq!(kinds(&events), want);
    // The pod that left is sent with its previous content at the version of the change.
    let left = &events[2]["object"];
    assert_eq!(left["spec"]["nodeName"], "n1");
    let change_versions: Vec<&str> = events
        .iter()
        .filter_map(|e| e["object"]["metadata"]["resourceVersion"].as_str())
        .collect();
    let mut sorted = change_versions.clone();
    sorted.sort_by_key(|v| v.parse::<u64>().unwrap_or(0));
    sorted.dedup();
    assert_eq!(sorted, change_versions, "versions increase");
}

#[test]
fn other_resources_and_namespaces_are_not_sent() {
    let mut store = Store::new(100);
    let start = store.revision();
    create(&mut store, "a", "n1");
    let configmaps = find("", "v1", "configmaps").expect("configmaps");
    let cm = prepare_create(
        configmaps,
        Some("ns"),
        json!({"metadata": {"name": "a"}}),
        0,
    )
    .expect("valid");
    store.create(configmaps, cm).expect("created");
    let mut request = on_node("n1", Some(start));
    assert_eq!(events_after(&store, &request, start).len(), 1);
    request.namespace = Some("elsewhere".to_owned());
    assert!(events_after(&store, &request, start).is_empty());
}

async fn collect(mut lines: mpsc::Receiver<Bytes>, want: usize) -> Vec<Value> {
    let mut events = Vec::new();
    while events.len() < want {
        match tokio::time::timeout(crate::EVENT_WAIT, lines.recv()).await {
            Ok(Some(line)) => events.push(serde_json::from_slice(&line).expect("a JSON line")),
            _ => break,
        }
    }
    events
}

#[tokio::test]
async fn a_stream_sends_the_initial_state_then_changes_and_bookmarks() {
    let mut store = Store::new(100);
    create(&mut store, "a", "n1");
    let mut request = on_node("n1", None);
    request.bookmarks = true;
    let start = start(&store, &request).expect("starts");
    let (out, lines) = mpsc::channel(16);
    let (_epoch, dropped) = watch::channel(0);
    let task = tokio::spawn(run(request, start, out, dropped, Duration::from_millis(20)));
    create(&mut store, "b", "n1");
    let events = collect(lines, 4).await;
    task.abort();
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "a");
    let b = events
        .iter()
        .position(|e| e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "b");
    assert!(b.is_some(), "the later pod came: {events:?}");
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(bookmark["object"]["kind"], "Pod");
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());
}

#[tokio::test]
async fn send_initial_events_ends_with_the_annotated_bookmark_and_a_drop_ends_the_stream() {
    let mut store = Store::new(100);
    create(&mut store, "a", "n1");
    let mut request = on_node("n1", Some(1));
    request.send_initial_events = true;
    let start = start(&store, &request).expect("starts");
    let (out, mut lines) = mpsc::channel(16);
    let (epoch, dropped) = watch::channel(0);
    let task = tokio::spawn(run(request, start, out, dropped, Duration::from_secs(3600)));
    let mut first = Vec::new();
    for _ in 0..2 {
        let line = tokio::time::timeout(crate::EVENT_WAIT, lines.recv())
            .await
            .expect("in time")
            .expect("a line");
        first.push(serde_json::from_slice::<Value>(&line).expect("JSON"));
    }
    assert_eq!(first[0]["type"], "ADDED");
    assert_eq!(first[1]["type"], "BOOKMARK");
    assert_eq!(
        first[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    epoch.send_replace(1);
    let end = tokio::time::timeout(crate::EVENT_WAIT, lines.recv())
        .await
        .expect("ends in time");
    assert!(end.is_none(), "the stream ended");
    assert!(task.await.is_ok());
}

#[test]
fn an_expired_version_is_an_error_event_with_410() {
    let mut store = Store::new(100);
    create(&mut store, "a", "n1");
    store.compact();
    let Err(error) = start(&store, &on_node("n1", Some(1))) else {
        panic!("an expired version cannot start");
    };
    let event: Value = serde_json::from_slice(&error_event(&error)).expect("JSON");
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
}
