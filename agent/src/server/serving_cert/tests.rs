use std::sync::Arc;

use rustls::{ServerConfig, crypto::ring};

use super::*;
use crate::server::test_pki::{Ca, handshake};

fn server(handle: &ServingCertificate) -> Arc<ServerConfig> {
    Arc::new(
        ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(handle.clone())),
    )
}

#[tokio::test]
async fn a_set_certificate_is_served_from_the_next_handshake() {
    let ca = Ca::new("ca");
    let (old, new) = (ca.serving("old"), ca.serving("new"));
    let handle = ServingCertificate::new(old.certified_key()).expect("old pair");
    let config = server(&handle);
    assert_eq!(
        handshake(config.clone(), &ca, None).await,
        Ok(old.der.clone())
    );
    // A clone shares the slot: a certificate source holds one, the server another.
    handle.clone().set(new.certified_key()).expect("new pair");
    assert_eq!(
        handshake(config.clone(), &ca, None).await,
        Ok(new.der.clone())
    );
    assert_eq!(handshake(config, &ca, None).await, Ok(new.der));
}

#[tokio::test]
async fn a_key_of_another_certificate_is_refused_and_the_old_pair_stays() {
    let ca = Ca::new("ca");
    let (old, new, other) = (ca.serving("old"), ca.serving("new"), ca.serving("other"));
    let handle = ServingCertificate::new(old.certified_key()).expect("old pair");
    let provider = ring::default_provider();

    let err = handle
        .set_pem(new.cert_pem.as_bytes(), other.key_pem.as_bytes(), &provider)
        .expect_err("mismatched key");
    assert!(matches!(err, CertificateError::KeyMismatch), "{err}");
    let mismatched = Arc::new(CertifiedKey::new(
        vec![new.der.clone()],
        other.certified_key().key.clone(),
    ));
    assert!(matches!(
        handle.set(mismatched),
        Err(CertificateError::KeyMismatch)
    ));
    assert!(
        ServingCertificate::new(Arc::new(CertifiedKey::new(
            vec![new.der.clone()],
            other.certified_key().key.clone(),
        )))
        .is_err()
    );
    assert_eq!(handshake(server(&handle), &ca, None).await, Ok(old.der));
}

#[tokio::test]
async fn unparsable_pem_is_refused_and_the_old_pair_stays() {
    let ca = Ca::new("ca");
    let (old, new) = (ca.serving("old"), ca.serving("new"));
    let handle = ServingCertificate::new(old.certified_key()).expect("old pair");
    let provider = ring::default_provider();
    let cases: [(&[u8], &[u8]); 3] = [
        (b"", new.key_pem.as_bytes()),
        (new.cert_pem.as_bytes(), b"not a key"),
        (new.key_pem.as_bytes(), new.key_pem.as_bytes()),
    ];
    for (chain, key) in cases {
        assert!(handle.set_pem(chain, key, &provider).is_err());
    }
    assert_eq!(handshake(server(&handle), &ca, None).await, Ok(old.der));
}

#[tokio::test]
async fn an_empty_handle_fails_handshakes_until_a_certificate_is_set() {
    let ca = Ca::new("ca");
    let leaf = ca.serving("issued");
    let handle = ServingCertificate::empty();
    assert!(handle.current().is_none());
    let config = server(&handle);
    assert!(handshake(config.clone(), &ca, None).await.is_err());
    handle
        .set_pem(
            leaf.cert_pem.as_bytes(),
            leaf.key_pem.as_bytes(),
            &ring::default_provider(),
        )
        .expect("issued pair");
    assert_eq!(handshake(config, &ca, None).await, Ok(leaf.der));
}
