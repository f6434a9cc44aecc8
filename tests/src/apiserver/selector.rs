//! Field and label selectors of list and watch, with the grammar and matching rules of
//! <https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/> and
//! <https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors>
//! (upstream `apimachinery/pkg/fields/selector.go` and `apimachinery/pkg/labels/selector.go`).

use serde_json::Value;

use super::{
    resources::Resource,
    status::{ApiError, ApiResult},
};

/// A parsed `fieldSelector`: every term must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

/// The fields a selector may name for `resource`: `metadata.name` and `metadata.namespace`
/// everywhere (upstream `DefaultClusterScopedAttr`/`DefaultNamespaceScopedAttr`), and the pod's
/// own (`pkg/registry/core/pod/strategy.go` `ToSelectableFields`). Any other field is refused
/// with 400, as upstream's field label conversion refuses it.
fn selectable(resource: &Resource, field: &str) -> bool {
    match field {
        "metadata.name" | "metadata.namespace" => true,
        _ if resource.kind == "Pod" && resource.group.is_empty() => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        _ if resource.kind == "Node" => field == "spec.unschedulable",
        _ if resource.kind == "Secret" => field == "type",
        _ => false,
    }
}

impl FieldSelector {
    /// Parses `key=value,key2!=value2` (`==` is `=`); `\` escapes `,`, `=` and `!` in values.
    pub fn parse(resource: &Resource, text: &str) -> ApiResult<FieldSelector> {
        let mut terms = Vec::new();
        for term in split_unescaped(text, ',') {
            if term.is_empty() {
                continue;
            }
            let (key, equal, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {term:?}: no operator"
                )));
            };
            let key = key.trim();
            if !selectable(resource, key) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            }
            terms.push((key.to_owned(), equal, unescape(value)));
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether `object` matches; an unset field reads as the empty string (as the pod's
    /// selectable fields are strings, `spec.nodeName` of an unbound pod is `""`).
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(key, equal, want)| {
            let have = field_value(object, key);
            (have == *want) == *equal
        })
    }
}

fn field_value(object: &Value, path: &str) -> String {
    let mut at = object;
    for part in path.split('.') {
        match at.get(part) {
            Some(next) => at = next,
            None => {
                // Booleans upstream reads from a zero-valued struct are "false".
                return if path == "spec.hostNetwork" || path == "spec.unschedulable" {
                    "false".to_owned()
                } else {
                    String::new()
                };
            }
        }
    }
    match at {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn split_unescaped(text: &str, separator: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            if let Some(last) = parts.last_mut() {
                last.push('\\');
                last.push(c);
            }
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == separator {
            parts.push(String::new());
        } else if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in value.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector`: equality-based (`=`, `==`, `!=`) and set-based (`in`, `notin`,
/// `key`, `!key`) requirements, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> ApiResult<LabelSelector> {
        let mut requirements = Vec::new();
        for term in split_outside_parens(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the object's labels satisfy every requirement. `!=` and `notin` hold for an
    /// object without the label, as the label selector documentation says.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = super::meta::labels(object);
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|have| vs.iter().any(|v| v == have)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|have| vs.iter().all(|v| v != have)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

fn split_outside_parens(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(term: &str) -> ApiResult<Requirement> {
    let invalid = || ApiError::bad_request(format!("unable to parse requirement: {term:?}"));
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key.trim().to_owned()));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    if let Some(open) = term.find('(') {
        let close = term.rfind(')').ok_or_else(invalid)?;
        let values: Vec<String> = term
            .get(open + 1..close)
            .ok_or_else(invalid)?
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        let head: Vec<&str> = term[..open].split_whitespace().collect();
        return match head.as_slice() {
            [key, "in"] => Ok(Requirement::In((*key).to_owned(), values)),
            [key, "notin"] => Ok(Requirement::NotIn((*key).to_owned(), values)),
            _ => Err(invalid()),
        };
    }
    if term.contains(char::is_whitespace) {
        return Err(invalid());
    }
    Ok(Requirement::Exists(term.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::resources::find;

    fn pods() -> &'static Resource {
        find("", "v1", "pods").expect("pods")
    }

    #[test]
    fn field_selectors_compare_the_pods_fields() {
        let bound =
            json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let unbound = json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": {}});
        let cases = [
            ("spec.nodeName=n1", true, false),
            ("spec.nodeName==n1", true, false),
            ("spec.nodeName!=n1", false, true),
            ("spec.nodeName=", false, true),
            ("metadata.name=a,metadata.namespace=ns", true, false),
            ("metadata.namespace!=ns", false, false),
            ("", true, true),
        ];
        for (text, want_bound, want_unbound) in cases {
            let selector = FieldSelector::parse(pods(), text).expect(text);
            assert_eq!(
                selector.matches(&bound),
                want_bound,
                "{text} on the bound pod"
            );
            assert_eq!(
                selector.matches(&unbound),
                want_unbound,
                "{text} on the unbound pod"
            );
        }
    }

    #[test]
    fn unknown_fields_are_refused_with_400() {
        let error = FieldSelector::parse(pods(), "spec.containers=x").expect_err("refused");
        assert_eq!(error.code, 400);
        let configmaps = find("", "v1", "configmaps").expect("configmaps");
        assert!(FieldSelector::parse(configmaps, "spec.nodeName=n1").is_err());
        assert!(FieldSelector::parse(configmaps, "metadata.name=x").is_ok());
    }

    #[test]
    fn label_selectors_are_equality_and_set_based() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let bare = json!({"metadata": {}});
        let cases = [
            ("app=web", true, false),
            ("app==web", true, false),
            ("app!=web", false, true),
            ("app=db", false, false),
            ("app in (web, db)", true, false),
            ("app notin (web)", false, true),
            ("app", true, false),
            ("!app", false, true),
            ("app=web,tier in (front)", true, false),
            ("app=web,tier notin (front,back)", false, false),
            ("", true, true),
        ];
        for (text, want_labelled, want_bare) in cases {
            let selector = LabelSelector::parse(text).expect(text);
            assert_eq!(
                selector.matches(&object),
                want_labelled,
                "{text} on the labelled object"
            );
            assert_eq!(
                selector.matches(&bare),
                want_bare,
                "{text} on the bare object"
            );
        }
        assert!(LabelSelector::parse("app web").is_err());
    }
}
