//! Node registration and status (upstream `kubelet_node_status.go`: `registerWithAPIServer`,
//! `tryRegisterWithAPIServer`, `updateDefaultLabels`, `syncNodeStatus`, `updateNodeStatus`/
//! `tryUpdateNodeStatus`). First the Node is created — labels, `--register-with-taints`, status —
//! retrying with upstream's backoff (100 ms doubling to 7 s); if it already exists (409
//! `AlreadyExists`, e.g. after a restart), it is read and only its default labels and its status
//! patched (taints and other labels are set at creation only, as upstream). With
//! `registerNode: false` nothing is created: the Node is read (again, on the same backoff, until
//! someone creates it) and its status patched. Then every `nodeStatusUpdateFrequency` the
//! status is computed again — the Ready condition from the readiness check — and patched when it
//! changed, or, unchanged, once `nodeStatusReportFrequency` passed since the last report. Until
//! the node's Lease has been written the status is the only heartbeat, so it is sent at every
//! update (upstream's older `NodeLease`-gated rule). A nudge (a pressure condition or the
//! runtime's health changed) computes it at once instead of at the next tick, so a node under
//! pressure says so without waiting up to 10 s. Each status the API server accepts reports the
//! condition changes it makes as events (`node_events.rs`).
//!
//! Patches are strategic merge patches of `nodes/<name>/status`, as upstream's `PatchNodeStatus`:
//! conditions merge by `type`, so conditions other components own are kept; addresses are
//! replaced whole (`node_object::status_patch`).
//!
//! Not here: the Node object itself (`node_object.rs`), the lease (`lease.rs`), re-registering a
//! Node deleted while the agent runs (upstream does not either).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    ApiServerOptions, Error, ImagesCheck, NodeDescription, PressureCheck, ReadinessCheck,
    WallClock, is_already_exists, is_not_found,
    node_events::record_status_events,
    node_object::{
        default_labels, initial_node, node_status, pressure_conditions, ready_condition, ready_of,
        same_but_heartbeat, status_patch,
    },
};

/// Upstream's registration backoff.
const REGISTER_FIRST_STEP: Duration = Duration::from_millis(100);
const REGISTER_MAX_STEP: Duration = Duration::from_secs(7);
/// Upstream `nodeStatusUpdateRetry`: attempts per status update.
const STATUS_UPDATE_RETRIES: usize = 5;

pub(super) struct NodeStatusLoop {
    api: Api<Node>,
    name: String,
    node: NodeDescription,
    readiness: ReadinessCheck,
    clock: WallClock,
    update_frequency: Duration,
    report_frequency: Duration,
    /// The Node's UID once known, for the lease's owner reference.
    uid: watch::Sender<Option<String>>,
    /// The status last accepted by the API server, and when.
    last: Option<(NodeStatus, Instant)>,
    /// The pressure conditions in force (from the eviction manager).
    pressure: PressureCheck,
    /// Notified when something the status shows may have changed.
    nudge: Arc<tokio::sync::Notify>,
    /// The images to list in the status.
    images: ImagesCheck,
    /// `registerNode`: whether a missing Node is created.
    register_node: bool,
    /// Whether the node's Lease has been written: until then every update is reported.
    lease_held: watch::Receiver<bool>,
    events: crate::events::Events,
}

impl NodeStatusLoop {
    pub(super) fn new(
        client: Client,
        options: &ApiServerOptions,
        node: NodeDescription,
        readiness: ReadinessCheck,
        clock: WallClock,
        uid: watch::Sender<Option<String>>,
    ) -> Self {
        NodeStatusLoop {
            api: Api::all(client),
            name: options.node_name.clone(),
            node,
            readiness,
            clock,
            update_frequency: options.node_status_update_frequency,
            report_frequency: options.node_status_report_frequency,
            uid,
            last: None,
            pressure: Arc::new(Vec::new),
            nudge: Arc::new(tokio::sync::Notify::new()),
            images: Arc::new(Vec::new),
            register_node: options.register_node,
            lease_held: watch::channel(true).1,
            events: crate::events::none(),
        }
    }

    /// Reports an unchanged status at every update until `held` says the Lease was written.
    pub(super) fn with_lease(mut self, held: watch::Receiver<bool>) -> Self {
        self.lease_held = held;
        self
    }

    /// Reports the node's condition changes to `events`.
    pub(super) fn with_events(mut self, events: crate::events::Events) -> Self {
        self.events = events;
        self
    }

    /// Lists the node's images in the status (upstream `nodeStatusMaxImages`).
    pub(super) fn with_images(mut self, images: ImagesCheck) -> Self {
        self.images = images;
        self
    }

    /// Computes the status at once whenever `nudge` is notified.
    pub(super) fn with_nudge(mut self, nudge: Arc<tokio::sync::Notify>) -> Self {
        self.nudge = nudge;
        self
    }

    /// Reports the eviction manager's pressure conditions too.
    pub(super) fn with_pressure(mut self, pressure: PressureCheck) -> Self {
        self.pressure = pressure;
        self
    }

    pub(super) async fn run(mut self, cancel: CancellationToken) {
        let mut step = REGISTER_FIRST_STEP;
        loop {
            // Upstream waits before each attempt too, so a crash loop cannot hammer the server.
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(step) => {}
            }
            step = (step * 2).min(REGISTER_MAX_STEP);
            let attempt = if self.register_node {
                tracing::info!(node = self.name, "attempting to register the node");
                self.try_register().await
            } else {
                self.adopt().await
            };
            match attempt {
                Ok(()) => break,
                Err(error) => {
                    tracing::warn!(%error, "unable to register the node with the API server")
                }
            }
        }
        tracing::info!(
            node = self.name,
            created_by_this_agent = self.register_node,
            "node registered"
        );

        let mut tick = tokio::time::interval_at(
            Instant::now() + self.update_frequency,
            self.update_frequency,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => self.update_status().await,
                () = self.nudge.notified() => self.update_status().await,
            }
        }
    }

    /// Upstream `tryRegisterWithAPIServer`: create, or on `AlreadyExists` read and patch.
    async fn try_register(&mut self) -> Result<(), Error> {
        let ready = ready_condition((self.readiness)(), (self.clock)(), None);
        let pressure = pressure_conditions(&(self.pressure)(), (self.clock)(), None);
        let mut node = initial_node(&self.name, &self.node, ready, pressure);
        if let Some(status) = node.status.as_mut() {
            status.images = self.images();
        }
        let created = self.api.create(&PostParams::default(), &node).await;
        let error = match created {
            Ok(created) => {
                let status = node.status.unwrap_or_default();
                record_status_events(self.events.as_ref(), &self.name, None, &status);
                self.accepted(&created, status);
                return Ok(());
            }
            Err(error) => error,
        };
        if !is_already_exists(&error) {
            return Err(Error::Api {
                what: format!("POST nodes ({})", self.name),
                source: error,
            });
        }
        tracing::info!(node = self.name, "node was previously registered");
        let existing = self
            .api
            .get(&self.name)
            .await
            .map_err(Error::api(format!("GET nodes/{}", self.name)))?;
        let status = self.current_status(existing.status.as_ref());
        let patch = status_patch(&status, Some(&default_labels(&self.node)));
        self.patch(&patch).await?;
        record_status_events(
            self.events.as_ref(),
            &self.name,
            existing.status.as_ref(),
            &status,
        );
        self.accepted(&existing, status);
        Ok(())
    }

    /// `registerNode: false` (upstream `syncNodeStatus` without `registerWithAPIServer`): the
    /// Node someone else created is read and its status patched; a missing one is not created.
    async fn adopt(&mut self) -> Result<(), Error> {
        let existing = match self.api.get(&self.name).await {
            Ok(node) => node,
            Err(error) if is_not_found(&error) => {
                tracing::info!(
                    node = self.name,
                    "the Node does not exist and registerNode is false: waiting for it to be created"
                );
                return Err(Error::api(format!("GET nodes/{}", self.name))(error));
            }
            Err(error) => return Err(Error::api(format!("GET nodes/{}", self.name))(error)),
        };
        let status = self.current_status(existing.status.as_ref());
        self.patch(&status_patch(&status, None)).await?;
        self.accepted(&existing, status);
        Ok(())
    }

    fn accepted(&mut self, node: &Node, status: NodeStatus) {
        if let Some(uid) = &node.metadata.uid {
            self.uid.send_replace(Some(uid.clone()));
        }
        self.last = Some((status, Instant::now()));
    }

    /// The status now, keeping the conditions' transition times of `previous`.
    fn current_status(&self, previous: Option<&NodeStatus>) -> NodeStatus {
        let now = (self.clock)();
        let ready = ready_condition((self.readiness)(), now, ready_of(previous));
        let pressure = pressure_conditions(&(self.pressure)(), now, previous);
        let mut status = node_status(&self.node, ready, pressure);
        status.images = self.images();
        status
    }

    fn images(&self) -> Option<Vec<k8s_openapi::api::core::v1::ContainerImage>> {
        Some((self.images)()).filter(|i| !i.is_empty())
    }

    /// Upstream `updateNodeStatus`: a few immediate attempts, then wait for the next tick.
    async fn update_status(&mut self) {
        let previous = self.last.as_ref().map(|(s, _)| s);
        let status = self.current_status(previous);
        let changed = previous.is_none_or(|p| !same_but_heartbeat(p, &status));
        let due = !*self.lease_held.borrow()
            || self
                .last
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() >= self.report_frequency);
        if !changed && !due {
            return;
        }
        let patch = status_patch(&status, None);
        for attempt in 1..=STATUS_UPDATE_RETRIES {
            match self.patch(&patch).await {
                Ok(()) => {
                    let previous = self.last.as_ref().map(|(s, _)| s);
                    record_status_events(self.events.as_ref(), &self.name, previous, &status);
                    self.last = Some((status, Instant::now()));
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "error updating the node status, will retry");
                }
            }
        }
        tracing::warn!(
            node = self.name,
            "node status update failed; next try at the next update"
        );
    }

    async fn patch(&self, patch: &serde_json::Value) -> Result<(), Error> {
        self.api
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map(drop)
            .map_err(Error::api(format!("PATCH nodes/{}/status", self.name)))
    }
}

#[cfg(test)]
mod tests;
