//! The event recorder, built first in the pod half (every component reports through it): its
//! broadcaster runs into the gRPC stream and, with `--kubeconfig`, the API server; the agent's
//! start (`Starting`) and the pods' allocatable limit (`NodeAllocatableEnforced`) are its first
//! events, as upstream's kubelet reports them at start. Also the system OOM watcher, which reports
//! through it.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::{Error, pods::App};
use crate::{
    events::{
        Action, BroadcasterConfig, Event, EventBroadcaster, EventMetrics, Events, Limits,
        Published, Sinks, node_ref, reasons,
    },
    kernel::StreamItem,
    kubelet::oom_watcher::{OomWatcher, memory_events_oom_count},
};

/// Starts the broadcaster and returns the recorder to hand to components.
pub(super) fn start(
    app: &mut App<'_>,
    api: Option<kube::Client>,
    stream: broadcast::Sender<Arc<Published>>,
) -> Result<Events, Error> {
    let config = app.config;
    let (queue, broadcaster) = EventBroadcaster::new(
        BroadcasterConfig {
            node_name: config.node_name.clone(),
            limits: Limits {
                qps: config.event_record_qps,
                burst: config.event_burst,
            },
        },
        EventMetrics::register(&app.metrics.registry)?,
    );
    let sinks = Sinks {
        stream: Some(stream),
        api,
    };
    let shutdown = app.shutdown.clone();
    app.spawn(async move { broadcaster.run(sinks, shutdown).await });
    let events: Events = queue;
    let node = || node_ref(&config.node_name);
    events.record(Event::normal(
        node(),
        reasons::STARTING_KUBELET,
        Action::StartKubelet,
        "Starting kubelet.",
    ));
    if config.reserved.enforce_pods {
        // `pods::cgroups` enforced it before anything else started, or the agent stopped.
        events.record(Event::normal(
            node(),
            reasons::SUCCESSFUL_NODE_ALLOCATABLE_ENFORCEMENT,
            Action::EnforceNodeAllocatable,
            "Updated Node Allocatable limit across pods",
        ));
    }
    Ok(events)
}

/// Watches the kernel's OOM kills for system OOMs (upstream's OOM watcher), when the kernel
/// events are loaded. The pods' memory cgroup OOM count is read on cgroup v2 only.
pub(super) fn watch_system_ooms(
    app: &mut App<'_>,
    kernel: Option<broadcast::Receiver<Arc<StreamItem>>>,
    events: &Events,
) {
    let Some(kernel) = kernel else {
        return;
    };
    let count = match crate::cgroup::CgroupLayout::detect() {
        Ok(crate::cgroup::CgroupLayout::Unified { root }) => {
            let pods = app.config.pod_cgroups();
            memory_events_oom_count(root.join(pods.pods_parent()))
        }
        _ => {
            tracing::info!(
                "system OOMs are not reported: telling them from memory cgroup OOMs needs the \
                 cgroup v2 memory controller"
            );
            Box::new(|| None)
        }
    };
    let watcher = OomWatcher::new(app.config.node_name.clone(), events.clone(), count);
    let shutdown = app.shutdown.clone();
    app.spawn(async move { watcher.run(kernel, shutdown).await });
}
