//! What the cluster-member system tests (`tests/tests/cluster*.rs`) share: the tokio runtime a
//! synchronous test makes its API calls on, a bounded wait for a condition, and the runtime's
//! view of one pod (its sandboxes and containers over CRI, behind the agent's back).

use std::time::{Duration, Instant};

use k8s_cri::v1::{Container, ContainerFilter, PodSandbox, PodSandboxFilter};

use crate::with_cri;

/// The runtime a synchronous test makes its API calls on: one for the whole test, since the
/// client's connection tasks live on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a tokio runtime: {e}"))
}

/// Polls `get` until `want` holds of what it returns, failing after `wait` with what it saw last.
pub fn wait_for<T: std::fmt::Debug>(
    what: &str,
    wait: Duration,
    mut get: impl FnMut() -> T,
    want: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + wait;
    loop {
        let value = get();
        if want(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: last seen {value:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pod_label(uid: &str) -> std::collections::HashMap<String, String> {
    [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into()
}

/// Every container of the pod with `uid` the runtime has, in any state.
pub fn pod_containers(uid: &str) -> Vec<Container> {
    let label = pod_label(uid);
    with_cri("pod_containers", |runtime| async move {
        use swiftlet::cri::RuntimeService as _;
        runtime
            .list_containers(Some(ContainerFilter {
                label_selector: label,
                ..Default::default()
            }))
            .await
            .unwrap_or_else(|e| panic!("list containers: {e}"))
    })
}

/// Every sandbox of the pod with `uid` the runtime has, in any state.
pub fn pod_sandboxes(uid: &str) -> Vec<PodSandbox> {
    let label = pod_label(uid);
    with_cri("pod_sandboxes", |runtime| async move {
        use swiftlet::cri::RuntimeService as _;
        runtime
            .list_pod_sandbox(Some(PodSandboxFilter {
                label_selector: label,
                ..Default::default()
            }))
            .await
            .unwrap_or_else(|e| panic!("list sandboxes: {e}"))
    })
}

/// How many containers of the pod with `uid` run.
pub fn running_containers(uid: &str) -> usize {
    pod_containers(uid)
        .iter()
        .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
        .count()
}
