//! What the kernel said about a pod's containers that the runtime does not say (yet): the exit of
//! a container's init before containerd shows it, and OOM kills containerd may never report. The
//! [`records`](super::records) put these into every status they record, so the kernel's account
//! and the runtime's are merged in one place; the kernel-event PLEG is the only writer.

use std::{
    collections::{HashMap, VecDeque},
    time::SystemTime,
};

use prometheus::{IntCounter, IntCounterVec};

use crate::container::{ContainerState, PodStatus, PodUid};

/// How many unconfirmed exits are remembered (a container removed before the runtime ever showed
/// it exited would otherwise stay forever).
pub const EXIT_MEMORY: usize = 4096;
/// How many OOM-killed container ids are remembered.
pub const OOM_MEMORY: usize = 4096;

/// The exit of a container's init as the kernel reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelExit {
    pub pod: PodUid,
    /// The runtime's convention: the exit code, or 128 + the signal.
    pub exit_code: i32,
    pub finished_at: SystemTime,
}

/// Whose account a status being recorded is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The runtime's, just fetched: an exit it shows is the runtime's own.
    Runtime,
    /// The cache's, amended before: an exit it shows may be the kernel's account, which the
    /// runtime has not confirmed.
    Cache,
}

/// containerd's account of an exit it did not see: when it restarts and finds a container's task
/// gone (the container exited while containerd was down and the shim could not tell it), it
/// reports exit code 255, reason `Unknown`, finished at its own recovery (`unknownExitCode`,
/// `unknownExitReason` in its CRI plugin's `restart.go`).
fn lost_by_the_runtime(c: &crate::container::ContainerStatus) -> bool {
    c.reason == "Unknown" && c.exit_code == Some(255)
}

/// Puts the kernel's account of `exit` into `c`.
fn amend_exit(c: &mut crate::container::ContainerStatus, exit: &KernelExit) {
    c.state = ContainerState::Exited;
    c.exit_code = Some(exit.exit_code);
    c.finished_at = Some(exit.finished_at);
    // containerd's reasons; an OOM kill is marked by the caller.
    c.reason = if exit.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
    .into();
}

/// The counters the facts keep (absent under the relist PLEG alone, which learns no facts).
#[derive(Clone)]
pub struct FactsMetrics {
    /// Exits the runtime reported with another exit code than the kernel did.
    pub exit_disagreements: IntCounter,
    /// OOM kills by pod (series removed with the pod).
    pub oom_kills: IntCounterVec,
}

/// Exits awaiting the runtime's confirmation, by container id; the oldest forgotten first.
#[derive(Default)]
pub(super) struct KernelExits {
    pub(super) by_container: HashMap<String, KernelExit>,
    pub(super) order: VecDeque<String>,
}

impl KernelExits {
    pub(super) fn insert(&mut self, container: String, exit: KernelExit) {
        if self.by_container.insert(container.clone(), exit).is_none() {
            if self.order.len() >= EXIT_MEMORY
                && let Some(oldest) = self.order.pop_front()
            {
                self.by_container.remove(&oldest);
            }
            self.order.push_back(container);
        }
    }

    fn remove(&mut self, container: &str) {
        if self.by_container.remove(container).is_some() {
            self.order.retain(|c| c != container);
        }
    }

    pub(super) fn remove_pod(&mut self, pod: &PodUid) {
        self.by_container.retain(|_, e| &e.pod != pod);
        let by_container = &self.by_container;
        self.order.retain(|c| by_container.contains_key(c));
    }

    pub(super) fn contains(&self, container: &str) -> bool {
        self.by_container.contains_key(container)
    }

    /// Forgets the exits of the containers of `status`'s pod that it (the runtime's own) no
    /// longer lists: removed, their ends need no more waiting for or amending.
    fn forget_unlisted(&mut self, status: &PodStatus) {
        let unlisted: Vec<String> = self
            .by_container
            .iter()
            .filter(|(id, exit)| {
                exit.pod == status.uid && !status.containers.iter().any(|c| &c.id.id == *id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        unlisted.iter().for_each(|id| self.remove(id));
    }
}

#[derive(Default)]
pub struct KernelFacts {
    pub(super) exits: KernelExits,
    /// Exits the runtime lost ([`lost_by_the_runtime`]): every status of the runtime shows its
    /// placeholder for as long as it keeps the container, so the kernel's account is kept to
    /// amend each; bounded, and forgotten with the container or its pod.
    lost: KernelExits,
    /// Containers an OOM kill hit, kept after their cgroup is gone (their exited status stays
    /// in the runtime); bounded.
    oom_killed: VecDeque<String>,
    /// Pod → (namespace, name) of its `swiftlet_oom_kills_total` series.
    oom_series: HashMap<PodUid, (String, String)>,
    metrics: Option<FactsMetrics>,
}

impl KernelFacts {
    pub fn new(metrics: Option<FactsMetrics>) -> KernelFacts {
        KernelFacts {
            metrics,
            ..KernelFacts::default()
        }
    }

    pub fn record_exit(&mut self, container: String, exit: KernelExit) {
        self.exits.insert(container, exit);
    }

    /// Whether the kernel reported an exit of `container` the runtime has not shown yet.
    pub fn exit_pending(&self, container: &str) -> bool {
        self.exits.contains(container)
    }

    /// Remembers that an OOM kill hit `container` of the pod `namespace/name`, and counts it.
    pub fn record_oom(&mut self, pod: &PodUid, container: &str, namespace: &str, name: &str) {
        if !self.oom_killed.iter().any(|c| c == container) {
            if self.oom_killed.len() >= OOM_MEMORY {
                self.oom_killed.pop_front();
            }
            self.oom_killed.push_back(container.to_owned());
        }
        if let Some(m) = &self.metrics {
            m.oom_kills.with_label_values(&[namespace, name]).inc();
        }
        self.oom_series
            .insert(pod.clone(), (namespace.to_owned(), name.to_owned()));
    }

    pub fn oom_killed(&self, container: &str) -> bool {
        self.oom_killed.iter().any(|c| c == container)
    }

    /// Forgets what was known of a pod the runtime no longer has. Its OOM series goes with it: a
    /// Failed pod still shows why it failed, a deleted one leaves no stale series.
    pub fn forget_pod(&mut self, pod: &PodUid) {
        self.exits.remove_pod(pod);
        self.lost.remove_pod(pod);
        if let Some((namespace, name)) = self.oom_series.remove(pod)
            && let Some(m) = &self.metrics
        {
            let _ = m
                .oom_kills
                .remove_label_values(&[namespace.as_str(), name.as_str()]);
        }
    }

    /// Puts the kernel's account of each exit the runtime does not show yet into `status`, and
    /// forgets those the runtime's own status (`source`) shows (counting the exit codes it
    /// disagrees on). A cached status showing an exit may show the kernel's account put in
    /// before: that confirms nothing, and forgetting the exit on it would let the runtime's next
    /// status, still behind, show the dead container running again. A sandbox's exit (its pause
    /// process) is the runtime's business alone: the sandbox state says it.
    /// The runtime's own status not listing a container at all confirms its end too (it was
    /// removed, or the pod is not this runtime's): waiting for its exit to show would be vain.
    ///
    /// Returns the containers whose exit the runtime confirmed with more to say than the
    /// kernel's account did (a termination message, its own reason or exit code): the status
    /// reported at the kernel's word lacked it, and nothing else would make a worker read it
    /// again before its next sync — which, for a container in back-off, is minutes away.
    #[must_use]
    pub fn amend(&mut self, status: &mut PodStatus, source: Source) -> Vec<String> {
        let mut confirmed = Vec::new();
        for sandbox in &status.sandboxes {
            self.exits.remove(&sandbox.id);
        }
        if source == Source::Runtime {
            self.exits.forget_unlisted(status);
            self.lost.forget_unlisted(status);
        }
        for c in &mut status.containers {
            if c.state == ContainerState::Exited
                && lost_by_the_runtime(c)
                && let Some(exit) = self.lost.by_container.get(&c.id.id)
            {
                amend_exit(c, exit);
                continue;
            }
            let Some(exit) = self.exits.by_container.get(&c.id.id) else {
                continue;
            };
            if c.state == ContainerState::Exited {
                if source == Source::Cache {
                    continue;
                }
                if lost_by_the_runtime(c) {
                    // The kernel saw the exit the runtime lost: its account, not the runtime's
                    // placeholder and recovery time, in this status and every later one.
                    tracing::info!(
                        container = c.id.id,
                        kernel = exit.exit_code,
                        "the runtime lost this exit (its reason Unknown); reporting the kernel's"
                    );
                    let exit = exit.clone();
                    self.exits.remove(&c.id.id);
                    amend_exit(c, &exit);
                    self.lost.insert(c.id.id.clone(), exit);
                    continue;
                }
                if c.exit_code != Some(exit.exit_code) {
                    if let Some(m) = &self.metrics {
                        m.exit_disagreements.inc();
                    }
                    tracing::warn!(container = c.id.id, kernel = exit.exit_code, runtime = ?c.exit_code, "the runtime reports another exit code than the kernel did; keeping the runtime's");
                }
                let mut kernels = c.clone();
                amend_exit(&mut kernels, exit);
                let oom = self.oom_killed(&c.id.id);
                let reason = |c: &crate::container::ContainerStatus| {
                    if oom { "OOMKilled" } else { c.reason.as_str() }.to_owned()
                };
                if !c.message.is_empty()
                    || c.exit_code != kernels.exit_code
                    || reason(c) != reason(&kernels)
                {
                    confirmed.push(c.id.id.clone());
                }
                let id = c.id.id.clone();
                self.exits.remove(&id);
                continue;
            }
            amend_exit(c, exit);
        }
        // containerd may not have seen the OOM kill when it reports the exit; the kernel has.
        for c in &mut status.containers {
            if c.state == ContainerState::Exited
                && c.reason != "OOMKilled"
                && self.oom_killed(&c.id.id)
            {
                c.reason = "OOMKilled".into();
            }
        }
        confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::{UID, container, runtime, t};

    #[test]
    fn an_exit_the_runtime_lost_is_reported_as_the_kernel_saw_it() {
        let spec = container("app");
        // containerd restarted after the container died: 255, Unknown, finished at its restart.
        let mut status = runtime()
            .ready_sandbox()
            .exited(&spec, 255)
            .map_latest(|c| {
                c.reason = "Unknown".into();
                c.finished_at = Some(t(500));
            })
            .build();
        let id = status.containers[0].id.id.clone();
        let mut facts = KernelFacts::new(None);
        facts.record_exit(
            id.clone(),
            KernelExit {
                pod: PodUid::from(UID),
                exit_code: 137,
                finished_at: t(100),
            },
        );
        let _ = facts.amend(&mut status, Source::Runtime);
        let c = &status.containers[0];
        assert_eq!(
            (c.state, c.exit_code, c.finished_at, c.reason.as_str()),
            (ContainerState::Exited, Some(137), Some(t(100)), "Error")
        );
        assert!(!facts.exit_pending(&id), "the runtime's end confirms it");
        // Every later status of the runtime still shows its placeholder: amended too.
        let mut later = runtime()
            .ready_sandbox()
            .exited(&spec, 255)
            .map_latest(|c| c.reason = "Unknown".into())
            .running(&spec)
            .build();
        later.containers[1].id.id.clone_from(&id);
        let _ = facts.amend(&mut later, Source::Runtime);
        assert_eq!(later.containers[1].exit_code, Some(137));
        // Once the runtime removed the container, nothing of it is kept.
        let mut removed = runtime()
            .ready_sandbox()
            .running(&spec)
            .map_latest(|c| c.id.id = "a-new-instance".into())
            .build();
        let _ = facts.amend(&mut removed, Source::Runtime);
        assert!(facts.lost.by_container.is_empty());

        // A runtime that knows the exit keeps its own account.
        let mut known = runtime().ready_sandbox().exited(&spec, 3).build();
        let id = known.containers[0].id.id.clone();
        facts.record_exit(
            id,
            KernelExit {
                pod: PodUid::from(UID),
                exit_code: 137,
                finished_at: t(100),
            },
        );
        let _ = facts.amend(&mut known, Source::Runtime);
        assert_eq!(known.containers[0].exit_code, Some(3));
    }

    /// The runtime's confirmation of an exit the kernel reported is worth a new status only when
    /// it says more than the kernel did.
    #[test]
    fn a_confirmation_that_adds_a_message_or_a_reason_is_returned() {
        let spec = container("app");
        let kernel = |code| KernelExit {
            pod: PodUid::from(UID),
            exit_code: code,
            finished_at: t(100),
        };
        let confirm = |facts: &mut KernelFacts, status: &mut PodStatus, code| {
            let id = status.containers[0].id.id.clone();
            facts.record_exit(id.clone(), kernel(code));
            (id, facts.amend(status, Source::Runtime))
        };
        let mut facts = KernelFacts::new(None);

        // What the kernel said, and no more.
        let mut same = runtime().ready_sandbox().exited(&spec, 1).build();
        let (id, confirmed) = confirm(&mut facts, &mut same, 1);
        assert!(confirmed.is_empty());
        assert!(!facts.exit_pending(&id));

        // A termination message only the runtime's status brings.
        let mut message = runtime()
            .ready_sandbox()
            .exited(&spec, 1)
            .map_latest(|c| c.message = "crashed".into())
            .build();
        let (id, confirmed) = confirm(&mut facts, &mut message, 1);
        assert_eq!(confirmed, vec![id]);

        // Another exit code, or another reason (an OOM kill the kernel did not see).
        let mut code = runtime().ready_sandbox().exited(&spec, 3).build();
        let (id, confirmed) = confirm(&mut facts, &mut code, 1);
        assert_eq!(confirmed, vec![id]);
        let mut oom = runtime()
            .ready_sandbox()
            .exited(&spec, 137)
            .map_latest(|c| c.reason = "OOMKilled".into())
            .build();
        let (id, confirmed) = confirm(&mut facts, &mut oom, 137);
        assert_eq!(confirmed, vec![id]);

        // An OOM kill both saw is no news.
        let mut both = runtime()
            .ready_sandbox()
            .exited(&spec, 137)
            .map_latest(|c| c.reason = "OOMKilled".into())
            .build();
        let id = both.containers[0].id.id.clone();
        facts.record_oom(&PodUid::from(UID), &id, "default", "web");
        let (_, confirmed) = confirm(&mut facts, &mut both, 137);
        assert!(confirmed.is_empty());

        // A cached status showing the kernel's own account confirms nothing.
        let mut cached = runtime()
            .ready_sandbox()
            .exited(&spec, 1)
            .map_latest(|c| c.message = "crashed".into())
            .build();
        let id = cached.containers[0].id.id.clone();
        facts.record_exit(id.clone(), kernel(1));
        assert!(facts.amend(&mut cached, Source::Cache).is_empty());
        assert!(facts.exit_pending(&id));
    }
}
