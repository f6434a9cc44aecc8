//! The kubelet server's request parsing: the input is a request target (`/path?query`) as a
//! client sends it, also tried as an `Authorization` header. The path is mapped to the
//! authorization attributes (`server::auth::request_attributes`); the query is decoded as
//! `/exec`, `/attach`, `/portForward` and `/run` decode theirs (`server::streaming::query_pairs`,
//! `StreamOptions::from_query`), and sent to the real `/containerLogs` route
//! (`server::logs::router`, for a pod that does not exist), whose `PodLogOptions` decoding must
//! answer 400 or 422 (or 404 once the query is valid), never anything else. A panic is a finding.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::{Router, body::Body};
use http::{Method, Request, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use swiftlet::{
    cri::fake::FakeRuntime,
    logs::FollowTiming,
    server::{
        auth::{UserInfo, bearer_token, request_attributes},
        logs::{LogsState, router},
        streaming::{StreamOptions, query_pairs},
    },
};
use tower::ServiceExt as _;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    logs: Router,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime"),
        logs: router(LogsState {
            pods: Arc::new(|_, _| None),
            runtime: Arc::new(FakeRuntime::new()),
            timing: FollowTiming::default(),
        }),
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(target) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(token) = bearer_token(target) {
        assert!(!token.is_empty());
    }
    // hyper refuses a request whose target is not a URI before any handler runs.
    let Ok(uri) = target.parse::<Uri>() else {
        return;
    };
    let attributes = request_attributes(&UserInfo::anonymous(), &Method::GET, uri.path(), "node-1");
    assert!(!attributes.is_empty(), "every path maps to a subresource");

    let query = uri.query().unwrap_or_default();
    let pairs = query_pairs(query);
    if let Ok(options) = StreamOptions::from_query(query) {
        assert!(options.stdin || options.stdout || options.stderr);
        assert!(!(options.tty && options.stderr), "a terminal has no stderr");
        let commands = pairs.iter().filter(|(k, _)| k == "command").count();
        assert_eq!(options.command.len(), commands);
    }

    let Ok(request) = Request::get(format!("/containerLogs/ns/pod/c?{query}")).body(Body::empty())
    else {
        return;
    };
    let fixture = fixture();
    let response = fixture
        .runtime
        .block_on(fixture.logs.clone().oneshot(request))
        .expect("a router is infallible");
    let status = response.status();
    assert!(
        matches!(
            status,
            StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::UNPROCESSABLE_ENTITY
        ),
        "/containerLogs?{query} answered {status}"
    );
});
