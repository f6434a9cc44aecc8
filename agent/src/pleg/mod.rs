//! The pod lifecycle event generator: it tells the sync loop which pods changed in the runtime,
//! and keeps the pod status cache that pod workers read (upstream `pkg/kubelet/pleg`).
//!
//! Three implementations share this seam: [`relist::RelistPleg`] (upstream GenericPLEG: diff the
//! runtime's list every second), the kernel-event PLEG ([`ebpf`], the default), which reports
//! what the eBPF programs see at once and keeps the relist underneath as its safety net, at a
//! 300 s period, calling it through plain methods as upstream's `evented.go` calls `generic.go`,
//! and upstream's Evented PLEG itself ([`evented`]: the runtime's CRI container events, the
//! relist underneath the same way).
//! Every observation of a pod, by either, is recorded in one place, [`records::PodRecords`]: it
//! merges in what the kernel said and the runtime does not ([`facts`]), decides how fresh the
//! status is, fills the [`PodCache`] and sends [`PodLifecycleEvent`]s on a bounded channel;
//! [`index`] maps the kernel's cgroup ids to pods and containers.
//!
//! Not here: what the events mean for a pod (the sync loop and pod workers decide).

pub mod cache;
pub mod ebpf;
pub mod evented;
pub mod facts;
pub mod index;
pub mod records;
pub mod relist;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

pub use cache::PodCache;

use crate::container::{ContainerId, ContainerStatus, PodStatus, PodUid, RunningPod};

/// Capacity of the event channel (upstream `plegChannelCapacity`).
pub const CHANNEL_CAPACITY: usize = 1000;

/// What happened to a pod's container (upstream `PodLifeCycleEventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// Something about the pod changed that is not one container's state (e.g. its sandbox).
    PodSync,
    /// A container's state became unknown; upstream filters these out and so do we.
    ContainerChanged,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ContainerStarted => "ContainerStarted",
            EventType::ContainerDied => "ContainerDied",
            EventType::ContainerRemoved => "ContainerRemoved",
            EventType::PodSync => "PodSync",
            EventType::ContainerChanged => "ContainerChanged",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodLifecycleEvent {
    pub pod: PodUid,
    pub kind: EventType,
    /// The container (or sandbox) the event is about, if any.
    pub container: Option<ContainerId>,
    /// When the kernel saw what caused it (CLOCK_MONOTONIC ns), for kernel-triggered events.
    pub kernel_ts_ns: Option<u64>,
    /// When the status it was computed from was observed: the moment a refresh asked the
    /// runtime, or the runtime's own timestamp of the event it came in (Evented PLEG). Benchmarks
    /// split an event's latency at it.
    pub observed_at: Option<SystemTime>,
    /// The container's status as the runtime reported it in the refresh that produced the event.
    pub status: Option<ContainerStatus>,
}

/// A sent event as watchers see it: with the pod's name and when it was sent.
#[derive(Clone, Debug)]
pub struct PublishedEvent {
    pub event: PodLifecycleEvent,
    pub pod_name: String,
    pub namespace: String,
    /// CLOCK_MONOTONIC ns at which the PLEG sent it.
    pub sent_ns: u64,
}

/// The runtime as the PLEG sees it: a list of every pod and a full status of one.
#[tonic::async_trait]
pub trait RuntimeView: Send + Sync + 'static {
    /// Every pod the runtime has, exited containers included.
    async fn list_pods(&self) -> Result<Vec<RunningPod>, RuntimeViewError>;
    /// The full status of one pod.
    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, RuntimeViewError>;
}

#[derive(Clone, Debug, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct RuntimeViewError {
    pub operation: &'static str,
    pub message: String,
}

/// Health as upstream reports it: unhealthy once the last successful relist is older than the
/// threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy(String),
}

/// The seam the sync loop uses.
pub trait Pleg: Send + Sync {
    /// Health for `/healthz` and the node's Ready condition.
    fn health(&self) -> Health;
    /// The status cache this PLEG fills.
    fn cache(&self) -> Arc<PodCache>;
    /// Asks for a relist of one pod soon (after the kubelet itself changed it), so its worker
    /// sees the result without waiting for the next period (upstream on-demand relist).
    fn request_relist(&self, pod: &PodUid);
}

/// Configuration shared by the implementations.
#[derive(Clone, Debug)]
pub struct PlegConfig {
    pub relist_period: Duration,
    /// Unhealthy when the last relist is older than this (upstream 3 min for the relist PLEG).
    pub relist_threshold: Duration,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            relist_period: Duration::from_secs(1),
            relist_threshold: Duration::from_secs(180),
        }
    }
}
