//! A container's environment (upstream `makeEnvironmentVariables` in `kubelet_pods.go`): the
//! `envFrom` ConfigMaps and Secrets first (keys with their `prefix`), then `env` in order —
//! literal values with `$(VAR)` expansion, the downward API's field and resource references,
//! ConfigMap and Secret keys — each overriding an earlier variable of the same name, then the
//! service variables no earlier one defined; the same expansion applied to command and args.
//! What the cluster holds is read before (`cluster.rs`, with the service variables of
//! `services.rs`); deciding from it is pure and here.
//!
//! Upstream's messages for what fails the container with `CreateContainerConfigError`:
//! `configmap "x" not found`, `secret "x" not found` (its watch-based managers' NotFound),
//! `couldn't find key k in ConfigMap ns/x` (or `Secret`), `services have not yet been read at
//! least once, cannot construct envvars`. An `optional` reference to a missing object or key is
//! left out; an object that could not be read fails even when optional, as upstream. Without
//! an API server references fail unless optional.
//!
//! `envFrom` keys that are not environment variable names (upstream's relaxed rule since
//! `RelaxedEnvironmentVariableValidation`: printable ASCII without `=`; a ConfigMap key the API
//! server accepts always is one, so upstream no longer checks) are skipped with upstream's former
//! `InvalidEnvironmentVariableNames` warning, so that a hostile key never splits a variable.
//!
//! The order: upstream builds the list from a Go map (any order); here a variable keeps the place
//! of its first definition, and the service variables follow, sorted.
//!
//! Expansion and size are bounded: each reference can copy a whole earlier value, so a few dozen
//! variables referring to the one before twice would grow to gigabytes, and an `envFrom` object
//! or a namespace's services can be large. A container's environment (names and values),
//! command and args together may come to at most [`MAX_EXPANDED_BYTES`] (and one `subPathExpr`
//! as much); beyond that the container fails with `CreateContainerConfigError` naming the
//! field. Upstream has no such bound (the kernel's `ARG_MAX`, 2 MiB with the default 8 MiB stack,
//! refuses the exec later; swiftlet's bound is above it, so nothing that could run is refused).

mod cluster;
mod services;

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::cm::quantity;

pub use cluster::{ClusterEnv, ClusterValues, EnvObjects, Lookup, ReadError};
pub use services::{ServiceInfo, ServiceLister, ServicePort, ServiceRejected, service_env};

/// What the downward API can refer to besides the pod itself, and what was read of the cluster.
#[derive(Clone, Debug, Default)]
pub struct EnvContext<'a> {
    pub node_name: &'a str,
    pub pod_ips: &'a [String],
    pub host_ip: Option<&'a str>,
    /// Used for resource references to a limit the container does not set.
    pub node_cpu_millis: i64,
    pub node_memory_bytes: i64,
    /// What [`ClusterEnv::gather`] read; `None` is the standalone node's nothing.
    pub cluster: Option<&'a ClusterValues>,
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
    /// Upstream's NotFound from its ConfigMap or Secret manager (`configmap "x" not found`).
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// `configmap` or `secret`, as upstream's group resource names them.
        kind: &'static str,
        name: String,
    },
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        key: String,
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("couldn't get {kind} {namespace}/{name}: {reason}")]
    Read {
        kind: &'static str,
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotSynced,
    #[error("container {container:?}: {field}: {source}")]
    TooLong {
        container: String,
        /// `env NAME`, `command[i]` or `args[i]`.
        field: String,
        #[source]
        source: ExpansionTooLong,
    },
    #[error("container {container:?}: {field}: the environment would exceed {limit} bytes")]
    TooLarge {
        container: String,
        /// `envFrom[i]`, `env NAME`, `configMap "x"`, `service environment variables`.
        field: String,
        limit: usize,
    },
}

/// The variables in the order of their first definition, and their size so far.
struct EnvList {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
    bytes: usize,
}

impl EnvList {
    fn new() -> Self {
        EnvList {
            vars: Vec::new(),
            index: HashMap::new(),
            bytes: 0,
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }

    /// What is left of [`MAX_EXPANDED_BYTES`].
    fn room(&self) -> usize {
        MAX_EXPANDED_BYTES.saturating_sub(self.bytes)
    }

    /// Defines `name`, in the place of an earlier definition; `false` past the bound.
    fn set(&mut self, name: &str, value: String) -> bool {
        let old = self.index.get(name).map(|&i| self.vars[i].1.len());
        let bytes = self.bytes - old.map_or(0, |o| o + name.len()) + name.len() + value.len();
        if bytes > MAX_EXPANDED_BYTES {
            return false;
        }
        self.bytes = bytes;
        match self.index.get(name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.to_owned(), self.vars.len());
                self.vars.push((name.to_owned(), value));
            }
        }
        true
    }
}

/// Upstream `IsRelaxedEnvVarName`: not empty, printable ASCII, no `=`.
pub fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// The environment of `container`, in order, expanded.
pub fn environment(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
) -> Result<Vec<(String, String)>, EnvError> {
    let standalone = ClusterValues::default();
    let cluster = ctx.cluster.unwrap_or(&standalone);
    let mut env = EnvList::new();
    for (i, from) in container.env_from.iter().flatten().enumerate() {
        env_from(pod, container, from, i, cluster, &mut env)?;
    }
    let services: HashMap<&str, &str> = cluster
        .services
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for var in container.env.iter().flatten() {
        let Some(value) = value_of(pod, container, var, ctx, cluster, &env, &services)? else {
            continue;
        };
        if !env.set(&var.name, value) {
            return Err(too_large(container, format!("env {}", var.name)));
        }
    }
    for (name, value) in &cluster.services {
        if env.get(name).is_none() && !env.set(name, value.clone()) {
            return Err(too_large(container, "service environment variables".into()));
        }
    }
    Ok(env.vars)
}

/// One `envFrom` source's variables into `env`.
fn env_from(
    pod: &Pod,
    container: &Container,
    from: &k8s_openapi::api::core::v1::EnvFromSource,
    index: usize,
    cluster: &ClusterValues,
    env: &mut EnvList,
) -> Result<(), EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let (what, kind, name, optional, lookup) = match (&from.config_map_ref, &from.secret_ref) {
        (Some(c), _) => (
            "configMap",
            "configmap",
            &c.name,
            c.optional,
            cluster.config_maps.get(&c.name),
        ),
        (None, Some(s)) => (
            "secret",
            "secret",
            &s.name,
            s.optional,
            cluster.secrets.get(&s.name),
        ),
        (None, None) => return Ok(()),
    };
    let optional = optional.unwrap_or(false);
    let data = match lookup {
        _ if !cluster.connected => {
            if optional {
                return Ok(());
            }
            return Err(EnvError::NeedsApi {
                name: "envFrom".into(),
                what,
                source_name: name.clone(),
            });
        }
        Some(Lookup::Found(data)) => data,
        Some(Lookup::NotFound) | None if optional => return Ok(()),
        Some(Lookup::NotFound) | None => {
            return Err(EnvError::NotFound {
                kind,
                name: name.clone(),
            });
        }
        Some(Lookup::Failed(reason)) => {
            return Err(EnvError::Read {
                kind,
                namespace: namespace.to_owned(),
                name: name.clone(),
                reason: reason.clone(),
            });
        }
    };
    let prefix = from.prefix.as_deref().unwrap_or_default();
    let mut invalid = Vec::new();
    for (key, value) in data {
        let var = format!("{prefix}{key}");
        if !is_env_var_name(&var) {
            invalid.push(var);
            continue;
        }
        if !env.set(&var, value.clone()) {
            return Err(too_large(container, format!("envFrom[{index}]")));
        }
    }
    if !invalid.is_empty() {
        invalid.sort();
        tracing::warn!(
            pod = %crate::pod::format_pod(pod),
            reason = "InvalidEnvironmentVariableNames",
            "Keys [{}] from the EnvFrom {what} {namespace}/{name} were skipped since they are \
             considered invalid environment variable names.",
            invalid.iter().map(|k| k.escape_debug().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
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

fn too_large(container: &Container, field: String) -> EnvError {
    EnvError::TooLarge {
        container: container.name.clone(),
        field,
        limit: MAX_EXPANDED_BYTES,
    }
}

/// One `env` entry's value; `None` for an optional reference to what does not exist.
fn value_of(
    pod: &Pod,
    container: &Container,
    var: &EnvVar,
    ctx: &EnvContext<'_>,
    cluster: &ClusterValues,
    env: &EnvList,
    services: &HashMap<&str, &str>,
) -> Result<Option<String>, EnvError> {
    let literal = var.value.as_deref().unwrap_or_default();
    // Upstream looks at a non-empty value first; the API server allows only one of the two.
    let from = match &var.value_from {
        Some(from) if literal.is_empty() => from,
        _ => {
            let lookup = |name: &str| env.get(name).or_else(|| services.get(name).copied());
            return expand_with(literal, &lookup, env.room())
                .map(Some)
                .map_err(|_| too_long(container, format!("env {}", var.name)));
        }
    };
    if let Some(field) = &from.field_ref {
        return field_value(pod, &var.name, &field.field_path, ctx).map(Some);
    }
    if let Some(resource) = &from.resource_field_ref {
        let divisor = resource.divisor.as_ref().map(|d| d.0.as_str());
        return resource_value(container, &var.name, &resource.resource, divisor, ctx).map(Some);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let (what, kind, api_kind, name, key, optional, lookup) =
        match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(c), _) => (
                "configMap",
                "configmap",
                "ConfigMap",
                &c.name,
                &c.key,
                c.optional,
                cluster.config_maps.get(&c.name),
            ),
            (None, Some(s)) => (
                "secret",
                "secret",
                "Secret",
                &s.name,
                &s.key,
                s.optional,
                cluster.secrets.get(&s.name),
            ),
            (None, None) => return Ok(None),
        };
    let optional = optional.unwrap_or(false);
    if !cluster.connected {
        if optional {
            return Ok(None);
        }
        return Err(EnvError::NeedsApi {
            name: var.name.clone(),
            what,
            source_name: name.clone(),
        });
    }
    let data = match lookup {
        Some(Lookup::Found(data)) => data,
        Some(Lookup::NotFound) | None if optional => return Ok(None),
        Some(Lookup::NotFound) | None => {
            return Err(EnvError::NotFound {
                kind,
                name: name.clone(),
            });
        }
        Some(Lookup::Failed(reason)) => {
            return Err(EnvError::Read {
                kind,
                namespace: namespace.to_owned(),
                name: name.clone(),
                reason: reason.clone(),
            });
        }
    };
    match data.get(key) {
        Some(value) => Ok(Some(value.clone())),
        None if optional => Ok(None),
        None => Err(EnvError::MissingKey {
            key: key.clone(),
            kind: api_kind,
            namespace: namespace.to_owned(),
            name: name.clone(),
        }),
    }
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
    expand_with(
        input,
        &|name| defined.get(name).map(String::as_str),
        MAX_EXPANDED_BYTES,
    )
}

/// [`expand`] with the variables `lookup` finds, at most `limit` bytes coming out.
fn expand_with<'v>(
    input: &str,
    lookup: &dyn Fn(&str) -> Option<&'v str>,
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
                    match lookup(name) {
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
    let defined: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lookup = |name: &str| defined.get(name).copied();
    let used: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut budget = MAX_EXPANDED_BYTES.saturating_sub(used);
    let mut each = |list: &Option<Vec<String>>, field: &str| {
        list.iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| {
                let expanded = expand_with(s, &lookup, budget)
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
mod tests;
