//! The cache of the API server's review answers: each answer kept for its TTL, at most a fixed
//! number of them, the least recently used going first when a new one needs room (upstream's
//! `LRUExpireCache`). A client sending a new token or attribute with every request therefore
//! costs at most the cache's size in memory, and O(log n) per request.
//!
//! Not here: what is cached (`webhook.rs`).

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::Duration,
};

use tokio::time::Instant;

struct Entry<V> {
    value: V,
    until: Instant,
    /// Its place in the recency order.
    used: u64,
}

struct Inner<V> {
    entries: HashMap<String, Entry<V>>,
    /// Recency order: the smallest is the least recently used.
    order: BTreeMap<u64, String>,
    tick: u64,
}

/// Answers by key, each until its deadline, at most `capacity` of them.
pub struct ReviewCache<V> {
    capacity: usize,
    inner: Mutex<Inner<V>>,
}

impl<V: Clone> ReviewCache<V> {
    pub fn new(capacity: usize) -> Self {
        ReviewCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: BTreeMap::new(),
                tick: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock_unpoisoned()
    }

    /// The answer for `key` if it has not expired (it becomes the most recently used).
    pub fn get(&self, key: &str) -> Option<V> {
        let mut inner = self.lock();
        let now = Instant::now();
        let inner = &mut *inner;
        let entry = inner.entries.get_mut(key)?;
        if entry.until <= now {
            let used = entry.used;
            inner.entries.remove(key);
            inner.order.remove(&used);
            return None;
        }
        inner.tick += 1;
        inner.order.remove(&entry.used);
        entry.used = inner.tick;
        inner.order.insert(inner.tick, key.to_owned());
        Some(entry.value.clone())
    }

    /// Keeps `value` for `key` for `ttl` (not at all when `ttl` is zero), making room by
    /// dropping the least recently used answer.
    pub fn put(&self, key: String, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut inner = self.lock();
        let inner = &mut *inner;
        if let Some(old) = inner.entries.remove(&key) {
            inner.order.remove(&old.used);
        }
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
        inner.tick += 1;
        let used = inner.tick;
        inner.order.insert(used, key.clone());
        inner.entries.insert(
            key,
            Entry {
                value,
                until: Instant::now() + ttl,
                used,
            },
        );
    }

    /// Answers held now (expired ones included until they are looked up or pushed out).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_expire_and_the_least_recently_used_makes_room() {
        let cache = ReviewCache::new(3);
        let ttl = Duration::from_secs(60);
        for key in ["a", "b", "c"] {
            cache.put(key.into(), key.to_owned(), ttl);
        }
        // a is used, so b is now the least recently used.
        assert_eq!(cache.get("a").as_deref(), Some("a"));
        cache.put("d".into(), "d".into(), ttl);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("b"), None);
        assert_eq!(cache.get("a").as_deref(), Some("a"));
        assert_eq!(cache.get("c").as_deref(), Some("c"));
        assert_eq!(cache.get("d").as_deref(), Some("d"));
        // A zero TTL keeps nothing; an expired answer is gone.
        cache.put("e".into(), "e".into(), Duration::ZERO);
        assert_eq!(cache.get("e"), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test]
    async fn a_flood_of_new_keys_never_grows_it_past_its_capacity() {
        let cache = ReviewCache::new(1000);
        let ttl = Duration::from_secs(120);
        cache.put("kept".into(), 0u32, ttl);
        for i in 0..10_000u32 {
            cache.put(format!("token-{i}"), i, ttl);
            // A client that keeps using its answer keeps it.
            if i % 100 == 0 {
                assert_eq!(cache.get("kept"), Some(0));
            }
            assert!(cache.len() <= 1000);
        }
        assert_eq!(cache.len(), cache.capacity());
        assert_eq!(cache.get("token-9999"), Some(9999));
        assert_eq!(cache.get("token-0"), None);
    }
}
