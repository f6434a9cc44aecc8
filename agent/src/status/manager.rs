//! The status manager (upstream `pkg/kubelet/status/status_manager.go`): the latest status the
//! kubelet generated for each pod, versioned, readable by `/pods` and the next status generation
//! (as the "previous" status), and — when an API server is connected — pushed to it by a syncer
//! that watches for changes.
//!
//! Not here: computing a status (`generate`), talking to the API server (the API source).

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use tokio::sync::watch;

use super::terminated_status;
use crate::container::PodUid;

#[derive(Clone, Debug)]
struct Versioned {
    pod: Arc<Pod>,
    status: ApiPodStatus,
    version: u64,
    finished: bool,
}

/// A pod with the status the kubelet last set, and that status's version.
#[derive(Clone, Debug)]
pub struct PodWithStatus {
    pub pod: Pod,
    pub version: u64,
    /// The pod's termination is complete: its containers are stopped and its volumes torn down
    /// (upstream `podIsFinished`, set by `TerminatePod` at the end of `SyncTerminatedPod`).
    pub finished: bool,
    /// The status the pod's source gave with it (the API server's copy, for an API pod).
    pub source_status: Option<ApiPodStatus>,
}

pub struct StatusManager {
    statuses: Mutex<HashMap<PodUid, Versioned>>,
    /// Pods the kubelet itself ended (evicted): every status recorded for them from then on says
    /// so, whatever a sync in flight generated meanwhile (upstream passes this as the kill's
    /// `statusFn`).
    terminal: Mutex<HashMap<PodUid, TerminalStatus>>,
    /// Bumped on every change; a syncer to the API server waits on it.
    changed: watch::Sender<u64>,
}

impl Default for StatusManager {
    fn default() -> Self {
        StatusManager {
            statuses: Mutex::new(HashMap::new()),
            terminal: Mutex::new(HashMap::new()),
            changed: watch::Sender::new(0),
        }
    }
}

impl StatusManager {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, Versioned>> {
        self.statuses.lock_unpoisoned()
    }

    fn terminal(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, TerminalStatus>> {
        self.terminal.lock_unpoisoned()
    }

    /// Marks `pod` as ended by the kubelet (phase Failed with this reason and message, and a
    /// `DisruptionTarget` condition), and records that at once.
    pub fn set_terminal(&self, pod: &Arc<Pod>, reason: &str, message: &str) {
        self.set_terminal_with(pod, reason, message, false);
    }

    /// [`StatusManager::set_terminal`], but a pod that already Succeeded keeps that phase (the
    /// node shutdown's status function, upstream).
    pub fn set_terminal_unless_succeeded(&self, pod: &Arc<Pod>, reason: &str, message: &str) {
        self.set_terminal_with(pod, reason, message, true);
    }

    fn set_terminal_with(&self, pod: &Arc<Pod>, reason: &str, message: &str, keep_succeeded: bool) {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        self.terminal().insert(
            uid.clone(),
            TerminalStatus {
                reason: reason.to_owned(),
                message: message.to_owned(),
                since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
                keep_succeeded,
            },
        );
        let status = self.get(&uid).unwrap_or_default();
        self.set_pod_status(pod, status);
    }

    /// Records `status` for `pod`. An unchanged status does not bump the version.
    pub fn set_pod_status(&self, pod: &Arc<Pod>, mut status: ApiPodStatus) {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        if let Some(terminal) = self.terminal().get(&uid) {
            terminal.apply(&mut status);
        }
        limit_termination_messages(pod, &mut status);
        let mut statuses = self.lock();
        let (version, finished) = match statuses.get(&uid) {
            Some(old) if old.status == status && Arc::ptr_eq(&old.pod, pod) => return,
            Some(old) if old.status == status => (old.version, old.finished),
            Some(old) => (old.version + 1, old.finished),
            None => (1, false),
        };
        statuses.insert(
            uid,
            Versioned {
                pod: pod.clone(),
                status,
                version,
                finished,
            },
        );
        drop(statuses);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Upstream `TerminatePod`, as `SyncTerminatedPod` ends: the pod's status made final
    /// ([`terminated_status`]: every container terminated, an API pod's phase terminal), and its
    /// termination recorded as complete, so the syncer may delete a pod the API server is
    /// deleting. A new version, so the syncer looks at the pod again.
    pub fn terminate_pod(&self, pod: &Pod) {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let mut statuses = self.lock();
        let Some(entry) = statuses.get_mut(&uid) else {
            return;
        };
        let status = terminated_status(pod, entry.status.clone());
        if entry.finished && entry.status == status {
            return;
        }
        entry.status = status;
        entry.finished = true;
        entry.version += 1;
        drop(statuses);
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn get(&self, uid: &PodUid) -> Option<ApiPodStatus> {
        self.lock().get(uid).map(|v| v.status.clone())
    }

    /// The pod with the status the kubelet last set for it (the status generation's "previous").
    pub fn with_status(&self, pod: &Pod) -> Pod {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let mut pod = pod.clone();
        if let Some(status) = self.get(&uid) {
            pod.status = Some(status);
        }
        pod
    }

    /// Forgets the statuses of pods not in `keep` (upstream `RemoveOrphanedStatuses`).
    pub fn retain(&self, keep: impl Fn(&PodUid) -> bool) {
        self.lock().retain(|uid, _| keep(uid));
        self.terminal().retain(|uid, _| keep(uid));
    }

    pub fn remove(&self, uid: &PodUid) {
        self.lock().remove(uid);
        self.terminal().remove(uid);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Every pod with its latest status, sorted by namespace and name.
    pub fn pods(&self) -> Vec<PodWithStatus> {
        let mut pods: Vec<PodWithStatus> = self
            .lock()
            .values()
            .map(|v| {
                let mut pod = (*v.pod).clone();
                let source_status = pod.status.replace(v.status.clone());
                PodWithStatus {
                    pod,
                    version: v.version,
                    finished: v.finished,
                    source_status,
                }
            })
            .collect();
        pods.sort_by(|a, b| {
            (&a.pod.metadata.namespace, &a.pod.metadata.name)
                .cmp(&(&b.pod.metadata.namespace, &b.pod.metadata.name))
        });
        pods
    }

    /// Changes for whoever pushes statuses elsewhere.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// How the kubelet ended a pod.
#[derive(Clone, Debug)]
struct TerminalStatus {
    reason: String,
    message: String,
    since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// A Succeeded phase stays (the node shutdown's); else the phase is Failed (eviction's).
    keep_succeeded: bool,
}

impl TerminalStatus {
    fn apply(&self, status: &mut ApiPodStatus) {
        if !(self.keep_succeeded && status.phase.as_deref() == Some("Succeeded")) {
            status.phase = Some("Failed".into());
        }
        status.reason = Some(self.reason.clone());
        status.message = Some(self.message.clone());
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(self.message.clone()),
            last_transition_time: Some(self.since.clone()),
            ..Default::default()
        });
    }
}

/// Upstream `MaxPodTerminationMessageLogLength`: what all of a pod's termination messages may
/// add up to.
pub const MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH: usize = 12 * 1024;

/// Cuts each terminated state's message to an even share of the pod's budget (upstream
/// `normalizeStatus` in `status_manager.go`, which divides it by the spec's regular and init
/// containers and keeps each message's first bytes; here cut at a character boundary, as the
/// API's strings are UTF-8).
fn limit_termination_messages(pod: &Pod, status: &mut ApiPodStatus) {
    let containers = pod.spec.as_ref().map_or(0, |s| {
        s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len)
    });
    let per_status = MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH / containers.max(1);
    let lists = [
        &mut status.container_statuses,
        &mut status.init_container_statuses,
        &mut status.ephemeral_container_statuses,
    ];
    for c in lists.into_iter().flatten().flatten() {
        let states = [c.state.as_mut(), c.last_state.as_mut()];
        for terminated in states
            .into_iter()
            .flatten()
            .filter_map(|s| s.terminated.as_mut())
        {
            if let Some(message) = terminated.message.as_mut()
                && message.len() > per_status
            {
                let mut cut = per_status;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_messages_share_the_pods_budget() {
        use k8s_openapi::api::core::v1::{
            Container, ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec,
        };
        let terminated = |message: String| ContainerState {
            terminated: Some(ContainerStateTerminated {
                message: Some(message),
                ..Default::default()
            }),
            ..Default::default()
        };
        let containers = |n: usize| {
            (0..n)
                .map(|i| Container {
                    name: format!("c{i}"),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        };
        let pod = Pod {
            spec: Some(PodSpec {
                containers: containers(2),
                init_containers: Some(containers(1)),
                ..Default::default()
            }),
            ..Default::default()
        };
        // 4096 bytes each for three containers; "é" is two bytes and straddles the cut.
        let long = format!("{}é{}", "a".repeat(4095), "b".repeat(100));
        let mut status = ApiPodStatus {
            container_statuses: Some(vec![ContainerStatus {
                state: Some(terminated(long.clone())),
                last_state: Some(terminated("short".into())),
                ..Default::default()
            }]),
            init_container_statuses: Some(vec![ContainerStatus {
                state: Some(terminated("x".repeat(4096))),
                ..Default::default()
            }]),
            ..Default::default()
        };
        limit_termination_messages(&pod, &mut status);
        let message = |s: &Option<Vec<ContainerStatus>>, last: bool| {
            let c = &s.as_ref().expect("statuses")[0];
            let state = if last { &c.last_state } else { &c.state };
            state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.message.clone())
        };
        assert_eq!(
            message(&status.container_statuses, false),
            Some("a".repeat(4095))
        );
        assert_eq!(
            message(&status.container_statuses, true).as_deref(),
            Some("short")
        );
        assert_eq!(
            message(&status.init_container_statuses, false),
            Some("x".repeat(4096))
        );
    }

    fn pod(uid: &str, name: &str) -> Arc<Pod> {
        crate::testing::pod().named("default", name, uid).arc()
    }

    fn phase(p: &str) -> ApiPodStatus {
        ApiPodStatus {
            phase: Some(p.into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_evicted_pod_stays_failed_whatever_is_generated_later() {
        let m = StatusManager::default();
        let p = pod("a", "web");
        m.set_pod_status(&p, phase("Running"));
        m.set_terminal(&p, "Evicted", "The node was low on resource: memory. ");
        // A sync that was in flight records what it generated: the eviction still shows.
        m.set_pod_status(&p, phase("Running"));
        let s = m.get(&PodUid("a".into())).unwrap_or_default();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        let conditions = s.conditions.unwrap_or_default();
        assert_eq!(
            conditions
                .iter()
                .filter(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                .count(),
            1
        );
        m.remove(&PodUid("a".into()));
        m.set_pod_status(&p, phase("Running"));
        assert_eq!(
            m.get(&PodUid("a".into())).and_then(|s| s.phase).as_deref(),
            Some("Running"),
            "forgotten with the pod"
        );
    }

    #[test]
    fn a_pod_shut_down_with_the_node_reads_as_upstream_writes_it() {
        let m = StatusManager::default();
        let running = pod("a", "web");
        m.set_pod_status(&running, phase("Running"));
        m.set_terminal_unless_succeeded(
            &running,
            crate::nodeshutdown::SHUTDOWN_REASON,
            crate::nodeshutdown::SHUTDOWN_MESSAGE,
        );
        let s = m.get(&PodUid("a".into())).unwrap_or_default();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Terminated"));
        assert_eq!(
            s.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown.")
        );
        let conditions = s.conditions.unwrap_or_default();
        let target: Vec<_> = conditions
            .iter()
            .filter(|c| c.type_ == "DisruptionTarget")
            .collect();
        assert_eq!(target.len(), 1);
        assert_eq!(target[0].status, "True");
        assert_eq!(target[0].reason.as_deref(), Some("TerminationByKubelet"));
        assert_eq!(
            target[0].message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown.")
        );

        // A pod that had already succeeded keeps its phase, as upstream's status function.
        let done = pod("b", "job");
        m.set_pod_status(&done, phase("Succeeded"));
        m.set_terminal_unless_succeeded(
            &done,
            crate::nodeshutdown::SHUTDOWN_REASON,
            crate::nodeshutdown::SHUTDOWN_MESSAGE,
        );
        let s = m.get(&PodUid("b".into())).unwrap_or_default();
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(s.reason.as_deref(), Some("Terminated"));
        // Eviction makes even a succeeded pod Failed (upstream's eviction status function).
        m.set_terminal(&done, "Evicted", "low on memory");
        let s = m.get(&PodUid("b".into())).unwrap_or_default();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn versions_grow_with_changes_only() {
        let m = StatusManager::default();
        let p = pod("a", "web");
        m.set_pod_status(&p, phase("Pending"));
        m.set_pod_status(&p, phase("Pending"));
        assert_eq!(m.pods()[0].version, 1);
        m.set_pod_status(&p, phase("Running"));
        assert_eq!(m.pods()[0].version, 2);
        assert_eq!(
            m.with_status(&p).status.and_then(|s| s.phase).as_deref(),
            Some("Running")
        );
    }

    #[test]
    fn pods_are_listed_sorted_and_orphans_removed() {
        let m = StatusManager::default();
        m.set_pod_status(&pod("b", "zeta"), phase("Running"));
        m.set_pod_status(&pod("a", "alpha"), phase("Running"));
        let names: Vec<_> = m
            .pods()
            .into_iter()
            .filter_map(|p| p.pod.metadata.name)
            .collect();
        assert_eq!(names, vec!["alpha".to_owned(), "zeta".to_owned()]);
        m.retain(|uid| uid.0 == "a");
        assert_eq!(m.pods().len(), 1);
    }
}
