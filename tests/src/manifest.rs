//! Pod manifests for system tests: busybox containers running a shell command, and the pod around
//! them, as YAML text the agent reads from its manifest folder.

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
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{spec}  containers:
{}",
        containers.concat()
    )
}
