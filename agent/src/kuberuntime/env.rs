//! A container's environment (upstream `makeEnvironmentVariables` in `kubelet_pods.go`): literal
//! values with `$(VAR)` expansion, the downward API's field and resource references, and the
//! same expansion applied to command and args. References to ConfigMaps and Secrets need an API
//! server; without one they fail the container with `CreateContainerConfigError` unless optional.
//!
//! Expansion is bounded: each reference can copy a whole earlier value, so a few dozen variables
//! referring to the one before twice would grow to gigabytes. A container's environment, command
//! and args together may come to at most [`MAX_EXPANDED_BYTES`] once expanded (and one
//! `subPathExpr` as much); beyond that the container fails with `CreateContainerConfigError`
//! naming the field. Upstream has no such bound (the kernel's `ARG_MAX`, 2 MiB with the default
//! 8 MiB stack, refuses the exec later; swiftlet's bound is above it, so nothing that could run is
//! refused).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::cm::quantity;

/// What the downward API can refer to besides the pod itself.
#[derive(Clone, Debug, Default)]
pub struct EnvContext<'a> {
    pub node_name: &'a str,
    pub pod_ips: &'a [String],
    pub host_ip: Option<&'a str>,
    /// Used for resource references to a limit the container does not set.
    pub node_cpu_millis: i64,
    pub node_memory_bytes: i64,
}

/// The most bytes a container's environment, command and args come to once expanded.
pub const MAX_EXPANDED_BYTES: usize = 4 << 20;

/// An expansion that would exceed its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expanding its $(VAR) references would exceed {limit} bytes")]
pub struct ExpansionTooLong {
    pub limit: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("env {name}: field path {path:?} is not supported")]
    FieldPath { name: String, path: String },
    #[error("env {name}: resource {resource:?} is not supported")]
    Resource { name: String, resource: String },
    #[error("env {name}: {what} {source_name:?} cannot be read: no API server is connected")]
    NeedsApi {
        name: String,
        what: &'static str,
        source_name: String,
    },
    #[error("env {name}: {reason}")]
    Quantity { name: String, reason: String },
    #[error("container {container:?}: {field}: {source}")]
    TooLong {
        container: String,
        /// `env NAME`, `command[i]` or `args[i]`.
        field: String,
        #[source]
        source: ExpansionTooLong,
    },
}

/// The environment of `container`, in order, expanded.
pub fn environment(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
) -> Result<Vec<(String, String)>, EnvError> {
    if let Some(from) = container.env_from.as_ref().and_then(|f| f.first()) {
        let (what, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(c), _) => ("configMap", c.name.clone(), c.optional),
            (None, Some(s)) => ("secret", s.name.clone(), s.optional),
            (None, None) => ("envFrom", String::new(), Some(true)),
        };
        if !optional.unwrap_or(false) {
            return Err(EnvError::NeedsApi {
                name: "envFrom".into(),
                what,
                source_name: name,
            });
        }
    }
    let mut defined: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    let mut budget = MAX_EXPANDED_BYTES;
    for var in container.env.iter().flatten() {
        let Some(value) = value_of(pod, container, var, ctx, &defined, budget)? else {
            continue;
        };
        budget = budget
            .checked_sub(value.len())
            .ok_or_else(|| too_long(container, format!("env {}", var.name)))?;
        defined.insert(var.name.clone(), value.clone());
        out.push((var.name.clone(), value));
    }
    Ok(out)
}

fn too_long(container: &Container, field: String) -> EnvError {
    EnvError::TooLong {
        container: container.name.clone(),
        field,
        source: ExpansionTooLong {
            limit: MAX_EXPANDED_BYTES,
        },
    }
}

fn value_of(
    pod: &Pod,
    container: &Container,
    var: &EnvVar,
    ctx: &EnvContext<'_>,
    defined: &HashMap<String, String>,
    budget: usize,
) -> Result<Option<String>, EnvError> {
    let Some(from) = &var.value_from else {
        let value = var.value.as_deref().unwrap_or_default();
        return expand_within(value, defined, budget)
            .map(Some)
            .map_err(|_| too_long(container, format!("env {}", var.name)));
    };
    if let Some(field) = &from.field_ref {
        return field_value(pod, &var.name, &field.field_path, ctx).map(Some);
    }
    if let Some(resource) = &from.resource_field_ref {
        let divisor = resource.divisor.as_ref().map(|d| d.0.as_str());
        return resource_value(container, &var.name, &resource.resource, divisor, ctx).map(Some);
    }
    let (what, name, optional) = match (&from.config_map_key_ref, &from.secret_key_ref) {
        (Some(c), _) => ("configMap", c.name.clone(), c.optional),
        (None, Some(s)) => ("secret", s.name.clone(), s.optional),
        (None, None) => return Ok(None),
    };
    if optional.unwrap_or(false) {
        return Ok(None);
    }
    Err(EnvError::NeedsApi {
        name: var.name.clone(),
        what,
        source_name: name,
    })
}

pub(crate) fn field_value(
    pod: &Pod,
    name: &str,
    path: &str,
    ctx: &EnvContext<'_>,
) -> Result<String, EnvError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_owned)
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| ctx.node_name.to_owned()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.unwrap_or_default().to_owned(),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        _ => {
            if let Some(key) = map_key("metadata.labels['") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = map_key("metadata.annotations['") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(EnvError::FieldPath {
                    name: name.to_owned(),
                    path: path.to_owned(),
                });
            }
        }
    };
    Ok(value)
}

/// Downward API resource values, rounded up to the divisor as upstream does.
pub(crate) fn resource_value(
    container: &Container,
    name: &str,
    resource: &str,
    divisor: Option<&str>,
    ctx: &EnvContext<'_>,
) -> Result<String, EnvError> {
    let bad = |e: quantity::QuantityError| EnvError::Quantity {
        name: name.to_owned(),
        reason: e.to_string(),
    };
    let resources = container.resources.clone().unwrap_or_default();
    let get = |list: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
               key: &str| list.as_ref().and_then(|l| l.get(key)).map(|q| q.0.clone());
    let (kind, value) = match resource {
        "limits.cpu" => ("cpu", get(&resources.limits, "cpu")),
        "requests.cpu" => (
            "cpu",
            get(&resources.requests, "cpu").or(get(&resources.limits, "cpu")),
        ),
        "limits.memory" => ("memory", get(&resources.limits, "memory")),
        "requests.memory" => (
            "memory",
            get(&resources.requests, "memory").or(get(&resources.limits, "memory")),
        ),
        _ => {
            return Err(EnvError::Resource {
                name: name.to_owned(),
                resource: resource.to_owned(),
            });
        }
    };
    if kind == "cpu" {
        let millis = match value {
            Some(v) => quantity::cpu_millis(&v).map_err(bad)?,
            None => ctx.node_cpu_millis,
        };
        let divisor = quantity::cpu_millis(divisor.unwrap_or("1"))
            .map_err(bad)?
            .max(1);
        Ok(((millis + divisor - 1) / divisor).to_string())
    } else {
        let bytes = match value {
            Some(v) => quantity::memory_bytes(&v).map_err(bad)?,
            None => ctx.node_memory_bytes,
        };
        let divisor = quantity::memory_bytes(divisor.unwrap_or("1"))
            .map_err(bad)?
            .max(1);
        Ok(((bytes + divisor - 1) / divisor).to_string())
    }
}

/// `$(VAR)` expansion as Kubernetes does it: a defined variable is replaced, an undefined one is
/// left as written, `$$` is a literal `$`. At most [`MAX_EXPANDED_BYTES`] come out.
pub fn expand(input: &str, defined: &HashMap<String, String>) -> Result<String, ExpansionTooLong> {
    expand_within(input, defined, MAX_EXPANDED_BYTES)
}

/// [`expand`] with at most `limit` bytes coming out.
fn expand_within(
    input: &str,
    defined: &HashMap<String, String>,
    limit: usize,
) -> Result<String, ExpansionTooLong> {
    let mut out = String::with_capacity(input.len().min(limit));
    let push = |out: &mut String, piece: &str| {
        if out.len() + piece.len() > limit {
            return Err(ExpansionTooLong {
                limit: MAX_EXPANDED_BYTES,
            });
        }
        out.push_str(piece);
        Ok(())
    };
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        push(&mut out, &rest[..at])?;
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            push(&mut out, "$")?;
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match defined.get(name) {
                        Some(value) => push(&mut out, value)?,
                        None => {
                            push(&mut out, "$(")?;
                            push(&mut out, name)?;
                            push(&mut out, ")")?;
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    push(&mut out, "$(")?;
                    rest = inner;
                }
            }
        } else {
            push(&mut out, "$")?;
            rest = after;
        }
    }
    push(&mut out, rest)?;
    Ok(out)
}

/// Command and args with `$(VAR)` expanded from the container's environment, within what the
/// environment left of [`MAX_EXPANDED_BYTES`].
pub fn expand_command(
    container: &Container,
    env: &[(String, String)],
) -> Result<(Vec<String>, Vec<String>), EnvError> {
    let defined: HashMap<String, String> = env.iter().cloned().collect();
    let mut budget = MAX_EXPANDED_BYTES.saturating_sub(env.iter().map(|(_, v)| v.len()).sum());
    let mut each = |list: &Option<Vec<String>>, field: &str| {
        list.iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| {
                let expanded = expand_within(s, &defined, budget)
                    .map_err(|_| too_long(container, format!("{field}[{i}]")))?;
                budget -= expanded.len();
                Ok(expanded)
            })
            .collect::<Result<Vec<_>, EnvError>>()
    };
    let command = each(&container.command, "command")?;
    let args = each(&container.args, "args")?;
    Ok((command, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let defined: HashMap<String, String> =
            [("A".to_owned(), "1".to_owned())].into_iter().collect();
        let cases = [
            ("$(A)", "1"),
            ("x$(A)y", "x1y"),
            ("$(B)", "$(B)"),
            ("$$(A)", "$(A)"),
            ("$(A", "$(A"),
            ("cost $5", "cost $5"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &defined).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn downward_api_fields_and_earlier_variables() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u1".into()),
                labels: Some(
                    [("tier".to_owned(), "front".to_owned())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        };
        let container = Container {
            name: "c".into(),
            env: Some(vec![
                field("POD", "metadata.name"),
                field("NODE", "spec.nodeName"),
                field("TIER", "metadata.labels['tier']"),
                field("IP", "status.podIP"),
                var("GREETING", "hello $(POD) on $(NODE)"),
            ]),
            args: Some(vec!["echo".into(), "$(GREETING)".into()]),
            ..Default::default()
        };
        let ips = vec!["10.88.0.5".to_owned()];
        let ctx = EnvContext {
            node_name: "node-1",
            pod_ips: &ips,
            ..Default::default()
        };
        let env = environment(&pod, &container, &ctx).expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("POD"), Some("web"));
        assert_eq!(get("NODE"), Some("node-1"));
        assert_eq!(get("TIER"), Some("front"));
        assert_eq!(get("IP"), Some("10.88.0.5"));
        assert_eq!(get("GREETING"), Some("hello web on node-1"));
        let (_, args) = expand_command(&container, &env).expect("expanded");
        assert_eq!(
            args,
            vec!["echo".to_owned(), "hello web on node-1".to_owned()]
        );
    }

    #[test]
    fn config_map_references_fail_without_an_api_server_unless_optional() {
        let pod = Pod::default();
        let mut reference = EnvVar {
            name: "X".into(),
            value: None,
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                    name: "cm".into(),
                    key: "k".into(),
                    optional: None,
                }),
                ..Default::default()
            }),
        };
        let container = |v: EnvVar| Container {
            name: "c".into(),
            env: Some(vec![v]),
            ..Default::default()
        };
        let err = environment(&pod, &container(reference.clone()), &EnvContext::default());
        assert!(matches!(err, Err(EnvError::NeedsApi { .. })));
        if let Some(from) = reference.value_from.as_mut()
            && let Some(r) = from.config_map_key_ref.as_mut()
        {
            r.optional = Some(true);
        }
        let env = environment(&pod, &container(reference), &EnvContext::default());
        assert_eq!(env, Ok(vec![]));
    }

    /// Each variable twice the one before: unbounded, 40 of them would be a terabyte.
    fn doubling(count: usize) -> Vec<EnvVar> {
        let mut vars = vec![var("V0", &"x".repeat(1024))];
        for i in 1..count {
            vars.push(var(
                &format!("V{i}"),
                &format!("$(V{})$(V{})", i - 1, i - 1),
            ));
        }
        vars
    }

    #[test]
    fn an_expansion_past_the_bound_is_an_error_naming_the_container_and_field() {
        let container = Container {
            name: "bomb".into(),
            env: Some(doubling(40)),
            ..Default::default()
        };
        let err =
            environment(&Pod::default(), &container, &EnvContext::default()).expect_err("refused");
        // 1 KiB doubled: V0..V11 come to 4 MiB - 1 KiB, so V12 (4 MiB) is past the bound.
        assert_eq!(
            err.to_string(),
            "container \"bomb\": env V12: expanding its $(VAR) references would exceed 4194304 \
             bytes"
        );

        // Within the bound for the environment; the command's expansion is what goes past it.
        let container = Container {
            name: "cmd".into(),
            env: Some(doubling(11)),
            command: Some(vec!["echo".into()]),
            args: Some(vec!["$(V10)".into(), "$(V10)$(V10)$(V10)".into()]),
            ..Default::default()
        };
        let env = environment(&Pod::default(), &container, &EnvContext::default()).expect("env");
        assert_eq!(env.len(), 11);
        let err = expand_command(&container, &env).expect_err("refused");
        assert!(
            matches!(&err, EnvError::TooLong { container, field, .. }
                if container == "cmd" && field == "args[1]"),
            "{err}"
        );
        // One string on its own is bounded too (subPathExpr's path).
        let defined: HashMap<String, String> = env.into_iter().collect();
        assert!(expand("$(V10)$(V10)$(V10)$(V10)$(V10)", &defined).is_err());
        assert_eq!(expand("$(V0)", &defined).map(|s| s.len()), Ok(1024));
    }
}
