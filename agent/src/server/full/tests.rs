//! The auth filter in front of the full server's routes: the status and body of each refusal,
//! and a request let through to its handler.

use axum::body::Body;
use http::Request as HttpRequest;
use tower::ServiceExt as _;

use super::*;
use crate::{
    config::AuthorizationMode,
    metrics::Metrics,
    server::{
        Health,
        auth::{Attributes, ReviewError, Reviewer, TokenReviewed, UserInfo},
    },
};

/// Allows only `subresource`, or fails every review.
struct OneSubresource(Option<&'static str>);

#[tonic::async_trait]
impl Reviewer for OneSubresource {
    async fn review_token(&self, _: &str) -> Result<TokenReviewed, ReviewError> {
        Err(ReviewError::unreachable("TokenReview"))
    }
    async fn review_access(&self, attributes: &Attributes) -> Result<bool, ReviewError> {
        match self.0 {
            Some(allowed) => Ok(attributes.subresource == allowed),
            None => Err(ReviewError::unreachable("SubjectAccessReview")),
        }
    }
}

fn app(mode: AuthorizationMode, reviewer: Option<OneSubresource>) -> Router {
    app_with(mode, reviewer, None)
}

fn app_with(
    mode: AuthorizationMode,
    reviewer: Option<OneSubresource>,
    configz: Option<serde_json::Value>,
) -> Router {
    router(FullState {
        http: HttpState {
            metrics: Metrics::new().expect("metrics"),
            health: Health::default(),
            pods: None,
            annotate: None,
            node: None,
        },
        summary: None,
        streaming: None,
        logs: None,
        auth: Arc::new(Auth {
            node_name: "node-1".into(),
            anonymous: false,
            token_webhook: false,
            mode,
            reviewer: reviewer.map(|r| Arc::new(r) as Arc<dyn Reviewer>),
        }),
        configz: configz.map(Arc::new),
    })
}

#[tokio::test]
async fn configz_is_served_behind_its_own_subresource() {
    let config = serde_json::json!({"kubeletconfig": {"syncFrequency": "1m0s"}});
    let configz_only = || {
        app_with(
            AuthorizationMode::Webhook,
            Some(OneSubresource(Some("configz"))),
            Some(config.clone()),
        )
    };
    let (status, body) = get(configz_only(), "/configz", Some("prometheus")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).ok(),
        Some(config.clone())
    );
    assert_eq!(
        get(configz_only(), "/configz", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let metrics_only = app_with(
        AuthorizationMode::Webhook,
        Some(OneSubresource(Some("metrics"))),
        Some(config),
    );
    assert_eq!(
        get(metrics_only, "/configz", Some("prometheus")).await.0,
        StatusCode::FORBIDDEN
    );
    // Without debugging handlers there is no such path (upstream installs it with them).
    assert_eq!(
        get(open_again(), "/configz", Some("alice")).await.0,
        StatusCode::NOT_FOUND
    );
}

fn open_again() -> Router {
    app(AuthorizationMode::AlwaysAllow, None)
}

async fn get(app: Router, path: &str, user: Option<&str>) -> (StatusCode, String) {
    let mut request = HttpRequest::get(path).body(Body::empty()).expect("request");
    if let Some(name) = user {
        request.extensions_mut().insert(PeerUser(Some(UserInfo {
            name: name.into(),
            ..UserInfo::default()
        })));
    }
    let response = app.oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn refusals_carry_upstreams_status_and_message() {
    let open = app(AuthorizationMode::AlwaysAllow, None);
    assert_eq!(
        get(open.clone(), "/pods", None).await,
        (StatusCode::UNAUTHORIZED, "Unauthorized".into())
    );
    let (status, body) = get(open, "/pods", Some("alice")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"kind\":\"PodList\""), "{body}");

    let metrics_only = app(
        AuthorizationMode::Webhook,
        Some(OneSubresource(Some("metrics"))),
    );
    assert_eq!(
        get(metrics_only.clone(), "/healthz", Some("prometheus")).await,
        (
            StatusCode::FORBIDDEN,
            "Forbidden (user=prometheus, verb=get, resource=nodes, subresource(s)=[healthz proxy])"
                .into()
        )
    );
    assert_eq!(
        get(metrics_only, "/metrics", Some("prometheus")).await.0,
        StatusCode::OK
    );

    // Without container access (enableDebuggingHandlers off), the paths say so, after auth.
    assert_eq!(
        get(
            open_again(),
            "/exec/default/web/main?stdout=1",
            Some("alice")
        )
        .await,
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.\n".into()
        )
    );
    assert_eq!(
        get(open_again(), "/runningpods/", None).await.0,
        StatusCode::UNAUTHORIZED
    );

    let broken = app(AuthorizationMode::Webhook, Some(OneSubresource(None)));
    assert_eq!(
        get(broken, "/stats/summary", Some("alice")).await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Authorization error (user=alice, verb=get, resource=nodes, subresource=stats)".into()
        )
    );
}
