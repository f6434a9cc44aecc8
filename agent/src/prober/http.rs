//! One HTTP GET for `httpGet` probes and lifecycle hooks (upstream `pkg/probe/http` and the
//! handler runner): a fresh connection per request (upstream disables keep-alive for probes), TLS
//! without verification for `scheme: HTTPS` (upstream `InsecureSkipVerify`), redirects followed
//! only to the same host, at most 10, and at most 10 KiB of the body kept for messages.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Upstream `maxRespBodyLength`.
const MAX_BODY: usize = 10 * 1024;
/// Upstream follows at most this many redirects.
const MAX_REDIRECTS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A GET as the probe or hook describes it, with its host and port resolved.
#[derive(Clone, Debug)]
pub struct HttpGet {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Headers from the spec; `Host` among them sets the request's host.
    pub headers: Vec<(String, String)>,
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: StatusCode,
    /// At most [`MAX_BODY`] bytes.
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("Get \"{url}\": {reason}")]
    Request { url: String, reason: String },
    #[error(
        "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )]
    Timeout { url: String },
    #[error("Get \"{url}\": stopped after {MAX_REDIRECTS} redirects")]
    TooManyRedirects { url: String },
}

/// The version kubelets send in `User-Agent: kube-probe/<major>.<minor>`.
pub const USER_AGENT: &str = "kube-probe/1.35";

impl HttpGet {
    pub fn url(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let host = if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{scheme}://{host}:{}{}", self.port, self.path)
    }
}

/// Sends the GET, following same-host redirects, all within `timeout`.
pub async fn get(request: &HttpGet, timeout: Duration) -> Result<HttpResponse, HttpError> {
    let url = request.url();
    match tokio::time::timeout(timeout, follow(request.clone())).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout { url }),
    }
}

/// Sends the GET with no deadline of its own (a lifecycle hook, bounded by its caller).
pub async fn get_unbounded(request: &HttpGet) -> Result<HttpResponse, HttpError> {
    follow(request.clone()).await
}

async fn follow(mut request: HttpGet) -> Result<HttpResponse, HttpError> {
    for _ in 0..=MAX_REDIRECTS {
        let (response, location) = once(&request).await?;
        let Some(location) = location.filter(|_| response.status.is_redirection()) else {
            return Ok(response);
        };
        match redirect_target(&request, &location) {
            Some(next) => request = next,
            // Another host: the redirect itself is the answer (upstream `ErrUseLastResponse`).
            None => return Ok(response),
        }
    }
    Err(HttpError::TooManyRedirects { url: request.url() })
}

/// Where a `Location` leads, if it stays on the same host.
fn redirect_target(from: &HttpGet, location: &str) -> Option<HttpGet> {
    if location.starts_with('/') {
        return Some(HttpGet {
            path: location.to_owned(),
            ..from.clone()
        });
    }
    let uri: hyper::Uri = location.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    if host != from.host {
        return None;
    }
    let scheme = match uri.scheme_str() {
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        _ => return None,
    };
    let port = uri.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    Some(HttpGet {
        scheme,
        host: from.host.clone(),
        port,
        path: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        headers: from.headers.clone(),
    })
}

/// One request on a new connection; the response and its `Location`.
async fn once(request: &HttpGet) -> Result<(HttpResponse, Option<String>), HttpError> {
    let url = request.url();
    let fail = |reason: String| HttpError::Request {
        url: url.clone(),
        reason,
    };
    let tcp = TcpStream::connect((request.host.as_str(), request.port))
        .await
        .map_err(|e| {
            fail(format!(
                "dial tcp {}:{}: connect: {e}",
                request.host, request.port
            ))
        })?;
    let mut builder = Request::get(request.path.as_str());
    let mut host_header = format!("{}:{}", request.host, request.port);
    let mut has_agent = false;
    let mut has_accept = false;
    for (name, value) in &request.headers {
        if name.eq_ignore_ascii_case("host") {
            host_header = value.clone();
            continue;
        }
        has_agent |= name.eq_ignore_ascii_case("user-agent");
        has_accept |= name.eq_ignore_ascii_case("accept");
        builder = builder.header(name.as_str(), value.as_str());
    }
    if !has_agent {
        builder = builder.header(header::USER_AGENT, USER_AGENT);
    }
    if !has_accept {
        builder = builder.header(header::ACCEPT, "*/*");
    }
    let req = builder
        .header(header::HOST, host_header)
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(e.to_string()))?;
    let response = match request.scheme {
        Scheme::Http => send(TokioIo::new(tcp), req).await,
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(request.host.clone())
                .map_err(|e| fail(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(insecure_tls())
                .connect(name, tcp)
                .await
                .map_err(|e| fail(e.to_string()))?;
            send(TokioIo::new(tls), req).await
        }
    };
    response.map_err(fail)
}

async fn send<IO>(
    io: IO,
    req: Request<Empty<Bytes>>,
) -> Result<(HttpResponse, Option<String>), String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let response = sender.send_request(req).await.map_err(|e| e.to_string());
    let result = match response {
        Ok(response) => {
            let status = response.status();
            let location = response
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = read_at_most(response.into_body()).await;
            Ok((HttpResponse { status, body }, location))
        }
        Err(e) => Err(e),
    };
    driver.abort();
    result
}

/// The body's first [`MAX_BODY`] bytes; a body that breaks off keeps what came.
async fn read_at_most(mut body: hyper::body::Incoming) -> Bytes {
    let mut kept = Vec::new();
    while kept.len() < MAX_BODY {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let room = MAX_BODY - kept.len();
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            _ => break,
        }
    }
    Bytes::from(kept)
}

/// Probes check that something answers, not who: like upstream, HTTPS targets are not verified.
fn insecure_tls() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                        .with_no_client_auth()
                });
            match config {
                Ok(config) => Arc::new(config),
                // The ring provider supports the default versions; keep a verifying config
                // rather than fail if that ever changes.
                Err(_) => Arc::new(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                ),
            }
        })
        .clone()
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> HttpGet {
        HttpGet {
            scheme: Scheme::Http,
            host: "10.0.0.5".into(),
            port: 8080,
            path: "/healthz".into(),
            headers: vec![],
        }
    }

    #[test]
    fn urls_bracket_ipv6_hosts() {
        assert_eq!(target().url(), "http://10.0.0.5:8080/healthz");
        let v6 = HttpGet {
            host: "fd00::1".into(),
            ..target()
        };
        assert_eq!(v6.url(), "http://[fd00::1]:8080/healthz");
    }

    #[test]
    fn redirects_are_followed_only_on_the_same_host() {
        let relative = redirect_target(&target(), "/other?x=1").map(|t| t.url());
        assert_eq!(relative.as_deref(), Some("http://10.0.0.5:8080/other?x=1"));
        let same = redirect_target(&target(), "https://10.0.0.5:8443/tls").map(|t| t.url());
        assert_eq!(same.as_deref(), Some("https://10.0.0.5:8443/tls"));
        assert!(redirect_target(&target(), "http://example.com/").is_none());
    }
}
