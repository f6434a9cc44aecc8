//! Rules of the registration settings: `--node-labels` (flag only, as upstream), checked as
//! `ValidateKubeletFlags` checks them; `registerWithTaints` (`--register-with-taints`
//! `<key>=<value>:<effect>,...`, or the file's list of taints), parsed as `ParseTaints`;
//! `--node-ip` (flag only, as upstream), parsed as `ParseNodeIPArgument` but strictly (an item
//! that is not an IP is an error, where upstream logs and drops it). Each returns its value or a
//! [`ConfigError`] naming the flag or field and the bad entry. The rules themselves are in
//! `crate::node`, shared with registration and admission.
//!
//! Not here: whether `--node-ip` is one of the host's (checked at start, `app`), and
//! `nodeStatusReportFrequency`'s default (`load.rs`, it depends on `nodeStatusUpdateFrequency`).
//! Upstream: `cmd/kubelet/app/options/options.go`, `KubeletConfiguration.RegisterWithTaints`.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;

use super::{
    error::{ConfigError, Origin, invalid},
    input::{Input, map},
};
use crate::node::{addresses::parse_node_ips, labels::validate_node_label, taints};

type Resolved<T> = Result<Option<T>, ConfigError>;

/// A taint as the file writes it (upstream's `v1.Taint`; `timeAdded` is accepted and ignored,
/// as for taints the kubelet registers with).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileTaint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub effect: String,
    pub time_added: Option<String>,
}

/// `--node-labels key=value,...`: every entry checked; the flag repeatable, a later key
/// replacing an earlier one.
pub(super) fn node_labels(
    input: Input<Vec<String>, BTreeMap<String, String>>,
) -> Resolved<BTreeMap<String, String>> {
    let field = input.field;
    let Some(given) = map(
        input,
        "label",
        &['='],
        "expected <key>=<value>, e.g. node.kubernetes.io/pool=a",
    )?
    else {
        return Ok(None);
    };
    let mut labels = BTreeMap::new();
    for entry in given.entries {
        validate_node_label(&entry.key, &entry.value)
            .map_err(|why| invalid(&given.origin, field, "label", &entry.shown, why.to_string()))?;
        labels.insert(entry.key, entry.value);
    }
    Ok(Some(labels))
}

/// `--register-with-taints` (comma-separated, repeatable) over the file's `registerWithTaints`.
pub(super) fn register_with_taints(
    input: Input<Vec<String>, Vec<FileTaint>>,
) -> Resolved<Vec<Taint>> {
    if let Some((flag, name)) = input.flag
        && !flag.is_empty()
    {
        let specs: Vec<&str> = flag
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        return taints::parse_taints(&specs).map(Some).map_err(|why| {
            invalid(
                &Origin::Flag(name),
                input.field,
                "taint",
                specs.join(","),
                why.to_string(),
            )
        });
    }
    let Some(written) = input.file else {
        return Ok(None);
    };
    let mut parsed = Vec::new();
    for taint in written {
        taints::push_checked(&mut parsed, &taint.key, &taint.value, &taint.effect).map_err(
            |why| {
                invalid(
                    input.file_origin,
                    input.field,
                    "taint",
                    format!("{}={}:{}", taint.key, taint.value, taint.effect),
                    why.to_string(),
                )
            },
        )?;
    }
    Ok(Some(parsed))
}

/// `--node-ip IP[,IP]`: one address, or one per family; `0.0.0.0` or `::` alone asks for the
/// automatic choice with that family first.
pub(super) fn node_ips(input: Input<Vec<String>, Vec<String>>) -> Resolved<Vec<IpAddr>> {
    let Some((flag, name)) = input.flag.filter(|(flag, _)| !flag.is_empty()) else {
        return Ok(None);
    };
    let items: Vec<&str> = flag
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    parse_node_ips(&items).map(Some).map_err(|why| {
        invalid(
            &Origin::Flag(name),
            input.field,
            "address",
            items.join(","),
            why.to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag_input<'a, G>(
        value: &'a Vec<String>,
        name: &'static str,
        origin: &'a Origin,
    ) -> Input<'a, Vec<String>, G> {
        Input {
            field: "x",
            flag: Some((value, name)),
            file: None,
            file_origin: origin,
        }
    }

    #[test]
    fn node_labels_refuse_what_upstream_refuses() {
        let origin = Origin::Default;
        let good = vec![
            "node.kubernetes.io/pool=a,disk=ssd".to_owned(),
            "disk=nvme".to_owned(),
        ];
        let labels = node_labels(flag_input(&good, "--node-labels", &origin));
        assert_eq!(
            labels
                .ok()
                .flatten()
                .map(|l| l.into_iter().collect::<Vec<_>>()),
            Some(vec![
                ("disk".to_owned(), "nvme".to_owned()),
                ("node.kubernetes.io/pool".to_owned(), "a".to_owned()),
            ])
        );
        let role = vec!["node-role.kubernetes.io/worker=".to_owned()];
        let error = node_labels(flag_input(&role, "--node-labels", &origin))
            .err()
            .map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains("--node-labels")
                && e.contains("node-role.kubernetes.io/worker")
                && e.contains("unknown 'kubernetes.io' or 'k8s.io' label")),
            "{error:?}"
        );
        let bad = vec!["disk=a b".to_owned()];
        assert!(node_labels(flag_input(&bad, "--node-labels", &origin)).is_err());
    }

    #[test]
    fn taints_from_the_flag_or_the_file() {
        let origin = Origin::Default;
        let flag = vec!["a=1:NoExecute,b:NoSchedule".to_owned()];
        let parsed = register_with_taints(flag_input(&flag, "--register-with-taints", &origin));
        assert_eq!(parsed.ok().flatten().map(|t| t.len()), Some(2));
        let bad = vec!["a=1".to_owned()];
        let error = register_with_taints(flag_input(&bad, "--register-with-taints", &origin))
            .err()
            .map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("invalid taint spec: a=1")),
            "{error:?}"
        );
        let file = vec![FileTaint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        let none = Vec::new();
        let from_file = register_with_taints(Input {
            field: "registerWithTaints",
            flag: Some((&none, "--register-with-taints")),
            file: Some(&file),
            file_origin: &origin,
        });
        assert_eq!(
            from_file
                .ok()
                .flatten()
                .and_then(|t| t.first().cloned())
                .map(|t| t.key),
            Some("dedicated".to_owned())
        );
    }

    #[test]
    fn node_ips_one_per_family() {
        let origin = Origin::Default;
        let pair = vec!["10.0.0.1, fd00::1".to_owned()];
        assert_eq!(
            node_ips(flag_input(&pair, "--node-ip", &origin))
                .ok()
                .flatten()
                .map(|ips| ips.len()),
            Some(2)
        );
        let same = vec!["10.0.0.1,10.0.0.2".to_owned()];
        let error = node_ips(flag_input(&same, "--node-ip", &origin))
            .err()
            .map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(
                |e| e.contains("--node-ip") && e.contains("a single IP or a dual-stack pair")
            ),
            "{error:?}"
        );
    }
}
