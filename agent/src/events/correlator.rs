//! What the node writes of the events it records (client-go `tools/record/events_cache.go`,
//! `EventCorrelator` with its defaults), in three steps, each with its state in an LRU of 4096
//! entries (upstream `maxLruCacheEntries`):
//! 1. The spam filter: each object (its kind, namespace, name, UID) gets a token bucket of 25
//!    events refilled at one every 5 minutes; an event over it is dropped (counted).
//! 2. Aggregation: once 10 events of one object, type and reason with different notes came
//!    within 10 minutes, the next different ones become one event whose note is
//!    `(combined from similar events): <note>`, about the object without a `fieldPath`.
//! 3. Series: the same event again (the same object with its `fieldPath`, type, reason and
//!    note; or the same aggregate) within 6 minutes of its last occurrence is the next of its
//!    series, with a growing count; the API writer patches the Event it created into a series
//!    (`series.count`, `series.lastObservedTime`) instead of creating another.
//!
//! Differences from client-go, and why: the filter runs first (upstream counts a filtered
//! event into its series before dropping it, which events.k8s.io's series cannot show without a
//! write); a series ends after 6 minutes without an occurrence (kube-rs's `Recorder` and
//! client-go's events.k8s.io broadcaster start a new Event then; the core/v1 correlator counts
//! on for as long as the LRU keeps the entry); an aggregate's note stays the first one it was
//! written with (a series patch of kube-rs's `Recorder` carries the Event as first created,
//! where upstream's patch updates the message). Keys are hashed with a per-process random key,
//! so a pod author cannot choose notes that collide.

use std::{
    collections::HashSet,
    hash::{BuildHasher, Hash, Hasher, RandomState},
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::time::Instant;

use super::{Event, EventType, NOTE_MAX_BYTES, bounded, limiter::TokenBucket, lru::Lru};

/// Upstream `maxLruCacheEntries`.
pub const CACHE_ENTRIES: usize = 4096;
/// Upstream `defaultSpamBurst` and `defaultSpamQPS`.
pub const SPAM_BURST: u32 = 25;
pub const SPAM_QPS: f64 = 1.0 / 300.0;
/// Upstream `defaultAggregateMaxEvents` and `defaultAggregateIntervalInSeconds`.
pub const AGGREGATE_MAX_EVENTS: usize = 10;
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// kube-rs `Recorder`'s `CACHE_TTL` (and client-go's events.k8s.io series' end).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// Upstream `EventAggregatorByReasonMessageFunc`'s prefix.
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";

/// An event to publish, and where it stands in its series.
#[derive(Clone, Debug, PartialEq)]
pub struct Correlated {
    pub event: Event,
    /// The series: equal for the occurrences of one series.
    pub key: u64,
    /// Occurrences of the series so far, this one included (1: a new Event).
    pub count: u32,
}

struct Aggregate {
    /// The notes seen (hashed), at most [`AGGREGATE_MAX_EVENTS`].
    notes: HashSet<u64>,
    last: Instant,
}

struct Series {
    count: u32,
    last: Instant,
}

pub struct Correlator {
    hasher: RandomState,
    spam: Lru<u64, TokenBucket>,
    aggregates: Lru<u64, Aggregate>,
    series: Lru<u64, Series>,
}

/// What the keys are made of, so that no two kinds of key can be equal by construction.
enum KeyPart<'a> {
    Object(&'a ObjectReference),
    Aggregate(&'a ObjectReference, &'a str, &'a str),
    Event(&'a ObjectReference, &'a str, &'a str, &'a str),
    Note(&'a str),
}

/// The identity of an object: `fieldPath` only where the caller says.
fn hash_object(reference: &ObjectReference, with_field_path: bool, state: &mut impl Hasher) {
    reference.kind.hash(state);
    reference.namespace.hash(state);
    reference.name.hash(state);
    reference.uid.hash(state);
    reference.api_version.hash(state);
    if with_field_path {
        reference.field_path.hash(state);
    }
}

impl Hash for KeyPart<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let tag: u8 = match self {
            KeyPart::Object(_) => 0,
            KeyPart::Aggregate(..) => 1,
            KeyPart::Event(..) => 2,
            KeyPart::Note(_) => 3,
        };
        tag.hash(state);
        match self {
            KeyPart::Object(r) => hash_object(r, false, state),
            KeyPart::Aggregate(r, type_, reason) => {
                hash_object(r, false, state);
                type_.hash(state);
                reason.hash(state);
            }
            KeyPart::Event(r, type_, reason, note) => {
                hash_object(r, true, state);
                type_.hash(state);
                reason.hash(state);
                note.hash(state);
            }
            KeyPart::Note(note) => note.hash(state),
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator {
            hasher: RandomState::new(),
            spam: Lru::new(CACHE_ENTRIES),
            aggregates: Lru::new(CACHE_ENTRIES),
            series: Lru::new(CACHE_ENTRIES),
        }
    }
}

impl Correlator {
    fn key(&self, part: KeyPart<'_>) -> u64 {
        self.hasher.hash_one(part)
    }

    /// `event` as it is to be published, or `None` when the spam filter drops it.
    pub fn correlate(&mut self, mut event: Event, now: Instant) -> Option<Correlated> {
        let object = self.key(KeyPart::Object(&event.regarding));
        let bucket = self
            .spam
            .get_or_insert_with(object, || TokenBucket::new(SPAM_QPS, SPAM_BURST, now));
        if !bucket.try_take(now) {
            return None;
        }

        let type_ = type_name(event.type_);
        let aggregate_key = self.key(KeyPart::Aggregate(&event.regarding, type_, &event.reason));
        let note = self.key(KeyPart::Note(&event.note));
        let aggregate = self
            .aggregates
            .get_or_insert_with(aggregate_key, || Aggregate {
                notes: HashSet::new(),
                last: now,
            });
        if now.saturating_duration_since(aggregate.last) > AGGREGATE_INTERVAL {
            aggregate.notes.clear();
        }
        aggregate.notes.insert(note);
        aggregate.last = now;
        let key = if aggregate.notes.len() < AGGREGATE_MAX_EVENTS {
            self.key(KeyPart::Event(
                &event.regarding,
                type_,
                &event.reason,
                &event.note,
            ))
        } else {
            // Upstream keeps the set below the maximum by dropping any one note.
            if let Some(any) = aggregate.notes.iter().next().copied() {
                aggregate.notes.remove(&any);
            }
            event.note = bounded(format!("{AGGREGATE_PREFIX}{}", event.note), NOTE_MAX_BYTES);
            event.regarding.field_path = None;
            aggregate_key
        };

        let series = self.series.get_or_insert_with(key, || Series {
            count: 0,
            last: now,
        });
        if now.saturating_duration_since(series.last) > SERIES_TTL {
            series.count = 0;
        }
        series.count = series.count.saturating_add(1);
        series.last = now;
        Some(Correlated {
            event,
            key,
            count: series.count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Action, pod_ref};

    fn pod(name: &str) -> ObjectReference {
        pod_ref(
            &crate::testing::pod()
                .named("default", name, &format!("uid-{name}"))
                .build(),
        )
    }

    fn unhealthy(object: ObjectReference, note: &str) -> Event {
        Event::warning(object, "Unhealthy", Action::ProbeContainer, note)
    }

    #[test]
    fn repeats_become_one_series_with_a_growing_count() {
        let mut correlator = Correlator::default();
        let now = Instant::now();
        let counts: Vec<(u64, u32)> = (0..3)
            .map(|i| {
                let c = correlator
                    .correlate(
                        unhealthy(pod("a"), "Liveness probe failed: "),
                        now + Duration::from_secs(i),
                    )
                    .expect("let through");
                (c.key, c.count)
            })
            .collect();
        assert_eq!(counts.iter().map(|c| c.1).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(counts.iter().all(|c| c.0 == counts[0].0));
        // Another note, another container or another reason starts a series of its own.
        let other = [
            unhealthy(pod("a"), "Readiness probe failed: "),
            unhealthy(
                ObjectReference {
                    field_path: Some("spec.containers{b}".into()),
                    ..pod("a")
                },
                "Liveness probe failed: ",
            ),
            Event::warning(pod("a"), "BackOff", Action::StartContainer, "x"),
        ];
        for event in other {
            let c = correlator.correlate(event, now).expect("let through");
            assert_eq!(c.count, 1);
            assert_ne!(c.key, counts[0].0);
        }
    }

    #[test]
    fn a_series_ends_after_six_quiet_minutes() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        let event = || unhealthy(pod("a"), "x");
        assert_eq!(
            correlator.correlate(event(), start).map(|c| c.count),
            Some(1)
        );
        let within = start + SERIES_TTL;
        assert_eq!(
            correlator.correlate(event(), within).map(|c| c.count),
            Some(2)
        );
        let after = within + SERIES_TTL + Duration::from_secs(1);
        assert_eq!(
            correlator.correlate(event(), after).map(|c| c.count),
            Some(1)
        );
    }

    #[test]
    fn the_spam_filter_allows_a_burst_per_object_then_one_every_five_minutes() {
        let mut correlator = Correlator::default();
        let now = Instant::now();
        let passed = (0..40)
            .filter(|_| {
                correlator
                    .correlate(unhealthy(pod("a"), "x"), now)
                    .is_some()
            })
            .count();
        assert_eq!(passed, SPAM_BURST as usize);
        // Other objects have their own budget; the first one's refills slowly.
        assert!(
            correlator
                .correlate(unhealthy(pod("b"), "x"), now)
                .is_some()
        );
        let soon = now + Duration::from_secs(299);
        assert!(
            correlator
                .correlate(unhealthy(pod("a"), "x"), soon)
                .is_none()
        );
        let later = now + Duration::from_secs(301);
        assert!(
            correlator
                .correlate(unhealthy(pod("a"), "x"), later)
                .is_some()
        );
    }

    #[test]
    fn ten_different_notes_within_ten_minutes_are_combined() {
        let mut correlator = Correlator::default();
        let now = Instant::now();
        let container = ObjectReference {
            field_path: Some("spec.containers{app}".into()),
            ..pod("a")
        };
        let results: Vec<Correlated> = (0..12)
            .map(|i| {
                correlator
                    .correlate(
                        unhealthy(container.clone(), &format!("probe output {i}")),
                        now + Duration::from_secs(i),
                    )
                    .expect("within the burst")
            })
            .collect();
        // The first nine are themselves.
        for (i, c) in results.iter().take(9).enumerate() {
            assert_eq!(c.event.note, format!("probe output {i}"));
            assert_eq!(c.count, 1);
            assert_eq!(c.event.regarding.field_path, container.field_path);
        }
        // From the tenth on: one aggregate series about the pod.
        let combined = &results[9..];
        assert_eq!(
            combined[0].event.note,
            "(combined from similar events): probe output 9"
        );
        assert!(combined.iter().all(|c| c.key == combined[0].key
            && c.event.regarding.field_path.is_none()
            && c.event.note.starts_with(AGGREGATE_PREFIX)));
        assert_eq!(
            combined.iter().map(|c| c.count).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn aggregation_forgets_notes_older_than_ten_minutes() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        for i in 0..9 {
            correlator.correlate(unhealthy(pod("a"), &format!("n{i}")), start);
        }
        let later = start + AGGREGATE_INTERVAL + Duration::from_secs(1);
        let c = correlator
            .correlate(unhealthy(pod("a"), "n9"), later)
            .expect("let through");
        assert_eq!(c.event.note, "n9");
    }

    #[test]
    fn its_caches_stay_bounded() {
        let mut correlator = Correlator::default();
        let now = Instant::now();
        for i in 0..(CACHE_ENTRIES + 100) {
            correlator.correlate(unhealthy(pod(&format!("p{i}")), "x"), now);
        }
        assert_eq!(correlator.spam.len(), CACHE_ENTRIES);
        assert_eq!(correlator.aggregates.len(), CACHE_ENTRIES);
        assert_eq!(correlator.series.len(), CACHE_ENTRIES);
    }
}
