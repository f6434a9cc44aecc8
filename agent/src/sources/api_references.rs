//! The static-pod rule that a pod read from disk may not reference API objects (service accounts,
//! secrets, config maps, claims, CSI drivers...): the node could not resolve them without the
//! API server, and a static pod must run without one. Upstream: `HasAPIObjectReference` in
//! `pkg/api/pod/util.go`, enforced for static pods under the feature `PreventStaticPodAPIReferences`.
//!
//! Not here: the rest of pod validation (`validation.rs`).

use k8s_openapi::api::core::v1::PodSpec;

use super::validation::{Errors, FieldErrorKind};

/// A static pod is read from disk, so it may not depend on API objects it cannot see.
pub(super) fn api_references(spec: &PodSpec, errs: &mut Errors) {
    let mut forbid = |field: String, resource: &str| {
        errs.push(
            field,
            FieldErrorKind::Forbidden {
                detail: format!("static pods may not reference {resource}"),
            },
        );
    };
    if spec
        .service_account_name
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        forbid("spec.serviceAccountName".to_owned(), "serviceaccounts");
    }
    if spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        forbid("spec.imagePullSecrets".to_owned(), "secrets");
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        forbid("spec.resourceClaims".to_owned(), "resourceclaims");
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        let resource = if v.secret.is_some() || v.azure_file.is_some() {
            Some("secrets")
        } else if v.config_map.is_some() {
            Some("configmaps")
        } else if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            Some("persistentvolumeclaims")
        } else if v.csi.is_some() {
            Some("csidrivers")
        } else if v.glusterfs.is_some() {
            Some("endpoints")
        } else {
            v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .find_map(|s| {
                    if s.secret.is_some() {
                        Some("secrets")
                    } else if s.config_map.is_some() {
                        Some("configmaps")
                    } else if s.service_account_token.is_some() {
                        Some("serviceaccounts")
                    } else if s.cluster_trust_bundle.is_some() {
                        Some("clustertrustbundles")
                    } else if s.pod_certificate.is_some() {
                        Some("podcertificates")
                    } else {
                        None
                    }
                })
        };
        if let Some(resource) = resource {
            forbid(field, resource);
        }
    }
    let init = spec.init_containers.iter().flatten().enumerate();
    let init = init.map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let regular = spec.containers.iter().enumerate();
    let regular = regular.map(|(i, c)| (format!("spec.containers[{i}]"), c));
    for (path, c) in init.chain(regular) {
        for (i, env) in c.env.iter().flatten().enumerate() {
            let from = env.value_from.as_ref();
            if from.is_some_and(|f| f.secret_key_ref.is_some()) {
                forbid(format!("{path}.env[{i}].valueFrom"), "secrets");
            } else if from.is_some_and(|f| f.config_map_key_ref.is_some()) {
                forbid(format!("{path}.env[{i}].valueFrom"), "configmaps");
            }
        }
        for (i, from) in c.env_from.iter().flatten().enumerate() {
            if from.secret_ref.is_some() {
                forbid(format!("{path}.envFrom[{i}]"), "secrets");
            } else if from.config_map_ref.is_some() {
                forbid(format!("{path}.envFrom[{i}]"), "configmaps");
            }
        }
    }
}
