//! Building the node shutdown manager: logind on the system bus, the kubelet's pods and pod
//! workers, the node status it wakes, and its metrics (with the state file in the root dir).

use std::{path::Path, sync::Arc};

use tokio::sync::Notify;

use super::{Error, pods::App};
use crate::{
    kubelet::{Kubelet, KubeletShutdownTerminator},
    nodeshutdown::{
        NodeShutdownManager, ShutdownMetrics, ShutdownState,
        logind::{LOGIND_CONF_DIR, LogindInhibitor},
    },
};

/// Starts the manager; `state` is the one admission and the Ready condition already read.
pub fn start(
    app: &mut App<'_>,
    kubelet: &Arc<Kubelet>,
    state: ShutdownState,
    node_status: Arc<Notify>,
) -> Result<(), Error> {
    let config = app.config;
    let manager = NodeShutdownManager {
        config: config.shutdown.clone(),
        inhibitor: Arc::new(LogindInhibitor::new(Path::new(LOGIND_CONF_DIR))),
        terminator: Arc::new(KubeletShutdownTerminator(kubelet.clone())),
        state,
        node_status,
        events: kubelet.events().clone(),
        node_name: config.node_name.clone(),
        metrics: ShutdownMetrics::register(&app.metrics.registry, Some(&config.root_dir))?,
    };
    let shutdown = app.shutdown.clone();
    app.spawn(manager.run(shutdown));
    Ok(())
}
