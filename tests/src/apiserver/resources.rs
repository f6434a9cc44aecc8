//! The resources this API server serves: the table that routes a URL path to a kind, its scope
//! and its subresources. The names, groups and scopes are those of the API reference
//! (<https://kubernetes.io/docs/reference/kubernetes-api/>); the paths follow
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris>.

/// One resource type (a group/version/resource).
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// The API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    /// The plural name in URLs (`pods`).
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether it has a `status` subresource; then the main resource ignores status changes and
    /// the subresource changes nothing else (upstream's `*StatusStrategy` for each).
    pub status: bool,
    /// Only created, never stored: reviews answer a POST with the request plus a status
    /// (`tokenreviews`, `subjectaccessreviews` are "virtual" resources upstream).
    pub virtual_create: bool,
}

impl Resource {
    /// `v1` or `group/version`, as `apiVersion` spells it.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `leases.coordination.k8s.io`: the name the `Status` details and messages use
    /// (upstream's `GroupResource.String()`).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether upstream's strategy for this resource tracks `metadata.generation` (bumped on a
    /// change of the desired state), as those of resources with a status subresource do.
    pub fn tracks_generation(&self) -> bool {
        self.status
    }
}

const fn core(
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
) -> Resource {
    Resource {
        group: "",
        version: "v1",
        plural,
        kind,
        namespaced,
        status,
        virtual_create: false,
    }
}

const fn grouped(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    virtual_create: bool,
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
        status,
        virtual_create,
    }
}

/// Every resource served.
pub static RESOURCES: &[Resource] = &[
    core("pods", "Pod", true, true),
    core("nodes", "Node", false, true),
    core("services", "Service", true, true),
    core("configmaps", "ConfigMap", true, false),
    core("secrets", "Secret", true, false),
    core("serviceaccounts", "ServiceAccount", true, false),
    core("namespaces", "Namespace", false, true),
    core("events", "Event", true, false),
    grouped("events.k8s.io", "v1", "events", "Event", true, false, false),
    grouped(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        false,
        false,
    ),
    grouped(
        "node.k8s.io",
        "v1",
        "runtimeclasses",
        "RuntimeClass",
        false,
        false,
        false,
    ),
    grouped(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "TokenReview",
        false,
        false,
        true,
    ),
    grouped(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
        false,
        true,
    ),
    grouped(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        false,
        true,
    ),
    grouped(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        true,
        false,
    ),
];

/// The resource `plural` of `group`/`version`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of `kind` in `api_version` (for typed helpers and tests).
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_reference() {
        let lease = find("coordination.k8s.io", "v1", "leases").map(Resource::api_version);
        assert_eq!(lease.as_deref(), Some("coordination.k8s.io/v1"));
        assert_eq!(find("", "v1", "pods").map(|r| r.kind), Some("Pod"));
        assert_eq!(
            by_kind("events.k8s.io/v1", "Event").map(Resource::group_resource),
            Some("events.events.k8s.io".to_owned())
        );
        assert!(find("", "v1", "nodes").is_some_and(|r| !r.namespaced));
    }
}
