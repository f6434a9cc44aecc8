//! The API clients' transport when the client certificate rotates: the same stack kube builds
//! from a kubeconfig (its TLS roots, server name, base URI, credentials, headers, timeouts),
//! except that the client certificate is whatever [`Identity`] holds at each handshake (a
//! rustls `ResolvesClientCert`), and that setting a new one closes every connection made
//! before, idle or busy, so that nothing keeps talking with the old certificate.
//!
//! Upstream: `pkg/kubelet/certificate/transport.go` (`UpdateTransport`: a dialer that tracks its
//! connections and closes them all when the certificate changes, because the API server checks
//! a client certificate's validity when a connection is made, and a connection kept past the
//! certificate's expiry would keep an identity that no longer holds). Requests in flight on a
//! closed connection fail, as upstream's do; every loop of the agent retries on its own period.
//! Not here: choosing when to rotate (`manager.rs`).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, RwLock},
    task::{Context, Poll},
};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector},
    rt::TokioExecutor,
};
use kube::client::{Body, ClientBuilder, ConfigExt as _};
use rustls::{SignatureScheme, client::ResolvesClientCert, sign::CertifiedKey};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower::{BoxError, Service, ServiceBuilder, util::BoxService};

/// The current client certificate, and the connections made with the ones before it.
#[derive(Debug)]
pub struct Identity {
    key: RwLock<Arc<CertifiedKey>>,
    /// Cancelled (and replaced) when the certificate changes: every connection made before
    /// holds a child of it and closes.
    connections: Mutex<CancellationToken>,
}

impl Identity {
    pub fn new(key: Arc<CertifiedKey>) -> Arc<Identity> {
        Arc::new(Identity {
            key: RwLock::new(key),
            connections: Mutex::new(CancellationToken::new()),
        })
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.key.read() {
            Ok(key) => key.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Presents `key` from now on and closes every connection open so far.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        match self.key.write() {
            Ok(mut slot) => *slot = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
        let old = match self.connections.lock() {
            Ok(mut token) => std::mem::take(&mut *token),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        old.cancel();
    }

    fn connection_token(&self) -> CancellationToken {
        match self.connections.lock() {
            Ok(token) => token.child_token(),
            Err(poisoned) => poisoned.into_inner().child_token(),
        }
    }
}

#[derive(Debug)]
struct Resolver(Arc<Identity>);

impl ResolvesClientCert for Resolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A TCP connector whose connections close when the identity changes.
#[derive(Clone)]
struct ClosingConnector {
    inner: HttpConnector,
    identity: Arc<Identity>,
}

impl Service<Uri> for ClosingConnector {
    type Response = Closing<<HttpConnector as Service<Uri>>::Response>;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // The token is taken before connecting: a rotation during the handshake closes this
        // connection too, as it may have presented the old certificate.
        let token = self.identity.connection_token();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(Closing {
                io,
                closed: Box::pin(token.cancelled_owned()),
            })
        })
    }
}

/// A connection that fails every read and write once its token is cancelled; hyper then drops
/// it (an idle pooled connection too: its read is always polled, and the token wakes it).
struct Closing<T> {
    io: T,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<T> Closing<T> {
    fn check(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        match self.closed.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed: the client certificate was rotated",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<T: Read + Unpin> Read for Closing<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Closing<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for Closing<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

/// The service under the agent's layers: requests in, hyper's responses out.
pub type RotatingService =
    BoxService<http::Request<Body>, http::Response<hyper::body::Incoming>, BoxError>;

/// A client builder for `config` whose client certificate is `identity`'s (the kubeconfig's own
/// certificate, if any, is never presented). Layers (the rate limit) go on as with kube's.
pub fn client_builder(
    config: &kube::Config,
    identity: &Arc<Identity>,
) -> Result<ClientBuilder<RotatingService>, kube::Error> {
    let mut tls = config.rustls_client_config()?;
    tls.client_auth_cert_resolver = Arc::new(Resolver(identity.clone()));
    // A resumed TLS session keeps the identity of the handshake that made it: a connection made
    // after a rotation would still be the old certificate's. client-go keeps no session cache
    // either, so every connection is a full handshake with the current certificate.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let closing = ClosingConnector {
        inner: tcp,
        identity: identity.clone(),
    };
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
            })?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let https = builder.enable_http1().wrap_connector(closing);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client);
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::{csr::tests::self_signed_pem, store::Pair};

    fn key(cn: &str) -> Arc<CertifiedKey> {
        Pair::from_pem(self_signed_pem(cn, 3600), std::path::Path::new("t"))
            .expect("pair")
            .certified
    }

    #[test]
    fn the_resolver_presents_the_current_certificate() {
        let first = key("a");
        let identity = Identity::new(first.clone());
        let resolver = Resolver(identity.clone());
        assert!(resolver.has_certs());
        let got = resolver.resolve(&[], &[]).expect("a certificate");
        assert_eq!(got.cert, first.cert);
        let second = key("b");
        identity.set(second.clone());
        let got = resolver.resolve(&[], &[]).expect("a certificate");
        assert_eq!(got.cert, second.cert);
    }

    #[tokio::test]
    async fn setting_a_certificate_closes_the_connections_made_before() {
        let identity = Identity::new(key("a"));
        let before = identity.connection_token();
        identity.set(key("b"));
        assert!(before.is_cancelled());
        let after = identity.connection_token();
        assert!(!after.is_cancelled());

        // A live connection fails its next read once closed, and wakes an idle reader.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let accept = tokio::spawn(async move { listener.accept().await });
        let mut connector = ClosingConnector {
            inner: HttpConnector::new(),
            identity: identity.clone(),
        };
        let uri: Uri = format!("http://{address}").parse().expect("uri");
        let mut connection = connector.call(uri).await.expect("connects");
        let _server = accept.await.expect("joined").expect("accepted");
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let mut io = hyper_util::rt::TokioIo::new(&mut connection);
            tokio::io::AsyncReadExt::read(&mut io, &mut buf).await
        });
        tokio::task::yield_now().await;
        identity.set(key("c"));
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("woken")
            .expect("joined");
        let error = read.expect_err("closed");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    }
}
