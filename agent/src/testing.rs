//! Builders for the unit tests of every module: one pod builder with the fields tests vary, so
//! that a test says only what matters to it. Compiled only for tests. Module-specific fixtures
//! (a runtime status, a fake CRI, a clock) stay next to the module they serve
//! (`kuberuntime/fixtures.rs`, `cri/fake.rs`); pods are built here, and the one check of whether
//! a privileged unit test may run.

pub(crate) mod fake_api;

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodSecurityContext, PodSpec, PodStatus, Volume,
};

/// Whether a test that writes kernel files may run. Outside CI a test that is not root skips,
/// saying why; in CI (`CI` set) it fails instead (as the system tests' `privileged`).
pub(crate) fn privileged(test: &str, needs: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: privileged test cannot run: not root (CI is set, so this is a failure)"
    );
    eprintln!("skipped {test}: needs root to {needs}");
    false
}

/// A pod with nothing set: no metadata, no spec, no status. Each method sets one field (a spec
/// or status field creates the spec or status).
pub(crate) fn pod() -> PodBuilder {
    PodBuilder(Pod::default())
}

/// A container named `name`, nothing else set.
pub(crate) fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        ..Container::default()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct PodBuilder(Pod);

impl PodBuilder {
    pub(crate) fn name(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.into());
        self
    }

    pub(crate) fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    pub(crate) fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    /// `name` in `namespace` with `uid`: what most tests set first.
    pub(crate) fn named(self, namespace: &str, name: &str, uid: &str) -> Self {
        self.namespace(namespace).name(name).uid(uid)
    }

    pub(crate) fn resource_version(mut self, version: &str) -> Self {
        self.0.metadata.resource_version = Some(version.into());
        self
    }

    pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub(crate) fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// Any other spec field.
    pub(crate) fn spec(mut self, set: impl FnOnce(&mut PodSpec)) -> Self {
        set(self.0.spec.get_or_insert_with(PodSpec::default));
        self
    }

    pub(crate) fn containers(self, containers: Vec<Container>) -> Self {
        self.spec(|s| s.containers = containers)
    }

    pub(crate) fn container(self, container: Container) -> Self {
        self.spec(|s| s.containers.push(container))
    }

    /// `initContainers`, left unset when `inits` is empty (as the API server returns it).
    pub(crate) fn init_containers(self, inits: Vec<Container>) -> Self {
        self.spec(|s| s.init_containers = (!inits.is_empty()).then_some(inits))
    }

    pub(crate) fn restart_policy(self, policy: &str) -> Self {
        self.spec(|s| s.restart_policy = Some(policy.into()))
    }

    pub(crate) fn grace_period(self, seconds: i64) -> Self {
        self.spec(|s| s.termination_grace_period_seconds = Some(seconds))
    }

    pub(crate) fn host_network(self, on: bool) -> Self {
        self.spec(|s| s.host_network = Some(on))
    }

    pub(crate) fn security_context(self, context: Option<PodSecurityContext>) -> Self {
        self.spec(|s| s.security_context = context)
    }

    pub(crate) fn volumes(self, volumes: Vec<Volume>) -> Self {
        self.spec(|s| s.volumes = Some(volumes))
    }

    pub(crate) fn container_statuses(mut self, statuses: Vec<ContainerStatus>) -> Self {
        self.0
            .status
            .get_or_insert_with(PodStatus::default)
            .container_statuses = Some(statuses);
        self
    }

    pub(crate) fn build(self) -> Pod {
        self.0
    }

    pub(crate) fn arc(self) -> Arc<Pod> {
        Arc::new(self.0)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    #[test]
    fn a_built_pod_has_exactly_the_fields_set() {
        assert_eq!(pod().build(), Pod::default());
        assert_eq!(
            pod()
                .named("default", "web", "u1")
                .label("app", "web")
                .restart_policy("Never")
                .container(container("c"))
                .build(),
            Pod {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    namespace: Some("default".into()),
                    uid: Some("u1".into()),
                    labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![container("c")],
                    ..PodSpec::default()
                }),
                status: None,
            }
        );
        assert_eq!(
            pod().init_containers(vec![]).build().spec,
            Some(PodSpec::default())
        );
    }
}
