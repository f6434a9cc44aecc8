//! JSON patch (RFC 6902, `application/json-patch+json`): `add`, `remove`, `replace`, `move`,
//! `copy` and `test` on RFC 6901 pointers, applied in order, all or nothing.

use serde_json::Value;

use super::patch::PatchError;

fn fail(message: String) -> PatchError {
    PatchError::JsonPatch(message)
}

/// Applies `operations` (a JSON array) to a copy of `target`.
pub fn json_patch(target: &Value, operations: &Value) -> Result<Value, PatchError> {
    let Value::Array(operations) = operations else {
        return Err(fail("a JSON patch is an array of operations".to_owned()));
    };
    let mut doc = target.clone();
    for op in operations {
        let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| fail(format!("operation {op} has no path")))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| fail(format!("operation {op} has no value")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| fail(format!("operation {op} has no from")))
        };
        match name {
            "add" => add(&mut doc, path, value()?)?,
            "remove" => {
                remove(&mut doc, path)?;
            }
            "replace" => {
                remove(&mut doc, path)?;
                add(&mut doc, path, value()?)?;
            }
            "move" => {
                let moved = remove(&mut doc, from()?)?;
                add(&mut doc, path, moved)?;
            }
            "copy" => {
                let copied = doc.pointer(&pointer(from()?)?).cloned().ok_or_else(|| {
                    fail(format!("copy: no value at {}", from().unwrap_or_default()))
                })?;
                add(&mut doc, path, copied)?;
            }
            "test" => {
                if doc.pointer(&pointer(path)?) != Some(&value()?) {
                    return Err(fail(format!("test failed at {path}")));
                }
            }
            other => return Err(fail(format!("unknown operation {other:?}"))),
        }
    }
    Ok(doc)
}

/// The pointer as serde_json's `pointer` takes it (which unescapes `~0`/`~1` itself).
fn pointer(path: &str) -> Result<String, PatchError> {
    if path.is_empty() || path.starts_with('/') {
        Ok(path.to_owned())
    } else {
        Err(fail(format!("{path:?} is not a JSON pointer")))
    }
}

/// The parent's pointer and the last token, unescaped.
fn split(path: &str) -> Result<(String, String), PatchError> {
    let path = pointer(path)?;
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| fail("the root cannot be the target".to_owned()))?;
    Ok((
        parent.to_owned(),
        last.replace("~1", "/").replace("~0", "~"),
    ))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    match doc.pointer_mut(&parent) {
        Some(Value::Object(map)) => {
            map.insert(last, value);
            Ok(())
        }
        Some(Value::Array(items)) => {
            let index = if last == "-" {
                items.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|&i| i <= items.len())
                    .ok_or_else(|| fail(format!("add: bad index in {path}")))?
            };
            items.insert(index, value);
            Ok(())
        }
        _ => Err(fail(format!("add: no parent for {path}"))),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let (parent, last) = split(path)?;
    let missing = || fail(format!("remove: no value at {path}"));
    match doc.pointer_mut(&parent) {
        Some(Value::Object(map)) => map.remove(&last).ok_or_else(missing),
        Some(Value::Array(items)) => {
            let index = last
                .parse::<usize>()
                .ok()
                .filter(|&i| i < items.len())
                .ok_or_else(missing)?;
            Ok(items.remove(index))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn operations_apply_in_order() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 3]});
        let ops = json!([
            {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
            {"op": "add", "path": "/list/1", "value": 2},
            {"op": "add", "path": "/list/-", "value": 4},
            {"op": "copy", "from": "/list/0", "path": "/first"},
            {"op": "move", "from": "/first", "path": "/moved"},
            {"op": "test", "path": "/moved", "value": 1},
            {"op": "remove", "path": "/list/0"},
        ]);
        assert_eq!(
            json_patch(&doc, &ops).expect("applies"),
            json!({"metadata": {"labels": {"a": "9", "b/c": "2"}}, "list": [2, 3, 4], "moved": 1})
        );
    }

    #[test]
    fn a_failed_test_or_missing_path_fails_the_whole_patch() {
        let doc = json!({"a": 1});
        assert!(json_patch(&doc, &json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
        assert!(json_patch(&doc, &json!([{"op": "remove", "path": "/b"}])).is_err());
        assert!(json_patch(&doc, &json!([{"op": "replace", "path": "/b", "value": 1}])).is_err());
        assert!(json_patch(&doc, &json!({"op": "add"})).is_err());
    }
}
