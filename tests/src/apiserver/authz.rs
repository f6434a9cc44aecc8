//! What a user may do: the part of a kubeadm cluster's RBAC the node's TLS bootstrap meets.
//! `system:masters` and `system:nodes` may do everything; `system:bootstrappers` may only
//! create, get, list and watch `certificatesigningrequests` (the `system:node-bootstrapper`
//! ClusterRole kubeadm binds to them); every authenticated user may read the discovery
//! documents and `/version` (`system:discovery`, `system:public-info-viewer`) and create
//! `selfsubjectreviews` (`system:basic-user`); anything else is 403 with upstream's message
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`
//! `forbiddenMessage`).
//!
//! Not modelled: the Node authorizer and the NodeRestriction admission plugin (a node may act
//! on any object here, not only its own), and RBAC objects (no Roles or bindings are served).
//! <https://kubernetes.io/docs/reference/access-authn-authz/kubelet-tls-bootstrapping/#authorize-kubelet-to-create-csr>

use super::{
    authn::{BOOTSTRAPPERS_GROUP, MASTERS_GROUP, NODES_GROUP, User},
    status::ApiError,
};

/// A resource request's attributes (upstream `authorizer.Attributes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub verb: &'static str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// The API verb of a request (upstream `RequestInfoFactory`): a collection's GET is `list`, or
/// `watch` with `watch=true`.
pub fn verb(method: &str, named: bool, watch: bool) -> &'static str {
    match (method, named) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "",
    }
}

fn unrestricted(user: &User) -> bool {
    user.in_group(MASTERS_GROUP) || user.in_group(NODES_GROUP)
}

/// Whether `user` may make the resource request `attributes`; 403 `Forbidden` otherwise.
pub fn authorize_resource(user: &User, attributes: &Attributes<'_>) -> Result<(), ApiError> {
    let csr = attributes.group == "certificates.k8s.io"
        && attributes.resource == "certificatesigningrequests"
        && attributes.subresource.is_none()
        && matches!(attributes.verb, "create" | "get" | "list" | "watch");
    let self_review = attributes.group == "authentication.k8s.io"
        && attributes.resource == "selfsubjectreviews"
        && attributes.verb == "create";
    if unrestricted(user) || self_review || (csr && user.in_group(BOOTSTRAPPERS_GROUP)) {
        return Ok(());
    }
    let resource = match attributes.subresource {
        Some(sub) => format!("{}/{sub}", attributes.resource),
        None => attributes.resource.to_owned(),
    };
    let scope = match attributes.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    let what = if attributes.group.is_empty() {
        attributes.resource.to_owned()
    } else {
        format!("{}.{}", attributes.resource, attributes.group)
    };
    let object = match attributes.name {
        Some(name) => format!("{what} \"{name}\""),
        None => what,
    };
    Err(ApiError {
        code: 403,
        reason: "Forbidden",
        message: format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.name, attributes.verb, attributes.group
        ),
        details: Some(serde_json::json!({
            "name": attributes.name.unwrap_or_default(),
            "group": attributes.group,
            "kind": attributes.resource,
        })),
    })
}

/// Whether `user` may make a request for a path that is no resource: discovery and `/version`
/// for everyone authenticated, the `/_test/…` controls for masters only.
pub fn authorize_path(user: &User, verb: &'static str, path: &str) -> Result<(), ApiError> {
    let public = verb == "get" && !path.starts_with("/_test/");
    if public || user.in_group(MASTERS_GROUP) {
        return Ok(());
    }
    Err(ApiError {
        code: 403,
        reason: "Forbidden",
        message: format!(
            "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
            user.name
        ),
        details: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::authn::AUTHENTICATED_GROUP;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..User::default()
        }
    }

    fn attributes<'a>(
        verb: &'static str,
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            subresource,
            namespace: None,
            name: None,
        }
    }

    #[test]
    fn bootstrappers_may_only_request_certificates() {
        let boot = user(
            "system:bootstrap:abcdef",
            &[BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP],
        );
        for verb in ["create", "get", "list", "watch"] {
            let csr = attributes(
                verb,
                "certificates.k8s.io",
                "certificatesigningrequests",
                None,
            );
            assert_eq!(authorize_resource(&boot, &csr), Ok(()), "{verb}");
        }
        let approve = attributes(
            "update",
            "certificates.k8s.io",
            "certificatesigningrequests",
            Some("approval"),
        );
        let denied = authorize_resource(&boot, &approve).expect_err("approval");
        assert_eq!(denied.code, 403);
        assert_eq!(
            denied.message,
            "certificatesigningrequests.certificates.k8s.io is forbidden: User \"system:bootstrap:abcdef\" cannot update resource \"certificatesigningrequests/approval\" in API group \"certificates.k8s.io\" at the cluster scope"
        );
        let pods = attributes("list", "", "pods", None);
        let denied = authorize_resource(&boot, &pods).expect_err("pods");
        assert_eq!(
            denied.message,
            "pods is forbidden: User \"system:bootstrap:abcdef\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        );
        let mut pod = attributes("get", "", "pods", None);
        pod.namespace = Some("default");
        pod.name = Some("web");
        let denied = authorize_resource(&boot, &pod).expect_err("a pod");
        assert_eq!(
            denied.message,
            "pods \"web\" is forbidden: User \"system:bootstrap:abcdef\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(authorize_path(&boot, "get", "/version"), Ok(()));
        assert!(authorize_path(&boot, "get", "/_test/requests").is_err());
        let review = attributes(
            "create",
            "authentication.k8s.io",
            "selfsubjectreviews",
            None,
        );
        assert_eq!(authorize_resource(&boot, &review), Ok(()));
    }

    #[test]
    fn masters_and_nodes_may_do_everything_others_nothing() {
        let pods = attributes("delete", "", "pods", None);
        for groups in [[MASTERS_GROUP], [NODES_GROUP]] {
            assert_eq!(authorize_resource(&user("u", &groups), &pods), Ok(()));
        }
        let nobody = user("someone", &[AUTHENTICATED_GROUP]);
        assert!(authorize_resource(&nobody, &pods).is_err());
        let csr = attributes(
            "create",
            "certificates.k8s.io",
            "certificatesigningrequests",
            None,
        );
        assert!(authorize_resource(&nobody, &csr).is_err());
        assert_eq!(verb("GET", false, true), "watch");
        assert_eq!(verb("GET", false, false), "list");
        assert_eq!(verb("PUT", true, false), "update");
    }
}
