//! A map of at most `capacity` entries that forgets the least recently used one to make room
//! (upstream's correlator keeps its state in `groupcache/lru` caches of 4096 entries): every
//! cache of the event pipeline is keyed by what pods do, so none may grow without bound.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

pub(super) struct Lru<K, V> {
    capacity: usize,
    entries: HashMap<K, (V, u64)>,
    /// Use stamp → key, oldest first.
    order: BTreeMap<u64, K>,
    next_stamp: u64,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// The entry of `key`, made most recently used.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let stamp = self.stamp();
        let (_, used) = self.entries.get_mut(key)?;
        self.order.remove(used);
        *used = stamp;
        self.order.insert(stamp, key.clone());
        self.entries.get_mut(key).map(|(v, _)| v)
    }

    /// The entry of `key`, made with `make` (forgetting the least recently used one when full)
    /// if there is none; either way the most recently used.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let stamp = self.stamp();
        if let Some((_, used)) = self.entries.get_mut(&key) {
            let old = std::mem::replace(used, stamp);
            self.order.remove(&old);
        } else {
            self.make_room();
        }
        self.order.insert(stamp, key.clone());
        &mut self.entries.entry(key).or_insert_with(|| (make(), stamp)).0
    }

    /// Forgets the least recently used entry when full.
    fn make_room(&mut self) {
        if self.entries.len() >= self.capacity
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
        }
    }

    /// Sets `key` to `value` (most recently used), forgetting the least recently used entry
    /// when full.
    pub fn insert(&mut self, key: K, value: V) {
        let stamp = self.stamp();
        if let Some((_, used)) = self.entries.remove(&key) {
            self.order.remove(&used);
        } else {
            self.make_room();
        }
        self.order.insert(stamp, key.clone());
        self.entries.insert(key, (value, stamp));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_least_recently_used_when_full() {
        let mut lru = Lru::new(2);
        lru.insert("a", 1);
        lru.insert("b", 2);
        // Using `a` makes `b` the oldest.
        assert_eq!(lru.get_mut(&"a"), Some(&mut 1));
        lru.insert("c", 3);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.get_mut(&"b"), None);
        assert_eq!(lru.get_mut(&"a"), Some(&mut 1));
        assert_eq!(lru.get_mut(&"c"), Some(&mut 3));
    }

    #[test]
    fn get_or_insert_with_makes_only_missing_entries() {
        let mut lru = Lru::new(2);
        *lru.get_or_insert_with("a", || 1) += 10;
        assert_eq!(*lru.get_or_insert_with("a", || 100), 11);
        lru.get_or_insert_with("b", || 2);
        lru.get_or_insert_with("c", || 3);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.get_mut(&"a"), None);
    }

    #[test]
    fn replacing_a_key_keeps_one_entry() {
        let mut lru = Lru::new(3);
        for v in 0..10 {
            lru.insert("k", v);
        }
        assert_eq!(lru.len(), 1);
        assert_eq!(lru.get_mut(&"k"), Some(&mut 9));
    }
}
