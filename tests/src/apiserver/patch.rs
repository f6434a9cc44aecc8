//! The PATCH bodies the API server accepts
//! (<https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/>):
//! JSON merge patch (RFC 7386), strategic merge patch (upstream
//! `apimachinery/pkg/util/strategicpatch/patch.go`, with the list merge keys of the types'
//! `patchMergeKey`/`patchStrategy` tags that swiftlet's patches touch) and JSON patch (RFC 6902,
//! in [`super::json_patch`]).

use serde_json::{Map, Value};

/// How a list at a path merges in a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ListStrategy {
    /// Elements are objects merged by this key (`patchStrategy:"merge" patchMergeKey:"…"`).
    MergeByKey(&'static str),
    /// A list of scalars merged as a set (`finalizers`).
    MergeScalars,
}

/// The list strategy of `path` (field names from the object's root, list levels skipped) in an
/// object of `kind`: the tags of `k8s.io/api/core/v1/types.go` and `metav1.ObjectMeta`. Lists
/// not named here are atomic: the patch's list replaces the object's.
fn list_strategy(kind: &str, path: &str) -> Option<ListStrategy> {
    use ListStrategy::{MergeByKey, MergeScalars};
    match (kind, path) {
        (_, "metadata.finalizers") => Some(MergeScalars),
        (_, "metadata.ownerReferences") => Some(MergeByKey("uid")),
        ("Pod", "status.conditions") => Some(MergeByKey("type")),
        (
            "Pod",
            "status.containerStatuses"
            | "status.initContainerStatuses"
            | "status.ephemeralContainerStatuses"
            | "status.resourceClaimStatuses",
        ) => Some(MergeByKey("name")),
        ("Pod", "status.podIPs" | "status.hostIPs") => Some(MergeByKey("ip")),
        ("Pod", "spec.containers" | "spec.initContainers" | "spec.ephemeralContainers") => {
            Some(MergeByKey("name"))
        }
        ("Pod", "spec.volumes" | "spec.imagePullSecrets") => Some(MergeByKey("name")),
        ("Pod", p) if p.ends_with("ontainers.env") => Some(MergeByKey("name")),
        ("Pod", p) if p.ends_with("ontainers.volumeMounts") => Some(MergeByKey("mountPath")),
        ("Pod", p) if p.ends_with("ontainers.ports") => Some(MergeByKey("containerPort")),
        ("Node", "status.conditions") => Some(MergeByKey("type")),
        ("Node", "status.addresses") => Some(MergeByKey("type")),
        ("Service", "spec.ports") => Some(MergeByKey("port")),
        _ => None,
    }
}

/// Why a patch could not be applied (upstream answers 422 or 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    #[error("the patch is not a JSON object")]
    NotAnObject,
    #[error("unknown $patch directive {0:?}")]
    UnknownDirective(String),
    #[error("{0}")]
    JsonPatch(String),
}

/// RFC 7386: objects merge recursively, `null` removes a field, anything else replaces.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    let Value::Object(patch_map) = patch else {
        return patch.clone();
    };
    let mut result = match target {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    for (key, value) in patch_map {
        if value.is_null() {
            result.remove(key);
        } else {
            let merged = merge_patch(result.get(key).unwrap_or(&Value::Null), value);
            result.insert(key.clone(), merged);
        }
    }
    Value::Object(result)
}

/// A strategic merge patch on an object of `kind`.
pub fn strategic_merge_patch(
    kind: &str,
    original: &Value,
    patch: &Value,
) -> Result<Value, PatchError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(PatchError::NotAnObject);
    };
    let merged = merge_map(kind, "", original, patch)?;
    Ok(Value::Object(merged.unwrap_or_default()))
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Merges `patch` into `original`; `None` when the patch deletes the map (`$patch: delete`).
fn merge_map(
    kind: &str,
    path: &str,
    original: &Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get("$patch").and_then(Value::as_str) {
        None => {}
        // `$patch: replace` on a map: the patch (without the directive) is the new map.
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            return Ok(Some(replaced));
        }
        Some("delete") => return Ok(None),
        Some(other) => return Err(PatchError::UnknownDirective(other.to_owned())),
    }
    let mut result = original.clone();
    // `$setElementOrder/<list>` and `$deleteFromPrimitiveList/<list>` apply after the lists
    // merged; `$retainKeys` is not used by swiftlet and is ignored.
    let mut orders = Vec::new();
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" {
            continue;
        }
        if let Some(list) = key.strip_prefix("$setElementOrder/") {
            orders.push((list.to_owned(), value.clone()));
            continue;
        }
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(have)), Value::Array(gone)) = (result.get_mut(list), value) {
                have.retain(|v| !gone.contains(v));
            }
            continue;
        }
        let field_path = child_path(path, key);
        if value.is_null() {
            result.remove(key);
            continue;
        }
        let existing = result.get(key).cloned();
        let merged = match (existing.as_ref(), value) {
            (Some(Value::Object(have)), Value::Object(want)) => {
                match merge_map(kind, &field_path, have, want)? {
                    Some(map) => Value::Object(map),
                    None => {
                        result.remove(key);
                        continue;
                    }
                }
            }
            (have, Value::Array(want)) => {
                let have = have.and_then(Value::as_array).cloned().unwrap_or_default();
                match list_strategy(kind, &field_path) {
                    Some(strategy) => {
                        Value::Array(merge_list(kind, &field_path, strategy, &have, want)?)
                    }
                    None => Value::Array(strip_directives(want)),
                }
            }
            (_, Value::Object(want)) => {
                // Nothing to merge into: the patch's map, directives applied to nothing.
                match merge_map(kind, &field_path, &Map::new(), want)? {
                    Some(map) => Value::Object(map),
                    None => {
                        result.remove(key);
                        continue;
                    }
                }
            }
            (_, want) => want.clone(),
        };
        result.insert(key.clone(), merged);
    }
    for (list, order) in orders {
        let field_path = child_path(path, &list);
        if let (Some(Value::Array(items)), Value::Array(order)) = (result.get_mut(&list), &order) {
            let key = match list_strategy(kind, &field_path) {
                Some(ListStrategy::MergeByKey(key)) => Some(key),
                _ => None,
            };
            apply_order(items, order, key);
        }
    }
    Ok(Some(result))
}

fn strip_directives(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|item| item.get("$patch").is_none())
        .cloned()
        .collect()
}

fn merge_list(
    kind: &str,
    path: &str,
    strategy: ListStrategy,
    original: &[Value],
    patch: &[Value],
) -> Result<Vec<Value>, PatchError> {
    // `{"$patch": "replace"}` as an element: the list becomes the patch's other elements.
    if patch
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(strip_directives(patch));
    }
    let key = match strategy {
        ListStrategy::MergeScalars => {
            let mut merged = original.to_vec();
            for item in patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            return Ok(merged);
        }
        ListStrategy::MergeByKey(key) => key,
    };
    let mut merged = original.to_vec();
    for item in patch {
        let Value::Object(fields) = item else {
            continue;
        };
        let id = fields.get(key);
        let position = merged
            .iter()
            .position(|have| have.get(key) == id && id.is_some());
        if fields.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = position {
                merged.remove(i);
            }
            continue;
        }
        match position {
            Some(i) => {
                let have = merged[i].as_object().cloned().unwrap_or_default();
                match merge_map(kind, path, &have, fields)? {
                    Some(map) => merged[i] = Value::Object(map),
                    None => {
                        merged.remove(i);
                    }
                }
            }
            None => {
                if let Some(map) = merge_map(kind, path, &Map::new(), fields)? {
                    merged.push(Value::Object(map));
                }
            }
        }
    }
    Ok(merged)
}

/// `$setElementOrder`: the elements the order names take, in the order's sequence, the places
/// those elements hold; the others keep theirs. Upstream interleaves server-only elements by
/// their server positions the same way (`normalizeElementOrder`).
fn apply_order(items: &mut [Value], order: &[Value], key: Option<&str>) {
    let id = |v: &Value| match key {
        Some(k) => v.get(k).cloned(),
        None => Some(v.clone()),
    };
    let wanted: Vec<Value> = order.iter().filter_map(&id).collect();
    let slots: Vec<usize> = (0..items.len())
        .filter(|&i| id(&items[i]).is_some_and(|v| wanted.contains(&v)))
        .collect();
    let mut ordered: Vec<Value> = slots.iter().map(|&i| items[i].clone()).collect();
    ordered.sort_by_key(|v| {
        id(v)
            .and_then(|v| wanted.iter().position(|w| *w == v))
            .unwrap_or(usize::MAX)
    });
    for (slot, value) in slots.into_iter().zip(ordered) {
        items[slot] = value;
    }
}

#[cfg(test)]
mod tests;
