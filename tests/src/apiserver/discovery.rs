//! `/version` and the discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`)
//! built from the resource table, as
//! <https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api> describes them
//! (the unaggregated form). kube-rs's typed `Api<K>` needs none of it; `kubectl` and kube's
//! `Discovery` do.

use serde_json::{Value, json};

use super::resources::RESOURCES;

/// `/version`: a `version.Info` naming a 1.35 server.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "gitVersion": "v1.35.0-swiftlet-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub fn group_list() -> Value {
    let mut groups: Vec<(&str, &str)> = RESOURCES
        .iter()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .collect();
    groups.dedup();
    let groups: Vec<Value> = groups
        .iter()
        .map(|(group, version)| {
            let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [gv], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs = if r.virtual_create {
            json!(["create"])
        } else {
            json!([
                "create", "delete", "get", "list", "patch", "update", "watch"
            ])
        };
        resources.push(json!({"name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs}));
        if r.status {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.kind == "Pod" && r.group.is_empty() {
            resources.push(json!({"name": "pods/ephemeralcontainers", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "patch", "update"]}));
        }
        if r.kind == super::csr::KIND {
            resources.push(json!({"name": format!("{}/approval", r.plural), "singularName": "", "namespaced": false, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.plural == "serviceaccounts" {
            resources.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}
