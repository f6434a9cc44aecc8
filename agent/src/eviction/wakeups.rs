//! The tasks that wake the eviction manager: PSI triggers on the pods' cgroup and the node, memory
//! cgroup notifications (re-armed after every decision), and the kernel programs' OOM kills and
//! reclaim records from the event bus. Each only says "look now"; the manager reads fresh figures
//! itself.
//!
//! Not here: the decision (`manager.rs`).

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{sync::broadcast, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::{
    logic::{Observations, quantity},
    manager::{WakeSource, Waker},
    memcg::{MemoryEvents, UsageThreshold, supports_usage_thresholds},
    observe::{NodeObserver, stat_value},
    thresholds::{Operator, Signal, Threshold},
};
use crate::{
    cm::{
        CgroupLayout,
        psi::{PsiResource, PsiTrigger},
    },
    kernel::{EventBody, StreamItem},
};

/// PSI triggers: a wake-up when tasks stalled this long within one window. The window is the
/// smallest the kernel grants this process (2 s without CAP_SYS_RESOURCE).
pub const PSI_STALL: Duration = Duration::from_millis(100);
pub const PSI_WINDOW: Duration = Duration::from_secs(1);

/// Starts one task per PSI trigger: `some` memory and io stalls of the pods' cgroup and of the
/// node. A trigger that cannot be registered is logged and left out.
pub fn spawn_psi(
    observer: &NodeObserver,
    waker: &Waker,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Vec<String> {
    let mut armed = Vec::new();
    let kubepods = observer
        .layout
        .cgroup2_root()
        .ok()
        .map(|r| r.join(&observer.pods_cgroup));
    let mut files: Vec<PathBuf> = Vec::new();
    for resource in [PsiResource::Memory, PsiResource::Io] {
        if let Some(dir) = &kubepods {
            files.push(dir.join(resource.file_name()));
        }
        files.push(PathBuf::from(resource.proc_path()));
    }
    for path in files {
        match PsiTrigger::new(&path, false, PSI_STALL, PSI_WINDOW) {
            Ok(mut trigger) => {
                armed.push(format!(
                    "{} (some {:?} in {:?})",
                    path.display(),
                    trigger.stall(),
                    trigger.window()
                ));
                let waker = waker.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            fired = trigger.fired() => match fired {
                                Ok(()) => waker.wake(WakeSource::Psi),
                                Err(e) => {
                                    tracing::warn!(error = %e, "a PSI trigger ended");
                                    return;
                                }
                            },
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "PSI trigger not registered"),
        }
    }
    armed
}

/// Wakes the manager on OOM kills and reclaim records from the kernel programs. A lagging
/// receiver lost records: it wakes the manager once for all of them.
pub fn spawn_kernel(
    mut events: broadcast::Receiver<Arc<StreamItem>>,
    waker: Waker,
    tasks: &mut JoinSet<()>,
    shutdown: CancellationToken,
) {
    tasks.spawn(async move {
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => return,
                item = events.recv() => item,
            };
            match item {
                Ok(item) => {
                    if let StreamItem::Event(event) = item.as_ref() {
                        match &event.body {
                            EventBody::Oom(_) => waker.wake(WakeSource::Oom),
                            EventBody::Pressure(_) => waker.wake(WakeSource::Reclaim),
                            _ => {}
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => waker.wake(WakeSource::Reclaim),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Memory cgroup notifications. On a v1 memory controller: one usage threshold per memory
/// threshold, re-armed whenever the manager's observations move the level it means. On cgroup
/// v2: `memory.events` of the pods' cgroup.
pub fn spawn_memcg(
    observer: NodeObserver,
    thresholds: Vec<Threshold>,
    mut observed: tokio::sync::watch::Receiver<Observations>,
    waker: Waker,
    tasks: &mut JoinSet<()>,
    shutdown: CancellationToken,
) -> Option<String> {
    if let CgroupLayout::Unified { .. } = observer.layout {
        let dir = observer.memory_dir(&observer.pods_cgroup)?;
        return match MemoryEvents::watch(&dir) {
            Ok(mut events) => {
                let what = format!("{} (inotify)", events.path.display());
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            changed = events.changed() => match changed {
                                Some(()) => waker.wake(WakeSource::Memcg),
                                None => return,
                            },
                        }
                    }
                });
                Some(what)
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory.events not watched");
                None
            }
        };
    }
    let memory: Vec<Threshold> = thresholds
        .into_iter()
        .filter(|t| {
            t.operator == Operator::LessThan
                && matches!(
                    t.signal,
                    Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
                )
        })
        .collect();
    if memory.is_empty() {
        return None;
    }
    let root = observer.memory_dir("")?;
    if !supports_usage_thresholds(&root) {
        return None;
    }
    let what = format!(
        "usage thresholds on {} (cgroup.event_control)",
        root.display()
    );
    tasks.spawn(async move {
        let mut armed: Vec<UsageThreshold> = Vec::new();
        loop {
            let levels = usage_levels(&observer, &memory, &observed.borrow_and_update());
            let moved = levels.len() != armed.len()
                || levels.iter().zip(&armed).any(|((dir, bytes), a)| {
                    *dir != a.dir || bytes.abs_diff(a.bytes) >= REARM_STEP
                });
            if moved {
                armed.clear();
                for (dir, bytes) in levels {
                    match UsageThreshold::arm(&dir, bytes) {
                        Ok(t) => armed.push(t),
                        Err(e) => tracing::warn!(error = %e, "memory usage threshold not armed"),
                    }
                }
            }
            enum Next {
                Stop,
                Look,
                Crossed,
                Failed(super::memcg::MemcgError),
            }
            let next = {
                let crossed = async {
                    if armed.is_empty() {
                        std::future::pending().await
                    } else {
                        futures::future::select_all(armed.iter().map(|t| Box::pin(t.crossed())))
                            .await
                            .0
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => Next::Stop,
                    changed = observed.changed() => if changed.is_err() { Next::Stop } else { Next::Look },
                    result = crossed => match result {
                        Ok(()) => Next::Crossed,
                        Err(e) => Next::Failed(e),
                    },
                }
            };
            match next {
                Next::Stop => return,
                Next::Look => {}
                Next::Crossed => waker.wake(WakeSource::Memcg),
                Next::Failed(e) => {
                    tracing::warn!(error = %e, "memory usage threshold failed; re-arming");
                    armed.clear();
                }
            }
        }
    });
    Some(what)
}

/// Re-registering costs a write and a new eventfd; the kernel's own usage figure is batched
/// per CPU anyway, so levels closer than this are the same level.
const REARM_STEP: u64 = 1 << 20;

/// The `memory.usage_in_bytes` level at which each memory threshold is crossed: the working set
/// it allows plus the cgroup's inactive file pages now (upstream `UpdateThreshold`).
fn usage_levels(
    observer: &NodeObserver,
    thresholds: &[Threshold],
    observed: &Observations,
) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for t in thresholds {
        let (path, capacity) = match t.signal {
            Signal::MemoryAvailable => ("", observer.memory_capacity),
            Signal::AllocatableMemoryAvailable => {
                (observer.pods_cgroup.as_str(), observer.allocatable_memory)
            }
            _ => continue,
        };
        if !observed.contains_key(&t.signal) {
            continue;
        }
        let Some(dir) = observer.memory_dir(path) else {
            continue;
        };
        let inactive = std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|s| stat_value(&s, "total_inactive_file"))
            .unwrap_or(0);
        let level = capacity - quantity(t.value, capacity) + inactive;
        if let Ok(level) = u64::try_from(level)
            && level > 0
        {
            out.push((dir, level));
        }
    }
    out
}
