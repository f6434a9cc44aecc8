//! The API-server source (upstream `pkg/kubelet/config/apiserver.go`, plus the parts of the kubelet
//! that talk to the API server on a node's behalf): with `--kubeconfig`, the agent watches the pods
//! bound to its node and feeds them to the merge, registers its Node and keeps the Ready condition
//! current, renews its Lease in `kube-node-lease`, and pushes the pod statuses the kubelet generates.
//!
//! - `pods.rs` — the pod watcher (field selector `spec.nodeName`) turned into SETs for the merge.
//! - `node_object.rs` — the Node object and its status, built from [`NodeDescription`] (pure).
//! - `node.rs` — registration (`registerWithAPIServer`) and the periodic status update, with
//!   the events of the node's condition changes (`node_events.rs`).
//! - `lease.rs` — the node lease controller (`component-helpers/apimachinery/lease`).
//! - `status_sync.rs` — the status manager's syncer (`status_manager.go` `syncBatch`/`syncPod`):
//!   two-way status patches, and the final DELETE of a pod whose termination is finished.
//! - `services.rs` — the cluster's Services, watched into a bounded store for containers'
//!   service environment variables (upstream's service lister); run by the app on its own.
//! - `mirror_pods.rs` — the static pods' mirror pods (`mirror_client.go`): created, replaced,
//!   and deleted with their static pods; the pod watch sets them apart from the pods to run.
//!
//! Not here: what a pod's status is (`status/`), the merge (`merge.rs`), volumes, the
//! kubelet's own HTTPS server. Every loop logs API errors and keeps
//! going: a node agent outlives API-server outages.

mod client;
mod lease;
mod local_node;
mod mirror_pods;
mod node;
mod node_events;
mod node_object;
mod pods;
mod ratelimit;
mod services;
mod status_sync;

use std::{path::PathBuf, sync::Arc, time::Duration};

use kube::config::KubeconfigError;
use tokio_util::sync::CancellationToken;

use super::SourceSender;
use crate::status::StatusManager;

pub use client::{ApiClients, ClientSettings, client_from_kubeconfig};
pub use local_node::LocalNode;
pub use mirror_pods::{StaticPods, StaticPodsCheck};
pub use node_object::{
    KUBELET_VERSION, MAX_IMAGES, NodeDescription, go_arch, node_images, os_image,
};
pub(crate) use pods::is_too_large_resource_version;
pub use services::{ServiceStore, watch_services};

/// Upstream's namespace for node leases (`v1.NamespaceNodeLease`).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Upstream `nodeLeaseRenewIntervalFraction`: the lease is renewed four times per duration.
pub const LEASE_RENEW_FRACTION: f64 = 0.25;
/// Upstream status manager's `syncPeriod`: statuses that failed to send are retried this often.
pub const STATUS_SYNC_PERIOD: Duration = Duration::from_secs(10);

/// Whether the node is ready: `None` when it is, else why not (e.g. the PLEG's health). Upstream's
/// Ready setter gathers the runtime, network and storage errors the same way.
pub type ReadinessCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The node's pressure conditions in force (`MemoryPressure`, `DiskPressure`, `PIDPressure`), as
/// the eviction manager reports them.
pub type PressureCheck = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The images on the node as the status lists them (`node_object::node_images`).
pub type ImagesCheck =
    Arc<dyn Fn() -> Vec<k8s_openapi::api::core::v1::ContainerImage> + Send + Sync>;

/// The wall clock for heartbeat and renew times, shared by the loops and pinned by tests.
pub use crate::clock::Clock as WallClock;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("API client from kubeconfig {}: {source}", path.display())]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
    /// One API call failed; `what` names the object, e.g. `PATCH nodes/n1/status`.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }
}

/// The kubelet configuration the API-server loops use.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiServerOptions {
    pub node_name: String,
    /// `nodeStatusUpdateFrequency`: how often the node status is computed.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`: how often an unchanged node status is still sent.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub node_lease_duration_seconds: u32,
    /// How often statuses that failed to send are tried again.
    pub status_sync_period: Duration,
    /// `registerNode`: create the Node when it does not exist.
    pub register_node: bool,
}

impl ApiServerOptions {
    /// Options with the given kubelet settings, the Node registered by the agent and its status
    /// reported at every update (the app sets `node_status_report_frequency`, upstream's 5 min
    /// between unchanged reports once the Lease exists, from the configuration).
    pub fn new(
        node_name: String,
        node_status_update_frequency: Duration,
        node_lease_duration_seconds: u32,
    ) -> Self {
        ApiServerOptions {
            node_name,
            node_status_update_frequency,
            node_status_report_frequency: node_status_update_frequency,
            node_lease_duration_seconds,
            status_sync_period: STATUS_SYNC_PERIOD,
            register_node: true,
        }
    }

    /// Upstream: `nodeLeaseDurationSeconds × nodeLeaseRenewIntervalFraction` (10 s for 40 s).
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.node_lease_duration_seconds))
            .mul_f64(LEASE_RENEW_FRACTION)
    }
}

/// Everything the API-server source needs; [`ApiServerSource::run`] runs its four loops.
pub struct ApiServerSource {
    pub clients: ApiClients,
    pub options: ApiServerOptions,
    pub node: NodeDescription,
    /// Where the kubelet's pod statuses are read from.
    pub status: Arc<StatusManager>,
    pub readiness: ReadinessCheck,
    pub pressure: PressureCheck,
    /// Notified when the readiness or pressure may have changed: the node status is posted at
    /// once if it did.
    pub node_changed: Arc<tokio::sync::Notify>,
    pub images: ImagesCheck,
    /// From `PodConfig::channel(Source::Api)`.
    pub pods: SourceSender,
    pub clock: WallClock,
    /// The kubelet's static pods, for their mirror pods.
    pub static_pods: StaticPodsCheck,
    /// The node's condition changes are reported here.
    pub events: crate::events::Events,
}

impl std::fmt::Debug for ApiServerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerSource")
            .field("options", &self.options)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl ApiServerSource {
    /// Runs the pod watcher, node registration and status, the lease, the status syncer and the
    /// mirror pods until `cancel`. The lease and the mirror pods learn the Node's UID (for
    /// their owner references) from the registration.
    pub async fn run(self, cancel: CancellationToken) {
        let ApiServerSource {
            clients: ApiClients {
                main, heartbeat, ..
            },
            options,
            node,
            status,
            readiness,
            pressure,
            node_changed,
            images,
            pods,
            clock,
            static_pods,
            events,
        } = self;
        let (node_uid_tx, node_uid) = tokio::sync::watch::channel(None);
        let (lease_held_tx, lease_held) = tokio::sync::watch::channel(false);
        let (mirrors_tx, mirrors) = tokio::sync::watch::channel(None);
        tracing::info!(node = options.node_name, "connecting the API server source");
        let pod_watch = pods::run(
            main.clone(),
            options.node_name.clone(),
            pods,
            mirrors_tx,
            cancel.clone(),
        );
        let mirror_pods = mirror_pods::MirrorPodController::new(
            main.clone(),
            options.node_name.clone(),
            node_uid.clone(),
            static_pods,
            mirrors.clone(),
        )
        .run(cancel.clone());
        let node_status = node::NodeStatusLoop::new(
            heartbeat.clone(),
            &options,
            node,
            readiness,
            clock.clone(),
            node_uid_tx,
        )
        .with_pressure(pressure)
        .with_nudge(node_changed)
        .with_images(images)
        .with_lease(lease_held)
        .with_events(events)
        .run(cancel.clone());
        let lease = lease::LeaseController::new(heartbeat, &options, clock, node_uid)
            .with_held(lease_held_tx)
            .run(cancel.clone());
        let statuses =
            status_sync::StatusSync::new(main, status, options.status_sync_period, mirrors)
                .run(cancel);
        tokio::join!(pod_watch, node_status, lease, statuses, mirror_pods);
    }
}

/// Whether an API error is `reason`/`code` (kube's `Status` helpers compare only the reason for
/// known reasons; a bare code from a proxy should count too).
fn is_status(error: &kube::Error, reason: &str, code: u16) -> bool {
    matches!(error, kube::Error::Api(s) if s.reason == reason || s.code == code)
}

fn is_not_found(error: &kube::Error) -> bool {
    is_status(error, "NotFound", 404)
}

fn is_conflict(error: &kube::Error) -> bool {
    is_status(error, "Conflict", 409)
}

fn is_invalid(error: &kube::Error) -> bool {
    is_status(error, "Invalid", 422)
}

fn is_already_exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.reason == "AlreadyExists")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_interval_is_a_quarter_of_the_duration() {
        let options = ApiServerOptions::new("n1".into(), Duration::from_secs(10), 40);
        assert_eq!(options.lease_renew_interval(), Duration::from_secs(10));
    }
}
