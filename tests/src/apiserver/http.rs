//! HTTP routing: the resource URLs of
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris> (`/api/v1/…`,
//! `/apis/<group>/<version>/…`, namespaced and cluster-wide), the verbs on them, `/version`,
//! the discovery documents, authentication ([`super::authn`]) and authorization
//! ([`super::authz`]) of every request, the body limit (413), the CertificateSigningRequest
//! hooks ([`super::csr`]: the requester recorded on create, the `approval` subresource), the
//! `selfsubjectreviews` answer, and the `/_test/…` control endpoints of [`super::faults`].

use std::{collections::HashMap, sync::Arc};

use axum::{
    Router,
    body::Body,
    extract::{Query, State},
    http::{Method, Request, Response, StatusCode, header},
};
use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    ApiServer, LoggedRequest,
    authn::{PeerCertificate, User, authenticate, certificate_user},
    authz::{Attributes, authorize_path, authorize_resource, verb},
    control::control_request,
    csr,
    deletion::DeleteOptions,
    discovery::{group_list, resource_list, version},
    json_patch::json_patch,
    list::{list, watch_response, with_type},
    meta::{meta_str, now_seconds},
    patch::{merge_patch, strategic_merge_patch},
    resources::{RESOURCES, Resource, find},
    status::{ApiError, ApiResult},
    store::Deleted,
    strategy::{Target, UidCheck, prepare_create, prepare_update, with_metadata},
};

/// The router serving everything.
pub fn router(server: Arc<ApiServer>) -> Router {
    Router::new().fallback(handle).with_state(server)
}

/// The decoded query parameters.
pub(super) type Params = HashMap<String, String>;

/// Answers one request and logs it (the API's, not the control endpoints') with its status.
async fn handle(State(server): State<Arc<ApiServer>>, request: Request<Body>) -> Response<Body> {
    let logged = (!request.uri().path().starts_with("/_test/")).then(|| LoggedRequest {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        query: request.uri().query().unwrap_or_default().to_owned(),
        code: 0,
        user_agent: request
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        received_ms: server.faults.now_ms(),
    });
    let response = answer(&server, request).await;
    if let Some(mut logged) = logged {
        logged.code = response.status().as_u16();
        server.faults.record(logged);
    }
    response
}

async fn answer(server: &Arc<ApiServer>, request: Request<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let query: Params = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map(|q| q.0.into_iter().collect())
        .unwrap_or_default();
    let control = path.starts_with("/_test/");
    let certificate = parts
        .extensions
        .get::<PeerCertificate>()
        .zip(server.client_roots())
        .and_then(|(peer, roots)| certificate_user(peer, roots, now_seconds()));
    let Some(user) = authenticate(
        &server.config.token,
        &server.config.bootstrap_tokens,
        &parts.headers,
        certificate,
    ) else {
        return error_response(&ApiError::unauthorized());
    };
    if control
        && let Err(e) = authorize_path(&user, verb(parts.method.as_str(), true, false), &path)
    {
        return error_response(&e);
    }
    // The control endpoints stay reachable under every fault, so a test can lift it.
    if !control {
        if server.faults.unavailable() {
            return error_response(&ApiError::unavailable());
        }
        let delay = server.faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    let limit = server.config.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return error_response(&ApiError::too_large(limit));
    }
    let Ok(body) = axum::body::to_bytes(body, limit).await else {
        return error_response(&ApiError::too_large(limit));
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .trim()
        .to_owned();
    let answer = if control {
        control_request(server, &parts.method, &path, &body)
    } else {
        serve(
            server,
            &user,
            &parts.method,
            &path,
            &query,
            &content_type,
            &body,
        )
    };
    answer.unwrap_or_else(|e| error_response(&e))
}

pub(super) fn json_response(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .unwrap_or_default()
}

fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status())
}

pub(super) fn parse_json(body: &Bytes) -> ApiResult<Value> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

/// A request path resolved to a resource.
struct Addressed {
    resource: &'static Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

enum Route {
    Version,
    Discovery(Value),
    Resource(Addressed),
}

fn route(path: &str) -> ApiResult<Route> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["version"] => Ok(Route::Version),
        ["api"] => Ok(Route::Discovery(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        }))),
        ["apis"] => Ok(Route::Discovery(group_list())),
        ["api", "v1"] => Ok(Route::Discovery(resource_list("", "v1"))),
        ["apis", group, version]
            if RESOURCES
                .iter()
                .any(|r| r.group == *group && r.version == *version) =>
        {
            Ok(Route::Discovery(resource_list(group, version)))
        }
        ["api", "v1", rest @ ..] => resource_path("", "v1", rest).map(Route::Resource),
        ["apis", group, version, rest @ ..] => {
            resource_path(group, version, rest).map(Route::Resource)
        }
        _ => Err(ApiError::no_route()),
    }
}

fn resource_path(group: &str, version: &str, rest: &[&str]) -> ApiResult<Addressed> {
    let target = |resource, namespace: Option<&str>, tail: &[&str]| -> ApiResult<Addressed> {
        let (name, subresource) = match tail {
            [] => (None, None),
            [name] => (Some(*name), None),
            [name, sub] => (Some(*name), Some(*sub)),
            _ => return Err(ApiError::no_route()),
        };
        Ok(Addressed {
            resource,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            subresource: subresource.map(str::to_owned),
        })
    };
    if let ["namespaces", namespace, plural, tail @ ..] = rest
        && let Some(resource) = find(group, version, plural).filter(|r| r.namespaced)
    {
        return target(resource, Some(*namespace), tail);
    }
    let [plural, tail @ ..] = rest else {
        return Err(ApiError::no_route());
    };
    match find(group, version, plural) {
        // A namespaced resource across all namespaces: the collection only.
        Some(resource) if resource.namespaced && tail.is_empty() => target(resource, None, tail),
        Some(resource) if !resource.namespaced => target(resource, None, tail),
        _ => Err(ApiError::no_route()),
    }
}

fn serve(
    server: &Arc<ApiServer>,
    user: &User,
    method: &Method,
    path: &str,
    query: &Params,
    content_type: &str,
    body: &Bytes,
) -> ApiResult<Response<Body>> {
    let target = match route(path)? {
        Route::Version if *method == Method::GET => {
            authorize_path(user, "get", path)?;
            return Ok(json_response(200, &version()));
        }
        Route::Discovery(document) if *method == Method::GET => {
            authorize_path(user, "get", path)?;
            return Ok(json_response(200, &document));
        }
        Route::Version | Route::Discovery(_) => {
            return Err(ApiError::method_not_allowed(method.as_str()));
        }
        Route::Resource(target) => target,
    };
    let resource = target.resource;
    let namespace = target.namespace.as_deref();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    authorize_resource(
        user,
        &Attributes {
            verb: verb(method.as_str(), target.name.is_some(), watching),
            group: resource.group,
            resource: resource.plural,
            subresource: target.subresource.as_deref(),
            namespace,
            name: target.name.as_deref(),
        },
    )?;
    let Some(name) = target.name.as_deref() else {
        return match *method {
            Method::GET if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) => {
                watch_response(server, resource, namespace, query)
            }
            Method::GET => list(server, resource, namespace, query).map(|l| json_response(200, &l)),
            Method::POST if resource.kind == "SelfSubjectReview" => {
                Ok(json_response(201, &self_subject_review(resource, user)))
            }
            Method::POST if resource.virtual_create => review(server, resource, parse_json(body)?),
            Method::POST if resource.namespaced && namespace.is_none() => {
                Err(ApiError::method_not_allowed(method.as_str()))
            }
            Method::POST => create(server, user, resource, namespace, parse_json(body)?),
            _ => Err(ApiError::method_not_allowed(method.as_str())),
        };
    };
    let csr_part = match target.subresource.as_deref() {
        Some("status") => csr::Part::Status,
        Some("approval") => csr::Part::Approval,
        _ => csr::Part::Main,
    };
    let part = match target.subresource.as_deref() {
        None => Target::Main,
        Some("status") if resource.status => Target::Status,
        // The approval writes only conditions; the generic status rules keep the spec.
        Some("approval") if resource.kind == csr::KIND => Target::Status,
        Some("ephemeralcontainers") if resource.kind == "Pod" && resource.group.is_empty() => {
            Target::EphemeralContainers
        }
        Some("token") if resource.plural == "serviceaccounts" && *method == Method::POST => {
            return token_request(server, resource, namespace, name, parse_json(body)?);
        }
        Some(_) => return Err(ApiError::no_route()),
    };
    match *method {
        Method::GET => server
            .store()
            .get(resource, namespace, name)
            .map(|o| json_response(200, &o)),
        Method::PUT => {
            let object = with_metadata(parse_json(body)?);
            server
                .store()
                .update(resource, namespace, name, |old| {
                    prepare_update(resource, part, UidCheck::Precondition, old, object)
                        .and_then(|new| csr_update(resource, csr_part, old, new))
                })
                .map(|o| json_response(200, &o))
        }
        Method::PATCH => {
            let patch = parse_json(body)?;
            server
                .store()
                .update(resource, namespace, name, |old| {
                    let patched = apply_patch(resource, name, content_type, old, &patch)?;
                    prepare_update(resource, part, UidCheck::Immutable, old, patched)
                        .and_then(|new| csr_update(resource, csr_part, old, new))
                })
                .map(|o| json_response(200, &o))
        }
        Method::DELETE if part == Target::Main => {
            delete(server, resource, namespace, name, query, body)
        }
        _ => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

fn apply_patch(
    resource: &Resource,
    name: &str,
    content_type: &str,
    old: &Value,
    patch: &Value,
) -> ApiResult<Value> {
    let invalid = |e: super::patch::PatchError| ApiError::invalid(resource, name, &e.to_string());
    match content_type {
        "application/merge-patch+json" => Ok(merge_patch(old, patch)),
        "application/strategic-merge-patch+json" => {
            strategic_merge_patch(resource.kind, old, patch).map_err(invalid)
        }
        "application/json-patch+json" => json_patch(old, patch).map_err(invalid),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// The CertificateSigningRequest strategy after the generic one; others unchanged.
fn csr_update(resource: &Resource, part: csr::Part, old: &Value, new: Value) -> ApiResult<Value> {
    if resource.kind == csr::KIND {
        csr::prepare_update(resource, part, old, new, now_seconds())
    } else {
        Ok(new)
    }
}

/// A SelfSubjectReview: the requester as the server authenticated it
/// (`pkg/registry/authentication/selfsubjectreview`).
fn self_subject_review(resource: &Resource, user: &User) -> Value {
    json!({
        "kind": resource.kind,
        "apiVersion": resource.api_version(),
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": user.to_json()},
    })
}

fn create(
    server: &ApiServer,
    user: &User,
    resource: &'static Resource,
    namespace: Option<&str>,
    body: Value,
) -> ApiResult<Response<Body>> {
    let now = now_seconds();
    let mut object = prepare_create(resource, namespace, with_metadata(body), now)?;
    if resource.kind == csr::KIND {
        object = csr::prepare_create(resource, object, user)?;
    }
    let mut store = server.store();
    // NamespaceLifecycle admission: nothing is created in a namespace that does not exist.
    if let Some(namespace) = namespace
        && let Some(namespaces) = find("", "v1", "namespaces")
    {
        store.get(namespaces, None, namespace)?;
    }
    store
        .create(resource, object)
        .map(|o| json_response(201, &o))
}

fn review(
    server: &ApiServer,
    resource: &'static Resource,
    body: Value,
) -> ApiResult<Response<Body>> {
    let body = with_type(resource, &with_metadata(body));
    let reviews = server.reviews();
    let answered = match resource.kind {
        "TokenReview" => reviews.token_review(body),
        _ => reviews.access_review(body),
    };
    Ok(json_response(201, &answered))
}

fn token_request(
    server: &ApiServer,
    resource: &'static Resource,
    namespace: Option<&str>,
    name: &str,
    body: Value,
) -> ApiResult<Response<Body>> {
    let account = server.store().get(resource, namespace, name)?;
    let issued = server.reviews().token_request(
        resource,
        &account,
        with_metadata(body),
        now_seconds(),
        (
            server.config.min_token_expiration_seconds,
            server.config.max_token_expiration_seconds,
        ),
    )?;
    Ok(json_response(201, &issued))
}

fn delete(
    server: &ApiServer,
    resource: &'static Resource,
    namespace: Option<&str>,
    name: &str,
    query: &Params,
    body: &Bytes,
) -> ApiResult<Response<Body>> {
    let grace = query.get("gracePeriodSeconds").and_then(|g| g.parse().ok());
    let options = DeleteOptions::from_request(&parse_json(body)?, grace);
    let deleted = server
        .store()
        .delete(resource, namespace, name, &options, now_seconds())?;
    Ok(match deleted {
        Deleted::Remains(object) => json_response(200, &object),
        // Pod storage returns the deleted object (`ReturnDeletedObject`); the others a Status.
        Deleted::Gone(object) if resource.kind == "Pod" => json_response(200, &object),
        Deleted::Gone(object) => json_response(
            200,
            &json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": name,
                    "group": resource.group,
                    "kind": resource.plural,
                    "uid": meta_str(&object, "uid").unwrap_or_default(),
                },
            }),
        ),
    })
}

#[cfg(test)]
mod tests;
