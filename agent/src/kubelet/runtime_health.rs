//! The container runtime's health for the node's Ready condition (upstream `updateRuntimeUp` and
//! `runtimeState`): CRI `Status` every 5 s; the node is not ready while the runtime or its network
//! says it is not, or when no answer came for 30 s. Each answer also refreshes the runtime's
//! features (handlers with user namespaces, `supplementalGroupsPolicy`) that admission reads.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_cri::v1 as cri;
use tokio_util::sync::CancellationToken;

use crate::{container::RuntimeFeatures, cri::RuntimeService, lock::MutexExt as _};

/// Upstream checks the runtime this often.
const PERIOD: Duration = Duration::from_secs(5);
/// With no good answer for this long the runtime counts as down.
const DOWN_AFTER: Duration = Duration::from_secs(30);

#[derive(Default)]
struct State {
    last_sync: Option<Instant>,
    runtime: Option<String>,
    network: Option<String>,
}

#[derive(Clone, Default)]
pub struct RuntimeHealth(Arc<Mutex<State>>);

impl RuntimeHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock_unpoisoned()
    }

    /// Why the node is not ready on the runtime's account, upstream's wording; `None` if it is.
    pub fn problem(&self) -> Option<String> {
        let state = self.lock();
        let mut problems = Vec::new();
        match state.last_sync {
            None => problems
                .push("container runtime status check may not have completed yet".to_owned()),
            Some(at) if at.elapsed() > DOWN_AFTER => {
                problems.push("container runtime is down".to_owned())
            }
            Some(_) => {}
        }
        problems.extend(state.runtime.clone());
        problems.extend(state.network.clone());
        (!problems.is_empty()).then(|| problems.join(", "))
    }

    /// Records one `Status` answer.
    pub fn observe(&self, status: &cri::StatusResponse, now: Instant) {
        let condition = |kind: &str| {
            status
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.r#type == kind))
        };
        let describe = |c: Option<&cri::RuntimeCondition>| match c {
            None => "<nil>".to_owned(),
            Some(c) => format!(
                "{}={} reason:{} message:{}",
                c.r#type, c.status, c.reason, c.message
            ),
        };
        let mut state = self.lock();
        let network = condition("NetworkReady");
        state.network = (!network.is_some_and(|c| c.status))
            .then(|| format!("container runtime network not ready: {}", describe(network)));
        let runtime = condition("RuntimeReady");
        if runtime.is_some_and(|c| c.status) {
            state.runtime = None;
            state.last_sync = Some(now);
        } else {
            state.runtime = Some(format!(
                "container runtime not ready: {}",
                describe(runtime)
            ));
        }
    }

    /// The runtime's features, asked once at start-up: admission decides from the first pod on
    /// with them, and [`Self::run`] keeps them current. `None` when the runtime does not answer.
    pub async fn features_now(runtime: &dyn RuntimeService) -> Option<RuntimeFeatures> {
        let features = match runtime.status().await {
            Ok(status) => Some(crate::cri::convert::runtime_features(&status)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the runtime's features yet (CRI Status)");
                None
            }
        };
        tracing::info!(
            supplemental_groups_policy = features
                .as_ref()
                .is_some_and(|f| f.supplemental_groups_policy),
            user_namespaces = features
                .as_ref()
                .is_some_and(|f| f.handler_supports_user_namespaces("")),
            "the container runtime's features"
        );
        features
    }

    /// Asks the runtime every period until `shutdown`; `changed` is notified when the problem
    /// changes, `features` gets the runtime's features when they change.
    pub async fn run(
        self,
        runtime: Arc<dyn RuntimeService>,
        changed: Arc<tokio::sync::Notify>,
        features: tokio::sync::watch::Sender<Option<RuntimeFeatures>>,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let before = self.problem();
            match runtime.status().await {
                Ok(status) => {
                    self.observe(&status, Instant::now());
                    let now = crate::cri::convert::runtime_features(&status);
                    features.send_if_modified(|known| {
                        let changed = known.as_ref() != Some(&now);
                        if changed {
                            tracing::info!(features = ?now, "the container runtime's features changed");
                            *known = Some(now);
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!(error = %e, "container runtime sanity check failed"),
            }
            if self.problem() != before {
                changed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(runtime: bool, network: bool) -> cri::StatusResponse {
        let condition = |kind: &str, ok: bool| cri::RuntimeCondition {
            r#type: kind.into(),
            status: ok,
            reason: if ok {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: if ok {
                String::new()
            } else {
                "cni config uninitialized".into()
            },
        };
        cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition("RuntimeReady", runtime),
                    condition("NetworkReady", network),
                ],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ready_only_once_the_runtime_and_its_network_say_so() {
        let health = RuntimeHealth::default();
        assert_eq!(
            health.problem().as_deref(),
            Some("container runtime status check may not have completed yet")
        );
        health.observe(&status(true, false), Instant::now());
        assert_eq!(
            health.problem().as_deref(),
            Some(
                "container runtime network not ready: NetworkReady=false \
                 reason:NetworkPluginNotReady message:cni config uninitialized"
            )
        );
        health.observe(&status(true, true), Instant::now());
        assert_eq!(health.problem(), None);
        health.observe(&status(false, true), Instant::now());
        assert!(
            health
                .problem()
                .is_some_and(|p| p.starts_with("container runtime not ready: RuntimeReady=false"))
        );
    }

    #[test]
    fn no_good_answer_for_30_s_means_down() {
        let health = RuntimeHealth::default();
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(31))
            .expect("a machine up for more than 31 s");
        health.observe(&status(true, true), long_ago);
        assert_eq!(
            health.problem().as_deref(),
            Some("container runtime is down")
        );
    }
}
