//! A scripted API server for the unit tests of what talks to the API server: kube's [`Client`]
//! over tower-test's mock transport. A test takes each request in turn, asserts what it must be (method, path, query,
//! content type, body) and answers with canned JSON, so every request the source makes is seen and
//! checked, in order. Run under paused tokio time: waiting for a request lets timers fire at once.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

use crate::clock::Clock as WallClock;

/// The wall time at the start of a test: 2023-11-14T22:13:20Z.
pub(crate) const T0_SECONDS: u64 = 1_700_000_000;

/// How long (of paused time) a test waits for a request it expects.
const EXPECT_WITHIN: Duration = Duration::from_secs(600);

pub(crate) struct FakeApi {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// One request as the server saw it, with the means to answer it.
pub(crate) struct Call {
    pub method: Method,
    pub path: String,
    /// The decoded query pairs, in order.
    pub query: Vec<(String, String)>,
    /// The raw query string, for asserting exact encodings.
    pub raw_query: String,
    pub content_type: Option<String>,
    /// The JSON body, `Value::Null` when empty.
    pub body: Value,
    respond: SendResponse<Response<Body>>,
}

pub(crate) fn fake_api() -> (Client, FakeApi) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), FakeApi { handle })
}

impl FakeApi {
    /// The next request; fails the test if none comes.
    pub async fn next(&mut self) -> Call {
        let (request, respond) = tokio::time::timeout(EXPECT_WITHIN, self.handle.next_request())
            .await
            .expect("a request within the wait")
            .expect("the client is alive");
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        let raw_query = parts.uri.query().unwrap_or_default().to_owned();
        Call {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: form_urlencoded_pairs(&raw_query),
            raw_query,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            respond,
        }
    }

    /// The next request, asserted to be `method path`.
    pub async fn expect(&mut self, method: Method, path: &str) -> Call {
        let call = self.next().await;
        assert_eq!(
            (&call.method, call.path.as_str()),
            (&method, path),
            "unexpected request (query {:?}, body {})",
            call.raw_query,
            call.body
        );
        call
    }

    /// Asserts that no request comes within `wait` (of paused time).
    pub async fn assert_no_request(&mut self, wait: Duration) {
        if let Ok(Some((request, _))) = tokio::time::timeout(wait, self.handle.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

impl Call {
    /// The value of query parameter `key`, if present.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn reply(self, code: u16, body: &Value) {
        let status = StatusCode::from_u16(code).expect("a status code");
        let bytes = serde_json::to_vec(body).expect("serializable");
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = status;
        self.respond.send_response(response);
    }

    /// Answers a watch with these events (one JSON object per line), then ends the stream.
    pub fn reply_events(self, events: &[Value]) {
        let mut bytes = Vec::new();
        for event in events {
            bytes.extend(serde_json::to_vec(event).expect("serializable"));
            bytes.push(b'\n');
        }
        self.respond.send_response(Response::new(Body::from(bytes)));
    }

    /// Never answers: the caller keeps waiting (a watch with nothing to say).
    pub fn hold(self) -> SendResponse<Response<Body>> {
        self.respond
    }
}

/// A wall clock that starts at [`T0_SECONDS`] and follows tokio's (paused) time, so the times in
/// requests are exact.
pub(crate) fn paused_clock() -> WallClock {
    let start = tokio::time::Instant::now();
    Arc::new(move || UNIX_EPOCH + Duration::from_secs(T0_SECONDS) + start.elapsed())
}

/// RFC 3339 (seconds) of `T0 + offset`, as `Time` serializes.
pub(crate) fn t0_plus(offset: Duration) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(T0_SECONDS) + offset;
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(seconds).expect("fits"))
        .expect("valid")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The `Status` body the API server sends with an error.
pub(crate) fn status_error(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{reason} (test)"),
        "reason": reason,
        "code": code,
    })
}

fn form_urlencoded_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii");
                out.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).expect("utf-8")
}
