//! CertificateSigningRequests (`certificates.k8s.io/v1`): what create and the three update
//! paths (the object, `/status`, `/approval`) may change, their validation, the kubelet CSR
//! checks, and the csrapproving controller's decision.
//!
//! Upstream: `pkg/registry/certificates/certificates/strategy.go` (create records the
//! requester in `spec.username/uid/groups/extra` and clears the status; the object's update
//! changes neither spec nor status; `/status` keeps the Approved/Denied conditions, `/approval`
//! changes only them; new conditions get their timestamps), `pkg/apis/certificates/validation`
//! (the request a PEM `CERTIFICATE REQUEST`, `signerName` and `usages` required,
//! `expirationSeconds` ≥ 600, Approved and Denied exclusive, neither removable, a certificate
//! not replaceable), `pkg/apis/certificates/helpers.go` (`ValidateKubeletClientCSR`,
//! `ValidateKubeletServingCSR`) and `pkg/controller/certificates/approver/sarapprove.go`
//! (`selfnodeclient`, then `nodeclient`, each after a SubjectAccessReview, modelled here by
//! kubeadm's bindings: `system:nodes` may `selfnodeclient`, `system:bootstrappers` may
//! `nodeclient`, `system:masters` both).
//! <https://kubernetes.io/docs/reference/access-authn-authz/certificate-signing-requests/>

use std::collections::BTreeSet;

use k8s_openapi::{ByteString, api::certificates::v1::CertificateSigningRequest};
use rustls_pki_types::{CertificateSigningRequestDer, pem::PemObject};
use serde_json::{Value, json};
use x509_parser::{
    certification_request::X509CertificationRequest, extensions::GeneralName,
    extensions::ParsedExtension, prelude::FromDer,
};

use super::{
    authn::{BOOTSTRAPPERS_GROUP, MASTERS_GROUP, NODES_GROUP, User},
    meta::{meta_str, rfc3339},
    resources::Resource,
    status::{ApiError, ApiResult},
};

pub const KIND: &str = "CertificateSigningRequest";
pub const CLIENT_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The shortest `spec.expirationSeconds` accepted.
pub const MIN_EXPIRATION_SECONDS: i32 = 600;

/// Which path an update came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    Approval,
}

/// The parsed request's parts the kubelet checks look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: usize,
    pub ip_addresses: usize,
    pub emails: usize,
    pub uris: usize,
}

/// The CSR's DER, from `spec.request` (PEM): `ParseCSR`, with the signature checked.
pub fn parse_request(pem: &[u8]) -> Result<(Vec<u8>, Request), String> {
    let der = CertificateSigningRequestDer::from_pem_slice(pem)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_owned())?;
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref())
        .map_err(|e| format!("the certificate request does not parse: {e}"))?;
    csr.verify_signature()
        .map_err(|e| format!("the certificate request's signature does not verify: {e}"))?;
    let subject = &csr.certification_request_info.subject;
    let mut request = Request {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned(),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect(),
        ..Request::default()
    };
    for extension in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(_) => request.dns_names += 1,
                    GeneralName::IPAddress(_) => request.ip_addresses += 1,
                    GeneralName::RFC822Name(_) => request.emails += 1,
                    GeneralName::URI(_) => request.uris += 1,
                    _ => {}
                }
            }
        }
    }
    Ok((der.as_ref().to_vec(), request))
}

fn usage_set(usages: &[String]) -> BTreeSet<&str> {
    usages.iter().map(String::as_str).collect()
}

fn usages_match(usages: &[String], auth: &str) -> bool {
    let have = usage_set(usages);
    let with_rsa: BTreeSet<&str> = ["digital signature", "key encipherment", auth].into();
    let without: BTreeSet<&str> = ["digital signature", auth].into();
    have == with_rsa || have == without
}

/// `ValidateKubeletClientCSR`.
pub fn validate_kubelet_client(request: &Request, usages: &[String]) -> Result<(), String> {
    if request.organizations != [NODES_GROUP] {
        return Err("subject organization is not system:nodes".to_owned());
    }
    for (count, kind) in [
        (request.dns_names, "DNS"),
        (request.emails, "Email"),
        (request.ip_addresses, "IP"),
        (request.uris, "URI"),
    ] {
        if count > 0 {
            return Err(format!("{kind} subjectAltNames are not allowed"));
        }
    }
    if !request.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".to_owned());
    }
    if !usages_match(usages, "client auth") {
        return Err(
            "usages did not match [client auth digital signature key encipherment]".to_owned(),
        );
    }
    Ok(())
}

/// `ValidateKubeletServingCSR`.
pub fn validate_kubelet_serving(request: &Request, usages: &[String]) -> Result<(), String> {
    if request.organizations != [NODES_GROUP] {
        return Err("subject organization is not system:nodes".to_owned());
    }
    if request.dns_names == 0 && request.ip_addresses == 0 {
        return Err("DNS or IP subjectAltName is required".to_owned());
    }
    if request.emails > 0 {
        return Err("Email subjectAltNames are not allowed".to_owned());
    }
    if request.uris > 0 {
        return Err("URI subjectAltNames are not allowed".to_owned());
    }
    if !usages_match(usages, "server auth") {
        return Err(
            "usages did not match [digital signature key encipherment server auth]".to_owned(),
        );
    }
    if !request.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".to_owned());
    }
    Ok(())
}

/// The typed view of a stored CSR (the store keeps JSON).
pub fn typed(object: &Value) -> ApiResult<CertificateSigningRequest> {
    serde_json::from_value(object.clone()).map_err(|e| {
        ApiError::bad_request(format!("the body is not a CertificateSigningRequest: {e}"))
    })
}

/// `Validate` on create.
fn validate(resource: &Resource, object: &Value) -> ApiResult<()> {
    let name = meta_str(object, "name").unwrap_or_default();
    let csr = typed(object)?;
    let invalid = |why: String| ApiError::invalid(resource, name, &why);
    if let Err(why) = parse_request(&csr.spec.request.0) {
        return Err(invalid(format!(
            "spec.request: Invalid value: \"<request data>\": {why}"
        )));
    }
    if csr.spec.signer_name.is_empty() {
        return Err(invalid("spec.signerName: Required value".to_owned()));
    }
    if csr.spec.usages.as_ref().is_none_or(Vec::is_empty) {
        return Err(invalid("spec.usages: Required value".to_owned()));
    }
    if let Some(seconds) = csr.spec.expiration_seconds
        && seconds < MIN_EXPIRATION_SECONDS
    {
        return Err(invalid(format!(
            "spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 600 seconds (10 minutes)"
        )));
    }
    Ok(())
}

/// `PrepareForCreate` and `Validate`: the requester recorded, the status emptied.
pub fn prepare_create(resource: &Resource, mut object: Value, user: &User) -> ApiResult<Value> {
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        for field in ["username", "uid", "groups", "extra"] {
            spec.remove(field);
        }
        spec.insert("username".to_owned(), json!(user.name));
        if !user.uid.is_empty() {
            spec.insert("uid".to_owned(), json!(user.uid));
        }
        spec.insert("groups".to_owned(), json!(user.groups));
    }
    if let Some(map) = object.as_object_mut() {
        map.insert("status".to_owned(), json!({}));
    }
    validate(resource, &object)?;
    Ok(object)
}

fn conditions(object: &Value) -> Vec<Value> {
    object
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn condition_type(condition: &Value) -> &str {
    condition
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn is_approval(condition: &Value) -> bool {
    matches!(condition_type(condition), "Approved" | "Denied")
}

/// Whether a condition of `kind` is there with status True.
pub fn has_condition(object: &Value, kind: &str) -> bool {
    conditions(object).iter().any(|c| {
        condition_type(c) == kind && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

fn status_mut(object: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let map = object.as_object_mut()?;
    let status = map.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    status.as_object_mut()
}

/// The update strategies of the object and its two subresources, after the generic
/// [`super::strategy::prepare_update`] (`new` has the stored metadata rules applied).
pub fn prepare_update(
    resource: &Resource,
    part: Part,
    old: &Value,
    mut new: Value,
    now: i64,
) -> ApiResult<Value> {
    let name = meta_str(old, "name").unwrap_or_default().to_owned();
    let invalid = |why: &str| ApiError::invalid(resource, &name, why);
    if let Some(map) = new.as_object_mut() {
        map.insert(
            "spec".to_owned(),
            old.get("spec").cloned().unwrap_or_else(|| json!({})),
        );
    }
    // The spec cannot change, so neither does the generation the generic rules may have bumped.
    let generation = old
        .get("metadata")
        .and_then(|m| m.get("generation"))
        .cloned()
        .unwrap_or(Value::Null);
    super::meta::set_meta(&mut new, "generation", generation);
    let old_status = old.get("status").cloned().unwrap_or_else(|| json!({}));
    let merged: Vec<Value> = match part {
        Part::Main => {
            if let Some(map) = new.as_object_mut() {
                map.insert("status".to_owned(), old_status);
            }
            return Ok(new);
        }
        Part::Status => {
            let mut kept: Vec<Value> = conditions(old).into_iter().filter(is_approval).collect();
            kept.extend(conditions(&new).into_iter().filter(|c| !is_approval(c)));
            kept
        }
        Part::Approval => {
            let certificate = old_status.get("certificate").cloned();
            let mut kept: Vec<Value> = conditions(&new).into_iter().filter(is_approval).collect();
            kept.extend(conditions(old).into_iter().filter(|c| !is_approval(c)));
            if let Some(status) = status_mut(&mut new) {
                status.clear();
                if let Some(certificate) = certificate {
                    status.insert("certificate".to_owned(), certificate);
                }
            }
            kept
        }
    };
    let stamped = stamp(merged, &conditions(old), now);
    validate_conditions(old, &stamped).map_err(|why| invalid(&why))?;
    let old_certificate = old_status.get("certificate").cloned();
    if let Some(status) = status_mut(&mut new) {
        status.insert("conditions".to_owned(), Value::Array(stamped));
        let certificate = status.get("certificate").cloned();
        if old_certificate.is_some() && certificate != old_certificate {
            return Err(invalid(
                "status.certificate: Forbidden: updates may not modify existing certificate content",
            ));
        }
        if let Some(certificate) = certificate {
            validate_certificate(&certificate).map_err(|why| invalid(&why))?;
        }
    }
    Ok(new)
}

/// `populateConditionTimestamps`: a new or changed condition gets `lastUpdateTime` and, when its
/// status changed, `lastTransitionTime`.
fn stamp(mut conditions: Vec<Value>, old: &[Value], now: i64) -> Vec<Value> {
    for condition in &mut conditions {
        let before = old
            .iter()
            .find(|o| condition_type(o) == condition_type(condition));
        let Some(map) = condition.as_object_mut() else {
            continue;
        };
        map.entry("lastUpdateTime")
            .or_insert_with(|| json!(rfc3339(now)));
        let status = map.get("status").cloned();
        let transition = match before {
            Some(b) if b.get("status").cloned() == status => b.get("lastTransitionTime").cloned(),
            _ => None,
        };
        map.entry("lastTransitionTime")
            .or_insert_with(|| transition.unwrap_or_else(|| json!(rfc3339(now))));
    }
    conditions
}

fn validate_conditions(old: &Value, conditions: &[Value]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for (i, condition) in conditions.iter().enumerate() {
        let kind = condition_type(condition);
        if kind.is_empty() {
            return Err(format!("status.conditions[{i}].type: Required value"));
        }
        if matches!(kind, "Approved" | "Denied" | "Failed") && !seen.insert(kind) {
            return Err(format!(
                "status.conditions[{i}].type: Duplicate value: \"{kind}\""
            ));
        }
        if matches!(kind, "Approved" | "Denied")
            && condition.get("status").and_then(Value::as_str) != Some("True")
        {
            return Err(format!(
                "status.conditions[{i}].status: Unsupported value: only \"True\" is allowed for {kind}"
            ));
        }
    }
    if seen.contains("Approved") && seen.contains("Denied") {
        return Err(
            "status.conditions: Invalid value: Approved and Denied conditions are mutually exclusive"
                .to_owned(),
        );
    }
    for kind in ["Approved", "Denied"] {
        if has_condition(old, kind) && !seen.contains(kind) {
            return Err(format!(
                "status.conditions: Forbidden: updates may not remove a condition of type \"{kind}\""
            ));
        }
    }
    Ok(())
}

/// `status.certificate`: base64 of PEM `CERTIFICATE` blocks, at least one.
fn validate_certificate(value: &Value) -> Result<(), String> {
    let bad =
        |why: &str| format!("status.certificate: Invalid value: \"<certificate data>\": {why}");
    let bytes: ByteString =
        serde_json::from_value(value.clone()).map_err(|e| bad(&e.to_string()))?;
    let certificates: Vec<_> = rustls_pki_types::CertificateDer::pem_slice_iter(&bytes.0)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&e.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("must contain at least one CERTIFICATE PEM block"));
    }
    Ok(())
}

/// The csrapproving controller's verdict on a CSR: the condition to add, if any.
pub fn approval(object: &Value) -> Option<Value> {
    let csr = typed(object).ok()?;
    let status = csr.status.unwrap_or_default();
    if status.certificate.is_some()
        || has_condition(object, "Approved")
        || has_condition(object, "Denied")
    {
        return None;
    }
    let (_, request) = parse_request(&csr.spec.request.0).ok()?;
    let usages = csr.spec.usages.unwrap_or_default();
    if csr.spec.signer_name != CLIENT_KUBELET_SIGNER
        || validate_kubelet_client(&request, &usages).is_err()
    {
        return None;
    }
    let groups = csr.spec.groups.unwrap_or_default();
    let in_group = |g: &str| groups.iter().any(|have| have == g);
    let username = csr.spec.username.unwrap_or_default();
    // selfnodeclient first, as upstream's recognizers are ordered.
    let message =
        if username == request.common_name && (in_group(NODES_GROUP) || in_group(MASTERS_GROUP)) {
            "Auto approving self kubelet client certificate after SubjectAccessReview."
        } else if in_group(BOOTSTRAPPERS_GROUP) || in_group(MASTERS_GROUP) {
            "Auto approving kubelet client certificate after SubjectAccessReview."
        } else {
            return None;
        };
    Some(json!({
        "type": "Approved",
        "status": "True",
        "reason": "AutoApproved",
        "message": message,
    }))
}

/// `object` with `condition` added through the approval path's rules.
pub fn with_condition(object: &Value, condition: Value, now: i64) -> Value {
    let mut new = object.clone();
    let mut all = conditions(object);
    all.push(condition);
    let stamped = stamp(all, &conditions(object), now);
    if let Some(status) = status_mut(&mut new) {
        status.insert("conditions".to_owned(), Value::Array(stamped));
    }
    new
}

#[cfg(test)]
pub(crate) mod tests;
