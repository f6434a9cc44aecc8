//! The store's versions, conflicts, deletion and compaction.

use serde_json::json;

use super::*;
use crate::apiserver::{
    resources::find,
    strategy::{Target, UidCheck, prepare_create, prepare_update},
};

fn pods() -> &'static Resource {
    find("", "v1", "pods").expect("pods")
}

fn configmaps() -> &'static Resource {
    find("", "v1", "configmaps").expect("configmaps")
}

const NOW: i64 = 1_700_000_000;

fn create_pod(store: &mut Store, name: &str, node: &str) -> Value {
    let pod = json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}});
    let pod = prepare_create(pods(), Some("ns"), pod, NOW).expect("valid");
    store.create(pods(), pod).expect("created")
}

fn version(object: &Value) -> u64 {
    meta_str(object, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .expect("a resourceVersion")
}

#[test]
fn every_write_bumps_one_global_revision() {
    let mut store = Store::new(100);
    let a = create_pod(&mut store, "a", "n1");
    let b = create_pod(&mut store, "b", "n1");
    assert!(version(&b) > version(&a));
    assert_eq!(store.revision(), version(&b));
    assert!(meta_str(&a, "uid").is_some_and(|u| u.len() == 36));
    assert_eq!(
        meta_str(&a, "creationTimestamp"),
        Some("2023-11-14T22:13:20Z")
    );
    assert_eq!(a["status"]["phase"], "Pending");
    let again = prepare_create(
        pods(),
        Some("ns"),
        json!({"metadata": {"name": "a"}, "spec": {}}),
        NOW,
    )
    .expect("valid");
    let error = store.create(pods(), again).expect_err("duplicate");
    assert_eq!((error.code, error.reason), (409, "AlreadyExists"));
    let missing = store.get(pods(), Some("ns"), "zz").expect_err("missing");
    assert_eq!((missing.code, missing.reason), (404, "NotFound"));
}

#[test]
fn a_stale_resource_version_conflicts_and_a_no_op_writes_nothing() {
    let mut store = Store::new(100);
    let pod = create_pod(&mut store, "a", "n1");
    let mut labelled = pod.clone();
    labelled["metadata"]["labels"] = json!({"x": "1"});
    let updated = store
        .update(pods(), Some("ns"), "a", |old| {
            prepare_update(
                pods(),
                Target::Main,
                UidCheck::Precondition,
                old,
                labelled.clone(),
            )
        })
        .expect("updated");
    assert!(version(&updated) > version(&pod));
    // The same body again carries the old version now.
    let error = store
        .update(pods(), Some("ns"), "a", |old| {
            prepare_update(pods(), Target::Main, UidCheck::Precondition, old, labelled)
        })
        .expect_err("stale");
    assert_eq!((error.code, error.reason), (409, "Conflict"));
    let revision = store.revision();
    let same = store
        .update(pods(), Some("ns"), "a", |old| {
            prepare_update(
                pods(),
                Target::Main,
                UidCheck::Precondition,
                old,
                old.clone(),
            )
        })
        .expect("no-op");
    assert_eq!(store.revision(), revision);
    assert_eq!(same, updated);
}

#[test]
fn graceful_deletion_keeps_the_pod_until_grace_zero() {
    let mut store = Store::new(100);
    create_pod(&mut store, "a", "n1");
    let options = DeleteOptions::default();
    let Deleted::Remains(deleting) = store
        .delete(pods(), Some("ns"), "a", &options, NOW)
        .expect("deleting")
    else {
        panic!("a bound pod is deleted gracefully");
    };
    assert_eq!(
        meta_str(&deleting, "deletionTimestamp"),
        Some("2023-11-14T22:13:50Z")
    );
    assert_eq!(deleting["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(store.get(pods(), Some("ns"), "a").is_ok());
    let now = DeleteOptions {
        grace_period_seconds: Some(0),
        ..DeleteOptions::default()
    };
    assert!(matches!(
        store.delete(pods(), Some("ns"), "a", &now, NOW),
        Ok(Deleted::Gone(_))
    ));
    assert_eq!(
        store.get(pods(), Some("ns"), "a").map_err(|e| e.code),
        Err(404)
    );
}

#[test]
fn finalizers_hold_a_deleted_object_until_the_last_goes() {
    let mut store = Store::new(100);
    let object = prepare_create(
        configmaps(),
        Some("ns"),
        json!({"metadata": {"name": "c", "finalizers": ["x/y"]}}),
        NOW,
    )
    .expect("valid");
    store.create(configmaps(), object).expect("created");
    let options = DeleteOptions::default();
    let Deleted::Remains(marked) = store
        .delete(configmaps(), Some("ns"), "c", &options, NOW)
        .expect("marked")
    else {
        panic!("finalizers hold it");
    };
    assert!(meta_str(&marked, "deletionTimestamp").is_some());
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
    let mut cleared = marked.clone();
    cleared["metadata"]["finalizers"] = json!([]);
    let last = store
        .update(configmaps(), Some("ns"), "c", |old| {
            prepare_update(
                configmaps(),
                Target::Main,
                UidCheck::Precondition,
                old,
                cleared,
            )
        })
        .expect("updated");
    assert!(meta_str(&last, "deletionTimestamp").is_some());
    assert_eq!(
        store.get(configmaps(), Some("ns"), "c").map_err(|e| e.code),
        Err(404)
    );
}

#[test]
fn history_is_bounded_and_compaction_expires_old_versions() {
    let mut store = Store::new(3);
    let first = create_pod(&mut store, "a", "n1");
    for name in ["b", "c", "d"] {
        create_pod(&mut store, name, "n1");
    }
    // Four changes, three kept: resuming after the first's version needs the dropped one.
    let before_first = version(&first) - 1;
    assert_eq!(
        store
            .watch_from(before_first)
            .map(|_| ())
            .map_err(|e| e.code),
        Err(410)
    );
    let (backlog, _) = store.watch_from(version(&first)).expect("kept");
    assert_eq!(backlog.len(), 3);
    store.compact();
    let error = store
        .watch_from(version(&first))
        .map(|_| ())
        .expect_err("compacted");
    assert_eq!((error.code, error.reason), (410, "Expired"));
    assert!(store.watch_from(store.revision()).is_ok());
    let old = store.revision();
    store.renumber();
    assert!(store.revision() > old);
    assert_eq!(
        store.watch_from(old).map(|_| ()).map_err(|e| e.code),
        Err(410)
    );
    let renumbered = store.get(pods(), Some("ns"), "a").expect("kept");
    assert_eq!(version(&renumbered), store.revision());
}

#[test]
fn deletions_are_published_with_their_own_version() {
    let mut store = Store::new(100);
    let mut changes = store.subscribe();
    create_pod(&mut store, "a", "");
    let options = DeleteOptions::default();
    assert!(matches!(
        store.delete(pods(), Some("ns"), "a", &options, NOW),
        Ok(Deleted::Gone(_))
    ));
    let added = changes.try_recv().expect("added");
    let deleted = changes.try_recv().expect("deleted");
    assert_eq!(added.change, ChangeType::Added);
    assert_eq!(deleted.change, ChangeType::Deleted);
    assert_eq!(version(&deleted.object), deleted.revision);
    assert!(deleted.revision > added.revision);
}
