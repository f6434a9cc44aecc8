//! The order in which a pod's containers stop when the whole pod is killed (upstream
//! `kuberuntime_termination_order.go`: `newTerminationOrdering`, `waitForTurn`,
//! `containerTerminated`). Sidecars (restartable init containers) serve the main containers, so
//! they outlive them: every sidecar waits until all main containers have terminated, and until
//! every sidecar declared after it has, so sidecars stop in reverse spec order. The wait is
//! bounded by the container's grace period; the killer takes it out of that period.
//!
//! What it does not do: stop anything (`manager::kill_container` waits here, then stops), order
//! kills of single containers (upstream orders only whole-pod kills, and so does swiftlet), or
//! order plain init containers, which nothing waits for.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::pod::spec;

/// Who waits for whom while one pod is killed. A container's token is cancelled once it has
/// terminated, or from the start when it was not running: nobody waits for it then.
#[derive(Debug)]
pub struct TerminationOrdering {
    terminated: HashMap<String, CancellationToken>,
    /// For each sidecar, the names of the containers it waits for, main containers first.
    prerequisites: HashMap<String, Vec<String>>,
}

/// How a wait for a container's turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Everything it waits for has terminated.
    Reached,
    /// Its grace period ended first.
    GraceExpired,
}

impl TerminationOrdering {
    /// The ordering for killing `pod` whose containers named `running` are being stopped
    /// (upstream `newTerminationOrdering`). `None` when the pod has no sidecar, as upstream
    /// builds none then: nothing would wait.
    pub fn new<'a>(pod: &Pod, running: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let inits = spec::init_containers(pod);
        if !inits.iter().any(spec::is_sidecar) {
            return None;
        }
        let running: std::collections::HashSet<&str> = running.into_iter().collect();
        let token = |name: &str| {
            let token = CancellationToken::new();
            if !running.contains(name) {
                token.cancel();
            }
            token
        };
        let mut ordering = TerminationOrdering {
            terminated: HashMap::new(),
            prerequisites: HashMap::new(),
        };
        let mains: Vec<String> = spec::containers(pod)
            .iter()
            .map(|c| c.name.clone())
            .collect();
        for name in &mains {
            ordering.terminated.insert(name.clone(), token(name));
        }
        // Walked from the last declared: each sidecar waits for the one met just before it here,
        // which itself waits for the one after it, and so on: reverse order by chaining.
        let mut later_sidecar: Option<&str> = None;
        for init in inits.iter().rev() {
            ordering
                .terminated
                .insert(init.name.clone(), token(&init.name));
            if spec::is_sidecar(init) {
                let mut waits_for = mains.clone();
                waits_for.extend(later_sidecar.map(str::to_owned));
                ordering.prerequisites.insert(init.name.clone(), waits_for);
                later_sidecar = Some(&init.name);
            }
        }
        Some(ordering)
    }

    /// Waits until every container `name` waits for has terminated, or `grace` has gone by
    /// (upstream `waitForTurn`). With no grace period there is no wait. Returns how it ended and
    /// how long it took; the caller takes the time out of the container's grace period.
    pub async fn wait_for_turn(&self, name: &str, grace: Duration) -> (Turn, Duration) {
        if grace.is_zero() {
            return (Turn::Reached, Duration::ZERO);
        }
        let began = tokio::time::Instant::now();
        let tokens: Vec<&CancellationToken> = self
            .prerequisites
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|prerequisite| self.terminated.get(prerequisite))
            .collect();
        let all = async {
            for token in tokens {
                token.cancelled().await;
            }
        };
        let turn = match tokio::time::timeout(grace, all).await {
            Ok(()) => Turn::Reached,
            Err(_) => Turn::GraceExpired,
        };
        (turn, began.elapsed())
    }

    /// Records that container `name` has stopped, releasing whoever waits for it (upstream
    /// `containerTerminated`). Unknown names and repeats are no-ops.
    pub fn container_terminated(&self, name: &str) {
        if let Some(token) = self.terminated.get(name) {
            token.cancel();
        }
    }

    /// The containers `name` still waits for, in the order it waits: what a test or a log line
    /// needs to know.
    pub fn pending(&self, name: &str) -> Vec<&str> {
        self.prerequisites
            .get(name)
            .into_iter()
            .flatten()
            .filter(|p| self.terminated.get(*p).is_some_and(|t| !t.is_cancelled()))
            .map(String::as_str)
            .collect()
    }
}

/// What is left of `grace` after waiting `waited` for a turn. Upstream keeps grace periods in
/// whole seconds and truncates the wait downwards before subtracting it, so a container never
/// loses more than it waited; the minimum grace is applied later, at the stop.
pub fn grace_after_wait(grace: Duration, waited: Duration) -> Duration {
    grace.saturating_sub(Duration::from_secs(waited.as_secs()))
}

#[cfg(test)]
mod tests;
