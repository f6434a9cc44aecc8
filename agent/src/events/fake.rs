//! A recorder that keeps what it is given, for the unit tests of the components that report
//! (upstream `record.FakeRecorder`).

use std::sync::{Arc, Mutex};

use super::{Event, EventRecorder, EventType};
use crate::lock::MutexExt as _;

#[derive(Default)]
pub struct FakeRecorder {
    events: Mutex<Vec<Event>>,
}

impl FakeRecorder {
    pub fn new() -> Arc<FakeRecorder> {
        Arc::new(FakeRecorder::default())
    }

    /// Everything recorded so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock_unpoisoned().clone()
    }

    /// `(type, reason, note)` of everything recorded so far, in order.
    pub fn summary(&self) -> Vec<(&'static str, String, String)> {
        self.events()
            .into_iter()
            .map(|e| {
                let type_ = match e.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                };
                (type_, e.reason, e.note)
            })
            .collect()
    }

    /// The reasons recorded so far, in order.
    pub fn reasons(&self) -> Vec<String> {
        self.events().into_iter().map(|e| e.reason).collect()
    }
}

impl EventRecorder for FakeRecorder {
    fn record(&self, event: Event) {
        self.events.lock_unpoisoned().push(event);
    }
}
