//! Certificate signing requests: a new key (ECDSA P-256), the PKCS#10 request with the node's
//! subject, the `certificates.k8s.io/v1` object for one signer, and the wait for its approval
//! and certificate.
//!
//! Upstream: client-go `util/certificate/csr/csr.go` (`RequestCertificate`: create, and on
//! AlreadyExists take the existing object when it asks for the same thing; `WaitForCertificate`:
//! a watch on the one name until Approved with a certificate, or Denied/Failed), and
//! `pkg/kubelet/certificate/bootstrap/bootstrap.go` (`digestedName`: the CSR's name from its
//! public key, subject and usages, so that a restart with the same key finds its own CSR).
//! Not here: which identity sends them (`manager.rs`, `bootstrap.rs`), the files (`store.rs`).

use std::{net::IpAddr, time::Duration};

use base64::Engine as _;
use futures::StreamExt as _;
use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{PostParams, WatchEvent, WatchParams},
};
use rcgen::{CertificateParams, DnType, KeyPair, PublicKeyData as _, SanType};
use sha2::Digest as _;
use x509_parser::prelude::FromDer as _;

use super::Error;

/// The client certificate's signer (upstream `certificatesv1.KubeAPIServerClientKubeletSignerName`).
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The serving certificate's signer (upstream `certificatesv1.KubeletServingSignerName`).
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Every node's group (upstream `user.NodesGroup`).
pub const NODES_GROUP: &str = "system:nodes";

/// What a certificate is for: its signer and usages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Client,
    Serving,
}

impl Kind {
    pub fn signer(self) -> &'static str {
        match self {
            Kind::Client => CLIENT_SIGNER,
            Kind::Serving => SERVING_SIGNER,
        }
    }

    /// Upstream's usages for an ECDSA key (key encipherment only with RSA keys).
    pub fn usages(self) -> [&'static str; 2] {
        match self {
            Kind::Client => ["digital signature", "client auth"],
            Kind::Serving => ["digital signature", "server auth"],
        }
    }

    /// `client` or `server`, as the metrics and the files name them.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Serving => "server",
        }
    }
}

/// The subject and alternative names a certificate is requested for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// `system:node:<nodeName>`.
    pub common_name: String,
    pub organization: String,
    /// Serving only: the node's hostname and addresses.
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Subject {
    pub fn node(node_name: &str) -> Subject {
        Subject {
            common_name: format!("system:node:{node_name}"),
            organization: NODES_GROUP.to_owned(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }
}

/// A new private key as upstream's kubelet makes them (ECDSA P-256).
pub fn new_key() -> Result<KeyPair, Error> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::Generate)
}

/// The PKCS#10 request (PEM) for `subject`, signed with `key`.
pub fn request_pem(subject: &Subject, key: &KeyPair) -> Result<String, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Generate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, subject.common_name.as_str());
    params
        .distinguished_name
        .push(DnType::OrganizationName, subject.organization.as_str());
    let mut sans = Vec::new();
    for name in &subject.dns_names {
        let name = name.as_str().try_into().map_err(Error::Generate)?;
        sans.push(SanType::DnsName(name));
    }
    sans.extend(subject.ips.iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    let request = params.serialize_request(key).map_err(Error::Generate)?;
    request.pem().map_err(Error::Generate)
}

/// Upstream's `digestedName`: `node-csr-` and the unpadded URL-safe base64 of a SHA-512/256
/// over the public key, the subject's CN and O and the usages, each base64-encoded and ended
/// with `|` (a byte outside that alphabet, so two inputs never write the same stream).
pub fn digested_name(key: &KeyPair, subject: &Subject, usages: &[&str]) -> String {
    let encode = |data: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data);
    let mut hash = sha2::Sha512_256::new();
    let mut write = |data: &[u8]| {
        hash.update(encode(data).as_bytes());
        hash.update(b"|");
    };
    write(&key.subject_public_key_info());
    write(subject.common_name.as_bytes());
    write(subject.organization.as_bytes());
    for usage in usages {
        write(usage.as_bytes());
    }
    format!("node-csr-{}", encode(&hash.finalize()))
}

/// The CertificateSigningRequest object.
pub fn object(name: &str, kind: Kind, request_pem: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.as_bytes().to_vec()),
            signer_name: kind.signer().to_owned(),
            usages: Some(kind.usages().iter().map(|u| (*u).to_owned()).collect()),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    }
}

/// Creates the CSR `name`; when it exists already (a restart with the same key), takes it if it
/// asks the same signer for the same key (upstream `ensureCompatible`).
pub async fn create(
    client: &Client,
    csr: &CertificateSigningRequest,
    key: &KeyPair,
) -> Result<(), Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = csr.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), csr).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&name).await.map_err(|source| Error::Api {
                name: name.clone(),
                source,
            })?;
            if compatible(&existing, csr, key) {
                Ok(())
            } else {
                Err(Error::Incompatible { name })
            }
        }
        Err(source) => Err(Error::Api { name, source }),
    }
}

/// Creates a CSR named by the API server from its `generateName`; returns the name given.
pub async fn create_generated(
    client: &Client,
    csr: &CertificateSigningRequest,
) -> Result<String, Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = api
        .create(&PostParams::default(), csr)
        .await
        .map_err(|source| Error::Api {
            name: csr.metadata.generate_name.clone().unwrap_or_default(),
            source,
        })?;
    Ok(created.metadata.name.unwrap_or_default())
}

fn compatible(
    existing: &CertificateSigningRequest,
    wanted: &CertificateSigningRequest,
    key: &KeyPair,
) -> bool {
    if existing.spec.signer_name != wanted.spec.signer_name {
        return false;
    }
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(&existing.spec.request.0) else {
        return false;
    };
    let Ok((_, request)) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
    else {
        return false;
    };
    request.certification_request_info.subject_pki.raw == key.subject_public_key_info()
}

/// How long a watch runs before it is made again (the server may end it sooner).
const WATCH_SECONDS: u32 = 60;
/// The pause before reading again after a failed watch.
const RETRY: Duration = Duration::from_secs(2);

/// Waits until CSR `name` is approved and its certificate issued, and returns the certificate
/// (PEM); Denied or Failed are errors carrying the condition's reason and message.
pub async fn wait_for_certificate(client: &Client, name: &str) -> Result<Vec<u8>, Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    loop {
        let current = api.get(name).await.map_err(|source| Error::Api {
            name: name.to_owned(),
            source,
        })?;
        if let Some(certificate) = issued(&current, name)? {
            return Ok(certificate);
        }
        let version = current
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_SECONDS);
        let stream = match api.watch(&params, &version).await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(csr = name, %error, "watching the CSR failed; reading it again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(csr) | WatchEvent::Modified(csr)) => {
                    if csr.metadata.name.as_deref() != Some(name) {
                        continue;
                    }
                    if let Some(certificate) = issued(&csr, name)? {
                        return Ok(certificate);
                    }
                }
                Ok(WatchEvent::Deleted(csr)) if csr.metadata.name.as_deref() == Some(name) => {
                    return Err(Error::Deleted {
                        name: name.to_owned(),
                    });
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(csr = name, %error, "the CSR's watch ended; reading it again");
                    tokio::time::sleep(RETRY).await;
                    break;
                }
            }
        }
    }
}

/// The certificate when `csr` is approved and issued; an error when denied or failed.
pub fn issued(csr: &CertificateSigningRequest, name: &str) -> Result<Option<Vec<u8>>, Error> {
    let Some(status) = &csr.status else {
        return Ok(None);
    };
    let mut approved = false;
    for condition in status.conditions.iter().flatten() {
        if condition.status != "True" {
            continue;
        }
        match condition.type_.as_str() {
            "Denied" | "Failed" => {
                return Err(Error::NotIssued {
                    name: name.to_owned(),
                    condition: condition.type_.clone(),
                    reason: condition.reason.clone().unwrap_or_default(),
                    message: condition.message.clone().unwrap_or_default(),
                });
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    match &status.certificate {
        Some(certificate) if approved && !certificate.0.is_empty() => {
            Ok(Some(certificate.0.clone()))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };
    use x509_parser::{
        certification_request::X509CertificationRequest, extensions::GeneralName,
        extensions::ParsedExtension,
    };

    use super::*;

    /// A self-signed certificate for `cn` valid `seconds` from an hour ago, with its key (PEM).
    pub(crate) fn self_signed_pem(cn: &str, seconds: i64) -> Vec<u8> {
        let key = new_key().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::seconds(seconds);
        let cert = params.self_signed(&key).expect("sign");
        format!("{}{}", cert.pem(), key.serialize_pem()).into_bytes()
    }

    fn parse(pem: &str) -> Vec<u8> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("pem");
        assert_eq!(pem.label, "CERTIFICATE REQUEST");
        pem.contents
    }

    #[test]
    fn a_client_request_names_the_node_and_its_group() {
        let key = new_key().expect("key");
        let pem = request_pem(&Subject::node("n1"), &key).expect("request");
        let der = parse(&pem);
        let (_, request) = X509CertificationRequest::from_der(&der).expect("parses");
        let info = &request.certification_request_info;
        let cn: Vec<_> = info
            .subject
            .iter_common_name()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        let o: Vec<_> = info
            .subject
            .iter_organization()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        assert_eq!(cn, ["system:node:n1"]);
        assert_eq!(o, ["system:nodes"]);
        assert_eq!(
            info.subject_pki.raw,
            key.subject_public_key_info().as_slice()
        );
        // ECDSA P-256 with SHA-256, as upstream's kubelet.
        assert_eq!(
            request.signature_algorithm.algorithm.to_id_string(),
            "1.2.840.10045.4.3.2"
        );
        assert!(
            request
                .requested_extensions()
                .is_none_or(|mut e| e.next().is_none())
        );
    }

    #[test]
    fn a_serving_request_carries_the_nodes_names_and_addresses() {
        let key = new_key().expect("key");
        let subject = Subject {
            dns_names: vec!["node-a".into()],
            ips: vec![
                "10.1.2.3".parse().expect("ip"),
                "fd00::5".parse().expect("ip"),
            ],
            ..Subject::node("node-a")
        };
        let der = parse(&request_pem(&subject, &key).expect("request"));
        let (_, request) = X509CertificationRequest::from_der(&der).expect("parses");
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        for extension in request.requested_extensions().into_iter().flatten() {
            if let ParsedExtension::SubjectAlternativeName(san) = extension {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                        GeneralName::IPAddress(ip) => ips.push(ip.to_vec()),
                        _ => {}
                    }
                }
            }
        }
        assert_eq!(dns, ["node-a"]);
        assert_eq!(
            ips,
            [
                vec![10, 1, 2, 3],
                "fd00::5"
                    .parse::<std::net::Ipv6Addr>()
                    .expect("ip")
                    .octets()
                    .to_vec()
            ]
        );
    }

    #[test]
    fn the_name_is_stable_for_a_key_and_differs_between_keys() {
        let subject = Subject::node("n1");
        let key = new_key().expect("key");
        let usages = Kind::Client.usages();
        let name = digested_name(&key, &subject, &usages);
        assert!(name.starts_with("node-csr-"), "{name}");
        // 32 bytes of SHA-512/256, unpadded base64: 43 characters.
        assert_eq!(name.len(), "node-csr-".len() + 43);
        let reloaded = KeyPair::from_pem(&key.serialize_pem()).expect("reload");
        assert_eq!(digested_name(&reloaded, &subject, &usages), name);
        let other = new_key().expect("key");
        assert_ne!(digested_name(&other, &subject, &usages), name);
        assert_ne!(
            digested_name(&key, &Subject::node("n2"), &usages),
            name,
            "the subject is part of the name"
        );
    }

    #[test]
    fn the_object_asks_the_signer_for_its_usages() {
        let csr = object("node-csr-x", Kind::Client, "PEM");
        assert_eq!(
            csr.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert_eq!(
            csr.spec.usages.as_deref(),
            Some(&["digital signature".to_owned(), "client auth".to_owned()][..])
        );
        let serving = object("s", Kind::Serving, "PEM");
        assert_eq!(serving.spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(
            serving.spec.usages.as_deref(),
            Some(&["digital signature".to_owned(), "server auth".to_owned()][..])
        );
    }

    fn with_conditions(
        conditions: &[&str],
        certificate: Option<&[u8]>,
    ) -> CertificateSigningRequest {
        let mut csr = object("c", Kind::Client, "PEM");
        csr.status = Some(CertificateSigningRequestStatus {
            certificate: certificate.map(|c| ByteString(c.to_vec())),
            conditions: Some(
                conditions
                    .iter()
                    .map(|t| CertificateSigningRequestCondition {
                        type_: (*t).to_owned(),
                        status: "True".into(),
                        reason: Some(format!("{t}Reason")),
                        message: Some("by the test".into()),
                        ..CertificateSigningRequestCondition::default()
                    })
                    .collect(),
            ),
        });
        csr
    }

    #[test]
    fn issued_only_when_approved_with_a_certificate() {
        assert!(
            issued(&object("c", Kind::Client, "PEM"), "c")
                .expect("pending")
                .is_none()
        );
        assert!(
            issued(&with_conditions(&["Approved"], None), "c")
                .expect("approved")
                .is_none()
        );
        assert!(
            issued(&with_conditions(&[], Some(b"cert")), "c")
                .expect("unapproved")
                .is_none()
        );
        assert_eq!(
            issued(&with_conditions(&["Approved"], Some(b"cert")), "c").expect("issued"),
            Some(b"cert".to_vec())
        );
        let denied = issued(&with_conditions(&["Denied"], None), "c").expect_err("denied");
        let message = denied.to_string();
        assert!(
            message.contains("Denied") && message.contains("DeniedReason"),
            "{message}"
        );
        assert!(issued(&with_conditions(&["Approved", "Failed"], Some(b"c")), "c").is_err());
    }
}
