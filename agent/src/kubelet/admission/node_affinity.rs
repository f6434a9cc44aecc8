//! Whether a pod's node selection allows this node (upstream
//! `component-helpers/scheduling/corev1/nodeaffinity` `GetRequiredNodeAffinity(pod).Match(node)`):
//! every `nodeSelector` entry must equal the node's label, and when
//! `requiredDuringSchedulingIgnoredDuringExecution` is set one of its terms must match. A term
//! matches when all its `matchExpressions` hold on the node's labels (`In`, `NotIn`, `Exists`,
//! `DoesNotExist`, `Gt`, `Lt`, as `labels.Requirement.Matches`) and all its `matchFields` hold on
//! `metadata.name` (`In`/`NotIn` with one value); an empty term, or one that does not parse
//! (`LazyErrorNodeSelector`: an unknown operator, a wrong number of values, a `Gt`/`Lt` value
//! that is not an integer), matches nothing.
//!
//! Not here: the preferred terms (scheduling only), the reason the rejection gives
//! (`admission.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

/// Upstream's only field a `matchFields` requirement may name.
const FIELD_NAME: &str = "metadata.name";

/// Whether `pod` may run on the node `name` with `labels`.
pub fn matches(pod: &Pod, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_holds = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    if !selector_holds {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(selector) => selector
            .node_selector_terms
            .iter()
            .any(|term| term_matches(term, name, labels)),
    }
}

fn term_matches(term: &NodeSelectorTerm, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    // Parsed first, as upstream: one bad requirement spoils the term, whatever the others say.
    let Some(expressions) = expressions
        .iter()
        .map(LabelRequirement::parse)
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let Some(fields) = fields
        .iter()
        .map(FieldRequirement::parse)
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    expressions.iter().all(|r| r.matches(labels))
        && (name.is_empty() || fields.iter().all(|r| r.matches(name)))
}

/// A `matchExpressions` entry that parsed (upstream `labels.NewRequirement`'s rules).
enum LabelRequirement<'a> {
    In(&'a str, &'a [String]),
    NotIn(&'a str, &'a [String]),
    Exists(&'a str),
    DoesNotExist(&'a str),
    Gt(&'a str, i64),
    Lt(&'a str, i64),
}

impl<'a> LabelRequirement<'a> {
    fn parse(r: &'a NodeSelectorRequirement) -> Option<Self> {
        let key = r.key.as_str();
        let values = r.values.as_deref().unwrap_or_default();
        if !crate::node::labels::qualified_name_errors(key).is_empty() {
            return None;
        }
        let integer = || match values {
            [one] => one.parse::<i64>().ok(),
            _ => None,
        };
        match r.operator.as_str() {
            "In" if !values.is_empty() => Some(Self::In(key, values)),
            "NotIn" if !values.is_empty() => Some(Self::NotIn(key, values)),
            "Exists" if values.is_empty() => Some(Self::Exists(key)),
            "DoesNotExist" if values.is_empty() => Some(Self::DoesNotExist(key)),
            "Gt" => integer().map(|v| Self::Gt(key, v)),
            "Lt" => integer().map(|v| Self::Lt(key, v)),
            _ => None,
        }
    }

    /// Upstream `Requirement.Matches`: a missing label satisfies only `NotIn` and
    /// `DoesNotExist`; `Gt`/`Lt` compare the label read as an integer.
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match *self {
            Self::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Self::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
            Self::Gt(key, bound) => Self::integer(labels, key).is_some_and(|v| v > bound),
            Self::Lt(key, bound) => Self::integer(labels, key).is_some_and(|v| v < bound),
        }
    }

    fn integer(labels: &BTreeMap<String, String>, key: &str) -> Option<i64> {
        labels.get(key)?.parse().ok()
    }
}

/// A `matchFields` entry that parsed (upstream `nodeSelectorRequirementsAsFieldSelector`).
enum FieldRequirement<'a> {
    Equals(&'a str, &'a str),
    NotEquals(&'a str, &'a str),
}

impl<'a> FieldRequirement<'a> {
    fn parse(r: &'a NodeSelectorRequirement) -> Option<Self> {
        let [value] = r.values.as_deref().unwrap_or_default() else {
            return None;
        };
        match r.operator.as_str() {
            "In" => Some(Self::Equals(&r.key, value)),
            "NotIn" => Some(Self::NotEquals(&r.key, value)),
            _ => None,
        }
    }

    /// A field selector over the node's one field, `metadata.name`: any other field reads
    /// empty, as in `fields.Set`.
    fn matches(&self, name: &str) -> bool {
        let field = |key: &str| if key == FIELD_NAME { name } else { "" };
        match *self {
            Self::Equals(key, value) => field(key) == value,
            Self::NotEquals(key, value) => field(key) != value,
        }
    }
}
