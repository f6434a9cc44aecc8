//! `SystemOOM` events on the Node (upstream `pkg/kubelet/oom/oom_watcher_linux.go`): the node
//! ran out of memory as a whole and the kernel's OOM killer chose a victim, as opposed to a
//! memory cgroup reaching its limit (which the container's status says as `OOMKilled`).
//! Upstream reads the kernel log through cAdvisor and reports an OOM whose constraint is the root
//! cgroup (`VictimContainerName == "/"`) as `System OOM encountered, victim process: <comm>,
//! pid: <pid>`.
//!
//! Here the OOM kills come from the kernel programs (`oom/mark_victim`, for the pods' processes
//! only: the programs watch the pods' cgroup), which do not say what constrained the OOM. A
//! memory cgroup's OOM counts `oom` in `memory.events` of that cgroup and every ancestor (cgroup
//! v2, hierarchical); a node-wide one counts it nowhere. So an OOM kill is a system OOM when the
//! pods' cgroup's `oom` count has not moved since the last kill. Where that count cannot be read
//! (cgroup v1 memory, or no pods' cgroup), no kill is called a system OOM: an OOM the node
//! cannot tell apart is left unreported rather than misreported.

use std::{path::PathBuf, sync::Arc};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::{
    events::{Action, Event, Events, node_ref, reasons},
    kernel::{EventBody, OomKill, StreamItem},
};

/// Reads the pods' cgroup's hierarchical memory cgroup OOM count (`None`: unknown).
pub type OomCount = Box<dyn Fn() -> Option<u64> + Send>;

/// `oom` in a cgroup v2 `memory.events` text.
pub fn parse_oom_count(memory_events: &str) -> Option<u64> {
    memory_events
        .lines()
        .find_map(|l| l.strip_prefix("oom ")?.trim().parse().ok())
}

/// The count in `<dir>/memory.events`.
pub fn memory_events_oom_count(dir: PathBuf) -> OomCount {
    let path = dir.join("memory.events");
    Box::new(move || parse_oom_count(&std::fs::read_to_string(&path).ok()?))
}

pub struct OomWatcher {
    node_name: String,
    events: Events,
    oom_count: OomCount,
    /// The count at the last look.
    last: Option<u64>,
}

impl OomWatcher {
    pub fn new(node_name: String, events: Events, oom_count: OomCount) -> OomWatcher {
        let last = oom_count();
        OomWatcher {
            node_name,
            events,
            oom_count,
            last,
        }
    }

    /// One OOM kill: reported when no memory cgroup below the pods' cgroup ran out since the
    /// last one.
    pub fn observe(&mut self, kill: &OomKill) {
        let now = (self.oom_count)();
        let system = matches!((self.last, now), (Some(before), Some(after)) if before == after);
        self.last = now;
        if !system {
            return;
        }
        let mut note = "System OOM encountered".to_owned();
        if !kill.comm.is_empty() && kill.pid != 0 {
            note.push_str(&format!(
                ", victim process: {}, pid: {}",
                kill.comm, kill.pid
            ));
        }
        self.events.record(Event::warning(
            node_ref(&self.node_name),
            reasons::SYSTEM_OOM,
            Action::WatchOom,
            note,
        ));
    }

    /// Watches the kernel events until `shutdown`.
    pub async fn run(
        mut self,
        mut kernel: broadcast::Receiver<Arc<StreamItem>>,
        shutdown: CancellationToken,
    ) {
        loop {
            let item = tokio::select! {
                item = kernel.recv() => item,
                () = shutdown.cancelled() => return,
            };
            match item {
                Ok(item) => {
                    if let StreamItem::Event(event) = item.as_ref()
                        && let EventBody::Oom(kill) = &event.body
                    {
                        self.observe(kill);
                    }
                }
                // Missed OOM kills are not reported; the PLEG relists on losses.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    // The kernel stream ended (the agent is stopping, or it failed and says so).
                    shutdown.cancelled().await;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };

    use super::*;
    use crate::events::fake::FakeRecorder;

    fn kill(comm: &str, pid: u32) -> OomKill {
        OomKill {
            cgroup_id: 9,
            pid,
            comm: comm.into(),
            exit_ts_ns: 0,
            total_vm_kb: None,
            anon_rss_kb: None,
            file_rss_kb: None,
            shmem_rss_kb: None,
            pgtables_kb: None,
            uid: None,
            oom_score_adj: None,
        }
    }

    #[test]
    fn reads_the_oom_count_of_memory_events() {
        let text = "low 0\nhigh 3\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_count(text), Some(2));
        assert_eq!(parse_oom_count("low 0\n"), None);
    }

    #[test]
    fn only_kills_no_memory_cgroup_limit_explains_are_system_ooms() {
        let count = Arc::new(AtomicU64::new(4));
        let read = count.clone();
        let recorder = FakeRecorder::new();
        let mut watcher = OomWatcher::new(
            "n1".into(),
            recorder.clone(),
            Box::new(move || Some(read.load(Ordering::Relaxed))),
        );
        // A container at its limit: the pods' cgroup counts its OOM.
        count.store(5, Ordering::Relaxed);
        watcher.observe(&kill("hog", 10));
        assert!(recorder.events().is_empty());
        // The node ran out: no memory cgroup did.
        watcher.observe(&kill("stress", 16713));
        watcher.observe(&kill("", 0));
        let events = recorder.events();
        assert_eq!(
            events.iter().map(|e| e.note.as_str()).collect::<Vec<_>>(),
            [
                "System OOM encountered, victim process: stress, pid: 16713",
                "System OOM encountered"
            ]
        );
        assert!(events.iter().all(|e| e.reason == "SystemOOM"
            && e.type_ == crate::events::EventType::Warning
            && e.regarding.kind.as_deref() == Some("Node")
            && e.regarding.name.as_deref() == Some("n1")));
    }

    #[test]
    fn without_the_count_nothing_is_called_a_system_oom() {
        let recorder = FakeRecorder::new();
        let mut watcher = OomWatcher::new("n1".into(), recorder.clone(), Box::new(|| None));
        watcher.observe(&kill("stress", 1));
        assert!(recorder.events().is_empty());
    }
}
