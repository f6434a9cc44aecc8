//! The create and update rules of upstream's strategies.

use serde_json::json;

use super::*;
use crate::apiserver::resources::find;

fn resource(plural: &str) -> &'static Resource {
    find("", "v1", plural).expect(plural)
}

fn stored_pod() -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "5", "generation": 1,
                     "creationTimestamp": "2023-11-14T22:13:20Z"},
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    })
}

#[test]
fn create_defaults_a_pod_and_sets_its_identity() {
    let pod = json!({"metadata": {"generateName": "web-"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}},
    ]}, "status": {"phase": "Running"}});
    let created = prepare_create(resource("pods"), Some("ns"), pod, 0).expect("valid");
    assert!(meta_str(&created, "name").is_some_and(|n| n.starts_with("web-") && n.len() == 9));
    assert_eq!(meta_str(&created, "namespace"), Some("ns"));
    assert_eq!(created["kind"], "Pod");
    assert_eq!(created["spec"]["terminationGracePeriodSeconds"], 30);
    assert_eq!(
        created["spec"]["containers"][0]["imagePullPolicy"],
        "Always"
    );
    assert_eq!(
        created["status"],
        json!({"phase": "Pending", "qosClass": "Burstable"})
    );
    assert_eq!(created["metadata"]["generation"], 1);
}

#[test]
fn create_refuses_a_namespace_mismatch_and_a_version() {
    let other = json!({"metadata": {"name": "p", "namespace": "other"}});
    assert_eq!(
        prepare_create(resource("pods"), Some("ns"), other, 0).map_err(|e| e.code),
        Err(400)
    );
    let versioned = json!({"metadata": {"name": "p", "resourceVersion": "3"}});
    assert_eq!(
        prepare_create(resource("pods"), Some("ns"), versioned, 0).map_err(|e| e.code),
        Err(500)
    );
    let nameless = json!({"metadata": {}});
    assert_eq!(
        prepare_create(resource("configmaps"), Some("ns"), nameless, 0).map_err(|e| e.code),
        Err(422)
    );
}

#[test]
fn the_main_resource_ignores_status_and_the_status_subresource_ignores_spec() {
    let old = stored_pod();
    let mut new = old.clone();
    new["status"]["phase"] = json!("Failed");
    new["spec"]["activeDeadlineSeconds"] = json!(5);
    new["metadata"]["labels"] = json!({"a": "b"});
    let main = prepare_update(
        resource("pods"),
        Target::Main,
        UidCheck::Precondition,
        &old,
        new.clone(),
    )
    .expect("valid");
    assert_eq!(main["status"]["phase"], "Running");
    assert_eq!(main["spec"]["activeDeadlineSeconds"], 5);
    assert_eq!(main["metadata"]["generation"], 2);
    let status = prepare_update(
        resource("pods"),
        Target::Status,
        UidCheck::Immutable,
        &old,
        new,
    )
    .expect("valid");
    assert_eq!(status["status"]["phase"], "Failed");
    assert!(status["spec"].get("activeDeadlineSeconds").is_none());
    // podStatusStrategy resets spec, not metadata: labels written through status stay.
    assert_eq!(status["metadata"]["labels"], json!({"a": "b"}));
    assert_eq!(status["metadata"]["generation"], 1);
}

#[test]
fn a_different_uid_fails_as_precondition_or_immutable_field() {
    let old = stored_pod();
    let mut new = old.clone();
    new["metadata"]["uid"] = json!("u2");
    let put = prepare_update(
        resource("pods"),
        Target::Main,
        UidCheck::Precondition,
        &old,
        new.clone(),
    )
    .expect_err("refused");
    assert_eq!((put.code, put.reason), (409, "Conflict"));
    let patch = prepare_update(
        resource("pods"),
        Target::Status,
        UidCheck::Immutable,
        &old,
        new,
    )
    .expect_err("refused");
    assert_eq!((patch.code, patch.reason), (422, "Invalid"));
}

#[test]
fn updates_keep_identity_and_deletion_fields() {
    let mut old = stored_pod();
    old["metadata"]["deletionTimestamp"] = json!("2023-11-14T22:14:00Z");
    old["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    let new = json!({"metadata": {"name": "p", "creationTimestamp": "1999-01-01T00:00:00Z"}, "spec": old["spec"].clone()});
    let kept = prepare_update(
        resource("pods"),
        Target::Main,
        UidCheck::Precondition,
        &old,
        new,
    )
    .expect("valid");
    assert_eq!(meta_str(&kept, "uid"), Some("u1"));
    assert_eq!(
        meta_str(&kept, "creationTimestamp"),
        Some("2023-11-14T22:13:20Z")
    );
    assert_eq!(
        meta_str(&kept, "deletionTimestamp"),
        Some("2023-11-14T22:14:00Z")
    );
    assert_eq!(kept["metadata"]["deletionGracePeriodSeconds"], 30);
    let renamed = json!({"metadata": {"name": "q"}});
    assert_eq!(
        prepare_update(
            resource("pods"),
            Target::Main,
            UidCheck::Precondition,
            &old,
            renamed
        )
        .map_err(|e| e.code),
        Err(400)
    );
}

#[test]
fn qos_classes() {
    let pod =
        |resources: Value| json!({"spec": {"containers": [{"name": "c", "resources": resources}]}});
    assert_eq!(qos_class(&pod(json!({}))), "BestEffort");
    assert_eq!(
        qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
        "Guaranteed"
    );
    assert_eq!(
        qos_class(&pod(
            json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}})
        )),
        "Burstable"
    );
}
