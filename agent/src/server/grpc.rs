//! `swiftlet.v1.Events`: every watcher gets its own subscription to the agent's event bus; a
//! watcher that falls behind is told how many events it missed instead of slowing anyone down.

use std::sync::Arc;

use swiftlet_common::EventKind;
use swiftlet_proto::v1::{self, events_server::Events};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::{
    container::ContainerState,
    events::{EventType, Published},
    eviction::manager::Decision,
    kernel::{EventBody, KernelEvent, StreamItem},
    pleg::PublishedEvent,
};

/// Per-watcher queue between the bus and the client's HTTP/2 stream.
const WATCH_QUEUE: usize = 1024;

pub struct EventsService {
    bus: broadcast::Sender<Arc<StreamItem>>,
    pods: broadcast::Sender<Arc<PublishedEvent>>,
    evictions: Option<broadcast::Sender<Decision>>,
    kube_events: Option<broadcast::Sender<Arc<Published>>>,
}

impl EventsService {
    /// Kernel events from `bus`, pod lifecycle events from `pods`.
    pub fn new(
        bus: broadcast::Sender<Arc<StreamItem>>,
        pods: broadcast::Sender<Arc<PublishedEvent>>,
    ) -> Self {
        EventsService {
            bus,
            pods,
            evictions: None,
            kube_events: None,
        }
    }

    /// Also the eviction manager's decisions (kind `eviction`).
    pub fn with_evictions(mut self, evictions: broadcast::Sender<Decision>) -> Self {
        self.evictions = Some(evictions);
        self
    }

    /// Also the Kubernetes Events the node reports (kind `kube_event`).
    pub fn with_kube_events(mut self, events: broadcast::Sender<Arc<Published>>) -> Self {
        self.kube_events = Some(events);
        self
    }
}

/// The kind name of pod lifecycle events in `WatchRequest.kinds`.
pub const POD_KIND: &str = "pod";
/// The kind name of eviction decisions in `WatchRequest.kinds`.
pub const EVICTION_KIND: &str = "eviction";
/// The kind name of Kubernetes Events in `WatchRequest.kinds`.
pub const KUBE_EVENT_KIND: &str = "kube_event";

/// Kinds not from the kernel.
const AGENT_KINDS: [&str; 3] = [POD_KIND, EVICTION_KIND, KUBE_EVENT_KIND];

#[tonic::async_trait]
impl Events for EventsService {
    type WatchStream = ReceiverStream<Result<v1::Event, Status>>;

    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let request = request.into_inner();
        let want_pods = request.kinds.is_empty() || request.kinds.iter().any(|k| k == POD_KIND);
        let want_evictions =
            request.kinds.is_empty() || request.kinds.iter().any(|k| k == EVICTION_KIND);
        let want_kube_events =
            request.kinds.is_empty() || request.kinds.iter().any(|k| k == KUBE_EVENT_KIND);
        let kernel_kinds: Vec<String> = request
            .kinds
            .iter()
            .filter(|k| !AGENT_KINDS.contains(&k.as_str()))
            .cloned()
            .collect();
        let want_kernel = request.kinds.is_empty() || !kernel_kinds.is_empty();
        let kinds = parse_kinds(&kernel_kinds)?;
        let cgroups = request.cgroup_ids;
        let mut rx = self.bus.subscribe();
        let (tx, out) = mpsc::channel(WATCH_QUEUE);
        if want_pods {
            forward(self.pods.subscribe(), tx.clone(), |p| pod_to_proto(p));
        }
        if want_evictions && let Some(evictions) = &self.evictions {
            forward(evictions.subscribe(), tx.clone(), decision_to_proto);
        }
        if want_kube_events && let Some(events) = &self.kube_events {
            forward(events.subscribe(), tx.clone(), |e| kube_event_to_proto(e));
        }
        if !want_kernel {
            return Ok(Response::new(ReceiverStream::new(out)));
        }
        tokio::spawn(async move {
            loop {
                let message = match rx.recv().await {
                    Ok(item) => match item.as_ref() {
                        StreamItem::Event(event) => {
                            let kind = event.body.kind();
                            let cgroup = event.body.cgroup_id();
                            if (!kinds.is_empty() && !kinds.contains(&kind))
                                || (!cgroups.is_empty() && !cgroups.contains(&cgroup))
                            {
                                continue;
                            }
                            to_proto(event)
                        }
                        StreamItem::Lost { count } => lost(*count, "kernel"),
                    },
                    Err(broadcast::error::RecvError::Lagged(missed)) => lost(missed, "watcher"),
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                if tx.send(Ok(message)).await.is_err() {
                    break; // the client went away
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }
}

/// Forwards one bus to a watcher, as `to_proto` shows each item, until either side is gone; a
/// watcher that fell behind is told how many it missed.
fn forward<T: Clone + Send + 'static>(
    mut rx: broadcast::Receiver<T>,
    tx: mpsc::Sender<Result<v1::Event, Status>>,
    to_proto: impl Fn(&T) -> v1::Event + Send + 'static,
) {
    tokio::spawn(async move {
        loop {
            let message = match rx.recv().await {
                Ok(item) => to_proto(&item),
                Err(broadcast::error::RecvError::Lagged(missed)) => lost(missed, "watcher"),
                Err(broadcast::error::RecvError::Closed) => break,
            };
            if tx.send(Ok(message)).await.is_err() {
                break;
            }
        }
    });
}

fn parse_kinds(kinds: &[String]) -> Result<Vec<EventKind>, Status> {
    kinds
        .iter()
        .map(|name| {
            EventKind::ALL
                .into_iter()
                .find(|k| k.as_str() == name)
                .ok_or_else(|| {
                    let mut known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                    known.extend(AGENT_KINDS);
                    Status::invalid_argument(format!(
                        "kinds: unknown kind {name:?}; expected one of {}",
                        known.join(", ")
                    ))
                })
        })
        .collect()
}

fn lost(count: u64, place: &str) -> v1::Event {
    v1::Event {
        ts_ns: crate::kernel::monotonic_ns(),
        cgroup_id: 0,
        kind: Some(v1::event::Kind::Lost(v1::EventsLost {
            count,
            r#where: place.to_owned(),
        })),
    }
}

pub fn to_proto(event: &KernelEvent) -> v1::Event {
    use v1::event::Kind;
    let kind = match &event.body {
        EventBody::Exit(e) => Kind::Exit(v1::ProcessExit {
            pid: e.pid,
            tid: e.tid,
            comm: e.comm.clone(),
            exit_code: e.exit_code,
            signal: e.signal,
            core_dumped: e.core_dumped,
            wait_status: e.wait_status,
        }),
        EventBody::Exec(e) => Kind::Exec(v1::ProcessExec {
            pid: e.pid,
            tid: e.tid,
            old_pid: e.old_pid,
            comm: e.comm.clone(),
            filename: e.filename.clone(),
        }),
        EventBody::Oom(e) => Kind::Oom(v1::OomKill {
            pid: e.pid,
            comm: e.comm.clone(),
            exit_ts_ns: e.exit_ts_ns,
            total_vm_kb: e.total_vm_kb,
            anon_rss_kb: e.anon_rss_kb,
            file_rss_kb: e.file_rss_kb,
            shmem_rss_kb: e.shmem_rss_kb,
            pgtables_kb: e.pgtables_kb,
            uid: e.uid,
            oom_score_adj: e.oom_score_adj,
        }),
        EventBody::CgroupMkdir(c) => Kind::CgroupMkdir(cgroup_change(c)),
        EventBody::CgroupRmdir(c) => Kind::CgroupRmdir(cgroup_change(c)),
        EventBody::Pressure(p) => Kind::Pressure(v1::MemoryPressure {
            source: p.source.as_str().to_owned(),
            order: p.order,
            suppressed: p.suppressed,
        }),
        EventBody::MemcgLevel(m) => Kind::MemcgLevel(v1::MemcgLevel {
            usage_pages: m.usage_pages,
            nr_pages: m.nr_pages,
            level_pages: m.level_pages,
        }),
    };
    v1::Event {
        ts_ns: event.ts_ns,
        cgroup_id: event.body.cgroup_id(),
        kind: Some(kind),
    }
}

/// Nanoseconds since the Unix epoch; 0 for an instant before it (a runtime's zero time).
fn unix_ns(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A pod lifecycle event on the wire.
pub fn pod_to_proto(published: &PublishedEvent) -> v1::Event {
    let event = &published.event;
    let status = event.status.as_ref();
    let state = status.map_or("", |s| match s.state {
        ContainerState::Created => "created",
        ContainerState::Running => "running",
        ContainerState::Exited => "exited",
        ContainerState::Unknown => "unknown",
    });
    v1::Event {
        ts_ns: event.kernel_ts_ns.unwrap_or(published.sent_ns),
        cgroup_id: 0,
        kind: Some(v1::event::Kind::Pod(v1::PodLifecycle {
            pod_uid: event.pod.0.clone(),
            pod_name: published.pod_name.clone(),
            namespace: published.namespace.clone(),
            r#type: event.kind.as_str().to_owned(),
            container_id: event
                .container
                .as_ref()
                .map(|c| c.id.clone())
                .unwrap_or_default(),
            container_name: status.map(|s| s.name.clone()).unwrap_or_default(),
            kernel_ts_ns: event.kernel_ts_ns.unwrap_or(0),
            state: state.to_owned(),
            exit_code: status.and_then(|s| s.exit_code),
            reason: status.map(|s| s.reason.clone()).unwrap_or_default(),
            sent_ns: published.sent_ns,
            observed_unix_ns: event.observed_at.map_or(0, unix_ns),
            finished_unix_ns: status.and_then(|s| s.finished_at).map_or(0, unix_ns),
        })),
    }
}

/// A decision as the API shows it, its instants as CLOCK_MONOTONIC ns.
pub fn decision_to_proto(d: &Decision) -> v1::Event {
    let (now_ns, now) = (crate::kernel::monotonic_ns(), std::time::Instant::now());
    let ns = |at: std::time::Instant| {
        now_ns.saturating_sub(
            u64::try_from(now.saturating_duration_since(at).as_nanos()).unwrap_or(u64::MAX),
        )
    };
    let decided_ns = ns(d.decided);
    let (namespace, pod_name, pod_uid) = d.pod.clone().unwrap_or_default();
    v1::Event {
        ts_ns: decided_ns,
        cgroup_id: 0,
        kind: Some(v1::event::Kind::Eviction(v1::EvictionDecision {
            source: d.source.as_str().to_owned(),
            woke_ns: ns(d.woke),
            decided_ns,
            signal: d.signal.map(|s| s.to_string()).unwrap_or_default(),
            pod_uid,
            pod_name,
            namespace,
            message: d.message.clone(),
        })),
    }
}

/// A Kubernetes Event as the stream shows it.
pub fn kube_event_to_proto(published: &Published) -> v1::Event {
    let event = &published.event;
    let r = &event.regarding;
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    let unix_ns = published
        .event_time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    v1::Event {
        ts_ns: published.monotonic_ns,
        cgroup_id: 0,
        kind: Some(v1::event::Kind::KubeEvent(v1::KubernetesEvent {
            r#type: match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
            reason: event.reason.clone(),
            note: event.note.clone(),
            action: event.action.as_str().to_owned(),
            regarding: Some(v1::ObjectReference {
                kind: text(&r.kind),
                api_version: text(&r.api_version),
                namespace: text(&r.namespace),
                name: text(&r.name),
                uid: text(&r.uid),
                field_path: text(&r.field_path),
            }),
            reporting_controller: published.reporting_controller.to_owned(),
            reporting_instance: published.reporting_instance.clone(),
            count: published.count,
            event_time_unix_ns: unix_ns,
        })),
    }
}

fn cgroup_change(c: &crate::kernel::CgroupChange) -> v1::CgroupChange {
    v1::CgroupChange {
        level: c.level,
        path: c.path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{MemoryPressure, PressureSource, ProcessExit};
    use tokio_stream::StreamExt as _;

    fn exit(cgroup_id: u64, pid: u32) -> Arc<StreamItem> {
        Arc::new(StreamItem::Event(KernelEvent {
            ts_ns: 5,
            received_ns: 6,
            cpu: 0,
            body: EventBody::Exit(ProcessExit {
                cgroup_id,
                pid,
                tid: pid,
                comm: "x".into(),
                exit_code: Some(0),
                signal: None,
                core_dumped: false,
                wait_status: 0,
            }),
        }))
    }

    #[tokio::test]
    async fn watch_filters_by_cgroup_and_reports_losses() {
        let (bus, _keep) = broadcast::channel(16);
        let (pods, _keep_pods) = broadcast::channel(16);
        let service = EventsService::new(bus.clone(), pods);
        let response = service
            .watch(Request::new(v1::WatchRequest {
                kinds: vec!["exit".into()],
                cgroup_ids: vec![2],
            }))
            .await
            .expect("watch starts");
        let mut stream = response.into_inner();
        bus.send(exit(1, 10)).expect("send");
        bus.send(exit(2, 20)).expect("send");
        bus.send(Arc::new(StreamItem::Lost { count: 3 }))
            .expect("send");
        let first = stream.next().await.expect("item").expect("ok");
        assert_eq!(first.cgroup_id, 2);
        assert!(matches!(first.kind, Some(v1::event::Kind::Exit(ref e)) if e.pid == 20));
        let second = stream.next().await.expect("item").expect("ok");
        assert!(
            matches!(second.kind, Some(v1::event::Kind::Lost(ref l)) if l.count == 3 && l.r#where == "kernel")
        );
    }

    #[tokio::test]
    async fn eviction_decisions_are_watched_by_kind() {
        let (bus, _keep) = broadcast::channel(16);
        let (pods, _keep_pods) = broadcast::channel(16);
        let (evictions, _keep_evictions) = broadcast::channel(16);
        let service = EventsService::new(bus.clone(), pods).with_evictions(evictions.clone());
        let response = service
            .watch(Request::new(v1::WatchRequest {
                kinds: vec![EVICTION_KIND.into()],
                cgroup_ids: vec![],
            }))
            .await
            .expect("watch starts");
        let mut stream = response.into_inner();
        bus.send(exit(1, 10)).expect("send");
        let decided = std::time::Instant::now();
        let woke = decided
            .checked_sub(std::time::Duration::from_millis(2))
            .expect("the clock is past 2 ms");
        evictions
            .send(Decision {
                source: crate::eviction::WakeSource::Memcg,
                woke,
                decided,
                signal: Some(crate::eviction::thresholds::Signal::AllocatableMemoryAvailable),
                pod: Some(("default".into(), "hog".into(), "u1".into())),
                message: "The node was low on resource: memory. ".into(),
            })
            .expect("send");
        let event = stream.next().await.expect("item").expect("ok");
        let Some(v1::event::Kind::Eviction(d)) = event.kind else {
            panic!("not an eviction decision: {event:?}");
        };
        assert_eq!(
            (
                d.source.as_str(),
                d.signal.as_str(),
                d.pod_name.as_str(),
                d.pod_uid.as_str()
            ),
            ("memcg", "allocatableMemory.available", "hog", "u1")
        );
        // Both instants are mapped through the same clock reading: 2 ms apart, to rounding.
        assert!(
            (1_999_000..=2_001_000).contains(&(d.decided_ns - d.woke_ns)),
            "{} ns apart",
            d.decided_ns - d.woke_ns
        );
        assert_eq!(event.ts_ns, d.decided_ns);
    }

    #[tokio::test]
    async fn kubernetes_events_are_watched_by_kind() {
        use crate::events::{Action, Event, container_ref};
        let (bus, _keep) = broadcast::channel(16);
        let (pods, _keep_pods) = broadcast::channel(16);
        let (events, _keep_events) = broadcast::channel(16);
        let service = EventsService::new(bus.clone(), pods).with_kube_events(events.clone());
        let response = service
            .watch(Request::new(v1::WatchRequest {
                kinds: vec![KUBE_EVENT_KIND.into()],
                cgroup_ids: vec![],
            }))
            .await
            .expect("watch starts");
        let mut stream = response.into_inner();
        bus.send(exit(1, 10)).expect("send");
        let pod = crate::testing::pod()
            .named("ns1", "web", "u1")
            .container(crate::testing::container("app"))
            .build();
        events
            .send(Arc::new(Published {
                event: Event::normal(
                    container_ref(&pod, "app"),
                    "Started",
                    Action::StartContainer,
                    "Started container app",
                ),
                count: 2,
                reporting_controller: "kubelet",
                reporting_instance: "n1".into(),
                event_time: std::time::UNIX_EPOCH + std::time::Duration::from_secs(3),
                monotonic_ns: 42,
            }))
            .expect("send");
        let event = stream.next().await.expect("item").expect("ok");
        assert_eq!(event.ts_ns, 42);
        let Some(v1::event::Kind::KubeEvent(e)) = event.kind else {
            panic!("not a Kubernetes event: {event:?}");
        };
        assert_eq!(
            (
                e.r#type.as_str(),
                e.reason.as_str(),
                e.note.as_str(),
                e.count,
                e.event_time_unix_ns
            ),
            (
                "Normal",
                "Started",
                "Started container app",
                2,
                3_000_000_000
            )
        );
        let regarding = e.regarding.expect("regarding");
        assert_eq!(
            (
                regarding.kind.as_str(),
                regarding.name.as_str(),
                regarding.uid.as_str(),
                regarding.field_path.as_str()
            ),
            ("Pod", "web", "u1", "spec.containers{app}")
        );
        assert_eq!(
            (
                e.reporting_controller.as_str(),
                e.reporting_instance.as_str()
            ),
            ("kubelet", "n1")
        );
    }

    #[tokio::test]
    async fn pressure_events_are_watched_by_kind() {
        let (bus, _keep) = broadcast::channel(16);
        let (pods, _keep_pods) = broadcast::channel(16);
        let service = EventsService::new(bus.clone(), pods);
        let response = service
            .watch(Request::new(v1::WatchRequest {
                kinds: vec!["pressure".into()],
                cgroup_ids: vec![],
            }))
            .await
            .expect("watch starts");
        let mut stream = response.into_inner();
        bus.send(exit(1, 10)).expect("send");
        bus.send(Arc::new(StreamItem::Event(KernelEvent {
            ts_ns: 7,
            received_ns: 8,
            cpu: 0,
            body: EventBody::Pressure(MemoryPressure {
                cgroup_id: 4,
                source: PressureSource::MemcgReclaim,
                order: None,
                suppressed: 2,
            }),
        })))
        .expect("send");
        let event = stream.next().await.expect("item").expect("ok");
        assert_eq!((event.ts_ns, event.cgroup_id), (7, 4));
        let Some(v1::event::Kind::Pressure(p)) = event.kind else {
            panic!("not a pressure event: {event:?}");
        };
        assert_eq!(
            (p.source.as_str(), p.order, p.suppressed),
            ("memcg_reclaim", None, 2)
        );
    }

    #[tokio::test]
    async fn unknown_kinds_are_rejected_by_name() {
        let (bus, _keep) = broadcast::channel(1);
        let (pods, _keep_pods) = broadcast::channel(1);
        let Err(status) = EventsService::new(bus, pods)
            .watch(Request::new(v1::WatchRequest {
                kinds: vec!["exits".into()],
                cgroup_ids: vec![],
            }))
            .await
        else {
            panic!("an unknown kind is rejected");
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("\"exits\""),
            "{}",
            status.message()
        );
    }
}
