//! The routes and the controllers together, in process: a bootstrapper's CSR through the
//! router, approved and signed by the controllers, a serving CSR approved through
//! `/approval`, and the requests a bootstrapper may not make.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{Request, header},
};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::*;
use crate::apiserver::{
    ServerConfig,
    csr::tests::{csr_object, request_pem},
    http::router,
    serve,
};

const BOOT: &str = "abcdef.0123456789abcdef";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn server(auto_approve: bool) -> Arc<ApiServer> {
    let config = ServerConfig {
        token: "admin".to_owned(),
        bootstrap_tokens: vec![BOOT.to_owned()],
        auto_approve,
        ..ServerConfig::default()
    };
    let certificates = serve::certificates().expect("certificates");
    let server = Arc::new(
        ApiServer::new(config, 6443)
            .with_ca(certificates.ca)
            .expect("a CA"),
    );
    tokio::spawn(run(server.clone()));
    server
}

async fn call(
    server: &Arc<ApiServer>,
    token: &str,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map(|b| Body::from(b.to_string())).unwrap_or_default())
        .expect("a request");
    let response = router(server.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn until(server: &Arc<ApiServer>, name: &str, want: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..500 {
        let (_, csr) = call(server, "admin", "GET", &format!("{CSRS}/{name}"), None).await;
        if want(&csr) {
            return csr;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("CSR {name} never reached the wanted state");
}

fn request(name: &str, sans: &[&str], signer: &str, usages: &[&str]) -> Value {
    let pem = request_pem("system:node:n1", &["system:nodes"], sans);
    let mut object = csr_object(name, &pem, signer, usages);
    object["status"] = json!({});
    object
}

#[tokio::test]
async fn a_bootstrapper_s_client_csr_is_approved_then_signed() {
    let server = server(true);
    let mut changes = server.store().subscribe();
    let body = request(
        "c1",
        &[],
        csr::CLIENT_KUBELET_SIGNER,
        &["digital signature", "client auth"],
    );
    let (code, created) = call(&server, BOOT, "POST", CSRS, Some(body)).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["username"], "system:bootstrap:abcdef");
    let signed = until(&server, "c1", |c| c["status"]["certificate"].is_string()).await;
    assert!(csr::has_condition(&signed, "Approved"));
    // ADDED, MODIFIED (approved), MODIFIED (signed): the signature is a change of its own.
    let mut seen = Vec::new();
    while let Ok(change) = changes.try_recv() {
        seen.push((
            change.change,
            csr::has_condition(&change.object, "Approved"),
            change.object["status"]["certificate"].is_string(),
        ));
    }
    use crate::apiserver::store::ChangeType::{Added, Modified};
    assert_eq!(
        seen,
        [
            (Added, false, false),
            (Modified, true, false),
            (Modified, true, true)
        ]
    );
}

#[tokio::test]
async fn serving_csrs_wait_for_an_approval_and_bootstrappers_may_not_approve() {
    let server = server(true);
    let usages = ["digital signature", "key encipherment", "server auth"];
    let body = request("s1", &["n1"], csr::KUBELET_SERVING_SIGNER, &usages);
    let (code, created) = call(&server, BOOT, "POST", CSRS, Some(body)).await;
    assert_eq!(code, 201, "{created}");
    let mut approved = created.clone();
    approved["status"]["conditions"] =
        json!([{"type": "Approved", "status": "True", "reason": "KubectlApprove"}]);
    let uri = format!("{CSRS}/s1/approval");
    let (code, denied) = call(&server, BOOT, "PUT", &uri, Some(approved.clone())).await;
    assert_eq!(code, 403, "{denied}");
    assert_eq!(denied["reason"], "Forbidden");
    let (code, _) = call(
        &server,
        BOOT,
        "GET",
        "/api/v1/namespaces/default/pods",
        None,
    )
    .await;
    assert_eq!(code, 403);
    let (code, _) = call(&server, BOOT, "GET", "/_test/requests", None).await;
    assert_eq!(code, 403, "the controls are for masters");
    let (_, pending) = call(&server, "admin", "GET", &format!("{CSRS}/s1"), None).await;
    assert!(
        pending["status"]["certificate"].is_null(),
        "not auto-approved"
    );
    let (code, answer) = call(&server, "admin", "PUT", &uri, Some(approved)).await;
    assert_eq!(code, 200, "{answer}");
    let signed = until(&server, "s1", |c| c["status"]["certificate"].is_string()).await;
    let reasons: Vec<&str> = signed["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["KubectlApprove"]);
}

#[tokio::test]
async fn without_auto_approval_a_client_csr_waits_and_a_bad_one_fails_when_approved() {
    let server = server(false);
    // A client CSR with a SAN: never auto-approved; approved by hand, the signer fails it.
    let body = request(
        "c2",
        &["n1"],
        csr::CLIENT_KUBELET_SIGNER,
        &["digital signature", "client auth"],
    );
    let (code, created) = call(&server, BOOT, "POST", CSRS, Some(body)).await;
    assert_eq!(code, 201, "{created}");
    let mut approved = created;
    approved["status"]["conditions"] = json!([{"type": "Approved", "status": "True"}]);
    let uri = format!("{CSRS}/c2/approval");
    let (code, answer) = call(&server, "admin", "PUT", &uri, Some(approved)).await;
    assert_eq!(code, 200, "{answer}");
    let failed = until(&server, "c2", |c| csr::has_condition(c, "Failed")).await;
    let condition = failed["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .unwrap_or_default();
    assert_eq!(condition["reason"], "SignerValidationFailure");
    assert_eq!(condition["message"], "DNS subjectAltNames are not allowed");
    assert!(failed["status"]["certificate"].is_null());
}

#[tokio::test]
async fn a_self_subject_review_names_the_requester() {
    let server = server(true);
    let uri = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let (code, review) = call(&server, BOOT, "POST", uri, Some(json!({}))).await;
    assert_eq!(code, 201, "{review}");
    assert_eq!(review["kind"], "SelfSubjectReview");
    assert_eq!(
        review["status"]["userInfo"]["username"],
        "system:bootstrap:abcdef"
    );
    assert_eq!(
        review["status"]["userInfo"]["groups"],
        json!(["system:bootstrappers", "system:authenticated"])
    );
    let (code, _) = call(&server, "nope", "POST", uri, Some(json!({}))).await;
    assert_eq!(code, 401);
}
