//! The ephemeral containers' update rules.

use serde_json::json;

use super::*;
use crate::apiserver::resources::find;

fn pods() -> &'static Resource {
    find("", "v1", "pods").expect("pods")
}

fn stored() -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "5", "generation": 1},
        "spec": {"nodeName": "n", "initContainers": [{"name": "init", "image": "i"}],
                 "containers": [{"name": "main", "image": "i"}]},
        "status": {"phase": "Running"},
    })
}

fn written(list: Value) -> Value {
    json!({"metadata": {"name": "p"}, "spec": {"ephemeralContainers": list, "containers": [{"name": "changed"}]},
           "status": {"phase": "Failed"}})
}

#[test]
fn an_addition_changes_only_the_ephemeral_containers_and_is_defaulted() {
    let old = stored();
    let new = written(json!([{"name": "dbg", "image": "busybox", "targetContainerName": "main"}]));
    let pod = prepare_update(pods(), "p", &old, &new).expect("an addition is valid");
    assert_eq!(pod["spec"]["containers"], old["spec"]["containers"]);
    assert_eq!(pod["status"], old["status"]);
    let dbg = &pod["spec"]["ephemeralContainers"][0];
    assert_eq!(dbg["name"], "dbg");
    assert_eq!(dbg["targetContainerName"], "main");
    assert_eq!(dbg["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(dbg["imagePullPolicy"], "Always");
}

#[test]
fn an_existing_one_may_be_neither_changed_nor_removed() {
    let old = stored();
    let first = written(json!([{"name": "dbg", "image": "busybox"}]));
    let old = prepare_update(pods(), "p", &old, &first).expect("valid");
    // The same list again (the client's copy without the defaults) is no change.
    assert!(prepare_update(pods(), "p", &old, &first).is_ok());

    let changed = written(json!([{"name": "dbg", "image": "busybox", "command": ["sh"]}]));
    let e = prepare_update(pods(), "p", &old, &changed).expect_err("a change");
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    assert!(
        e.message.contains(
            "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be changed"
        ),
        "{}",
        e.message
    );

    let removed = written(json!([]));
    let e = prepare_update(pods(), "p", &old, &removed).expect_err("a removal");
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("\"dbg\" may not be removed"),
        "{}",
        e.message
    );
}

#[test]
fn names_are_unique_across_every_container_of_the_pod() {
    let old = stored();
    for (name, index) in [("main", 0), ("init", 0), ("dbg", 1)] {
        let list = if index == 0 {
            json!([{"name": name, "image": "busybox"}])
        } else {
            json!([{"name": "dbg", "image": "busybox"}, {"name": "dbg", "image": "busybox"}])
        };
        let e = prepare_update(pods(), "p", &old, &written(list)).expect_err(name);
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains(&format!(
                "spec.ephemeralContainers[{index}].name: Duplicate value: \"{name}\""
            )),
            "{}",
            e.message
        );
    }
}

#[test]
fn probes_ports_resources_hooks_and_a_restart_policy_are_forbidden() {
    let list = json!([{"name": "dbg", "image": "busybox",
        "ports": [{"containerPort": 80}], "resources": {"limits": {"cpu": "1"}},
        "livenessProbe": {"exec": {"command": ["true"]}}, "readinessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}}, "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
        "restartPolicy": "Always"}]);
    let errors = validate(&stored(), &list);
    assert_eq!(errors.len(), FORBIDDEN_FIELDS.len(), "{errors:?}");
    for field in FORBIDDEN_FIELDS {
        assert!(
            errors.contains(&format!(
                "spec.ephemeralContainers[0].{field}: Forbidden: cannot be set for an Ephemeral Container"
            )),
            "{field}: {errors:?}"
        );
    }
    let e = prepare_update(pods(), "p", &stored(), &written(list)).expect_err("forbidden");
    assert!(
        e.message.starts_with("Pod \"p\" is invalid: ["),
        "{}",
        e.message
    );
}

#[test]
fn a_target_must_be_a_container_of_the_pod_and_an_image_and_name_are_required() {
    let errors = validate(
        &stored(),
        &json!([{"name": "dbg", "image": "busybox", "targetContainerName": "nope"}, {}]),
    );
    assert_eq!(
        errors,
        vec![
            "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"".to_owned(),
            "spec.ephemeralContainers[1].name: Required value".to_owned(),
            "spec.ephemeralContainers[1].image: Required value".to_owned(),
        ]
    );
}

#[test]
fn a_mirror_pod_takes_none() {
    let mut old = stored();
    old["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    let e = prepare_update(
        pods(),
        "p",
        &old,
        &written(json!([{"name": "dbg", "image": "busybox"}])),
    )
    .expect_err("static pods take no ephemeral containers");
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("static pods do not support ephemeral containers")
    );
}
