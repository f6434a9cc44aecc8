//! Kubernetes Events: what the node tells the cluster about its pods and itself (image pulls,
//! container starts and kills, back-offs, probe failures, mount failures, evictions, admission
//! rejections, the node's conditions, OOM kills), as `kubectl describe` shows them. Upstream:
//! the kubelet's `record.EventRecorder` (client-go `tools/record`) with the reasons of
//! `pkg/kubelet/events/event.go`, source `{component: kubelet, host: <node>}`, which client-go
//! writes with `reportingController: kubelet` and `reportingInstance: <node>`.
//!
//! The seam is [`EventRecorder`]: every component that reports gets one handed in by `app` and
//! calls [`EventRecorder::record`], which never blocks and never fails (the kubelet's recorder
//! drops events when its queue is full). The real one ([`EventQueue`]) feeds a bounded queue
//! (client-go's `maxQueuedEvents`, 1000) that the [`EventBroadcaster`] drains: it correlates
//! (`correlator.rs`: upstream's spam filter, aggregation of similar messages and counting of
//! repeats into a series), publishes each result on the gRPC stream (`swiftlet.v1.Events/Watch`,
//! kind `kube_event`) and, with an API server, writes it as an events.k8s.io/v1 Event through
//! kube-rs's `Recorder` (`api.rs`), rate limited by `eventRecordQPS`/`eventBurst`. Every cache
//! and queue is bounded; every event not written is counted by why.
//!
//! Not here: deciding what happened (the call sites do, with upstream's messages); how the
//! stream's watchers read (`server/grpc.rs`).

mod api;
mod broadcaster;
mod correlator;
#[cfg(test)]
pub mod fake;
mod limiter;
mod lru;
pub mod metrics;
pub mod reasons;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

pub use broadcaster::{
    BroadcasterConfig, EventBroadcaster, EventQueue, Limits, Published, QUEUE_CAPACITY, Sinks,
};
pub use kube::runtime::events::EventType;
pub use metrics::EventMetrics;
pub use reasons::Action;

/// events.k8s.io/v1 bounds (upstream `ValidateEventCreate`): longer texts are cut, not refused.
pub const NOTE_MAX_BYTES: usize = 1024;
pub const REASON_MAX_BYTES: usize = 128;
/// `reportingInstance` holds at most this much of the node name.
pub const REPORTING_INSTANCE_MAX_BYTES: usize = 128;

/// Upstream's `reportingController` (the kubelet's event source component).
pub const REPORTING_CONTROLLER: &str = "kubelet";

/// One occurrence of something the node reports about an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The Pod (a container's events name it in `fieldPath`) or the Node.
    pub regarding: ObjectReference,
    pub type_: EventType,
    pub reason: String,
    pub action: Action,
    pub note: String,
}

impl Event {
    pub fn new(
        regarding: ObjectReference,
        type_: EventType,
        reason: impl Into<String>,
        action: Action,
        note: impl Into<String>,
    ) -> Event {
        Event {
            regarding,
            type_,
            reason: bounded(reason.into(), REASON_MAX_BYTES),
            action,
            note: bounded(note.into(), NOTE_MAX_BYTES),
        }
    }

    pub fn normal(
        regarding: ObjectReference,
        reason: impl Into<String>,
        action: Action,
        note: impl Into<String>,
    ) -> Event {
        Event::new(regarding, EventType::Normal, reason, action, note)
    }

    pub fn warning(
        regarding: ObjectReference,
        reason: impl Into<String>,
        action: Action,
        note: impl Into<String>,
    ) -> Event {
        Event::new(regarding, EventType::Warning, reason, action, note)
    }
}

/// Where components report events (upstream `record.EventRecorder`).
pub trait EventRecorder: Send + Sync {
    /// Takes `event` for reporting; never waits. An event that cannot be queued is dropped and
    /// counted.
    fn record(&self, event: Event);
}

/// The recorder components share.
pub type Events = Arc<dyn EventRecorder>;

/// Reports nothing (components built without a recorder, and their unit tests).
pub struct NoEvents;

impl EventRecorder for NoEvents {
    fn record(&self, _event: Event) {}
}

/// A recorder that reports nothing.
pub fn none() -> Events {
    Arc::new(NoEvents)
}

/// The reference an event about `pod` carries (upstream `ref.GetReference`). No
/// `resourceVersion`: an event is about the pod, not one version of it, and the series of a
/// repeated event must not break at each status update.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: Some(
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        uid: pod.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The reference of an event about one of `pod`'s containers (upstream
/// `kubecontainer.GenerateContainerRef`): the pod, with the container in `fieldPath`.
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    let spec = pod.spec.as_ref();
    let named = |list: Option<&Vec<k8s_openapi::api::core::v1::Container>>| {
        list.into_iter().flatten().any(|c| c.name == container)
    };
    let field_path = if named(spec.map(|s| &s.containers)) {
        format!("spec.containers{{{container}}}")
    } else if named(spec.and_then(|s| s.init_containers.as_ref())) {
        format!("spec.initContainers{{{container}}}")
    } else if spec
        .and_then(|s| s.ephemeral_containers.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.name == container)
    {
        format!("spec.ephemeralContainers{{{container}}}")
    } else {
        // Upstream's words for a container the spec does not name.
        format!("implicitly required container {container}")
    };
    ObjectReference {
        field_path: Some(field_path),
        ..pod_ref(pod)
    }
}

/// The reference of an event about the node (upstream's `nodeRef`: the node's name as its UID,
/// as the kubelet may not have the Node object).
pub fn node_ref(node_name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node_name.to_owned()),
        uid: Some(node_name.to_owned()),
        ..ObjectReference::default()
    }
}

/// `d` as Go prints a `time.Duration` truncated to milliseconds (`313ms`, `1.594s`, `1m2.5s`),
/// as upstream's messages show durations.
pub fn go_duration_millis(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return if ms == 0 {
            "0s".into()
        } else {
            format!("{ms}ms")
        };
    }
    let (hours, minutes) = (ms / 3_600_000, (ms / 60_000) % 60);
    let (seconds, fraction) = ((ms / 1000) % 60, ms % 1000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if fraction > 0 {
        out.push('.');
        out.push_str(format!("{fraction:03}").trim_end_matches('0'));
    }
    out.push('s');
    out
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn container_references_name_the_list_the_container_is_in() {
        let pod = testing::pod()
            .named("default", "web", "u1")
            .container(testing::container("app"))
            .init_containers(vec![testing::container("setup")])
            .build();
        let path = |c: &str| container_ref(&pod, c).field_path;
        assert_eq!(path("app").as_deref(), Some("spec.containers{app}"));
        assert_eq!(path("setup").as_deref(), Some("spec.initContainers{setup}"));
        assert_eq!(
            path("pause").as_deref(),
            Some("implicitly required container pause")
        );
        let reference = container_ref(&pod, "app");
        assert_eq!(reference.kind.as_deref(), Some("Pod"));
        assert_eq!(reference.api_version.as_deref(), Some("v1"));
        assert_eq!(reference.name.as_deref(), Some("web"));
        assert_eq!(reference.uid.as_deref(), Some("u1"));
        assert_eq!(reference.resource_version, None);
    }

    #[test]
    fn node_references_use_the_name_as_uid() {
        let node = node_ref("n1");
        assert_eq!(
            (
                node.kind.as_deref(),
                node.name.as_deref(),
                node.uid.as_deref()
            ),
            (Some("Node"), Some("n1"), Some("n1"))
        );
        assert_eq!(node.namespace, None);
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        let cases = [
            (0, "0s"),
            (313, "313ms"),
            (1000, "1s"),
            (1594, "1.594s"),
            (1500, "1.5s"),
            (62_500, "1m2.5s"),
            (3_600_000, "1h0m0s"),
        ];
        for (ms, want) in cases {
            assert_eq!(
                go_duration_millis(std::time::Duration::from_millis(ms)),
                want,
                "{ms} ms"
            );
        }
        // Truncated, not rounded.
        assert_eq!(
            go_duration_millis(std::time::Duration::from_micros(1_999_999)),
            "1.999s"
        );
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let note = "é".repeat(NOTE_MAX_BYTES);
        let event = Event::normal(node_ref("n1"), "R".repeat(500), Action::StartKubelet, note);
        assert_eq!(event.reason.len(), REASON_MAX_BYTES);
        assert!(event.note.len() <= NOTE_MAX_BYTES && event.note.len() >= NOTE_MAX_BYTES - 1);
        assert!(event.note.chars().all(|c| c == 'é'));
    }
}
