//! The node lease (upstream `k8s.io/component-helpers/apimachinery/lease/controller.go` with the
//! kubelet's `SetNodeOwnerFunc`): the `coordination.k8s.io/v1` Lease `<node>` in
//! `kube-node-lease`, held by the node, renewed every `duration × 0.25` — the cheap heartbeat the
//! node lifecycle controller watches. Upstream's rules, kept:
//! - renew from the lease last written (a PUT with its `resourceVersion`, no GET) while that works;
//! - otherwise "ensure" it: GET, and on 404 create it (a just-created lease is not updated again);
//! - a PUT that conflicts reads the lease again (GET, backing off 100 ms doubling to 7 s while that
//!   fails) and retries, up to 5 updates per renewal;
//! - the owner reference to the Node is added once the Node's UID is known; a lease is not created
//!   without it (the next renewal tries again), while an update goes ahead without it.
//!
//! Deviations: the Node's UID comes from the registration (`node.rs`) instead of a GET of the
//! Node at each renewal, and renewals are not jittered.
//!
//! Not here: the Node itself, leader election.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{ApiServerOptions, Error, NODE_LEASE_NAMESPACE, WallClock, is_conflict, is_not_found};

/// Upstream `maxUpdateRetries`.
const MAX_UPDATE_RETRIES: usize = 5;
/// Upstream's backoff while the lease cannot be read or created.
const ENSURE_FIRST_BACKOFF: Duration = Duration::from_millis(100);
const ENSURE_MAX_BACKOFF: Duration = Duration::from_secs(7);

pub(super) struct LeaseController {
    api: Api<Lease>,
    node_name: String,
    duration_seconds: i32,
    renew_interval: Duration,
    clock: WallClock,
    node_uid: watch::Receiver<Option<String>>,
    /// The lease as last written or read (upstream `latestLease`).
    latest: Option<Lease>,
    /// Told once the lease has been written: the node status loop then reports an unchanged
    /// status only every `nodeStatusReportFrequency`.
    held: watch::Sender<bool>,
}

impl LeaseController {
    pub(super) fn new(
        client: Client,
        options: &ApiServerOptions,
        clock: WallClock,
        node_uid: watch::Receiver<Option<String>>,
    ) -> Self {
        LeaseController {
            api: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            node_name: options.node_name.clone(),
            duration_seconds: i32::try_from(options.node_lease_duration_seconds)
                .unwrap_or(i32::MAX),
            renew_interval: options.lease_renew_interval(),
            clock,
            node_uid,
            latest: None,
            held: watch::channel(false).0,
        }
    }

    /// Says on `held` when the lease has been written.
    pub(super) fn with_held(mut self, held: watch::Sender<bool>) -> Self {
        self.held = held;
        self
    }

    /// Renews until cancelled; the interval counts from the end of each renewal, as upstream's
    /// sliding `JitterUntil`.
    pub(super) async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.sync() => {}
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.renew_interval) => {}
            }
        }
    }

    /// One renewal (upstream `sync`).
    async fn sync(&mut self) {
        if let Some(latest) = self.latest.clone() {
            match self.retry_update(latest).await {
                Ok(()) => return,
                Err(error) => {
                    tracing::info!(%error, "failed to update the lease from the last one; reading it again")
                }
            }
        }
        let Some((lease, created)) = self.backoff_ensure().await else {
            return;
        };
        self.latest = Some(lease.clone());
        if !created && let Err(error) = self.retry_update(lease).await {
            tracing::warn!(%error, interval = ?self.renew_interval, "will retry updating the lease");
        }
    }

    /// Reads (or creates) the lease until that works. `None` when the lease was not created for
    /// want of an owner; the next renewal tries again.
    async fn backoff_ensure(&self) -> Option<(Lease, bool)> {
        let mut sleep = ENSURE_FIRST_BACKOFF;
        loop {
            match self.ensure().await {
                Ok(found) => return found,
                Err(error) => {
                    sleep = (sleep * 2).min(ENSURE_MAX_BACKOFF);
                    tracing::warn!(%error, retry_in = ?sleep, "failed to ensure the node lease exists");
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    /// Upstream `ensureLease`: the lease and whether this call created it.
    async fn ensure(&self) -> Result<Option<(Lease, bool)>, Error> {
        match self.api.get(&self.node_name).await {
            Ok(lease) => Ok(Some((lease, false))),
            Err(error) if is_not_found(&error) => {
                let (lease, owned) = self.new_lease(None);
                if !owned {
                    tracing::debug!("the node's UID is not known yet; creating the lease later");
                    return Ok(None);
                }
                let created = self
                    .api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map_err(Error::api(format!(
                        "POST {NODE_LEASE_NAMESPACE}/leases ({})",
                        self.node_name
                    )))?;
                self.held.send_replace(true);
                Ok(Some((created, true)))
            }
            Err(error) => Err(Error::Api {
                what: format!("GET {NODE_LEASE_NAMESPACE}/leases/{}", self.node_name),
                source: error,
            }),
        }
    }

    /// Upstream `retryUpdateLease`: PUT `base` renewed; on a conflict, read it again and retry.
    async fn retry_update(&mut self, mut base: Lease) -> Result<(), Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Without an owner yet, the update still goes ahead: renewing matters more.
            let (lease, _owned) = self.new_lease(Some(base.clone()));
            let error = match self
                .api
                .replace(&self.node_name, &PostParams::default(), &lease)
                .await
            {
                Ok(updated) => {
                    self.latest = Some(updated);
                    self.held.send_replace(true);
                    return Ok(());
                }
                Err(error) => error,
            };
            tracing::warn!(%error, attempt, "failed to update the node lease");
            if attempt >= MAX_UPDATE_RETRIES {
                return Err(Error::Api {
                    what: format!("PUT {NODE_LEASE_NAMESPACE}/leases/{}", self.node_name),
                    source: error,
                });
            }
            if is_conflict(&error) {
                // Someone else wrote it: start from what is stored now.
                if let Some((fresh, _)) = self.backoff_ensure().await {
                    base = fresh;
                }
            }
        }
    }

    /// Upstream `newLease`: `base` (or a fresh lease) held by this node and renewed now, with the
    /// Node as owner when its UID is known; the flag says whether the lease has its owner.
    fn new_lease(&self, base: Option<Lease>) -> (Lease, bool) {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                namespace: Some(NODE_LEASE_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node_name.clone()),
                lease_duration_seconds: Some(self.duration_seconds),
                ..LeaseSpec::default()
            }),
        });
        let now = Timestamp::try_from((self.clock)()).unwrap_or(Timestamp::UNIX_EPOCH);
        lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(now));
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty())
        {
            return (lease, true);
        }
        let Some(uid) = self.node_uid.borrow().clone() else {
            return (lease, false);
        };
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node_name.clone(),
            uid,
            ..OwnerReference::default()
        }]);
        (lease, true)
    }
}

#[cfg(test)]
mod tests;
