//! The events a change of the node's conditions reports (upstream's condition setters in
//! `pkg/kubelet/nodestatus/setters.go` call `recordEventFunc`, which is
//! `kubelet_node_status.go`'s `recordNodeStatusEvent`: `Node <name> status is now: <event>`). A
//! pressure condition reports whenever its status is new or changed (`NodeHasSufficientMemory`,
//! `NodeHasInsufficientMemory`, ...); Ready only when it changed (`NodeReady`, `NodeNotReady`),
//! not when the Node first gets it; a new boot ID reports `Rebooted` (the `MachineInfo` setter).
//! The previous status is what the API server last accepted from this node, or the Node's
//! status found at registration.

use k8s_openapi::api::core::v1::NodeStatus;

use crate::events::{Action, Event, EventRecorder, EventType, node_ref, reasons};

/// The pressure conditions' events, for `False` and `True`, in upstream's setter order.
const PRESSURE_EVENTS: [(&str, [&str; 2]); 3] = [
    (
        "MemoryPressure",
        ["NodeHasSufficientMemory", "NodeHasInsufficientMemory"],
    ),
    (
        "DiskPressure",
        ["NodeHasNoDiskPressure", "NodeHasDiskPressure"],
    ),
    (
        "PIDPressure",
        ["NodeHasSufficientPID", "NodeHasInsufficientPID"],
    ),
];

fn condition<'a>(status: Option<&'a NodeStatus>, type_: &str) -> Option<&'a str> {
    status?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

/// What going from `previous` to `next` reports, in upstream's setter order: `(type, reason,
/// note)` of each event about node `name`.
pub(super) fn status_events(
    name: &str,
    previous: Option<&NodeStatus>,
    next: &NodeStatus,
) -> Vec<(EventType, &'static str, String)> {
    let boot_id = |s: Option<&NodeStatus>| {
        s.and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default()
    };
    let (before, now) = (boot_id(previous), boot_id(Some(next)));
    let mut out = Vec::new();
    if !before.is_empty() && !now.is_empty() && before != now {
        out.push((
            EventType::Warning,
            reasons::NODE_REBOOTED,
            format!("Node {name} has been rebooted, boot id: {now}"),
        ));
    }
    let mut conditions = Vec::new();
    for (type_, [sufficient, insufficient]) in PRESSURE_EVENTS {
        let now = condition(Some(next), type_);
        let event = match now {
            Some("True") => insufficient,
            Some("False") => sufficient,
            _ => continue,
        };
        if condition(previous, type_) != now {
            conditions.push(event);
        }
    }
    if let (Some(before), Some(now)) = (
        condition(previous, super::node_object::READY),
        condition(Some(next), super::node_object::READY),
    ) && before != now
    {
        conditions.push(if now == "True" {
            reasons::NODE_READY
        } else {
            reasons::NODE_NOT_READY
        });
    }
    out.extend(conditions.into_iter().map(|event| {
        (
            EventType::Normal,
            event,
            format!("Node {name} status is now: {event}"),
        )
    }));
    out
}

/// Records what going from `previous` to `next` reports about node `name`.
pub(super) fn record_status_events(
    events: &dyn EventRecorder,
    name: &str,
    previous: Option<&NodeStatus>,
    next: &NodeStatus,
) {
    for (type_, reason, note) in status_events(name, previous, next) {
        events.record(Event::new(
            node_ref(name),
            type_,
            reason,
            Action::UpdateNodeStatus,
            note,
        ));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeCondition;

    use super::*;

    fn status(conditions: &[(&str, &str)]) -> NodeStatus {
        NodeStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s)| NodeCondition {
                        type_: (*t).into(),
                        status: (*s).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const CALM: [(&str, &str); 4] = [
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
        ("Ready", "True"),
    ];

    #[test]
    fn transitions_report_as_upstreams_setters_do() {
        let unknown = status(&[
            ("MemoryPressure", "Unknown"),
            ("DiskPressure", "Unknown"),
            ("PIDPressure", "Unknown"),
            ("Ready", "Unknown"),
        ]);
        let mut pressed = CALM;
        pressed[0].1 = "True";
        pressed[3] = ("Ready", "False");
        let cases: [(Option<NodeStatus>, NodeStatus, &[&str]); 5] = [
            // A new Node: its pressure conditions are new, Ready is not an event.
            (
                None,
                status(&CALM),
                &[
                    "NodeHasSufficientMemory",
                    "NodeHasNoDiskPressure",
                    "NodeHasSufficientPID",
                ],
            ),
            // The node controller had marked it Unknown while the agent was away.
            (
                Some(unknown),
                status(&CALM),
                &[
                    "NodeHasSufficientMemory",
                    "NodeHasNoDiskPressure",
                    "NodeHasSufficientPID",
                    "NodeReady",
                ],
            ),
            (Some(status(&CALM)), status(&CALM), &[]),
            (
                Some(status(&CALM)),
                status(&pressed),
                &["NodeHasInsufficientMemory", "NodeNotReady"],
            ),
            (
                Some(status(&pressed)),
                status(&CALM),
                &["NodeHasSufficientMemory", "NodeReady"],
            ),
        ];
        for (previous, next, want) in cases {
            let got: Vec<&str> = status_events("n1", previous.as_ref(), &next)
                .into_iter()
                .map(|(_, reason, _)| reason)
                .collect();
            assert_eq!(got, want, "{previous:?}");
        }
    }

    #[test]
    fn a_new_boot_id_is_a_reboot() {
        let booted = |id: &str| NodeStatus {
            node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: id.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let events = status_events("n1", Some(&booted("a")), &booted("b"));
        assert_eq!(
            events,
            [(
                EventType::Warning,
                "Rebooted",
                "Node n1 has been rebooted, boot id: b".to_owned()
            )]
        );
        assert!(status_events("n1", Some(&booted("b")), &booted("b")).is_empty());
        assert!(status_events("n1", None, &booted("b")).is_empty());
    }

    #[test]
    fn events_are_about_the_node_with_upstreams_message() {
        let recorder = crate::events::fake::FakeRecorder::new();
        record_status_events(recorder.as_ref(), "n1", None, &status(&CALM[..1]));
        let events = recorder.events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "NodeHasSufficientMemory");
        assert_eq!(
            events[0].note,
            "Node n1 status is now: NodeHasSufficientMemory"
        );
        assert_eq!(events[0].regarding.kind.as_deref(), Some("Node"));
        assert_eq!(events[0].regarding.uid.as_deref(), Some("n1"));
    }
}
