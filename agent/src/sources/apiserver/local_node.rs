//! The Node object served locally (`GET /node`): what the node status loop would post to the API
//! server, computed at each request from the same facts and checks, so a standalone node (no
//! API server) can be read the same way. Transition times move only when a condition flips
//! between two requests.

use crate::lock::MutexExt as _;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Node, NodeStatus};

use super::{
    ImagesCheck, NodeDescription, PressureCheck, ReadinessCheck, WallClock,
    node_object::{initial_node, pressure_conditions, ready_condition, ready_of},
};

pub struct LocalNode {
    name: String,
    node: NodeDescription,
    readiness: ReadinessCheck,
    pressure: PressureCheck,
    images: ImagesCheck,
    clock: WallClock,
    /// The status served last, for the conditions' transition times.
    last: Mutex<Option<NodeStatus>>,
}

impl LocalNode {
    pub fn new(
        name: String,
        node: NodeDescription,
        readiness: ReadinessCheck,
        pressure: PressureCheck,
        images: ImagesCheck,
        clock: WallClock,
    ) -> LocalNode {
        LocalNode {
            name,
            node,
            readiness,
            pressure,
            images,
            clock,
            last: Mutex::new(None),
        }
    }

    /// The Node now.
    pub fn object(&self) -> Node {
        let mut last = self.last.lock_unpoisoned();
        let now = (self.clock)();
        let ready = ready_condition((self.readiness)(), now, ready_of(last.as_ref()));
        let pressure = pressure_conditions(&(self.pressure)(), now, last.as_ref());
        let mut node = initial_node(&self.name, &self.node, ready, pressure);
        if let Some(status) = node.status.as_mut() {
            let images = (self.images)();
            status.images = (!images.is_empty()).then_some(images);
            *last = Some(status.clone());
        }
        node
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::*;

    #[test]
    fn the_local_node_says_why_it_is_not_ready_and_keeps_transition_times() {
        let problem = Arc::new(Mutex::new(None::<String>));
        let at = Arc::new(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
        ));
        let local = LocalNode::new(
            "n1".into(),
            NodeDescription {
                hostname: "n1".into(),
                max_pods: 110,
                ..NodeDescription::default()
            },
            {
                let problem = problem.clone();
                Arc::new(move || problem.lock_unpoisoned().clone())
            },
            Arc::new(|| vec!["DiskPressure".to_owned()]),
            Arc::new(Vec::new),
            {
                let at = at.clone();
                Arc::new(move || *at.lock_unpoisoned())
            },
        );
        let condition = |node: &Node, kind: &str| {
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == kind).cloned())
        };
        let first = local.object();
        assert_eq!(first.metadata.name.as_deref(), Some("n1"));
        let ready = condition(&first, "Ready");
        assert_eq!(ready.as_ref().map(|c| c.status.as_str()), Some("True"));
        let disk = condition(&first, "DiskPressure");
        assert_eq!(disk.as_ref().map(|c| c.status.as_str()), Some("True"));

        *at.lock_unpoisoned() += Duration::from_secs(10);
        *problem.lock_unpoisoned() = Some("container runtime is down".into());
        let second = local.object();
        let ready = condition(&second, "Ready");
        assert_eq!(ready.as_ref().map(|c| c.status.as_str()), Some("False"));
        assert_eq!(
            ready.and_then(|c| c.message),
            Some("container runtime is down".to_owned())
        );
        // DiskPressure did not flip: its transition time stays that of the first answer.
        assert_eq!(
            condition(&second, "DiskPressure").and_then(|c| c.last_transition_time),
            disk.and_then(|c| c.last_transition_time)
        );
    }
}
