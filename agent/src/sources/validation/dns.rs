//! A static pod's `dnsConfig`, as the API server validates an API pod's (upstream
//! `validatePodDNSConfig` in `pkg/apis/core/validation/validation.go`, with the limits of
//! `ExpandedDNSConfig`): `dnsPolicy: None` needs a `dnsConfig` with a nameserver; at most three
//! nameservers, each an IP; at most 32 search paths, 2048 characters of search line, each path a
//! DNS subdomain (a trailing dot allowed); every option named.

use k8s_openapi::api::core::v1::PodSpec;

use super::{Errors, FieldErrorKind, SUBDOMAIN_DETAIL, is_dns1123_subdomain};
use crate::kuberuntime::dns::{
    MAX_DNS_NAMESERVERS, MAX_DNS_SEARCH_LIST_CHARS, MAX_DNS_SEARCH_PATHS,
};

pub(super) fn validate_dns_config(spec: &PodSpec, errs: &mut Errors) {
    let config = spec.dns_config.as_ref();
    if spec.dns_policy.as_deref() == Some("None") {
        match config {
            None => return errs.push("spec.dnsConfig", FieldErrorKind::Required),
            Some(c) if c.nameservers.as_ref().is_none_or(Vec::is_empty) => {
                return errs.push("spec.dnsConfig.nameservers", FieldErrorKind::Required);
            }
            Some(_) => {}
        }
    }
    let Some(config) = config else {
        return;
    };
    let nameservers = config.nameservers.as_deref().unwrap_or_default();
    if nameservers.len() > MAX_DNS_NAMESERVERS {
        errs.invalid(
            "spec.dnsConfig.nameservers",
            &nameservers.join(" "),
            format!("must not have more than {MAX_DNS_NAMESERVERS} nameservers"),
        );
    }
    for (i, server) in nameservers.iter().enumerate() {
        if server.parse::<std::net::IpAddr>().is_err() {
            errs.invalid(
                format!("spec.dnsConfig.nameservers[{i}]"),
                server,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            );
        }
    }
    let searches = config.searches.as_deref().unwrap_or_default();
    if searches.len() > MAX_DNS_SEARCH_PATHS {
        errs.invalid(
            "spec.dnsConfig.searches",
            &searches.join(" "),
            format!("must not have more than {MAX_DNS_SEARCH_PATHS} search paths"),
        );
    }
    let line = searches.join(" ");
    if line.len() > MAX_DNS_SEARCH_LIST_CHARS {
        errs.invalid(
            "spec.dnsConfig.searches",
            &line,
            format!(
                "must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters (including \
                 spaces) in the search list"
            ),
        );
    }
    for (i, search) in searches.iter().enumerate() {
        let trimmed = search.strip_suffix('.').unwrap_or(search);
        if !is_dns1123_subdomain(trimmed) {
            errs.invalid(
                format!("spec.dnsConfig.searches[{i}]"),
                trimmed,
                SUBDOMAIN_DETAIL,
            );
        }
    }
    for (i, option) in config.options.iter().flatten().enumerate() {
        if option.name.as_deref().is_none_or(str::is_empty) {
            errs.push(
                format!("spec.dnsConfig.options[{i}]"),
                FieldErrorKind::Required,
            );
        }
    }
}
