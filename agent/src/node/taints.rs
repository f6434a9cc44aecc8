//! Taints: the node's own (`--register-with-taints`, `registerWithTaints`), parsed as upstream's
//! `pkg/util/taints` `ParseTaints` parses taints to add (`<key>=<value>:<effect>` or
//! `<key>:<effect>`, an effect required, one taint per key and effect), and whether a pod's
//! tolerations tolerate them (`k8s.io/api/core/v1` `Toleration.ToleratesTaint`,
//! `component-helpers/scheduling/corev1` `FindMatchingUntoleratedTaint`).
//!
//! Not here: which taints admission looks at (only `NoExecute`, `kubelet::admission`).

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::labels::{label_value_errors, qualified_name_errors};

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// Why a taint was refused; `spec` is the taint as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaintError {
    #[error("invalid taint spec: {spec}")]
    Syntax { spec: String },
    /// Upstream `validateTaintEffect`'s message.
    #[error("invalid taint effect: {effect}, unsupported taint effect (in {spec})")]
    Effect { spec: String, effect: String },
    #[error("invalid taint spec: {spec}, {}", reasons.join("; "))]
    Invalid { spec: String, reasons: Vec<String> },
    #[error("duplicated taints with the same key and effect: {spec}")]
    Duplicate { spec: String },
}

/// Upstream `ParseTaints` for taints to add: every spec parsed, none without an effect, no key
/// twice with the same effect.
pub fn parse_taints<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Taint>, TaintError> {
    let mut taints: Vec<Taint> = Vec::new();
    for spec in specs {
        let spec = spec.as_ref();
        let taint = parse_taint(spec)?;
        push_unique(&mut taints, taint, spec)?;
    }
    Ok(taints)
}

/// Checks a taint given field by field (the file's `registerWithTaints`) as [`parse_taints`]
/// checks a written one, and adds it to `taints` unless its key and effect are already there.
pub fn push_checked(
    taints: &mut Vec<Taint>,
    key: &str,
    value: &str,
    effect: &str,
) -> Result<(), TaintError> {
    let spec = if value.is_empty() {
        format!("{key}:{effect}")
    } else {
        format!("{key}={value}:{effect}")
    };
    check_effect(effect, &spec)?;
    let taint = checked(key, value, effect, &spec)?;
    push_unique(taints, taint, &spec)
}

fn push_unique(taints: &mut Vec<Taint>, taint: Taint, spec: &str) -> Result<(), TaintError> {
    if taints
        .iter()
        .any(|t| t.key == taint.key && t.effect == taint.effect)
    {
        return Err(TaintError::Duplicate {
            spec: spec.to_owned(),
        });
    }
    taints.push(taint);
    Ok(())
}

/// Upstream `parseTaint`, with the effect `ParseTaints` requires of a taint to add.
fn parse_taint(spec: &str) -> Result<Taint, TaintError> {
    let syntax = || TaintError::Syntax {
        spec: spec.to_owned(),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let [key_value, effect] = parts.as_slice() else {
        // `<key>` alone names a taint to remove, never one to add.
        return Err(syntax());
    };
    check_effect(effect, spec)?;
    let (key, value) = match key_value.split('=').collect::<Vec<_>>().as_slice() {
        [key] => (*key, ""),
        [key, value] => (*key, *value),
        _ => return Err(syntax()),
    };
    checked(key, value, effect, spec)
}

fn check_effect(effect: &str, spec: &str) -> Result<(), TaintError> {
    if [NO_SCHEDULE, PREFER_NO_SCHEDULE, NO_EXECUTE].contains(&effect) {
        return Ok(());
    }
    if effect.is_empty() {
        return Err(TaintError::Syntax {
            spec: spec.to_owned(),
        });
    }
    Err(TaintError::Effect {
        spec: spec.to_owned(),
        effect: effect.to_owned(),
    })
}

fn checked(key: &str, value: &str, effect: &str, spec: &str) -> Result<Taint, TaintError> {
    let mut reasons = label_value_errors(value);
    reasons.extend(qualified_name_errors(key));
    if !reasons.is_empty() {
        return Err(TaintError::Invalid {
            spec: spec.to_owned(),
            reasons,
        });
    }
    Ok(Taint {
        key: key.to_owned(),
        value: (!value.is_empty()).then(|| value.to_owned()),
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// Upstream `Toleration.ToleratesTaint`: the effect and key match when the toleration names
/// them; `Exists` tolerates any value, `Equal` (or no operator) only the same one.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let set = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    if let Some(effect) = set(&toleration.effect)
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = set(&toleration.key)
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// Upstream `FindMatchingUntoleratedTaint`: the first taint `considered` that no toleration
/// tolerates.
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    considered: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| considered(t))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    #[test]
    fn parses_taints_to_add_as_upstream() {
        let parsed = parse_taints(&["dedicated=gpu:NoSchedule", "example.com/drain:NoExecute"]);
        assert_eq!(
            parsed,
            Ok(vec![
                taint("dedicated", Some("gpu"), NO_SCHEDULE),
                taint("example.com/drain", None, NO_EXECUTE),
            ])
        );
        let refused = [
            ("dedicated", "invalid taint spec: dedicated"),
            ("dedicated=gpu", "invalid taint spec: dedicated=gpu"),
            ("a=b=c:NoSchedule", "invalid taint spec: a=b=c:NoSchedule"),
            ("a:b:NoSchedule", "invalid taint spec: a:b:NoSchedule"),
            (
                "a:Never",
                "invalid taint effect: Never, unsupported taint effect",
            ),
            (
                "a=bad value:NoSchedule",
                "invalid taint spec: a=bad value:NoSchedule, ",
            ),
            ("-a:NoSchedule", "invalid taint spec: -a:NoSchedule, "),
        ];
        for (spec, message) in refused {
            let error = parse_taints(&[spec]).err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.starts_with(message)),
                "{spec}: {error:?}"
            );
        }
        // One taint per key and effect; the same key with another effect is another taint.
        assert!(matches!(
            parse_taints(&["a=1:NoSchedule", "a=2:NoSchedule"]),
            Err(TaintError::Duplicate { .. })
        ));
        assert_eq!(
            parse_taints(&["a=1:NoSchedule", "a=1:NoExecute"]).map(|t| t.len()),
            Ok(2)
        );
    }

    #[test]
    fn file_taints_are_checked_like_written_ones() {
        let mut taints = Vec::new();
        assert_eq!(push_checked(&mut taints, "a", "1", NO_EXECUTE), Ok(()));
        assert!(matches!(
            push_checked(&mut taints, "a", "2", NO_EXECUTE),
            Err(TaintError::Duplicate { .. })
        ));
        assert!(matches!(
            push_checked(&mut taints, "b", "", ""),
            Err(TaintError::Syntax { .. })
        ));
        assert!(matches!(
            push_checked(&mut taints, "b", "", "Sometimes"),
            Err(TaintError::Effect { .. })
        ));
        assert_eq!(taints, vec![taint("a", Some("1"), NO_EXECUTE)]);
    }

    #[test]
    fn tolerations_as_upstream_matches_them() {
        let gpu = taint("dedicated", Some("gpu"), NO_EXECUTE);
        let toleration =
            |key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>| {
                Toleration {
                    key: key.map(Into::into),
                    operator: op.map(Into::into),
                    value: value.map(Into::into),
                    effect: effect.map(Into::into),
                    toleration_seconds: None,
                }
            };
        let cases = [
            (toleration(Some("dedicated"), None, Some("gpu"), None), true),
            (
                toleration(Some("dedicated"), Some("Equal"), Some("cpu"), None),
                false,
            ),
            (
                toleration(Some("dedicated"), Some("Exists"), None, None),
                true,
            ),
            (toleration(None, Some("Exists"), None, None), true),
            (
                toleration(None, Some("Exists"), None, Some(NO_SCHEDULE)),
                false,
            ),
            (toleration(Some("other"), Some("Exists"), None, None), false),
            (
                toleration(Some("dedicated"), Some("Gt"), Some("1"), None),
                false,
            ),
        ];
        for (tol, want) in cases {
            assert_eq!(tolerates(&tol, &gpu), want, "{tol:?}");
        }
        let taints = [taint("soft", None, NO_SCHEDULE), gpu.clone()];
        let no_execute = |t: &Taint| t.effect == NO_EXECUTE;
        assert_eq!(first_untolerated(&taints, &[], no_execute), Some(&gpu));
        let tolerated = [toleration(Some("dedicated"), Some("Exists"), None, None)];
        assert_eq!(first_untolerated(&taints, &tolerated, no_execute), None);
    }
}
