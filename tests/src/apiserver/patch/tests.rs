//! Cases after upstream's `strategicpatch/patch_test.go` (merging lists of maps by key,
//! `$patch: delete`/`replace`, `null` deleting a field, `$setElementOrder`) on the lists swiftlet
//! patches, and RFC 7386's examples for the merge patch.

use serde_json::json;

use super::*;

#[test]
fn merge_patch_follows_rfc7386() {
    let target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]});
    let patch = json!({"a": "z", "c": {"f": null}, "list": [3]});
    assert_eq!(
        merge_patch(&target, &patch),
        json!({"a": "z", "c": {"d": "e"}, "list": [3]})
    );
    assert_eq!(merge_patch(&json!({"a": "b"}), &json!("x")), json!("x"));
}

#[test]
fn pod_conditions_merge_by_type() {
    let pod = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False"},
        {"type": "PodScheduled", "status": "True"},
    ]}});
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "Initialized", "status": "True"},
    ]}});
    let merged = strategic_merge_patch("Pod", &pod, &patch).expect("merges");
    assert_eq!(
        merged["status"]["conditions"],
        json!([
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
        ])
    );
}

#[test]
fn container_statuses_merge_by_name_and_fields_merge_inside() {
    let pod = json!({"status": {"containerStatuses": [
        {"name": "a", "ready": false, "state": {"waiting": {"reason": "ContainerCreating"}}},
        {"name": "b", "ready": true},
    ], "initContainerStatuses": [{"name": "i", "ready": false}]}});
    let patch = json!({"status": {
        "containerStatuses": [{"name": "a", "ready": true, "state": {"waiting": null, "running": {}}}],
        "initContainerStatuses": [{"name": "i", "ready": true}],
    }});
    let merged = strategic_merge_patch("Pod", &pod, &patch).expect("merges");
    assert_eq!(
        merged["status"]["containerStatuses"],
        json!([
            {"name": "a", "ready": true, "state": {"running": {}}},
            {"name": "b", "ready": true},
        ])
    );
    assert_eq!(
        merged["status"]["initContainerStatuses"],
        json!([{"name": "i", "ready": true}])
    );
}

#[test]
fn pod_ips_merge_by_ip_and_atomic_lists_replace() {
    let pod = json!({"spec": {"tolerations": [{"key": "a"}]}, "status": {"podIPs": [{"ip": "10.0.0.1"}]}});
    let patch =
        json!({"spec": {"tolerations": [{"key": "b"}]}, "status": {"podIPs": [{"ip": "fd00::1"}]}});
    let merged = strategic_merge_patch("Pod", &pod, &patch).expect("merges");
    assert_eq!(
        merged["status"]["podIPs"],
        json!([{"ip": "10.0.0.1"}, {"ip": "fd00::1"}])
    );
    assert_eq!(merged["spec"]["tolerations"], json!([{"key": "b"}]));
}

#[test]
fn patch_delete_removes_a_keyed_element() {
    let node = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "MemoryPressure", "status": "False"},
    ]}});
    let patch = json!({"status": {"conditions": [{"type": "MemoryPressure", "$patch": "delete"}]}});
    let merged = strategic_merge_patch("Node", &node, &patch).expect("merges");
    assert_eq!(
        merged["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}])
    );
}

#[test]
fn patch_replace_replaces_a_list_or_a_map() {
    let node = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n"}],
        "capacity": {"cpu": "2", "memory": "1Gi"},
    }});
    let patch = json!({"status": {
        "addresses": [{"$patch": "replace"}, {"type": "InternalIP", "address": "10.0.0.2"}],
        "capacity": {"$patch": "replace", "cpu": "4"},
    }});
    let merged = strategic_merge_patch("Node", &node, &patch).expect("merges");
    assert_eq!(
        merged["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.2"}])
    );
    assert_eq!(merged["status"]["capacity"], json!({"cpu": "4"}));
}

#[test]
fn node_addresses_merge_by_type() {
    let node = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
    let patch = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.9"},
        {"type": "Hostname", "address": "n"},
    ]}});
    let merged = strategic_merge_patch("Node", &node, &patch).expect("merges");
    assert_eq!(
        merged["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.9"}, {"type": "Hostname", "address": "n"}])
    );
}

/// Upstream `mergeSliceWithoutSpecialElements` merges each patch element into the first element
/// with its key, including one the patch itself just added: two `InternalIP`s (dual stack) fold
/// into one unless the list is replaced, which is why upstream's `PatchNodeStatus` sends
/// `$patch: replace` for addresses.
#[test]
fn a_dual_stack_pair_folds_unless_the_addresses_are_replaced() {
    let node = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
    let pair = [
        json!({"type": "InternalIP", "address": "10.0.0.1"}),
        json!({"type": "Hostname", "address": "n"}),
        json!({"type": "InternalIP", "address": "fd00::1"}),
    ];
    let merged = strategic_merge_patch("Node", &node, &json!({"status": {"addresses": pair}}))
        .expect("merges");
    assert_eq!(
        merged["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "fd00::1"}, {"type": "Hostname", "address": "n"}])
    );
    let mut replacing = pair.to_vec();
    replacing.push(json!({"$patch": "replace"}));
    let merged = strategic_merge_patch("Node", &node, &json!({"status": {"addresses": replacing}}))
        .expect("merges");
    assert_eq!(merged["status"]["addresses"], json!(pair));
}

#[test]
fn null_deletes_a_field_and_a_map_delete_removes_the_map() {
    let pod = json!({"status": {"phase": "Running", "message": "m", "nominatedNodeName": "x"}});
    let patch = json!({"status": {"message": null, "nominatedNodeName": {"$patch": "delete"}}});
    let merged = strategic_merge_patch("Pod", &pod, &patch).expect("merges");
    assert_eq!(merged["status"], json!({"phase": "Running"}));
}

#[test]
fn set_element_order_reorders_the_merged_list() {
    let pod = json!({"status": {"conditions": [
        {"type": "A", "status": "True"},
        {"type": "B", "status": "True"},
        {"type": "C", "status": "True"},
    ]}});
    let patch = json!({"status": {
        "$setElementOrder/conditions": [{"type": "C"}, {"type": "B"}, {"type": "A"}],
        "conditions": [{"type": "B", "status": "False"}],
    }});
    let merged = strategic_merge_patch("Pod", &pod, &patch).expect("merges");
    assert_eq!(
        merged["status"]["conditions"],
        json!([
            {"type": "C", "status": "True"},
            {"type": "B", "status": "False"},
            {"type": "A", "status": "True"},
        ])
    );
}

#[test]
fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
    let pod = json!({"metadata": {"finalizers": ["a", "b"]}});
    let add = json!({"metadata": {"finalizers": ["b", "c"]}});
    let merged = strategic_merge_patch("Pod", &pod, &add).expect("merges");
    assert_eq!(merged["metadata"]["finalizers"], json!(["a", "b", "c"]));
    let remove = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
    let merged = strategic_merge_patch("Pod", &merged, &remove).expect("merges");
    assert_eq!(merged["metadata"]["finalizers"], json!(["b", "c"]));
}

#[test]
fn unknown_directives_are_errors() {
    let patch = json!({"status": {"$patch": "explode"}});
    assert_eq!(
        strategic_merge_patch("Pod", &json!({"status": {}}), &patch),
        Err(PatchError::UnknownDirective("explode".to_owned()))
    );
    assert_eq!(
        strategic_merge_patch("Pod", &json!({}), &json!([1])),
        Err(PatchError::NotAnObject)
    );
}
