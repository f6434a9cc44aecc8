//! The `/_test/…` control endpoints (never part of the Kubernetes API), with the server's
//! bearer token, reachable under every fault but an outage:
//!
//! ```text
//! POST   /_test/down          {"millis": N}      refuse connections for N ms, cut open ones
//! POST   /_test/unavailable   {"enabled": bool}  answer 503 to every API request
//! POST   /_test/delay         {"millis": N}      wait N ms before every API request
//! POST   /_test/drop-watches                     end every open watch
//! POST   /_test/compact                          every resourceVersion before now: 410 Gone
//! POST   /_test/restart                          fresh resourceVersions, watches dropped
//! GET    /_test/requests                         {"total", "requests": [{method, path, query, code}]}
//! DELETE /_test/requests                         clear the log
//! PUT    /_test/reviews       ReviewTable        TokenReview/SubjectAccessReview answers
//! ```

use std::time::Duration;

use axum::{
    body::Body,
    http::{Method, Response},
};
use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    ApiServer, ReviewTable,
    http::{json_response, parse_json},
    status::{ApiError, ApiResult},
};

/// `/_test/…`: the fault switches, the request log and the review table.
pub fn control_request(
    server: &ApiServer,
    method: &Method,
    path: &str,
    body: &Bytes,
) -> ApiResult<Response<Body>> {
    let body = parse_json(body)?;
    let ok = |extra: Value| -> ApiResult<Response<Body>> { Ok(json_response(200, &extra)) };
    match (method.as_str(), path) {
        ("POST", "/_test/unavailable") => {
            server
                .faults
                .set_unavailable(body.get("enabled").and_then(Value::as_bool).unwrap_or(true));
            ok(json!({"unavailable": server.faults.unavailable()}))
        }
        ("POST", "/_test/down") => {
            let millis = body.get("millis").and_then(Value::as_u64).unwrap_or(0);
            server.faults.go_down(Duration::from_millis(millis));
            ok(json!({"millis": millis}))
        }
        ("POST", "/_test/delay") => {
            let millis = body.get("millis").and_then(Value::as_u64).unwrap_or(0);
            server.faults.set_delay(Duration::from_millis(millis));
            ok(json!({"millis": millis}))
        }
        ("POST", "/_test/drop-watches") => {
            server.faults.drop_watches();
            ok(json!({}))
        }
        ("POST", "/_test/compact") => {
            let mut store = server.store();
            store.compact();
            ok(json!({"compacted": store.compacted().to_string()}))
        }
        ("POST", "/_test/restart") => {
            let revision = {
                let mut store = server.store();
                store.renumber();
                store.revision()
            };
            server.faults.drop_watches();
            ok(json!({"resourceVersion": revision.to_string()}))
        }
        ("GET", "/_test/requests") => ok(server.faults.log_json()),
        ("DELETE", "/_test/requests") => {
            server.faults.clear_log();
            ok(json!({}))
        }
        ("PUT", "/_test/reviews") => {
            let table: ReviewTable = serde_json::from_value(body)
                .map_err(|e| ApiError::bad_request(format!("not a review table: {e}")))?;
            server.reviews().set_table(table);
            ok(json!({}))
        }
        _ => Err(ApiError::no_route()),
    }
}
