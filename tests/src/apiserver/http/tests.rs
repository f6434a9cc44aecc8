//! The routes, driven through the router without TLS.

use serde_json::json;
use tower::ServiceExt as _;

use super::*;
use crate::apiserver::ServerConfig;

fn server() -> Arc<ApiServer> {
    let config = ServerConfig {
        token: "t".to_owned(),
        max_body_bytes: 64 * 1024,
        ..ServerConfig::default()
    };
    Arc::new(ApiServer::new(config, 6443))
}

async fn call(
    server: &Arc<ApiServer>,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, "Bearer t")
        .header(header::CONTENT_TYPE, content_type)
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

const JSON: &str = "application/json";

fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

#[tokio::test]
async fn create_get_list_and_not_found() {
    let server = server();
    let (status, created) = call(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(pod("a", "n1")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(pod("b", "n2")),
    )
    .await;
    let (status, got) = call(
        &server,
        "GET",
        "/api/v1/namespaces/default/pods/a",
        JSON,
        None,
    )
    .await;
    assert_eq!(
        (status, &got["metadata"]["uid"]),
        (200, &created["metadata"]["uid"])
    );
    let (status, list) = call(
        &server,
        "GET",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1",
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(list["items"][0]["metadata"]["name"], "a");
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    let (status, missing) = call(
        &server,
        "GET",
        "/api/v1/namespaces/default/pods/zz",
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        (missing["kind"].as_str(), missing["reason"].as_str()),
        (Some("Status"), Some("NotFound"))
    );
    let (status, nowhere) = call(
        &server,
        "POST",
        "/api/v1/namespaces/nowhere/pods",
        JSON,
        Some(pod("c", "n1")),
    )
    .await;
    assert_eq!(
        (status, nowhere["message"].as_str()),
        (404, Some("namespaces \"nowhere\" not found"))
    );
    let (status, _) = call(
        &server,
        "GET",
        "/api/v1/namespaces/default/widgets",
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn limit_and_continue_page_through_a_list() {
    let server = server();
    for name in ["a", "b", "c"] {
        call(
            &server,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            JSON,
            Some(json!({"metadata": {"name": name}})),
        )
        .await;
    }
    let mut names = Vec::new();
    let mut uri = "/api/v1/namespaces/default/configmaps?limit=2".to_owned();
    for _ in 0..3 {
        let (status, page) = call(&server, "GET", &uri, JSON, None).await;
        assert_eq!(status, 200, "{page}");
        names.extend(
            page["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned)),
        );
        match page["metadata"]["continue"].as_str() {
            Some(token) => {
                uri = format!("/api/v1/namespaces/default/configmaps?limit=2&continue={token}")
            }
            None => break,
        }
    }
    assert_eq!(names, ["a", "b", "c"]);
}

#[tokio::test]
async fn patches_of_each_type_and_the_status_subresource() {
    let server = server();
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(pod("a", "n1")),
    )
    .await;
    let base = "/api/v1/namespaces/default/pods/a";
    let (status, merged) = call(
        &server,
        "PATCH",
        base,
        "application/merge-patch+json",
        Some(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await;
    assert_eq!(
        (status, &merged["metadata"]["labels"]["x"]),
        (200, &json!("1"))
    );
    let (status, patched) = call(
        &server,
        "PATCH",
        base,
        "application/json-patch+json",
        Some(json!([{"op": "add", "path": "/metadata/labels/y", "value": "2"}])),
    )
    .await;
    assert_eq!(
        (status, &patched["metadata"]["labels"]["y"]),
        (200, &json!("2"))
    );
    let status_patch = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    let (status, ignored) = call(
        &server,
        "PATCH",
        base,
        "application/strategic-merge-patch+json",
        Some(status_patch.clone()),
    )
    .await;
    assert_eq!(
        (status, &ignored["status"]["phase"]),
        (200, &json!("Pending"))
    );
    let (status, running) = call(
        &server,
        "PATCH",
        &format!("{base}/status"),
        "application/strategic-merge-patch+json",
        Some(status_patch),
    )
    .await;
    assert_eq!(
        (status, &running["status"]["phase"]),
        (200, &json!("Running"))
    );
    let (status, _) = call(
        &server,
        "PATCH",
        base,
        "application/apply-patch+yaml",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 415);
    let (status, wrong_uid) = call(
        &server,
        "PATCH",
        &format!("{base}/status"),
        "application/strategic-merge-patch+json",
        Some(json!({"metadata": {"uid": "not-it"}, "status": {"phase": "Failed"}})),
    )
    .await;
    assert_eq!(
        (status, wrong_uid["reason"].as_str()),
        (422, Some("Invalid"))
    );
}

#[tokio::test]
async fn authentication_body_limit_and_faults() {
    let server = server();
    let request = Request::builder()
        .uri("/api/v1/pods")
        .body(Body::empty())
        .expect("a request");
    let response = router(server.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let big = json!({"metadata": {"name": "big"}, "data": {"x": "y".repeat(100 * 1024)}});
    let (status, too_large) = call(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        Some(big),
    )
    .await;
    assert_eq!(
        (status, too_large["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
    let (status, _) = call(
        &server,
        "POST",
        "/_test/unavailable",
        JSON,
        Some(json!({"enabled": true})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call(&server, "GET", "/api/v1/pods", JSON, None).await;
    assert_eq!(status, 503);
    call(
        &server,
        "POST",
        "/_test/unavailable",
        JSON,
        Some(json!({"enabled": false})),
    )
    .await;
    let (status, _) = call(&server, "GET", "/api/v1/pods", JSON, None).await;
    assert_eq!(status, 200);
    let (_, log) = call(&server, "GET", "/_test/requests", JSON, None).await;
    let paths: Vec<&str> = log["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(
        paths.iter().filter(|p| **p == "/api/v1/pods").count() >= 3,
        "{log}"
    );
    assert!(paths.iter().all(|p| !p.starts_with("/_test/")));
    let codes: Vec<u64> = log["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["code"].as_u64())
        .collect();
    assert!(
        codes.contains(&503) && codes.contains(&413) && codes.contains(&200),
        "{log}"
    );
}

#[tokio::test]
async fn tokens_reviews_version_and_discovery() {
    let server = server();
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        JSON,
        Some(json!({"metadata": {"name": "sa"}})),
    )
    .await;
    let (status, issued) = call(
        &server,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/sa/token",
        JSON,
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["x"], "expirationSeconds": 3600}})),
    )
    .await;
    assert_eq!(status, 201, "{issued}");
    let token = issued["status"]["token"]
        .as_str()
        .expect("a token")
        .to_owned();
    assert!(issued["status"]["expirationTimestamp"].is_string());
    let (status, review) = call(
        &server,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        JSON,
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})),
    )
    .await;
    assert_eq!(
        (status, &review["status"]["user"]["username"]),
        (201, &json!("system:serviceaccount:default:sa"))
    );
    let table = json!({"access": [{"user": "alice", "allowed": true}]});
    assert_eq!(
        call(&server, "PUT", "/_test/reviews", JSON, Some(table))
            .await
            .0,
        200
    );
    let (_, access) = call(
        &server,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        JSON,
        Some(json!({"spec": {"user": "alice", "resourceAttributes": {"verb": "get", "resource": "nodes"}}})),
    )
    .await;
    assert_eq!(access["status"]["allowed"], true);
    let (status, version) = call(&server, "GET", "/version", JSON, None).await;
    assert_eq!((status, &version["major"]), (200, &json!("1")));
    let (_, core) = call(&server, "GET", "/api/v1", JSON, None).await;
    assert!(
        core["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["name"] == "pods/status")
    );
    let (_, service) = call(
        &server,
        "GET",
        "/api/v1/namespaces/default/services/kubernetes",
        JSON,
        None,
    )
    .await;
    assert_eq!(service["spec"]["ports"][0]["targetPort"], 6443);
}

#[tokio::test]
async fn namespaces_and_their_subresources_route_as_cluster_objects() {
    let server = server();
    let (status, namespace) = call(
        &server,
        "GET",
        "/api/v1/namespaces/kube-node-lease",
        JSON,
        None,
    )
    .await;
    assert_eq!(
        (status, &namespace["status"]["phase"]),
        (200, &json!("Active"))
    );
    let (status, same) = call(
        &server,
        "GET",
        "/api/v1/namespaces/kube-node-lease/status",
        JSON,
        None,
    )
    .await;
    assert_eq!(
        (status, &same["metadata"]["name"]),
        (200, &json!("kube-node-lease"))
    );
    let (status, leases) = call(
        &server,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        JSON,
        None,
    )
    .await;
    assert_eq!((status, &leases["kind"]), (200, &json!("LeaseList")));
    let (status, _) = call(&server, "GET", "/api/v1/pods/a", JSON, None).await;
    assert_eq!(status, 404, "a namespaced object has no cluster-wide path");
    let (status, _) = call(
        &server,
        "PUT",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn delete_answers_the_pod_or_a_status() {
    let server = server();
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(pod("a", "n1")),
    )
    .await;
    let (status, deleting) = call(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/pods/a",
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    let (status, conflict) = call(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/pods/a",
        JSON,
        Some(json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "other"}})),
    )
    .await;
    assert_eq!(
        (status, conflict["reason"].as_str()),
        (409, Some("Conflict"))
    );
    let (status, _) = call(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/pods/a?gracePeriodSeconds=0",
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        call(
            &server,
            "GET",
            "/api/v1/namespaces/default/pods/a",
            JSON,
            None
        )
        .await
        .0,
        404
    );
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        Some(json!({"metadata": {"name": "c"}})),
    )
    .await;
    let (status, gone) = call(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/c",
        JSON,
        None,
    )
    .await;
    assert_eq!(
        (status, gone["kind"].as_str(), gone["status"].as_str()),
        (200, Some("Status"), Some("Success"))
    );
}

#[tokio::test]
async fn a_watch_from_a_future_version_waits_for_it() {
    use tokio_stream::StreamExt as _;

    let server = server();
    let next = server.store().revision() + 1;
    let request = Request::builder()
        .uri(format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={next}"
        ))
        .header(header::AUTHORIZATION, "Bearer t")
        .body(Body::empty())
        .expect("a request");
    let response = router(server.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.into_body().into_data_stream();
    // The write that reaches the version, and the one after it, which the watch sends.
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        Some(json!({"metadata": {"name": "a"}})),
    )
    .await;
    call(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        Some(json!({"metadata": {"name": "b"}})),
    )
    .await;
    let line = tokio::time::timeout(crate::EVENT_WAIT, stream.next())
        .await
        .expect("an event in time")
        .expect("a line")
        .expect("no error");
    let event: Value = serde_json::from_slice(&line).expect("JSON");
    assert_eq!(
        (
            event["type"].as_str(),
            event["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
}

#[tokio::test]
async fn a_watch_from_a_version_never_reached_ends_with_504() {
    use tokio_stream::StreamExt as _;

    let server = server();
    let far = server.store().revision() + 1000;
    let request = Request::builder()
        .uri(format!("/api/v1/pods?watch=true&resourceVersion={far}"))
        .header(header::AUTHORIZATION, "Bearer t")
        .body(Body::empty())
        .expect("a request");
    let response = router(server.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    let mut stream = response.into_body().into_data_stream();
    let line = tokio::time::timeout(crate::EVENT_WAIT, stream.next())
        .await
        .expect("an event in time")
        .expect("a line")
        .expect("no error");
    let event: Value = serde_json::from_slice(&line).expect("JSON");
    assert_eq!(event["type"], "ERROR");
    assert_eq!(
        (
            event["object"]["code"].as_u64(),
            event["object"]["reason"].as_str()
        ),
        (Some(504), Some("Timeout"))
    );
    assert_eq!(
        event["object"]["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the error"
    );
}

#[tokio::test]
async fn the_ephemeral_containers_subresource_adds_and_refuses_changes() {
    let server = server();
    let base = "/api/v1/namespaces/default/pods/a";
    let (status, _) = call(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        Some(pod("a", "n1")),
    )
    .await;
    assert_eq!(status, 201);
    // What `kubectl debug` sends: a strategic merge patch of the list, merged by name.
    let add = json!({"spec": {"ephemeralContainers": [
        {"name": "dbg", "image": "busybox", "targetContainerName": "c"}
    ], "containers": [{"name": "c", "image": "other"}]}});
    let (status, patched) = call(
        &server,
        "PATCH",
        &format!("{base}/ephemeralcontainers"),
        "application/strategic-merge-patch+json",
        Some(add),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["spec"]["ephemeralContainers"][0]["name"], "dbg");
    assert_eq!(
        patched["spec"]["containers"][0]["image"], "busybox",
        "the subresource writes only the ephemeral containers"
    );
    let (status, got) = call(
        &server,
        "GET",
        &format!("{base}/ephemeralcontainers"),
        JSON,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        got["spec"]["ephemeralContainers"],
        patched["spec"]["ephemeralContainers"]
    );

    // A second `kubectl debug`: its two-way patch keeps the order of the existing ones.
    let second = json!({"spec": {
        "$setElementOrder/ephemeralContainers": [{"name": "dbg"}, {"name": "dbg2"}],
        "ephemeralContainers": [{"name": "dbg2", "image": "busybox"}],
    }});
    let (status, both) = call(
        &server,
        "PATCH",
        &format!("{base}/ephemeralcontainers"),
        "application/strategic-merge-patch+json",
        Some(second),
    )
    .await;
    assert_eq!(status, 200, "{both}");
    let names: Vec<&str> = both["spec"]["ephemeralContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["dbg", "dbg2"]);
    let got = both;

    let change = json!({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "alpine"}]}});
    let (status, refused) = call(
        &server,
        "PATCH",
        &format!("{base}/ephemeralcontainers"),
        "application/strategic-merge-patch+json",
        Some(change),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["reason"], "Invalid");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("existing ephemeral containers \"dbg\" may not be changed")),
        "{refused}"
    );
    // A PUT that collides with the regular container's name.
    let mut put = got.clone();
    put["spec"]["ephemeralContainers"]
        .as_array_mut()
        .expect("a list")
        .push(json!({"name": "c", "image": "busybox"}));
    let (status, refused) = call(
        &server,
        "PUT",
        &format!("{base}/ephemeralcontainers"),
        JSON,
        Some(put),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.ephemeralContainers[2].name: Duplicate value: \"c\"")),
        "{refused}"
    );
    // The main resource cannot write them.
    let (status, main) = call(
        &server,
        "PATCH",
        base,
        "application/merge-patch+json",
        Some(json!({"spec": {"ephemeralContainers": null}})),
    )
    .await;
    assert_eq!(status, 200, "{main}");
    assert_eq!(main["spec"]["ephemeralContainers"][0]["name"], "dbg");

    let (_, discovery) = call(&server, "GET", "/api/v1", JSON, None).await;
    let listed = discovery["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "pods/ephemeralcontainers");
    assert_eq!(
        listed.map(|r| r["verbs"].clone()),
        Some(json!(["get", "patch", "update"]))
    );
}
