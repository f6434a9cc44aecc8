//! The credentials a plugin returned, kept for the duration it asked (upstream `pluginProvider`'s
//! `cache.ExpirationStore`, `getCachedCredentials`): keyed by the image, its registry or nothing
//! (the response's `cacheKeyType`), looked up in that order, an expired entry never returned.
//!
//! Upstream's store is unbounded and purged every 15 minutes; here the images a pod author
//! chooses are what grows it, so it holds at most a fixed number of entries: when full, the
//! expired ones go first, then the one closest to expiring. Pure: the caller passes the time.

use std::{collections::HashMap, time::Instant};

/// What a response is cached under (upstream `PluginCacheKeyType`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// The image (repository) as the plugin was asked about it.
    Image(String),
    /// The image's registry: its first `/`-separated part (upstream `parseRegistry`).
    Registry(String),
    Global,
}

impl CacheKey {
    /// The keys `image` may be cached under, in upstream's lookup order.
    pub fn lookup_order(image: &str) -> [CacheKey; 3] {
        [
            CacheKey::Image(image.to_owned()),
            CacheKey::Registry(registry_of(image).to_owned()),
            CacheKey::Global,
        ]
    }
}

/// Upstream `parseRegistry`: everything before the first `/`.
pub fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires_at: Instant,
}

/// A bounded cache of values that expire.
#[derive(Debug)]
pub struct ExpiringCache<V> {
    entries: HashMap<CacheKey, Entry<V>>,
    capacity: usize,
}

impl<V: Clone> ExpiringCache<V> {
    pub fn new(capacity: usize) -> Self {
        ExpiringCache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The first unexpired value under `keys`, in order; the expired entries met are dropped.
    pub fn get(&mut self, keys: &[CacheKey], now: Instant) -> Option<V> {
        for key in keys {
            match self.entries.get(key) {
                Some(entry) if now <= entry.expires_at => return Some(entry.value.clone()),
                Some(_) => {
                    self.entries.remove(key);
                }
                None => {}
            }
        }
        None
    }

    /// Keeps `value` under `key` until `expires_at`, making room if the cache is full.
    pub fn insert(&mut self, key: CacheKey, value: V, expires_at: Instant, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, e| now <= e.expires_at);
            if self.entries.len() >= self.capacity
                && let Some(soonest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.expires_at)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, Entry { value, expires_at });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_image_then_its_registry_then_the_global_entry_is_found() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut cache = ExpiringCache::new(8);
        let keys = CacheKey::lookup_order("registry.io:5000/team/app");
        assert_eq!(keys[1], CacheKey::Registry("registry.io:5000".into()));
        assert_eq!(cache.get(&keys, now), None);
        cache.insert(CacheKey::Global, "global", later, now);
        assert_eq!(cache.get(&keys, now), Some("global"));
        cache.insert(
            CacheKey::Registry("registry.io:5000".into()),
            "registry",
            later,
            now,
        );
        assert_eq!(cache.get(&keys, now), Some("registry"));
        cache.insert(keys[0].clone(), "image", later, now);
        assert_eq!(cache.get(&keys, now), Some("image"));
        // Another registry's image sees only the global entry.
        assert_eq!(
            cache.get(&CacheKey::lookup_order("other.io/app"), now),
            Some("global")
        );
    }

    #[test]
    fn an_expired_entry_is_not_returned_and_is_dropped() {
        let now = Instant::now();
        let mut cache = ExpiringCache::new(8);
        let keys = CacheKey::lookup_order("r.io/app");
        cache.insert(keys[0].clone(), 1, now + Duration::from_secs(1), now);
        assert_eq!(cache.get(&keys, now + Duration::from_secs(1)), Some(1));
        assert_eq!(cache.get(&keys, now + Duration::from_secs(2)), None);
        assert_eq!(cache.len(), 0);
    }

    /// Images chosen by pod authors cannot grow the cache past its capacity; the expired
    /// entries make room first, then the ones closest to expiring.
    #[test]
    fn the_cache_is_bounded_and_evicts_the_expired_then_the_soonest_expiring() {
        let now = Instant::now();
        let mut cache = ExpiringCache::new(4);
        for i in 0..10_000_u64 {
            let key = CacheKey::Image(format!("r.io/app-{i}"));
            cache.insert(key, i, now + Duration::from_secs(100 + i), now);
            assert!(cache.len() <= 4);
        }
        // The four expiring last are kept.
        for i in 9996..10_000 {
            assert_eq!(
                cache.get(&[CacheKey::Image(format!("r.io/app-{i}"))], now),
                Some(i)
            );
        }
        let mut cache = ExpiringCache::new(2);
        cache.insert(
            CacheKey::Image("a".into()),
            'a',
            now + Duration::from_secs(1),
            now,
        );
        cache.insert(
            CacheKey::Image("b".into()),
            'b',
            now + Duration::from_secs(1000),
            now,
        );
        let t = now + Duration::from_secs(5);
        cache.insert(
            CacheKey::Image("c".into()),
            'c',
            t + Duration::from_secs(10),
            t,
        );
        assert_eq!(cache.get(&[CacheKey::Image("b".into())], t), Some('b'));
        assert_eq!(cache.get(&[CacheKey::Image("c".into())], t), Some('c'));
        assert_eq!(cache.len(), 2);
    }
}
