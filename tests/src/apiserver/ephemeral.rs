//! The `pods/ephemeralcontainers` subresource (what `kubectl debug` writes): upstream's
//! `podEphemeralContainersStrategy` in `pkg/registry/core/pod/strategy.go`
//! (`dropNonEphemeralContainerUpdates`: the write changes `spec.ephemeralContainers` and nothing
//! else) and `ValidatePodEphemeralContainersUpdate` in `pkg/apis/core/validation/validation.go`
//! (existing ephemeral containers may be neither changed nor removed, names are unique across
//! every container of the pod, and `validateEphemeralContainers`' fields an ephemeral container
//! may not set).

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{
    resources::Resource,
    status::{ApiError, ApiResult},
};

/// The fields `allowedEphemeralContainerFields` marks false (and `restartPolicy`, which
/// `validateEphemeralContainers` forbids on its own): an ephemeral container is never probed,
/// restarted, given resources or ports, and runs no hooks.
const FORBIDDEN_FIELDS: [&str; 7] = [
    "ports",
    "resources",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "restartPolicy",
];

/// What a write to the subresource stores: the stored pod with the written object's
/// `spec.ephemeralContainers` (defaulted as the API defaults a container), once validated against
/// the stored ones. `old` is the stored pod; `new` the written object after the generic update
/// checks (name, uid, resourceVersion), whose metadata is otherwise ignored.
pub fn prepare_update(
    resource: &Resource,
    name: &str,
    old: &Value,
    new: &Value,
) -> ApiResult<Value> {
    let mut written = new
        .get("spec")
        .and_then(|s| s.get("ephemeralContainers"))
        .cloned()
        .unwrap_or(Value::Null);
    let Some(list) = written.as_array_mut().map(|l| l.as_mut_slice()) else {
        if !written.is_null() {
            return Err(ApiError::bad_request(
                "spec.ephemeralContainers: expected an array",
            ));
        }
        return finish(resource, name, old, Value::Null);
    };
    for container in list.iter_mut() {
        super::strategy::default_container(container);
    }
    finish(resource, name, old, written)
}

fn finish(resource: &Resource, name: &str, old: &Value, written: Value) -> ApiResult<Value> {
    let errors = validate(old, &written);
    if !errors.is_empty() {
        let why = if errors.len() == 1 {
            errors.join("")
        } else {
            format!("[{}]", errors.join(", "))
        };
        return Err(ApiError::invalid(resource, name, &why));
    }
    let mut stored = old.clone();
    let Some(spec) = stored
        .as_object_mut()
        .map(|m| m.entry("spec").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    else {
        return Err(ApiError::bad_request("the stored pod has no spec object"));
    };
    if written.as_array().is_some_and(|l| !l.is_empty()) {
        spec.insert("ephemeralContainers".to_owned(), written);
    } else {
        spec.remove("ephemeralContainers");
    }
    Ok(stored)
}

fn names<'a>(pod: &'a Value, list: &str) -> impl Iterator<Item = &'a str> {
    pod.get("spec")
        .and_then(|s| s.get(list))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
}

/// The field errors of the write, in upstream's words (`field.Error.Error()`).
pub fn validate(old: &Value, written: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let path = "spec.ephemeralContainers";
    if old
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get("kubernetes.io/config.mirror"))
        .is_some()
    {
        // A mirror pod's containers are the static manifest's: nothing can be added to them.
        return vec![": Forbidden: static pods do not support ephemeral containers".to_owned()];
    }
    let empty = Vec::new();
    let new_list = written.as_array().unwrap_or(&empty);
    let old_list = old
        .get("spec")
        .and_then(|s| s.get("ephemeralContainers"))
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    // Patches do not keep the order, so each existing one is looked up by name.
    for existing in old_list {
        let name = existing
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match new_list
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
        {
            None => errors.push(format!(
                "{path}: Forbidden: existing ephemeral containers \"{name}\" may not be removed"
            )),
            Some(new) if new != existing => errors.push(format!(
                "{path}: Forbidden: existing ephemeral containers \"{name}\" may not be changed"
            )),
            Some(_) => {}
        }
    }
    let others: HashSet<&str> = names(old, "containers")
        .chain(names(old, "initContainers"))
        .collect();
    let mut seen = others.clone();
    for (i, container) in new_list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Some(fields) = container.as_object() else {
            errors.push(format!("{at}: Invalid value: must be an object"));
            continue;
        };
        match fields.get("name").and_then(Value::as_str) {
            None | Some("") => errors.push(format!("{at}.name: Required value")),
            Some(name) if !seen.insert(name) => {
                errors.push(format!("{at}.name: Duplicate value: \"{name}\""));
            }
            Some(_) => {}
        }
        if fields
            .get("image")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errors.push(format!("{at}.image: Required value"));
        }
        for field in FORBIDDEN_FIELDS {
            if fields.get(field).is_some_and(|v| !v.is_null()) {
                errors.push(format!(
                    "{at}.{field}: Forbidden: cannot be set for an Ephemeral Container"
                ));
            }
        }
        if let Some(target) = fields.get("targetContainerName").and_then(Value::as_str)
            && !target.is_empty()
            && !others.contains(target)
        {
            errors.push(format!("{at}.targetContainerName: Not found: \"{target}\""));
        }
    }
    errors
}

#[cfg(test)]
mod tests;
