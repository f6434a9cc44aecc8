//! The signer's validity window, usages and checks, read back with x509-parser.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::{Value, json};
use x509_parser::{extensions::GeneralName, prelude::X509Certificate};

use super::*;
use crate::apiserver::csr::{
    has_condition,
    tests::{csr_object, request_pem},
    with_condition,
};

const NOW: i64 = 1_800_000_000;
const DAY: i64 = 24 * 3600;

fn ca(not_before: i64, not_after: i64) -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, "test-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    params.not_before = OffsetDateTime::from_unix_timestamp(not_before).expect("time");
    params.not_after = OffsetDateTime::from_unix_timestamp(not_after).expect("time");
    let cert = params.self_signed(&key).expect("ca");
    Ca::new(cert.der().clone(), params, key)
}

fn approved(cn: &str, sans: &[&str], signer: &str, usages: &[&str]) -> Value {
    let pem = request_pem(cn, &["system:nodes"], sans);
    let object = csr_object("c", &pem, signer, usages);
    let mut object = object;
    object["status"] = json!({});
    with_condition(&object, json!({"type": "Approved", "status": "True"}), NOW)
}

fn parsed(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate")
        .to_vec()
}

fn with_cert<T>(der: &[u8], f: impl FnOnce(&X509Certificate<'_>) -> T) -> T {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("parses");
    f(&cert)
}

use rustls_pki_types::pem::PemObject as _;

#[test]
fn a_client_certificate_has_the_request_subject_and_client_usages() {
    let ca = ca(NOW - 10 * DAY, NOW + 3650 * DAY);
    let object = approved(
        "system:node:n1",
        &[],
        CLIENT_KUBELET_SIGNER,
        &["digital signature", "key encipherment", "client auth"],
    );
    let pem = sign(&ca, &object, NOW, 365 * DAY).expect("signed");
    with_cert(&parsed(&pem), |cert| {
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok());
        assert_eq!(cn, Some("system:node:n1"));
        let orgs: Vec<&str> = cert
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .collect();
        assert_eq!(orgs, ["system:nodes"]);
        let eku = cert
            .extended_key_usage()
            .expect("eku")
            .expect("present")
            .value;
        assert!(eku.client_auth && !eku.server_auth);
        let ku = cert.key_usage().expect("ku").expect("present").value;
        assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
        let ca_flag = cert.basic_constraints().expect("bc").map(|b| b.value.ca);
        assert_ne!(ca_flag, Some(true));
        assert_eq!(
            cert.validity().not_before.timestamp(),
            NOW - 300,
            "backdated 5 minutes"
        );
        assert_eq!(cert.validity().not_after.timestamp(), NOW - 300 + 365 * DAY);
        assert_eq!(
            cert.issuer()
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some("test-ca")
        );
    });
}

#[test]
fn a_serving_certificate_keeps_the_sans_and_has_server_auth() {
    let ca = ca(NOW - 10 * DAY, NOW + 3650 * DAY);
    let object = approved(
        "system:node:n1",
        &["n1", "10.0.0.7"],
        KUBELET_SERVING_SIGNER,
        &["digital signature", "server auth"],
    );
    let pem = sign(&ca, &object, NOW, 365 * DAY).expect("signed");
    with_cert(&parsed(&pem), |cert| {
        let eku = cert
            .extended_key_usage()
            .expect("eku")
            .expect("present")
            .value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans = cert
            .subject_alternative_name()
            .expect("san")
            .expect("present")
            .value;
        let dns = sans
            .general_names
            .iter()
            .filter(|n| matches!(n, GeneralName::DNSName("n1")))
            .count();
        let ips = sans
            .general_names
            .iter()
            .filter(|n| matches!(n, GeneralName::IPAddress(ip) if *ip == [10, 0, 0, 7]))
            .count();
        assert_eq!((dns, ips), (1, 1));
    });
}

#[test]
fn the_lifetime_is_capped_by_the_flag_the_request_and_the_ca() {
    // Upstream's floor of 10 minutes for expirationSeconds, the flag's cap above it.
    assert_eq!(ttl_seconds(Some(600), 365 * DAY), 600);
    assert_eq!(ttl_seconds(Some(3600), 365 * DAY), 3600);
    assert_eq!(
        ttl_seconds(Some(10 * 365 * DAY as i32), 365 * DAY),
        365 * DAY
    );
    assert_eq!(ttl_seconds(None, 365 * DAY), 365 * DAY);
    // The test-only deviation: a cap below 600 s wins.
    assert_eq!(ttl_seconds(Some(3600), 120), 120);
    assert_eq!(ttl_seconds(None, 120), 120);
    let young = ca(NOW - 60, NOW + 30 * DAY);
    // Short-lived: notAfter from now, notBefore never before the CA's.
    assert_eq!(validity(&young, NOW, 120), Ok((NOW - 60, NOW + 120)));
    // Long-lived: from the backdated start, capped at the CA's end.
    let old = ca(NOW - 10 * DAY, NOW + 30 * DAY);
    assert_eq!(
        validity(&old, NOW, 9 * 3600),
        Ok((NOW - 300, NOW - 300 + 9 * 3600))
    );
    assert_eq!(
        validity(&old, NOW, 365 * DAY),
        Ok((NOW - 300, NOW + 30 * DAY))
    );
    assert!(
        validity(&old, NOW + 31 * DAY, 60).is_err(),
        "an expired CA signs nothing"
    );
    let object = approved(
        "system:node:n1",
        &[],
        CLIENT_KUBELET_SIGNER,
        &["digital signature", "client auth"],
    );
    let pem = sign(&young, &object, NOW, 120).expect("signed");
    with_cert(&parsed(&pem), |cert| {
        assert_eq!(cert.validity().not_after.timestamp(), NOW + 120);
    });
}

#[test]
fn only_approved_unsigned_kubelet_requests_are_signed_and_bad_ones_fail() {
    let ca = ca(NOW - 10 * DAY, NOW + 3650 * DAY);
    let usages = ["digital signature", "client auth"];
    let mut pending = approved("system:node:n1", &[], CLIENT_KUBELET_SIGNER, &usages);
    pending["status"] = json!({});
    assert_eq!(
        sign(&ca, &pending, NOW, DAY),
        Err(SignError::NotOurs),
        "not approved"
    );
    let other = approved("system:node:n1", &[], "example.com/signer", &usages);
    assert_eq!(
        sign(&ca, &other, NOW, DAY),
        Err(SignError::NotOurs),
        "another signer"
    );
    let failed = with_condition(
        &approved("system:node:n1", &[], CLIENT_KUBELET_SIGNER, &usages),
        json!({"type": "Failed", "status": "True"}),
        NOW,
    );
    assert!(has_condition(&failed, "Failed"));
    assert_eq!(
        sign(&ca, &failed, NOW, DAY),
        Err(SignError::NotOurs),
        "failed"
    );
    let with_san = approved("system:node:n1", &["n1"], CLIENT_KUBELET_SIGNER, &usages);
    assert_eq!(
        sign(&ca, &with_san, NOW, DAY),
        Err(SignError::Validation(
            "DNS subjectAltNames are not allowed".to_owned()
        ))
    );
    let serving_without_san = approved(
        "system:node:n1",
        &[],
        KUBELET_SERVING_SIGNER,
        &["digital signature", "server auth"],
    );
    assert_eq!(
        sign(&ca, &serving_without_san, NOW, DAY),
        Err(SignError::Validation(
            "DNS or IP subjectAltName is required".to_owned()
        ))
    );
}
