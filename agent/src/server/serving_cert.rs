//! The kubelet server's current serving certificate, swappable while the server runs: a rustls
//! [`ResolvesServerCert`] that every handshake asks, so a certificate set here is the one the
//! next connection sees (connections already open keep theirs). Whoever has a newer pair feeds
//! it in: the reload of `tlsCertFile`/`tlsPrivateKeyFile` (`tls_reload.rs`) and the serving
//! certificate the cluster issues (`serverTLSBootstrap`).
//!
//! A pair whose private key does not match its certificate is refused here, at the only way in,
//! so no caller can make the server offer a certificate it cannot prove (the old pair stays).
//! Not here: reading files, watching them, building the rest of the TLS configuration
//! (`tls.rs`). Upstream: `dynamiccertificates.DynamicServingCertificateController` (its
//! `GetConfigForClient` hands each handshake the current certificate) with
//! `DynamicCertKeyPairContent`, and the kubelet's `GetCertificate` over its certificate manager
//! (`cmd/kubelet/app/server.go`), which fails the handshake while there is no certificate
//! ("no serving certificate available for the kubelet"), as an empty handle does here.

use std::{
    fmt,
    sync::{Arc, PoisonError, RwLock},
};

use rustls::{
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("the certificate chain is not PEM: {0}")]
    ChainPem(#[source] rustls_pki_types::pem::Error),
    #[error("the certificate chain has no PEM CERTIFICATE block")]
    NoCertificate,
    #[error("the private key is not a PEM private key: {0}")]
    KeyPem(#[source] rustls_pki_types::pem::Error),
    #[error("the private key cannot be used: {0}")]
    Key(#[source] rustls::Error),
    #[error("the private key does not match the certificate")]
    KeyMismatch,
    #[error("the certificate cannot be checked against its key: {0}")]
    Unverifiable(#[source] rustls::Error),
}

/// A handle on the serving certificate the kubelet server presents. Clones share one slot: a
/// clone given to a certificate source and the one inside the server's TLS configuration see
/// the same pair. Every handshake reads the slot ([`ResolvesServerCert::resolve`]), so
/// [`ServingCertificate::set`] takes effect from the next handshake on. While the slot is empty
/// ([`ServingCertificate::empty`]) handshakes fail, as upstream's kubelet does before its first
/// cluster-issued certificate.
#[derive(Clone, Default)]
pub struct ServingCertificate {
    current: Arc<RwLock<Option<Arc<CertifiedKey>>>>,
}

impl ServingCertificate {
    /// A handle serving `initial`; fails as [`ServingCertificate::set`] does.
    pub fn new(initial: Arc<CertifiedKey>) -> Result<ServingCertificate, CertificateError> {
        let handle = ServingCertificate::empty();
        handle.set(initial)?;
        Ok(handle)
    }

    /// A handle with no certificate yet: handshakes fail until one is set.
    pub fn empty() -> ServingCertificate {
        ServingCertificate::default()
    }

    /// Serves `key` from the next handshake on, unless its private key does not match its
    /// leaf certificate (or that cannot be told): then the current pair stays and the error
    /// says why.
    pub fn set(&self, key: Arc<CertifiedKey>) -> Result<(), CertificateError> {
        check_pair(&key)?;
        // A writer that panicked left a whole `Option<Arc<_>>`; the slot is never torn.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(key);
        Ok(())
    }

    /// Parses a PEM chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or SEC1) with
    /// `provider` and serves them as [`ServingCertificate::set`] does.
    pub fn set_pem(
        &self,
        chain_pem: &[u8],
        key_pem: &[u8],
        provider: &CryptoProvider,
    ) -> Result<(), CertificateError> {
        self.set(certified_key_from_pem(chain_pem, key_pem, provider)?)
    }

    /// The pair served now, if any.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl fmt::Debug for ServingCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCertificate")
            .field("set", &self.current().is_some())
            .finish()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// A chain (leaf first) and its private key from PEM, the key checked against the leaf.
pub fn certified_key_from_pem(
    chain_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, CertificateError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(CertificateError::ChainPem)?;
    if chain.is_empty() {
        return Err(CertificateError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(CertificateError::KeyPem)?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(CertificateError::Key)?;
    let pair = Arc::new(CertifiedKey::new(chain, signing));
    check_pair(&pair)?;
    Ok(pair)
}

/// Unlike rustls' `CertifiedKey::from_der`, a key whose match cannot be checked is refused too.
fn check_pair(pair: &CertifiedKey) -> Result<(), CertificateError> {
    match pair.keys_match() {
        Ok(()) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(CertificateError::KeyMismatch)
        }
        Err(e) => Err(CertificateError::Unverifiable(e)),
    }
}

#[cfg(test)]
mod tests;
