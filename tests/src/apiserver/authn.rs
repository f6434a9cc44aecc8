//! Who a request is: the admin bearer token (the kubeconfig's, `system:masters`), bootstrap
//! tokens (`system:bootstrap:<id>` in `system:bootstrappers`), and client certificates signed
//! by the server's CA (CN the user, O the groups), tried as kube-apiserver's union
//! authenticator tries its members: the first that recognises the request wins, none → 401.
//!
//! Upstream: `staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go` (the chain
//! and the certificate's validity are checked on every request, not only at the handshake, so a
//! certificate that expires on a long-lived connection stops authenticating — why the kubelet
//! closes its connections after rotating), `plugin/pkg/auth/authenticator/token/bootstrap`
//! (token format `[a-z0-9]{6}.[a-z0-9]{16}`,
//! <https://kubernetes.io/docs/reference/access-authn-authz/bootstrap-tokens/>), and the
//! `AuthenticatedGroupAdder`. Not here: what the user may do ([`super::authz`]).
//!
//! kube-apiserver asks for a client certificate without requiring one (`tls.RequestClientCert`)
//! and verifies it in the authenticator, on every request. So does this server: the handshake
//! ([`ClientCertVerifier`], rustls' `WebPkiClientVerifier` with `allow_unauthenticated` for
//! everything but the chain) only proves the client holds the certificate's key, and
//! [`certificate_user`] verifies the chain against the CA and the validity at the request's
//! time; an expired or foreign certificate gets 401 unless a token authenticates the request.

use std::{fmt, sync::Arc};

use axum::http::{HeaderMap, header};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error as TlsError, RootCertStore,
    SignatureScheme,
    client::danger::HandshakeSignatureValid,
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier as Verifier},
    },
};
use rustls_pki_types::{CertificateDer, UnixTime};
use serde_json::{Value, json};

pub const MASTERS_GROUP: &str = "system:masters";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
pub const NODES_GROUP: &str = "system:nodes";
/// The user of the admin token.
pub const ADMIN_USER: &str = "test-admin";

/// An authenticated user (upstream `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The `userInfo` of a SelfSubjectReview or a TokenReview.
    pub fn to_json(&self) -> Value {
        let mut info = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty()
            && let Some(map) = info.as_object_mut()
        {
            map.insert("uid".to_owned(), json!(self.uid));
        }
        info
    }

    fn authenticated(mut self) -> User {
        if !self.in_group(AUTHENTICATED_GROUP) {
            self.groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        self
    }
}

/// The client certificate chain a connection presented (end entity first), put in each of
/// its requests; verified per request by [`certificate_user`].
#[derive(Debug, Clone, Default)]
pub struct PeerCertificate(pub Option<Arc<Vec<CertificateDer<'static>>>>);

/// Why a bootstrap token flag is refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "bootstrap token {0:?}: want <id>.<secret> with id [a-z0-9]{{6}} and secret [a-z0-9]{{16}}"
)]
pub struct BadBootstrapToken(pub String);

/// Checks a `--bootstrap-token` value's format (upstream `bootstraputil.IsValidBootstrapToken`).
pub fn parse_bootstrap_token(token: &str) -> Result<String, BadBootstrapToken> {
    let ok = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match token.split_once('.') {
        Some((id, secret)) if ok(id, 6) && ok(secret, 16) => Ok(token.to_owned()),
        _ => Err(BadBootstrapToken(token.to_owned())),
    }
}

/// The user of a request, or `None` (401): the client certificate's (`certificate`, see
/// [`certificate_user`]), else the bearer token's.
pub fn authenticate(
    admin_token: &str,
    bootstrap_tokens: &[String],
    headers: &HeaderMap,
    certificate: Option<User>,
) -> Option<User> {
    if let Some(user) = certificate {
        return Some(user);
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    if token == admin_token {
        return Some(
            User {
                name: ADMIN_USER.to_owned(),
                groups: vec![MASTERS_GROUP.to_owned()],
                ..User::default()
            }
            .authenticated(),
        );
    }
    // The bootstrap authenticator compares the secret in constant time; a test server need not.
    let id = bootstrap_tokens
        .iter()
        .find(|t| t.as_str() == token)?
        .split_once('.')?
        .0;
    Some(
        User {
            name: format!("system:bootstrap:{id}"),
            groups: vec![BOOTSTRAPPERS_GROUP.to_owned()],
            ..User::default()
        }
        .authenticated(),
    )
}

/// The user of a client certificate chain that verifies against `roots` at `now` (Unix
/// seconds): CN the name, the organizations the groups. A certificate without a CN names no
/// one.
pub fn certificate_user(peer: &PeerCertificate, roots: &ClientRoots, now: i64) -> Option<User> {
    let (end_entity, intermediates) = peer.0.as_deref()?.split_first()?;
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(u64::try_from(now).ok()?));
    roots
        .0
        .verify_client_cert(end_entity, intermediates, at)
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(end_entity).ok()?;
    let validity = cert.validity();
    // webpki checked this too; kept so the rule reads here as x509.go states it.
    if now < validity.not_before.timestamp() || now > validity.not_after.timestamp() {
        return None;
    }
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|n| !n.is_empty())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(
        User {
            name,
            groups,
            ..User::default()
        }
        .authenticated(),
    )
}

/// The client CA (the cluster CA), as webpki verifies a chain against it.
#[derive(Clone)]
pub struct ClientRoots(Arc<dyn Verifier>);

impl fmt::Debug for ClientRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientRoots")
    }
}

impl ClientRoots {
    pub fn new(roots: RootCertStore) -> Result<ClientRoots, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::General(e.to_string()))?;
        Ok(ClientRoots(inner))
    }
}

/// The handshake's side: an optional client certificate, any chain accepted (it is verified
/// per request), its holder proven by the handshake signature; the CA named as the hint.
pub struct ClientCertVerifier {
    inner: Arc<dyn Verifier>,
}

impl fmt::Debug for ClientCertVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientCertVerifier")
    }
}

impl ClientCertVerifier {
    pub fn new(roots: &ClientRoots) -> Arc<ClientCertVerifier> {
        Arc::new(ClientCertVerifier {
            inner: roots.0.clone(),
        })
    }
}

impl Verifier for ClientCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, TlsError> {
        // Go's `RequestClientCert` takes any certificate; one that is not X.509 at all cannot
        // name anyone, and is refused as Go's handshake refuses it.
        x509_parser::parse_x509_certificate(end_entity)
            .map(|_| ClientCertVerified::assertion())
            .map_err(|_| TlsError::InvalidCertificate(CertificateError::BadEncoding))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
            headers.insert(header::AUTHORIZATION, value);
        }
        headers
    }

    const BOOT: &str = "abcdef.0123456789abcdef";

    #[test]
    fn the_admin_token_is_a_master_and_a_bootstrap_token_a_bootstrapper() {
        let tokens = vec![BOOT.to_owned()];
        let admin = authenticate("admin", &tokens, &bearer("admin"), None).expect("admin");
        assert_eq!(admin.name, ADMIN_USER);
        assert_eq!(admin.groups, [MASTERS_GROUP, AUTHENTICATED_GROUP]);
        let boot = authenticate("admin", &tokens, &bearer(BOOT), None).expect("bootstrapper");
        assert_eq!(boot.name, "system:bootstrap:abcdef");
        assert_eq!(boot.groups, [BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP]);
        assert_eq!(
            authenticate("admin", &tokens, &bearer("abcdef.0000000000000000"), None),
            None
        );
        assert_eq!(
            authenticate("admin", &tokens, &HeaderMap::new(), None),
            None
        );
    }

    #[test]
    fn bootstrap_tokens_must_have_the_documented_format() {
        assert!(parse_bootstrap_token(BOOT).is_ok());
        for bad in [
            "abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef0",
            "abc-ef.0123456789abcdef",
        ] {
            assert!(parse_bootstrap_token(bad).is_err(), "{bad}");
        }
    }

    fn ca() -> (Issuer<'static, KeyPair>, ClientRoots) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, "ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let cert = params.self_signed(&key).expect("ca");
        let mut roots = RootCertStore::empty();
        roots.add(cert.der().clone()).expect("a root");
        (
            Issuer::new(params, key),
            ClientRoots::new(roots).expect("roots"),
        )
    }

    fn certificate(
        issuer: &Issuer<'static, KeyPair>,
        cn: &str,
        validity: (i64, i64),
    ) -> PeerCertificate {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, NODES_GROUP);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = time::OffsetDateTime::from_unix_timestamp(validity.0).expect("time");
        params.not_after = time::OffsetDateTime::from_unix_timestamp(validity.1).expect("time");
        let cert = params.signed_by(&key, issuer).expect("cert");
        PeerCertificate(Some(Arc::new(vec![cert.der().clone()])))
    }

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_certificate_of_the_ca_names_its_user_only_while_valid() {
        let (issuer, roots) = ca();
        let peer = certificate(&issuer, "system:node:n1", (NOW - 10, NOW + 10));
        let user = certificate_user(&peer, &roots, NOW).expect("a valid certificate");
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.groups, [NODES_GROUP, AUTHENTICATED_GROUP]);
        assert_eq!(
            authenticate("admin", &[], &HeaderMap::new(), Some(user)).map(|u| u.name),
            Some("system:node:n1".to_owned())
        );
        assert_eq!(certificate_user(&peer, &roots, NOW + 11), None, "expired");
        assert_eq!(
            certificate_user(&peer, &roots, NOW - 11),
            None,
            "not yet valid"
        );
        // An expired certificate does not hide a valid token (the union tries the next one).
        let expired = certificate_user(&peer, &roots, NOW + 11);
        let admin = authenticate("admin", &[], &bearer("admin"), expired);
        assert_eq!(admin.map(|u| u.name), Some(ADMIN_USER.to_owned()));
        let (foreign, _) = ca();
        let stranger = certificate(&foreign, "system:node:n1", (NOW - 10, NOW + 10));
        assert_eq!(
            certificate_user(&stranger, &roots, NOW),
            None,
            "another CA's"
        );
        let nameless = certificate(&issuer, "", (NOW - 10, NOW + 10));
        assert_eq!(certificate_user(&nameless, &roots, NOW), None);
        assert_eq!(certificate_user(&PeerCertificate(None), &roots, NOW), None);
    }
}
