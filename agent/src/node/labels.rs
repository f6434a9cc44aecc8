//! Label syntax and the labels a node registers with. The syntax is apimachinery's
//! (`util/validation`: `IsQualifiedName`, `IsValidLabelValue`, `IsDNS1123Subdomain`, with their
//! wording); which labels a kubelet may set on its own Node is the kubelet's
//! (`pkg/kubelet/apis/well_known_labels.go` `IsKubeletLabel`, `cmd/kubelet/app/options`
//! `ValidateKubeletFlags`/`isKubernetesLabel`); the well-known labels every Node gets are those
//! of `initialNode` in `kubelet_node_status.go`, and `updateDefaultLabels` names the ones kept
//! current on a Node that already exists.
//!
//! Not here: reading the flag (`config`), label selectors (admission).

use std::collections::BTreeMap;

pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const LABEL_OS: &str = "kubernetes.io/os";
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// Upstream still sets the deprecated beta labels next to the stable ones.
pub const LABEL_BETA_OS: &str = "beta.kubernetes.io/os";
pub const LABEL_BETA_ARCH: &str = "beta.kubernetes.io/arch";

/// The operating system every swiftlet node runs (Go's `GOOS`).
pub const OS: &str = "linux";

/// Upstream `kubeletLabels`: the `kubernetes.io` labels a kubelet may set on its Node.
const KUBELET_LABELS: [&str; 11] = [
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    LABEL_BETA_OS,
    LABEL_BETA_ARCH,
];

/// Upstream `kubeletLabelNamespaces`: label namespaces (and their subdomains) a kubelet may use.
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Upstream `updateDefaultLabels`' list: the labels reconciled onto a Node that already exists
/// (every other label of the initial Node, `--node-labels` included, is set only on creation).
pub const DEFAULT_LABELS: [&str; 12] = [
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    "node.kubernetes.io/windows-build",
    LABEL_BETA_OS,
    LABEL_BETA_ARCH,
];

/// Upstream's `qualifiedNameErrMsg`.
const QUALIFIED_NAME_SHAPE: &str = "must consist of alphanumeric characters, '-', '_' or '.', \
     and must start and end with an alphanumeric character";
/// Upstream `qualifiedNameMaxLength` and `LabelValueMaxLength`.
const NAME_MAX: usize = 63;
/// Upstream `DNS1123SubdomainMaxLength`.
const SUBDOMAIN_MAX: usize = 253;

/// The well-known labels of `initialNode`, then `extra` (`--node-labels`) over them: upstream
/// lets a `--node-labels` entry replace a default one (with a log line).
pub fn node_labels(
    hostname: &str,
    arch: &str,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        (LABEL_HOSTNAME, hostname),
        (LABEL_OS, OS),
        (LABEL_ARCH, arch),
        (LABEL_BETA_OS, OS),
        (LABEL_BETA_ARCH, arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (key, value) in extra {
        if let Some(default) = labels.insert(key.clone(), value.clone()) {
            tracing::info!(
                label = key,
                value,
                default,
                "the node label overrides the default"
            );
        }
    }
    labels
}

/// What is wrong with one `--node-labels` entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeLabelError {
    /// Upstream's message for labels a kubelet may not set on itself.
    #[error(
        "unknown 'kubernetes.io' or 'k8s.io' label {key:?}: labels in the 'kubernetes.io' \
         namespace must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) \
         or be in the specifically allowed set (beta.kubernetes.io/arch, \
         beta.kubernetes.io/instance-type, beta.kubernetes.io/os, \
         failure-domain.beta.kubernetes.io/region, failure-domain.beta.kubernetes.io/zone, \
         kubernetes.io/arch, kubernetes.io/hostname, kubernetes.io/os, \
         node.kubernetes.io/instance-type, topology.kubernetes.io/region, \
         topology.kubernetes.io/zone)"
    )]
    NotAKubeletLabel { key: String },
    #[error("invalid label key {key:?}: {}", reasons.join("; "))]
    Key { key: String, reasons: Vec<String> },
    #[error("invalid label value {value:?} of {key:?}: {}", reasons.join("; "))]
    Value {
        key: String,
        value: String,
        reasons: Vec<String>,
    },
}

/// Upstream `ValidateKubeletFlags` for one `--node-labels` entry: a `kubernetes.io`/`k8s.io`
/// label only if the kubelet may set it (so `node-role.kubernetes.io/*` is refused), and a
/// qualified key with a valid value.
pub fn validate_node_label(key: &str, value: &str) -> Result<(), NodeLabelError> {
    if is_kubernetes_label(key) && !is_kubelet_label(key) {
        return Err(NodeLabelError::NotAKubeletLabel {
            key: key.to_owned(),
        });
    }
    let reasons = qualified_name_errors(key);
    if !reasons.is_empty() {
        return Err(NodeLabelError::Key {
            key: key.to_owned(),
            reasons,
        });
    }
    let reasons = label_value_errors(value);
    if !reasons.is_empty() {
        return Err(NodeLabelError::Value {
            key: key.to_owned(),
            value: value.to_owned(),
            reasons,
        });
    }
    Ok(())
}

/// The part before the `/`, if any (upstream `getLabelNamespace`).
fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(namespace, _)| namespace)
}

/// Upstream `isKubernetesLabel`: in `kubernetes.io` or `k8s.io`, or a subdomain of either.
pub fn is_kubernetes_label(key: &str) -> bool {
    let namespace = label_namespace(key);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| namespace == *d || namespace.ends_with(&format!(".{d}")))
}

/// Upstream `IsKubeletLabel`: one of the allowed labels, or in an allowed namespace.
pub fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let namespace = label_namespace(key);
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|allowed| namespace == *allowed || namespace.ends_with(&format!(".{allowed}")))
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?` (upstream `qualifiedNameFmt`).
fn is_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Upstream `IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= SUBDOMAIN_MAX
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Upstream `IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63
/// characters of the name shape. Empty when valid.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let name = match value.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else if !is_dns1123_subdomain(prefix) {
                errors.push(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                     alphanumeric characters, '-' or '.', and must start and end with an \
                     alphanumeric character"
                        .to_owned(),
                );
            }
            *name
        }
        _ => {
            errors.push(format!(
                "a qualified name {QUALIFIED_NAME_SHAPE} with an optional DNS subdomain prefix \
                 and '/' (e.g. 'example.com/MyName')"
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > NAME_MAX {
        errors.push(format!(
            "name part must be no more than {NAME_MAX} characters"
        ));
    }
    if !is_name(name) {
        errors.push(format!("name part {QUALIFIED_NAME_SHAPE}"));
    }
    errors
}

/// Upstream `IsValidLabelValue`: empty, or at most 63 characters of the name shape. Empty when
/// valid.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > NAME_MAX {
        errors.push(format!("must be no more than {NAME_MAX} characters"));
    }
    if !value.is_empty() && !is_name(value) {
        errors.push(format!(
            "a valid label must be an empty string or {}",
            QUALIFIED_NAME_SHAPE.trim_start_matches("must ")
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_labels_as_upstream_allows_them() {
        for allowed in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/pool",
            "a.node.kubernetes.io/x",
            "kubelet.kubernetes.io/thing",
            "topology.kubernetes.io/zone",
            "example.com/disk",
            "disk",
        ] {
            assert_eq!(validate_node_label(allowed, "v"), Ok(()), "{allowed}");
        }
        for refused in [
            "node-role.kubernetes.io/master",
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "k8s.io/anything",
            "sub.k8s.io/x",
            "node-restriction.kubernetes.io/x",
        ] {
            assert!(
                matches!(
                    validate_node_label(refused, "v"),
                    Err(NodeLabelError::NotAKubeletLabel { .. })
                ),
                "{refused}"
            );
        }
        // Not Kubernetes namespaces, though they end alike.
        assert!(!is_kubernetes_label("notkubernetes.io/x"));
        assert!(is_kubernetes_label("x.kubernetes.io/y"));
    }

    #[test]
    fn label_syntax_as_apimachinery_checks_it() {
        assert!(qualified_name_errors("example.com/My_Name-1").is_empty());
        assert!(!qualified_name_errors("/name").is_empty());
        assert!(!qualified_name_errors("Example.com/name").is_empty());
        assert!(!qualified_name_errors("a/b/c").is_empty());
        assert!(!qualified_name_errors("-name").is_empty());
        assert!(!qualified_name_errors(&"n".repeat(64)).is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(label_value_errors("ssd_1.2-x").is_empty());
        assert!(!label_value_errors("bad value").is_empty());
        assert!(!label_value_errors(&"v".repeat(64)).is_empty());
        let error = validate_node_label("disk", "-ssd")
            .err()
            .map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("\"-ssd\"") && e.contains("\"disk\"")),
            "{error:?}"
        );
    }

    #[test]
    fn node_labels_are_the_well_known_ones_then_the_flags() {
        let extra: BTreeMap<String, String> = [
            ("node.kubernetes.io/pool", "a"),
            (LABEL_HOSTNAME, "renamed"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let labels = node_labels("n1", "amd64", &extra);
        assert_eq!(labels.get(LABEL_OS).map(String::as_str), Some("linux"));
        assert_eq!(
            labels.get(LABEL_BETA_ARCH).map(String::as_str),
            Some("amd64")
        );
        assert_eq!(
            labels.get(LABEL_HOSTNAME).map(String::as_str),
            Some("renamed")
        );
        assert_eq!(
            labels.get("node.kubernetes.io/pool").map(String::as_str),
            Some("a")
        );
        assert_eq!(labels.len(), 6);
    }
}
