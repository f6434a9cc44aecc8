//! The cluster CA as the csrsigning controller uses it: for an approved, unsigned, not failed
//! CSR of `kubernetes.io/kube-apiserver-client-kubelet` or `kubernetes.io/kubelet-serving`,
//! the signer's checks (a failure becomes a `Failed` condition, reason
//! `SignerValidationFailure`), then a certificate with the request's subject, SANs and key,
//! the key usages of `spec.usages`, a random 128-bit serial, no CA, `notBefore` backdated 5
//! minutes (never before the CA's own) and `notAfter` `now + ttl` (for a ttl under 8 hours,
//! else from the backdated start), capped at the CA's `notAfter`.
//!
//! Upstream: `pkg/controller/certificates/signer/signer.go` (`handle`, `sign`, `duration`:
//! `spec.expirationSeconds` honoured up to `--cluster-signing-duration`, at least 10 minutes)
//! and `pkg/controller/certificates/authority/{authority,policies}.go`
//! (`PermissiveSigningPolicy`). Test-only deviation: `--cluster-signing-duration` is the cap
//! even below upstream's 10-minute floor, so a test can watch a certificate of two minutes
//! expire. Other signers (`kube-apiserver-client`, `legacy-unknown`) are left unsigned.

use std::time::Duration;

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer};
use time::OffsetDateTime;

use super::csr::{self, CLIENT_KUBELET_SIGNER, KUBELET_SERVING_SIGNER};

/// How far `notBefore` is backdated.
const BACKDATE_SECONDS: i64 = 5 * 60;
/// Below this ttl `notAfter` is not backdated with `notBefore` (upstream `Short`).
const SHORT_SECONDS: i64 = 8 * 3600;
/// The shortest ttl upstream grants for an `expirationSeconds`.
const MIN_TTL_SECONDS: i64 = 10 * 60;

/// The signing CA: its certificate and key.
pub struct Ca {
    pub der: CertificateDer<'static>,
    pub not_before: i64,
    pub not_after: i64,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(der: CertificateDer<'static>, params: CertificateParams, key: KeyPair) -> Ca {
        Ca {
            der,
            not_before: params.not_before.unix_timestamp(),
            not_after: params.not_after.unix_timestamp(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

/// Why a CSR got no certificate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    /// The signer's checks failed: the CSR gets a `Failed` condition with this message.
    #[error("{0}")]
    Validation(String),
    /// Not this signer's request, or not signable now (unapproved, failed, signed).
    #[error("not for this signer")]
    NotOurs,
    #[error("failed to sign certificate: {0}")]
    Signing(String),
}

/// `signer.duration`: the requested lifetime within [10 min, `cap`], and `cap` wins below 10
/// minutes (the test-only deviation).
pub fn ttl_seconds(expiration_seconds: Option<i32>, cap: i64) -> i64 {
    let wanted = expiration_seconds.map_or(cap, |s| i64::from(s).clamp(MIN_TTL_SECONDS, i64::MAX));
    wanted.min(cap)
}

/// (notBefore, notAfter) of a certificate signed at `now` (`PermissiveSigningPolicy.apply`).
pub fn validity(ca: &Ca, now: i64, ttl: i64) -> Result<(i64, i64), SignError> {
    if now >= ca.not_after {
        return Err(SignError::Signing(
            "refusing to sign a certificate that expired in the past".to_owned(),
        ));
    }
    let not_before = (now - BACKDATE_SECONDS).max(ca.not_before);
    let not_after = if ttl < SHORT_SECONDS {
        now + ttl
    } else {
        not_before + ttl
    };
    Ok((not_before, not_after.min(ca.not_after)))
}

fn key_usages(
    usages: &[String],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), String> {
    let mut key = Vec::new();
    let mut extended = Vec::new();
    for usage in usages {
        match usage.as_str() {
            "signing" | "digital signature" => key.push(KeyUsagePurpose::DigitalSignature),
            "content commitment" => key.push(KeyUsagePurpose::ContentCommitment),
            "key encipherment" => key.push(KeyUsagePurpose::KeyEncipherment),
            "key agreement" => key.push(KeyUsagePurpose::KeyAgreement),
            "data encipherment" => key.push(KeyUsagePurpose::DataEncipherment),
            "cert sign" => key.push(KeyUsagePurpose::KeyCertSign),
            "crl sign" => key.push(KeyUsagePurpose::CrlSign),
            "encipher only" => key.push(KeyUsagePurpose::EncipherOnly),
            "decipher only" => key.push(KeyUsagePurpose::DecipherOnly),
            "any" => extended.push(ExtendedKeyUsagePurpose::Any),
            "server auth" => extended.push(ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => extended.push(ExtendedKeyUsagePurpose::ClientAuth),
            "code signing" => extended.push(ExtendedKeyUsagePurpose::CodeSigning),
            "email protection" | "s/mime" => {
                extended.push(ExtendedKeyUsagePurpose::EmailProtection);
            }
            "timestamping" => extended.push(ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp signing" => extended.push(ExtendedKeyUsagePurpose::OcspSigning),
            other => return Err(format!("unrecognized usage values: [{other:?}]")),
        }
    }
    key.dedup();
    extended.dedup();
    Ok((key, extended))
}

/// The PEM certificate for an approved CSR object at `now`, its lifetime capped at
/// `cap_seconds`.
pub fn sign(
    ca: &Ca,
    object: &serde_json::Value,
    now: i64,
    cap_seconds: i64,
) -> Result<String, SignError> {
    let typed = csr::typed(object).map_err(|e| SignError::Signing(e.message))?;
    let signed = typed
        .status
        .as_ref()
        .is_some_and(|s| s.certificate.is_some());
    if signed || !csr::has_condition(object, "Approved") || csr::has_condition(object, "Failed") {
        return Err(SignError::NotOurs);
    }
    let signer = typed.spec.signer_name.as_str();
    if signer != CLIENT_KUBELET_SIGNER && signer != KUBELET_SERVING_SIGNER {
        return Err(SignError::NotOurs);
    }
    let (der, request) = csr::parse_request(&typed.spec.request.0)
        .map_err(|e| SignError::Signing(format!("unable to parse csr: {e}")))?;
    let usages = typed.spec.usages.clone().unwrap_or_default();
    if signer == CLIENT_KUBELET_SIGNER {
        csr::validate_kubelet_client(&request, &usages)
    } else {
        csr::validate_kubelet_serving(&request, &usages)
    }
    .map_err(SignError::Validation)?;
    let (key_usages, extended) = key_usages(&usages).map_err(SignError::Signing)?;
    let ttl = ttl_seconds(typed.spec.expiration_seconds, cap_seconds);
    let (not_before, not_after) = validity(ca, now, ttl)?;
    let mut params =
        CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(der))
            .map_err(|e| {
                SignError::Signing(format!(
                    "unable to verify certificate request signature: {e}"
                ))
            })?;
    let time = |t: i64| {
        OffsetDateTime::from_unix_timestamp(t).map_err(|e| SignError::Signing(e.to_string()))
    };
    // The policy drops the request's own extensions: only its SANs are kept.
    params.params.key_usages = key_usages;
    params.params.extended_key_usages = extended;
    params.params.is_ca = IsCa::ExplicitNoCa;
    params.params.not_before = time(not_before)?;
    params.params.not_after = time(not_after)?;
    params.params.serial_number = Some(SerialNumber::from_slice(
        &(fastrand::u128(..) >> 1).to_be_bytes(),
    ));
    params.params.use_authority_key_identifier_extension = true;
    let certificate = params
        .signed_by(ca.issuer())
        .map_err(|e| SignError::Signing(e.to_string()))?;
    Ok(certificate.pem())
}

/// How long to wait before signing an approved CSR (the controllers act on their informers'
/// events, never inside the approving request).
pub const SIGNING_DELAY: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests;
