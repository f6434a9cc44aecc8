//! What the benchmark hears from swiftlet's gRPC API (`swiftlet.v1.Events/Watch` with kinds
//! `eviction` and `pod`): every decision of the eviction manager and every container death, with
//! their CLOCK_MONOTONIC stamps as the agent sent them.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Serialize;
use swiftlet_proto::v1::{self, events_client::EventsClient};
use tokio::sync::mpsc;

/// One decision of the eviction manager.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    /// What woke the manager ("memcg", "psi", "periodic", ...).
    pub source: String,
    pub woke_ns: u64,
    pub decided_ns: u64,
    /// Empty when nothing was evicted.
    pub signal: String,
    pub pod_uid: String,
    /// The evicted pod's name (a static pod's has the node's name as a suffix).
    pub pod_name: String,
}

/// A container's death as the PLEG reported it.
#[derive(Clone, Debug, Serialize)]
pub struct Died {
    pub pod_uid: String,
    pub pod_name: String,
    pub container_name: String,
    /// When the kernel saw the exit (0 when a relist found it).
    pub kernel_ts_ns: u64,
    /// When the PLEG sent the event.
    pub sent_ns: u64,
    pub reason: String,
    pub exit_code: Option<i32>,
}

impl Died {
    /// When the container stopped: the kernel's time of the exit, else when it was reported.
    pub fn stopped_ns(&self) -> u64 {
        if self.kernel_ts_ns > 0 {
            self.kernel_ts_ns
        } else {
            self.sent_ns
        }
    }
}

#[derive(Clone, Debug)]
pub enum Heard {
    Decision(Decision),
    Died(Died),
    /// Events this watcher missed (the agent says how many).
    Lost(u64),
}

/// Subscribes to decisions and pod lifecycle events; what matters is passed on in order of
/// arrival. The channel closes when the stream ends.
pub async fn watch(socket: &Path) -> Result<mpsc::UnboundedReceiver<Heard>> {
    let channel = crate::unix_channel(socket.to_owned())
        .await
        .context("connecting to swiftlet's gRPC socket")?;
    let mut stream = EventsClient::new(channel)
        .watch(v1::WatchRequest {
            kinds: vec!["eviction".into(), "pod".into()],
            cgroup_ids: vec![],
        })
        .await
        .context("Events/Watch")?
        .into_inner();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.message().await {
            let heard = match event.kind {
                Some(v1::event::Kind::Eviction(d)) => Heard::Decision(Decision {
                    source: d.source,
                    woke_ns: d.woke_ns,
                    decided_ns: d.decided_ns,
                    signal: d.signal,
                    pod_uid: d.pod_uid,
                    pod_name: d.pod_name,
                }),
                Some(v1::event::Kind::Pod(p)) if p.r#type == "ContainerDied" => Heard::Died(Died {
                    pod_uid: p.pod_uid,
                    pod_name: p.pod_name,
                    container_name: p.container_name,
                    kernel_ts_ns: p.kernel_ts_ns,
                    sent_ns: p.sent_ns,
                    reason: p.reason,
                    exit_code: p.exit_code,
                }),
                Some(v1::event::Kind::Lost(l)) => Heard::Lost(l.count),
                _ => continue,
            };
            if tx.send(heard).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
