//! Failures as the API server reports them: a `Status` object (kind `Status`, `status:
//! Failure`, a machine-readable `reason`, the HTTP `code` and `details` naming the object), as
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#api-conventions> and upstream's
//! `apimachinery/pkg/api/errors/errors.go` (`NewNotFound`, `NewAlreadyExists`, `NewConflict`, …)
//! build them. kube-rs turns exactly this body into `kube::Error::Api`.

use serde_json::{Value, json};

use super::resources::Resource;

/// An API failure: the `Status` the server answers with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` (name, group, kind), when the failure is about one object.
    pub details: Option<Value>,
}

impl ApiError {
    fn about(
        code: u16,
        reason: &'static str,
        resource: &Resource,
        name: &str,
        message: String,
    ) -> Self {
        ApiError {
            code,
            reason,
            message,
            details: Some(json!({
                "name": name,
                "group": resource.group,
                "kind": resource.plural,
            })),
        }
    }

    /// `errors.NewNotFound`: `pods "web" not found`.
    pub fn not_found(resource: &Resource, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", resource.group_resource());
        Self::about(404, "NotFound", resource, name, message)
    }

    /// `errors.NewAlreadyExists`: `pods "web" already exists`.
    pub fn already_exists(resource: &Resource, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", resource.group_resource());
        Self::about(409, "AlreadyExists", resource, name, message)
    }

    /// `errors.NewConflict`: `Operation cannot be fulfilled on pods "web": <why>`.
    pub fn conflict(resource: &Resource, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            resource.group_resource()
        );
        Self::about(409, "Conflict", resource, name, message)
    }

    /// The conflict of a stale `resourceVersion` (upstream's `OptimisticLockErrorMsg`).
    pub fn stale(resource: &Resource, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `errors.NewInvalid` (422): the object fails validation, e.g. an immutable field changed.
    pub fn invalid(resource: &Resource, name: &str, why: &str) -> Self {
        let message = format!("{} \"{name}\" is invalid: {why}", resource.kind);
        Self::about(422, "Invalid", resource, name, message)
    }

    /// `errors.NewBadRequest` (400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// 410 `Expired`: a resourceVersion (or continue token) older than the history kept
    /// (upstream's `errors.NewResourceExpired`, "too old resource version").
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError {
            code: 410,
            reason: "Expired",
            message: message.into(),
            details: None,
        }
    }

    /// 404 for a path no resource serves (upstream answers `NotFound` with "the server could
    /// not find the requested resource").
    pub fn no_route() -> Self {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: "the server could not find the requested resource".to_owned(),
            details: None,
        }
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(method: &str) -> Self {
        ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!(
                "the server does not allow this method on the requested resource: {method}"
            ),
            details: None,
        }
    }

    /// 413 `RequestEntityTooLarge` (upstream limits request bodies to 3 MiB).
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            code: 413,
            reason: "RequestEntityTooLarge",
            message: format!("the request body is larger than {limit} bytes"),
            details: None,
        }
    }

    /// 415 `UnsupportedMediaType` for a PATCH content type the server does not know.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
            details: None,
        }
    }

    /// 401 `Unauthorized`.
    pub fn unauthorized() -> Self {
        ApiError {
            code: 401,
            reason: "Unauthorized",
            message: "Unauthorized".to_owned(),
            details: None,
        }
    }

    /// 503 `ServiceUnavailable` (the injected outage).
    pub fn unavailable() -> Self {
        ApiError {
            code: 503,
            reason: "ServiceUnavailable",
            message: "the server is currently unable to handle the request (injected fault)"
                .to_owned(),
            details: None,
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".to_owned(), details.clone());
        }
        status
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::find;

    #[test]
    fn not_found_is_the_status_upstream_sends() {
        let pods = find("", "v1", "pods").expect("pods");
        let status = ApiError::not_found(pods, "web").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(status["message"], "pods \"web\" not found");
        assert_eq!(status["details"]["name"], "web");
        assert_eq!(status["details"]["kind"], "pods");
    }
}
