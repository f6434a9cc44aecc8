//! Pod manifests for system tests: busybox containers running a shell command, and the pod around
//! them, as YAML text the agent reads from its manifest folder. Every system test writes its pods
//! with [`PodManifest`] (or [`pod`], its shortest form), so that what a test pod is by default (no
//! namespace, the local busybox never pulled) is said once.

use crate::node::BUSYBOX;

/// A busybox container entry (under `containers:`) running `sh -c command`; `extra` lines go
/// below it, indented at the container's level (6 spaces).
pub fn container(name: &str, command: &str, extra: &str) -> String {
    format!(
        "    - name: {name}
      image: {BUSYBOX}
      imagePullPolicy: Never
      command: [\"sh\", \"-c\", {command:?}]
{extra}"
    )
}

/// A `v1` Pod named `name`; `spec` lines (indented 2 spaces) go under `spec:` before its
/// `containers`.
pub fn pod(name: &str, spec: &str, containers: &[String]) -> String {
    containers
        .iter()
        .fold(PodManifest::new(name).spec(spec), |pod, c| {
            pod.container(c.clone())
        })
        .yaml()
}

/// A `v1` Pod, field by field: what a test sets is what it varies.
#[derive(Clone, Debug, Default)]
pub struct PodManifest {
    name: String,
    /// Lines under `metadata:` after the name (2 spaces).
    metadata: String,
    restart_policy: Option<String>,
    grace_seconds: Option<u32>,
    /// Lines under `spec:` before `containers:` (2 spaces).
    spec: String,
    init_containers: Vec<String>,
    containers: Vec<String>,
    /// Lines under `volumes:` (4 spaces).
    volumes: String,
}

impl PodManifest {
    /// A pod named `name` with no container yet, the restart policy and grace period left to
    /// their defaults.
    pub fn new(name: &str) -> PodManifest {
        PodManifest {
            name: name.to_owned(),
            ..PodManifest::default()
        }
    }

    /// `restartPolicy`.
    pub fn restart(mut self, policy: &str) -> PodManifest {
        self.restart_policy = Some(policy.to_owned());
        self
    }

    /// `terminationGracePeriodSeconds`. Tests whose containers' pid 1 is a shell or `sleep`
    /// (which ignore SIGTERM) set 1, or every teardown waits the default 30 s for the SIGKILL.
    pub fn grace(mut self, seconds: u32) -> PodManifest {
        self.grace_seconds = Some(seconds);
        self
    }

    /// More lines under `metadata:` (indented 2 spaces: `uid`, `labels`, ...).
    pub fn metadata(mut self, lines: &str) -> PodManifest {
        self.metadata.push_str(lines);
        self
    }

    /// More lines under `spec:` (indented 2 spaces), before the containers.
    pub fn spec(mut self, lines: &str) -> PodManifest {
        self.spec.push_str(lines);
        self
    }

    /// A container entry as [`container`] writes it.
    pub fn container(mut self, entry: String) -> PodManifest {
        self.containers.push(entry);
        self
    }

    /// An entry of `initContainers`, as [`container`] writes it.
    pub fn init_container(mut self, entry: String) -> PodManifest {
        self.init_containers.push(entry);
        self
    }

    /// A busybox container running `sh -c command`, with `extra` lines ([`container`]).
    pub fn shell(self, name: &str, command: &str, extra: &str) -> PodManifest {
        self.container(container(name, command, extra))
    }

    /// Lines under `volumes:` (indented 4 spaces: `- name: ...`).
    pub fn volumes(mut self, lines: &str) -> PodManifest {
        self.volumes.push_str(lines);
        self
    }

    /// The manifest's YAML.
    pub fn yaml(&self) -> String {
        let mut out = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n{}spec:\n",
            self.name, self.metadata
        );
        if let Some(policy) = &self.restart_policy {
            out.push_str(&format!("  restartPolicy: {policy}\n"));
        }
        if let Some(seconds) = self.grace_seconds {
            out.push_str(&format!("  terminationGracePeriodSeconds: {seconds}\n"));
        }
        out.push_str(&self.spec);
        if !self.init_containers.is_empty() {
            out.push_str("  initContainers:\n");
            out.push_str(&self.init_containers.concat());
        }
        out.push_str("  containers:\n");
        out.push_str(&self.containers.concat());
        if !self.volumes.is_empty() {
            out.push_str("  volumes:\n");
            out.push_str(&self.volumes);
        }
        out
    }
}

/// A container's `resources:` with the same requests and limits (`cpu`, `memory`): what makes a
/// pod of such containers Guaranteed. Lines at the container's level, for `extra`.
pub fn guaranteed(cpu: &str, memory: &str) -> String {
    format!(
        "      resources:\n        requests:\n          cpu: \"{cpu}\"\n          memory: {memory}\n        \
         limits:\n          cpu: \"{cpu}\"\n          memory: {memory}\n"
    )
}

/// A container's `resources:` requesting `memory` only, no limit: Burstable.
pub fn burstable(memory: &str) -> String {
    format!("      resources:\n        requests:\n          memory: {memory}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_its_fields_in_the_order_yaml_readers_expect() {
        let yaml = PodManifest::new("p")
            .metadata("  uid: u\n")
            .restart("Never")
            .grace(1)
            .spec("  hostUsers: false\n")
            .shell("main", "exit 0", "")
            .volumes("    - name: v\n      emptyDir: {}\n")
            .yaml();
        assert_eq!(
            yaml,
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  uid: u\nspec:\n  \
                 restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  hostUsers: false\n  \
                 containers:\n    - name: main\n      image: {BUSYBOX}\n      imagePullPolicy: \
                 Never\n      command: [\"sh\", \"-c\", \"exit 0\"]\n  volumes:\n    - name: v\n      \
                 emptyDir: {{}}\n"
            )
        );
    }

    #[test]
    fn the_short_form_is_the_builder_without_defaults() {
        let c = container("a", "true", "");
        assert_eq!(
            pod("p", "  restartPolicy: Always\n", std::slice::from_ref(&c)),
            PodManifest::new("p").restart("Always").container(c).yaml()
        );
    }
}
