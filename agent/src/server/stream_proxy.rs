//! The upgrade-aware proxy between a client of the kubelet server and the runtime's streaming
//! server: the client's request (its query kept, its credentials not) goes to the CRI URL; once
//! both sides switched protocols (SPDY/3.1 or WebSocket), bytes are copied both ways until either
//! side closes. An answer other than 101 goes back to the client as the runtime gave it.
//!
//! Not here: which URL (`streaming.rs`). Upstream: apimachinery's `UpgradeAwareHandler` with
//! `upgradeRequired`, as `pkg/kubelet/server/server.go` `proxyStream` uses it.

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (code, message.into()).into_response()
}

/// Headers that belong to one hop; `Connection` and `Upgrade` are kept (they carry the
/// upgrade), the client's credentials are not passed on.
fn forwarded_headers(from: &HeaderMap, host: &str) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        if matches!(
            name.as_str(),
            "host"
                | "authorization"
                | "proxy-connection"
                | "keep-alive"
                | "transfer-encoding"
                | "te"
        ) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Ok(host) = HeaderValue::from_str(host) {
        out.insert(header::HOST, host);
    }
    out
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        && headers.contains_key(header::UPGRADE)
}

/// Proxies an upgrade request to the runtime's streaming server at `url` (keeping the client's
/// query) and, once both sides switched protocols, copies bytes both ways until either closes.
pub async fn proxy_stream(url: &str, mut request: Request) -> Response {
    if !is_upgrade(request.headers()) {
        return error(StatusCode::BAD_REQUEST, "Upgrade request required");
    }
    let Ok(location) = url.parse::<Uri>() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's streaming URL {url:?} is not a URL"),
        );
    };
    let (Some(host), scheme) = (location.host(), location.scheme_str()) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no host in {url:?}"),
        );
    };
    if scheme != Some("http") {
        // containerd serves plain HTTP on loopback by default; TLS streaming is not supported.
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("streaming URL {url:?}: only http:// is supported"),
        );
    }
    let port = location.port_u16().unwrap_or(80);
    let authority = format!("{host}:{port}");
    let path = match request.uri().query() {
        Some(q) => format!("{}?{q}", location.path()),
        None => location.path().to_owned(),
    };
    let tcp = match tokio::net::TcpStream::connect(&authority).await {
        Ok(tcp) => tcp,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server {authority}: {e}"),
            );
        }
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp)).await {
            Ok(pair) => pair,
            Err(e) => return error(StatusCode::BAD_GATEWAY, e.to_string()),
        };
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "streaming proxy: runtime connection ended");
        }
    });
    let mut upstream = http::Request::builder()
        .method(request.method().clone())
        .uri(path);
    if let Some(headers) = upstream.headers_mut() {
        *headers = forwarded_headers(request.headers(), &authority);
    }
    let Ok(upstream) = upstream.body(Body::empty()) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "building the proxied request",
        );
    };
    let mut answer = match sender.send_request(upstream).await {
        Ok(answer) => answer,
        Err(e) => return error(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (e.g. an unknown protocol): its answer goes back as is.
        let (parts, body) = answer.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let client_side = hyper::upgrade::on(&mut request);
    let runtime_side = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, runtime) = match tokio::join!(client_side, runtime_side) {
            (Ok(c), Ok(r)) => (c, r),
            (c, r) => {
                tracing::debug!(client = ?c.err(), runtime = ?r.err(), "streaming proxy: upgrade failed");
                return;
            }
        };
        let (mut client, mut runtime) = (TokioIo::new(client), TokioIo::new(runtime));
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut runtime).await {
            tracing::debug!(error = %e, "streaming proxy: session ended");
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = answer.headers().clone();
    response
}
