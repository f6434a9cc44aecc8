use crate::testing;
use std::time::Duration;

use axum::http::Request as HttpRequest;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
};
use tower::ServiceExt as _;

use super::*;
use crate::{
    cri::fake::FakeRuntime,
    logs::testing::{logging_container, record},
};

fn query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn now() -> Timestamp {
    "2024-05-01T10:01:00Z".parse().expect("time")
}

#[test]
fn query_decoding_and_validation_as_upstream() {
    let r = parse_query(
        &query("tailLines=2&timestamps=true&follow&previous=0"),
        now(),
    )
    .unwrap_or_else(|e| panic!("{}", e.1));
    assert_eq!(r.options.tail_lines, Some(2));
    assert!(r.options.timestamps);
    // An empty value is true, `0` and `false` are false.
    assert!(r.options.follow);
    assert!(!r.previous);
    let r = parse_query(&query("sinceSeconds=30&tail=all&limitBytes=10"), now())
        .unwrap_or_else(|e| panic!("{}", e.1));
    assert_eq!(
        r.options.since,
        Some("2024-05-01T10:00:30Z".parse().expect("t"))
    );
    assert_eq!(r.options.tail_lines, None);
    assert_eq!(r.options.limit_bytes, Some(10));
    let r = parse_query(&query("tail=3&sinceTime=2024-05-01T10:00:00Z"), now())
        .unwrap_or_else(|e| panic!("{}", e.1));
    assert_eq!(r.options.tail_lines, Some(3));
    assert!(r.options.since.is_some());

    for (q, status, mention) in [
        ("tailLines=x", StatusCode::BAD_REQUEST, "tailLines"),
        ("sinceTime=yesterday", StatusCode::BAD_REQUEST, "sinceTime"),
        ("limitBytes=1.5", StatusCode::BAD_REQUEST, "limitBytes"),
        (
            "tailLines=-1",
            StatusCode::UNPROCESSABLE_ENTITY,
            "tailLines",
        ),
        (
            "limitBytes=0",
            StatusCode::UNPROCESSABLE_ENTITY,
            "limitBytes",
        ),
        (
            "sinceSeconds=0",
            StatusCode::UNPROCESSABLE_ENTITY,
            "sinceSeconds",
        ),
        (
            "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z",
            StatusCode::UNPROCESSABLE_ENTITY,
            "sinceTime",
        ),
    ] {
        let Err(Refusal(got, message)) = parse_query(&query(q), now()) else {
            panic!("{q} accepted");
        };
        assert_eq!(got, status, "{q}: {message}");
        assert!(message.contains(mention), "{q}: {message}");
    }
}

fn pod(statuses: Vec<ContainerStatus>) -> Pod {
    testing::pod()
        .namespace("prod")
        .name("web")
        .container(testing::container("app"))
        .container_statuses(statuses)
        .build()
}

fn running(id: &str) -> ContainerStatus {
    ContainerStatus {
        name: "app".into(),
        container_id: Some(format!("containerd://{id}")),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn get(router: &Router, uri: &str) -> (StatusCode, String) {
    let response = router
        .clone()
        .oneshot(HttpRequest::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn router_for(fake: Arc<FakeRuntime>, pod: Pod) -> Router {
    router(LogsState {
        pods: Arc::new(move |ns, name| (ns == "prod" && name == "web").then(|| pod.clone())),
        runtime: fake,
        timing: FollowTiming {
            poll: Duration::from_millis(5),
            state_check: Duration::from_millis(20),
        },
    })
}

#[tokio::test]
async fn serves_a_running_containers_log() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    std::fs::write(
        &c.log,
        [
            record(1, "stdout", "F", "one"),
            record(2, "stderr", "F", "two"),
        ]
        .concat(),
    )
    .expect("write");
    let router = router_for(fake.clone(), pod(vec![running(&c.id)]));
    let (status, body) = get(&router, "/containerLogs/prod/web/app").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "one\ntwo\n");
    let (_, body) = get(
        &router,
        "/containerLogs/prod/web/app?tailLines=1&timestamps=1",
    )
    .await;
    assert_eq!(body, "2024-05-01T10:00:02.5Z two\n");
    // A follower ends when the container exits.
    fake.exit_container(&c.id, 0);
    let (status, body) = get(&router, "/containerLogs/prod/web/app?follow=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "one\ntwo\n");
}

#[tokio::test]
async fn unknown_pods_containers_and_missing_instances_are_refused() {
    let fake = Arc::new(FakeRuntime::new());
    let c = logging_container(&fake).await;
    let router = router_for(fake.clone(), pod(vec![running(&c.id)]));
    let (status, body) = get(&router, "/containerLogs/prod/nope/app").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("pod \"nope\" does not exist"), "{body}");
    let (status, body) = get(&router, "/containerLogs/prod/web/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("container \"nope\" not found in pod \"web\""),
        "{body}"
    );
    let (status, body) = get(&router, "/containerLogs/prod/web/app?previous=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("previous terminated container \"app\" in pod \"web\" not found"),
        "{body}"
    );
    let (status, body) = get(&router, "/containerLogs/prod/web/app?tailLines=-2").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.contains("tailLines"), "{body}");

    let waiting = ContainerStatus {
        name: "app".into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let router = router_for(fake.clone(), pod(vec![waiting]));
    let (status, body) = get(&router, "/containerLogs/prod/web/app").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("is waiting to start: trying and failing to pull image"),
        "{body}"
    );
}

#[tokio::test]
async fn previous_reads_the_last_terminated_instance() {
    let fake = Arc::new(FakeRuntime::new());
    let old = logging_container(&fake).await;
    std::fs::write(&old.log, record(1, "stdout", "F", "first life")).expect("write");
    fake.exit_container(&old.id, 1);
    let mut status = running("new-id");
    status.last_state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(format!("containerd://{}", old.id)),
            ..Default::default()
        }),
        ..Default::default()
    });
    let router = router_for(fake.clone(), pod(vec![status]));
    let (code, body) = get(&router, "/containerLogs/prod/web/app?previous=true").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body, "first life\n");
}
