//! Validation of a static pod after its defaults: the subset of the API server's pod validation the
//! node depends on, with upstream's field paths and wording (`spec.containers[0].image: Required
//! value`), plus the static-pod rule that a pod read from disk may not reference API objects.
//! Upstream: `pkg/apis/core/validation/validation.go` (`ValidatePodCreate`) and
//! `pkg/api/pod/util.go` (`HasAPIObjectReference`, in `api_references.rs`).
//!
//! Also [`validate_pod_identity`]: what names the pod's directories and files on the node (its
//! UID, name, namespace, container and volume names), checked for every pod, static or from the
//! API server, before any path is built from it — nothing like `../..` or `/` ever reaches one.
//! The API server's own validation makes UIDs UUIDs; a static manifest may set any
//! `metadata.uid`, so upstream's kubelet took it as written.
//!
//! `dns.rs` — the pod's `dnsConfig` (`validatePodDNSConfig`).
//!
//! Not here: scheduling, security-context or volume-source details the API server also checks.

use std::{collections::HashSet, fmt};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};

use super::api_references::api_references;
use crate::cm::quantity::Quantity;

/// One problem, as upstream's `field.Error` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid {
        value: String,
        detail: String,
    },
    Duplicate {
        value: String,
    },
    NotSupported {
        value: String,
        supported: &'static [&'static str],
    },
    NotFound {
        value: String,
    },
    Forbidden {
        detail: String,
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = &self.field;
        match &self.kind {
            FieldErrorKind::Required => write!(f, "{field}: Required value"),
            FieldErrorKind::Invalid { value, detail } => {
                write!(f, "{field}: Invalid value: {value:?}: {detail}")
            }
            FieldErrorKind::Duplicate { value } => write!(f, "{field}: Duplicate value: {value:?}"),
            FieldErrorKind::NotSupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                write!(
                    f,
                    "{field}: Unsupported value: {value:?}: supported values: {}",
                    list.join(", ")
                )
            }
            FieldErrorKind::NotFound { value } => write!(f, "{field}: Not found: {value:?}"),
            FieldErrorKind::Forbidden { detail } => write!(f, "{field}: Forbidden: {detail}"),
        }
    }
}

/// Every problem found in one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}

const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const SUBDOMAIN_DETAIL: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const LABEL_DETAIL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";

#[derive(Default)]
pub(super) struct Errors(Vec<FieldError>);

impl Errors {
    pub(super) fn push(&mut self, field: impl Into<String>, kind: FieldErrorKind) {
        self.0.push(FieldError {
            field: field.into(),
            kind,
        });
    }

    fn invalid(&mut self, field: impl Into<String>, value: &str, detail: impl Into<String>) {
        self.push(
            field,
            FieldErrorKind::Invalid {
                value: value.to_owned(),
                detail: detail.into(),
            },
        );
    }

    fn one_of(
        &mut self,
        field: impl Into<String>,
        value: Option<&str>,
        supported: &'static [&'static str],
    ) {
        if let Some(value) = value
            && !supported.contains(&value)
        {
            self.push(
                field,
                FieldErrorKind::NotSupported {
                    value: value.to_owned(),
                    supported,
                },
            );
        }
    }
}

/// What a UID may be: it names `<rootDir>/pods/<uid>` and the pod's log directory.
const UID_DETAIL: &str = "must consist of alphanumeric characters, '-', '_' or '.', start with an alphanumeric character and be at most 128 characters long (it names the pod's directories on the node)";
const MAX_UID_LEN: usize = 128;

/// Whether `uid` is one path component swiftlet may build paths from.
pub fn is_valid_uid(uid: &str) -> bool {
    uid.len() <= MAX_UID_LEN
        && uid
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks what names the pod's paths on the node: `metadata.uid`, `metadata.name`,
/// `metadata.namespace`, and every container's and volume's name (each a DNS label, as the API
/// server requires).
pub fn validate_pod_identity(pod: &Pod) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    identity(pod, &mut errs);
    if let Some(spec) = &pod.spec {
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| (format!("spec.initContainers[{i}].name"), c.name.as_str()))
            .chain(
                spec.containers
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (format!("spec.containers[{i}].name"), c.name.as_str())),
            )
            .chain(
                spec.ephemeral_containers
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, c)| {
                        (
                            format!("spec.ephemeralContainers[{i}].name"),
                            c.name.as_str(),
                        )
                    }),
            );
        let volumes = spec
            .volumes
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| (format!("spec.volumes[{i}].name"), v.name.as_str()));
        for (field, name) in containers.chain(volumes) {
            if !is_dns1123_label(name) {
                errs.invalid(field, name, LABEL_DETAIL);
            }
        }
    }
    if errs.0.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errs.0))
    }
}

/// UID, name and namespace.
fn identity(pod: &Pod, errs: &mut Errors) {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        errs.push("metadata.uid", FieldErrorKind::Required);
    } else if !is_valid_uid(uid) {
        errs.invalid("metadata.uid", uid, UID_DETAIL);
    }
    name_and_namespace(pod, errs);
}

/// The name (a DNS-1123 subdomain) and the namespace (a DNS-1123 label).
fn name_and_namespace(pod: &Pod, errs: &mut Errors) {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if name.len() > 253 {
        errs.invalid("metadata.name", name, "must be no more than 253 characters");
    } else if !is_dns1123_subdomain(name) {
        errs.invalid("metadata.name", name, SUBDOMAIN_DETAIL);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if !is_dns1123_label(namespace) {
        errs.invalid("metadata.namespace", namespace, LABEL_DETAIL);
    }
}

/// Validates a defaulted static pod.
pub fn validate_static_pod(pod: &Pod) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !uid.is_empty() && !is_valid_uid(uid) {
        errs.invalid("metadata.uid", uid, UID_DETAIL);
    }
    name_and_namespace(pod, &mut errs);
    match &pod.spec {
        None => errs.push("spec", FieldErrorKind::Required),
        Some(spec) => {
            validate_spec(spec, &mut errs);
            api_references(spec, &mut errs);
        }
    }
    if errs.0.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errs.0))
    }
}

fn validate_spec(spec: &PodSpec, errs: &mut Errors) {
    errs.one_of(
        "spec.restartPolicy",
        spec.restart_policy.as_deref(),
        RESTART_POLICIES,
    );
    errs.one_of("spec.dnsPolicy", spec.dns_policy.as_deref(), DNS_POLICIES);
    dns::validate_dns_config(spec, errs);
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        errs.push(
            "spec.ephemeralContainers",
            FieldErrorKind::Forbidden {
                detail: "cannot be set on create".to_owned(),
            },
        );
    }

    let mut volumes = HashSet::new();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}].name");
        if volume.name.is_empty() {
            errs.push(field, FieldErrorKind::Required);
        } else if !is_dns1123_label(&volume.name) {
            errs.invalid(field, &volume.name, LABEL_DETAIL);
        } else if !volumes.insert(volume.name.as_str()) {
            errs.push(
                field,
                FieldErrorKind::Duplicate {
                    value: volume.name.clone(),
                },
            );
        }
    }

    if spec.containers.is_empty() {
        errs.push("spec.containers", FieldErrorKind::Required);
    }
    // Names are unique across init and regular containers.
    let mut names = HashSet::new();
    let init = spec.init_containers.iter().flatten().enumerate();
    let init = init.map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let regular = spec.containers.iter().enumerate();
    let regular = regular.map(|(i, c)| (format!("spec.containers[{i}]"), c));
    for (path, container) in init.chain(regular) {
        validate_container(&path, container, &volumes, &mut names, errs);
    }
}

fn validate_container<'a>(
    path: &str,
    c: &'a Container,
    volumes: &HashSet<&str>,
    names: &mut HashSet<&'a str>,
    errs: &mut Errors,
) {
    if c.name.is_empty() {
        errs.push(format!("{path}.name"), FieldErrorKind::Required);
    } else if !is_dns1123_label(&c.name) {
        errs.invalid(format!("{path}.name"), &c.name, LABEL_DETAIL);
    } else if !names.insert(c.name.as_str()) {
        errs.push(
            format!("{path}.name"),
            FieldErrorKind::Duplicate {
                value: c.name.clone(),
            },
        );
    }
    match c.image.as_deref() {
        None | Some("") => errs.push(format!("{path}.image"), FieldErrorKind::Required),
        Some(image) if image.trim() != image => errs.invalid(
            format!("{path}.image"),
            image,
            "must not have leading or trailing whitespace",
        ),
        Some(_) => {}
    }
    errs.one_of(
        format!("{path}.imagePullPolicy"),
        c.image_pull_policy.as_deref(),
        PULL_POLICIES,
    );
    for (i, port) in c.ports.iter().flatten().enumerate() {
        let field = format!("{path}.ports[{i}]");
        if !(1..=65535).contains(&port.container_port) {
            let value = port.container_port.to_string();
            errs.invalid(
                format!("{field}.containerPort"),
                &value,
                "must be between 1 and 65535, inclusive",
            );
        }
        if let Some(host_port) = port.host_port
            && host_port != 0
            && !(1..=65535).contains(&host_port)
        {
            let value = host_port.to_string();
            errs.invalid(
                format!("{field}.hostPort"),
                &value,
                "must be between 1 and 65535, inclusive",
            );
        }
        errs.one_of(
            format!("{field}.protocol"),
            port.protocol.as_deref(),
            PROTOCOLS,
        );
    }
    for (i, mount) in c.volume_mounts.iter().flatten().enumerate() {
        let field = format!("{path}.volumeMounts[{i}]");
        if !volumes.contains(mount.name.as_str()) {
            errs.push(
                format!("{field}.name"),
                FieldErrorKind::NotFound {
                    value: mount.name.clone(),
                },
            );
        }
        if mount.mount_path.is_empty() {
            errs.push(format!("{field}.mountPath"), FieldErrorKind::Required);
        }
    }
    if let Some(resources) = &c.resources {
        validate_resources(&format!("{path}.resources"), resources, errs);
    }
}

fn validate_resources(path: &str, r: &ResourceRequirements, errs: &mut Errors) {
    let mut parsed = |kind: &str,
                      list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        let mut values = Vec::new();
        for (name, quantity) in list.into_iter().flatten() {
            let field = format!("{path}.{kind}[{name}]");
            if !is_resource_name(name) {
                errs.invalid(
                    field.clone(),
                    name,
                    "must be a standard resource type or fully qualified",
                );
            }
            match Quantity::parse(&quantity.0).map(|q| q.nanos()) {
                Err(e) => errs.invalid(field, &quantity.0, e.to_string()),
                Ok(v) if v < 0 => {
                    errs.invalid(field, &quantity.0, "must be greater than or equal to 0")
                }
                Ok(v) => values.push((name.clone(), v)),
            }
        }
        values
    };
    let limits = parsed("limits", r.limits.as_ref());
    let requests = parsed("requests", r.requests.as_ref());
    for (name, request) in &requests {
        if let Some((_, limit)) = limits.iter().find(|(n, _)| n == name)
            && request > limit
        {
            let value = r
                .requests
                .as_ref()
                .and_then(|q| q.get(name))
                .map(|q| q.0.clone())
                .unwrap_or_default();
            errs.invalid(
                format!("{path}.requests[{name}]"),
                &value,
                format!("must be less than or equal to {name} limit"),
            );
        }
    }
}

/// `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`, or an extended `domain/name`.
fn is_resource_name(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage")
        || name
            .strip_prefix("hugepages-")
            .is_some_and(|size| Quantity::parse(size).is_ok())
        || name.split_once('/').is_some_and(|(domain, rest)| {
            is_dns1123_subdomain(domain)
                && !rest.is_empty()
                && rest.len() <= 63
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
}

/// Lowercase alphanumerics and '-', starting and ending alphanumeric (no length limit).
fn is_dns_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_dns_part(s)
}

/// Upstream's subdomain regex limits the whole name to 253 characters, not each part to 63.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_part)
}

mod dns;

#[cfg(test)]
mod tests;
