//! TokenReview and SubjectAccessReview against kube's mock transport: the exact requests, the
//! answers' meaning, and the caches' lifetimes (paused time).

use std::{sync::Arc, time::Duration};

use http::{Method, Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

use super::*;

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn reviewer() -> (KubeReviewer, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (
        KubeReviewer::new(
            client,
            Duration::from_secs(120),
            Duration::from_secs(300),
            Duration::from_secs(30),
        ),
        handle,
    )
}

/// Takes the next request, asserts it is `POST path` with `body`, and answers `reply`.
async fn expect_post(handle: &mut ApiHandle, path: &str, body: Value, reply: Value) {
    let (request, respond) = handle.next_request().await.expect("a request");
    let (parts, request_body) = request.into_parts();
    assert_eq!((&parts.method, parts.uri.path()), (&Method::POST, path));
    assert_eq!(
        parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let bytes = request_body.collect_bytes().await.expect("body");
    let sent: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(sent, body);
    let bytes = serde_json::to_vec(&reply).expect("JSON");
    respond.send_response(
        Response::builder()
            .status(201)
            .body(Body::from(bytes))
            .expect("response"),
    );
}

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

#[tokio::test(start_paused = true)]
async fn token_reviews_are_asked_once_per_ttl() {
    let (reviewer, mut api) = reviewer();
    let reviewer = Arc::new(reviewer);
    let ask = {
        let reviewer = reviewer.clone();
        tokio::spawn(async move { reviewer.review_token("t0k3n").await })
    };
    expect_post(
        &mut api,
        TOKEN_REVIEWS,
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {},
            "spec": { "token": "t0k3n" },
        }),
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {},
            "spec": { "token": "t0k3n" },
            "status": {
                "authenticated": true,
                "user": { "username": "bob", "uid": "42", "groups": ["ops"] },
            },
        }),
    )
    .await;
    let bob = UserInfo {
        name: "bob".into(),
        uid: "42".into(),
        groups: vec!["ops".into()],
        ..UserInfo::default()
    };
    assert_eq!(
        ask.await.expect("task").ok(),
        Some(TokenReviewed::User(bob.clone()))
    );
    // Within cacheTTL: no request (the mock would hang the call otherwise).
    tokio::time::advance(Duration::from_secs(119)).await;
    assert_eq!(
        reviewer.review_token("t0k3n").await.ok(),
        Some(TokenReviewed::User(bob))
    );
    // After it: asked again; a rejection carries the API server's error.
    tokio::time::advance(Duration::from_secs(2)).await;
    let ask = {
        let reviewer = reviewer.clone();
        tokio::spawn(async move { reviewer.review_token("t0k3n").await })
    };
    expect_post(
        &mut api,
        TOKEN_REVIEWS,
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {},
            "spec": { "token": "t0k3n" },
        }),
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {},
            "spec": {},
            "status": { "authenticated": false, "error": "token expired" },
        }),
    )
    .await;
    assert_eq!(
        ask.await.expect("task").ok(),
        Some(TokenReviewed::Rejected("token expired".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn access_reviews_carry_upstreams_attributes_and_cache_by_answer() {
    let (reviewer, mut api) = reviewer();
    let reviewer = Arc::new(reviewer);
    let attrs = Attributes {
        user: UserInfo {
            name: "alice".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            ..UserInfo::default()
        },
        verb: "get",
        subresource: "stats",
        node: "node-1".into(),
        path: "/stats/summary".into(),
    };
    let request = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {
            "user": "alice",
            "groups": ["dev", "system:authenticated"],
            "resourceAttributes": {
                "verb": "get",
                "version": "v1",
                "resource": "nodes",
                "subresource": "stats",
                "name": "node-1",
            },
        },
    });
    let answer = |allowed: bool| {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "metadata": {},
            "spec": {},
            "status": { "allowed": allowed },
        })
    };

    let ask = {
        let (reviewer, attrs) = (reviewer.clone(), attrs.clone());
        tokio::spawn(async move { reviewer.review_access(&attrs).await })
    };
    expect_post(&mut api, ACCESS_REVIEWS, request.clone(), answer(false)).await;
    assert_eq!(ask.await.expect("task").ok(), Some(false));
    // A denial is kept for cacheUnauthorizedTTL (30 s) only.
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(reviewer.review_access(&attrs).await.ok(), Some(false));
    tokio::time::advance(Duration::from_secs(2)).await;
    let ask = {
        let (reviewer, attrs) = (reviewer.clone(), attrs.clone());
        tokio::spawn(async move { reviewer.review_access(&attrs).await })
    };
    expect_post(&mut api, ACCESS_REVIEWS, request, answer(true)).await;
    assert_eq!(ask.await.expect("task").ok(), Some(true));
    // An allowance for cacheAuthorizedTTL (5 min).
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(reviewer.review_access(&attrs).await.ok(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn an_api_error_is_an_error_not_a_denial() {
    let (reviewer, mut api) = reviewer();
    let reviewer = Arc::new(reviewer);
    let ask = {
        let reviewer = reviewer.clone();
        tokio::spawn(async move { reviewer.review_token("x").await })
    };
    let (_, respond) = api.next_request().await.expect("a request");
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "forbidden", "reason": "Forbidden", "code": 403});
    respond.send_response(
        Response::builder()
            .status(403)
            .body(Body::from(serde_json::to_vec(&body).expect("JSON")))
            .expect("response"),
    );
    let result = ask.await.expect("task");
    assert!(
        matches!(&result, Err(e @ ReviewError::Api { review: "TokenReview", .. })
            if e.to_string().starts_with("TokenReview:")),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_caches_are_bounded_at_upstreams_sizes_and_huge_attributes_are_not_kept() {
    let (reviewer, mut api) = reviewer();
    assert_eq!(reviewer.tokens.capacity(), 32 * 1024);
    assert_eq!(reviewer.access.capacity(), 8192);
    let reviewer = Arc::new(reviewer);
    // A user with groups worth more than upstream's 10,000 bytes of attributes.
    let attrs = Attributes {
        user: UserInfo {
            name: "mallory".into(),
            groups: (0..400).map(|i| format!("group-{i:030}")).collect(),
            ..UserInfo::default()
        },
        verb: "get",
        subresource: "pods",
        node: "node-1".into(),
        path: "/pods".into(),
    };
    for _ in 0..2 {
        let ask = {
            let (reviewer, attrs) = (reviewer.clone(), attrs.clone());
            tokio::spawn(async move { reviewer.review_access(&attrs).await })
        };
        // Asked each time: the answer was not cached.
        let (_, respond) = api.next_request().await.expect("a request");
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {}, "spec": {}, "status": {"allowed": true}});
        respond.send_response(
            Response::builder()
                .status(201)
                .body(Body::from(serde_json::to_vec(&body).expect("JSON")))
                .expect("response"),
        );
        assert_eq!(ask.await.expect("task").ok(), Some(true));
    }
    assert_eq!(reviewer.access.len(), 0);
}
