//! The kubelet server (`port`, default 10250): TLS only, every request authenticated and
//! authorized (`auth.rs`) before its handler. It serves what the read-only port serves
//! (`/pods`, `/healthz`, `/metrics`, `/stats/summary`) and what only an authorized client may do:
//! `/runningpods/`, `/run`, `/exec`, `/attach`, `/portForward` (`streaming.rs`), `/configz`
//! (`config/configz.rs`).
//!
//! [`router`] builds the routes from a [`FullState`]; more routes are merged in by whoever adds
//! them (the auth filter wraps everything merged before [`with_auth`]). The TLS accept loop is
//! `listener.rs`: each connection's verified client certificate becomes a [`PeerUser`] in its
//! requests.
//!
//! Not here: the read-only port (`http.rs`). Upstream: `pkg/kubelet/server/server.go`
//! (`ListenAndServeKubeletServer`, `InstallAuthFilter`, `InstallDefaultHandlers`,
//! `InstallDebuggingHandlers`).

use std::sync::Arc;

use axum::{
    Router,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::any,
};

use super::{
    auth::{Auth, PeerUser, Refusal, request_attributes},
    http::{HttpState, read_only_router as read_only_routes},
    stats::{self, SummaryProvider},
    streaming::{self, Streaming},
};

/// What the full server's handlers need.
#[derive(Clone)]
pub struct FullState {
    /// `/pods`, `/healthz`, `/metrics`, as the read-only port serves them.
    pub http: HttpState,
    pub summary: Option<Arc<SummaryProvider>>,
    /// Container access; `None` when `enableDebuggingHandlers` is off.
    pub streaming: Option<Arc<Streaming>>,
    /// `/containerLogs`, served with container access.
    pub logs: Option<super::logs::LogsState>,
    pub auth: Arc<Auth>,
    /// The effective configuration for `/configz`; `None` when `enableDebuggingHandlers` is off
    /// (upstream installs it among the debugging handlers).
    pub configz: Option<Arc<serde_json::Value>>,
}

/// Every route of the full server, behind the auth filter.
pub fn router(state: FullState) -> Router {
    let mut routes = read_only_routes(state.http.clone());
    if let Some(summary) = &state.summary {
        routes = routes.merge(stats::router(summary.clone()));
    }
    // Container logs and access are upstream's debugging handlers: on only together.
    routes = match &state.streaming {
        Some(streaming) => {
            let routes = routes.merge(streaming::router(streaming.clone()));
            match &state.logs {
                Some(logs) => routes.merge(super::logs::router(logs.clone())),
                None => routes,
            }
        }
        None => routes.merge(debugging_disabled()),
    };
    if let Some(configz) = state.configz {
        routes = routes.route(
            "/configz",
            axum::routing::get(move || async move { configz_answer(&configz) }),
        );
    }
    with_auth(routes, state.auth)
}

/// Upstream `configz.handle`: the registered configurations as one JSON object.
fn configz_answer(configz: &serde_json::Value) -> Response {
    match serde_json::to_string(configz) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Upstream `InstallDebuggingDisabledHandlers`: the debugging paths answer 405.
fn debugging_disabled() -> Router {
    let disabled = || async {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.\n",
        )
    };
    [
        "/run",
        "/exec",
        "/attach",
        "/portForward",
        "/containerLogs",
        "/runningpods",
    ]
    .into_iter()
    .fold(Router::new(), |router, prefix| {
        router
            .route(&format!("{prefix}/"), any(disabled))
            .route(&format!("{prefix}/{{*rest}}"), any(disabled))
    })
}

/// `routes` behind authentication and authorization.
pub fn with_auth(routes: Router, auth: Arc<Auth>) -> Router {
    routes.layer(middleware::from_fn_with_state(auth, auth_filter))
}

/// Upstream `InstallAuthFilter`: 401 without a user, 403 when no attribute is allowed, 500 when
/// the authorizer fails.
async fn auth_filter(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<PeerUser>()
        .and_then(|p| p.0.clone());
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = match auth.authenticate(peer.as_ref(), header).await {
        Ok(user) => user,
        Err(refusal) => return refused(refusal),
    };
    let attributes = request_attributes(
        &user,
        request.method(),
        request.uri().path(),
        &auth.node_name,
    );
    if let Err(refusal) = auth.authorize(&attributes).await {
        tracing::debug!(
            user = user.name,
            path = request.uri().path(),
            ?refusal,
            "kubelet API: refused"
        );
        return refused(refusal);
    }
    next.run(request).await
}

fn refused(refusal: Refusal) -> Response {
    let (code, body) = match refusal {
        Refusal::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized".to_owned()),
        Refusal::Forbidden(message) => (StatusCode::FORBIDDEN, message),
        Refusal::AuthorizerError(message) => (StatusCode::INTERNAL_SERVER_ERROR, message),
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests;
