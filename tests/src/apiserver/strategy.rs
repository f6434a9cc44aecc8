//! What create and update do to an object before it is stored: upstream's
//! `registry/rest/create.go` `BeforeCreate`, `registry/rest/update.go` `BeforeUpdate` and the
//! resources' strategies (`pkg/registry/core/pod/strategy.go`, `node/strategy.go`: the main
//! resource keeps the stored status, the `status` subresource keeps the stored spec).

use serde_json::{Map, Value, json};

use super::{
    deletion::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
    meta::{meta_str, metadata_mut, new_uid, rfc3339, set_meta},
    resources::Resource,
    status::{ApiError, ApiResult},
};

/// Which part of the object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
    /// A pod's `ephemeralcontainers` subresource ([`super::ephemeral`]).
    EphemeralContainers,
}

/// How a `metadata.uid` in the written object that differs from the stored one fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UidCheck {
    /// PUT: the body's uid is a precondition (`defaultUpdatedObjectInfo.Preconditions`), a
    /// mismatch is 409 Conflict.
    Precondition,
    /// PATCH: the patched object's uid is validated as immutable
    /// (`ValidateObjectMetaAccessorUpdate`), a mismatch is 422 Invalid.
    Immutable,
}

fn check_type(resource: &Resource, object: &mut Value) -> ApiResult<()> {
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    };
    let api_version = resource.api_version();
    for (field, want) in [
        ("kind", resource.kind),
        ("apiVersion", api_version.as_str()),
    ] {
        match map.get(field).and_then(Value::as_str) {
            Some(have) if !have.is_empty() && have != want => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({have}) does not match the expected API version ({want})"
                )));
            }
            _ => {
                map.insert(field.to_owned(), Value::String(want.to_owned()));
            }
        }
    }
    Ok(())
}

fn check_namespace(
    resource: &Resource,
    object: &mut Value,
    namespace: Option<&str>,
) -> ApiResult<()> {
    if !resource.namespaced {
        set_meta(object, "namespace", Value::Null);
        return Ok(());
    }
    let url = namespace.unwrap_or_default();
    match meta_str(object, "namespace") {
        Some(have) if !have.is_empty() && have != url => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            set_meta(object, "namespace", Value::String(url.to_owned()));
            Ok(())
        }
    }
}

/// `BeforeCreate` and the strategy's `PrepareForCreate`: type and namespace checked, a name
/// from `generateName`, uid, creationTimestamp and generation set, deletion fields cleared; a
/// pod gets its API defaults and the `Pending` status upstream's pod strategy gives it.
pub fn prepare_create(
    resource: &Resource,
    namespace: Option<&str>,
    mut object: Value,
    now: i64,
) -> ApiResult<Value> {
    check_type(resource, &mut object)?;
    check_namespace(resource, &mut object, namespace)?;
    if meta_str(&object, "resourceVersion").is_some_and(|v| !v.is_empty()) {
        // Upstream's storage refuses it (as an internal error).
        return Err(ApiError {
            code: 500,
            reason: "InternalError",
            message: "resourceVersion should not be set on objects to be created".to_owned(),
            details: None,
        });
    }
    if meta_str(&object, "name").is_none_or(str::is_empty) {
        let Some(prefix) = meta_str(&object, "generateName").map(str::to_owned) else {
            return Err(ApiError::invalid(
                resource,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        };
        let suffix: String = (0..5)
            .map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[fastrand::usize(..27)]))
            .collect();
        set_meta(
            &mut object,
            "name",
            Value::String(format!("{prefix}{suffix}")),
        );
    }
    set_meta(&mut object, "uid", Value::String(new_uid()));
    set_meta(
        &mut object,
        "creationTimestamp",
        Value::String(rfc3339(now)),
    );
    set_meta(&mut object, "deletionTimestamp", Value::Null);
    set_meta(&mut object, "deletionGracePeriodSeconds", Value::Null);
    if resource.tracks_generation() {
        set_meta(&mut object, "generation", json!(1));
    }
    match (resource.group, resource.kind) {
        ("", "Pod") => default_pod(&mut object),
        ("", "Secret") => {
            if let Some(map) = object.as_object_mut() {
                map.entry("type").or_insert_with(|| json!("Opaque"));
            }
        }
        _ => {}
    }
    Ok(object)
}

/// The pod defaults swiftlet reads (`SetDefaults_PodSpec`, `SetDefaults_Container`) and the
/// status `podStrategy.PrepareForCreate` sets: `Pending` with the QoS class.
fn default_pod(pod: &mut Value) {
    let qos = qos_class(pod);
    let Some(map) = pod.as_object_mut() else {
        return;
    };
    let spec = map.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        spec.entry("restartPolicy")
            .or_insert_with(|| json!("Always"));
        spec.entry("dnsPolicy")
            .or_insert_with(|| json!("ClusterFirst"));
        spec.entry("schedulerName")
            .or_insert_with(|| json!("default-scheduler"));
        spec.entry("enableServiceLinks")
            .or_insert_with(|| json!(true));
        spec.entry("securityContext").or_insert_with(|| json!({}));
        spec.entry("terminationGracePeriodSeconds")
            .or_insert_with(|| json!(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS));
        for list in ["initContainers", "containers", "ephemeralContainers"] {
            for container in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                default_container(container);
            }
        }
    }
    map.insert(
        "status".to_owned(),
        json!({"phase": "Pending", "qosClass": qos}),
    );
}

/// `SetDefaults_Container` for the fields swiftlet reads (ephemeral containers get the same).
pub(super) fn default_container(container: &mut Value) {
    let Some(c) = container.as_object_mut() else {
        return;
    };
    c.entry("terminationMessagePath")
        .or_insert_with(|| json!("/dev/termination-log"));
    c.entry("terminationMessagePolicy")
        .or_insert_with(|| json!("File"));
    let latest = c.get("image").and_then(Value::as_str).is_some_and(|i| {
        !i.rsplit('/').next().unwrap_or(i).contains(':') || i.ends_with(":latest")
    });
    let policy = if latest { "Always" } else { "IfNotPresent" };
    c.entry("imagePullPolicy").or_insert_with(|| json!(policy));
}

/// Upstream `qos.GetPodQOS`, for the common cases: BestEffort without requests or limits,
/// Guaranteed when every container limits cpu and memory with requests equal to the limits.
fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .filter_map(|l| pod.get("spec")?.get(*l)?.as_array())
        .flatten()
        .collect();
    let resources = |c: &Value, what: &str| -> Map<String, Value> {
        c.get("resources")
            .and_then(|r| r.get(what))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let any = containers
        .iter()
        .any(|c| !resources(c, "requests").is_empty() || !resources(c, "limits").is_empty());
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = resources(c, "limits");
        let requests = resources(c, "requests");
        ["cpu", "memory"].iter().all(|r| limits.contains_key(*r))
            && requests.iter().all(|(k, v)| limits.get(k) == Some(v))
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// `BeforeUpdate` with the strategies' `PrepareForUpdate`: the object written (`new`, a PUT's
/// body or a patched copy of `old`) becomes what is stored.
pub fn prepare_update(
    resource: &Resource,
    target: Target,
    uid_check: UidCheck,
    old: &Value,
    mut new: Value,
) -> ApiResult<Value> {
    let name = meta_str(old, "name").unwrap_or_default().to_owned();
    check_type(resource, &mut new)?;
    check_namespace(resource, &mut new, meta_str(old, "namespace"))?;
    match meta_str(&new, "name") {
        Some(have) if !have.is_empty() && have != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({have}) does not match the name on the URL ({name})"
            )));
        }
        _ => set_meta(&mut new, "name", Value::String(name.clone())),
    }
    let old_uid = meta_str(old, "uid").unwrap_or_default().to_owned();
    match meta_str(&new, "uid") {
        Some(have) if !have.is_empty() && have != old_uid => {
            return Err(match uid_check {
                UidCheck::Precondition => ApiError::conflict(
                    resource,
                    &name,
                    &format!(
                        "Precondition failed: UID in precondition: {have}, UID in object meta: {old_uid}"
                    ),
                ),
                UidCheck::Immutable => ApiError::invalid(
                    resource,
                    &name,
                    &format!("metadata.uid: Invalid value: \"{have}\": field is immutable"),
                ),
            });
        }
        _ => set_meta(&mut new, "uid", Value::String(old_uid)),
    }
    // Optimistic concurrency: a resourceVersion given must be the stored one.
    let old_version = meta_str(old, "resourceVersion")
        .unwrap_or_default()
        .to_owned();
    if meta_str(&new, "resourceVersion").is_some_and(|v| !v.is_empty() && v != old_version) {
        return Err(ApiError::stale(resource, &name));
    }
    set_meta(&mut new, "resourceVersion", Value::String(old_version));
    if target == Target::EphemeralContainers {
        return super::ephemeral::prepare_update(resource, &name, old, &new);
    }
    if resource.status {
        let keep = match target {
            Target::Status => "spec",
            Target::Main | Target::EphemeralContainers => "status",
        };
        copy_field(old, &mut new, keep);
        if target == Target::Main && resource.kind == "Pod" {
            // Ephemeral containers are written through their subresource only.
            let stored = old
                .get("spec")
                .and_then(|s| s.get("ephemeralContainers"))
                .cloned();
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                match stored {
                    Some(list) => spec.insert("ephemeralContainers".to_owned(), list),
                    None => spec.remove("ephemeralContainers"),
                };
            }
        }
        if target == Target::Status && resource.kind == "Pod" {
            // podStatusStrategy: the status endpoint cannot touch owner references.
            let owners = old
                .get("metadata")
                .and_then(|m| m.get("ownerReferences"))
                .cloned();
            set_meta(&mut new, "ownerReferences", owners.unwrap_or(Value::Null));
        }
    }
    // Fields an update never changes.
    let old_meta = old.get("metadata");
    for field in ["creationTimestamp", "deletionTimestamp", "generation"] {
        let value = old_meta
            .and_then(|m| m.get(field))
            .cloned()
            .unwrap_or(Value::Null);
        set_meta(&mut new, field, value);
    }
    if let Some(grace) = old_meta.and_then(|m| m.get("deletionGracePeriodSeconds"))
        && new
            .get("metadata")
            .and_then(|m| m.get("deletionGracePeriodSeconds"))
            .is_none()
    {
        set_meta(&mut new, "deletionGracePeriodSeconds", grace.clone());
    }
    if resource.tracks_generation() && target == Target::Main && old.get("spec") != new.get("spec")
    {
        let generation = old_meta
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        set_meta(&mut new, "generation", json!(generation + 1));
    }
    Ok(new)
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    if let Some(map) = to.as_object_mut() {
        match from.get(field) {
            Some(value) => {
                map.insert(field.to_owned(), value.clone());
            }
            None => {
                map.remove(field);
            }
        }
    }
}

/// Whether an update leaves the object deleted: it is being deleted, has no finalizers left
/// and no grace period to wait for (upstream `Store.shouldDeleteDuringUpdate`).
pub fn delete_during_update(old: &Value, new: &Value) -> bool {
    let deleting = old
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some();
    let grace = old
        .get("metadata")
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    deleting && grace == 0 && super::meta::finalizers(new).is_empty()
}

/// Ensures `metadata` exists (an object written without one).
pub fn with_metadata(mut object: Value) -> Value {
    let _ = metadata_mut(&mut object);
    object
}

#[cfg(test)]
mod tests;
