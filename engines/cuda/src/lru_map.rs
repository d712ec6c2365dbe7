//! A map holding at most `capacity` entries: inserting into a full one drops the least
//! recently used entry (its `Drop` runs then, so a cuBLASLt plan's descriptors are
//! destroyed), and evictions are counted. What keeps the cuBLASLt plans of one executable
//! bounded ([`crate::segment`]): a partition run with ever new shapes (a growing sequence
//! length, a batch that varies) made one plan per product and shape, and kept every one.
//!
//! Written out rather than taken from the `lru` crate: the workspace builds with `--locked`
//! and this crate does not depend on it yet. A hit is O(1) (a stamp updated); an eviction
//! scans the entries for the oldest stamp, O(capacity) — paid only when a new shape makes
//! a plan, which asks cuBLASLt's heuristic and costs far more than a scan of a few hundred
//! entries. Pure: tested without a GPU.

use std::collections::HashMap;
use std::hash::Hash;

/// Entries kept when nothing else is asked.
pub const DEFAULT_CAPACITY: usize = 256;

pub struct LruMap<K, V> {
    /// Each value with the stamp of its last use (insert or `get`).
    entries: HashMap<K, (V, u64)>,
    capacity: usize,
    /// The last stamp handed out: uses are ordered by it.
    clock: u64,
    evictions: u64,
}

impl<K: Hash + Eq + Clone, V> LruMap<K, V> {
    /// An empty map keeping at most `capacity` entries (at least 1: a map that kept none
    /// would drop a plan before its first use).
    pub fn new(capacity: usize) -> LruMap<K, V> {
        LruMap { entries: HashMap::new(), capacity: capacity.max(1), clock: 0, evictions: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries dropped to stay within the capacity so far (not those `clear` dropped).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether `key` is held; not a use (its recency is unchanged).
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The value of `key`, marked as the most recently used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.clock += 1;
        let clock = self.clock;
        let (value, used) = self.entries.get_mut(key)?;
        *used = clock;
        Some(&*value)
    }

    /// Holds `value` under `key` as the most recently used entry (replacing, and dropping,
    /// a value already there). When a new key finds the map full, the least recently used
    /// entry is taken out first, counted, and returned (dropping it destroys it).
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        self.clock += 1;
        let clock = self.clock;
        if let Some(slot) = self.entries.get_mut(&key) {
            *slot = (value, clock);
            return None;
        }
        let evicted = if self.entries.len() >= self.capacity { self.evict_oldest() } else { None };
        self.entries.insert(key, (value, clock));
        evicted
    }

    /// A new capacity (at least 1); entries past it are evicted, oldest first, and dropped.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        while self.entries.len() > self.capacity {
            drop(self.evict_oldest());
        }
    }

    /// Drops every entry (a context reset: plans of the old context are let go). Not
    /// counted as evictions, which are what the capacity cost.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    fn evict_oldest(&mut self) -> Option<(K, V)> {
        let oldest = self.entries.iter().min_by_key(|(_, (_, used))| *used)?.0.clone();
        let (value, _) = self.entries.remove(&oldest)?;
        self.evictions += 1;
        Some((oldest, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[test]
    fn the_capacity_is_respected_and_the_least_recently_used_goes_first() {
        let mut m = LruMap::new(3);
        for k in 0..3 {
            assert!(m.insert(k, k * 10).is_none());
        }
        assert_eq!((m.len(), m.evictions()), (3, 0));
        // Full: each new key evicts the oldest, in insertion order when nothing was read.
        assert_eq!(m.insert(3, 30), Some((0, 0)));
        assert_eq!(m.insert(4, 40), Some((1, 10)));
        assert_eq!((m.len(), m.capacity(), m.evictions()), (3, 3, 2));
        assert!(!m.contains(&0) && !m.contains(&1));
        assert!(m.contains(&2) && m.contains(&3) && m.contains(&4));
    }

    #[test]
    fn a_hit_makes_an_entry_the_most_recently_used() {
        let mut m = LruMap::new(3);
        for k in ["a", "b", "c"] {
            m.insert(k, k.len());
        }
        // Reading "a" (the oldest) makes "b" the one to go next, then "c".
        assert_eq!(m.get(&"a"), Some(&1));
        assert_eq!(m.insert("d", 1).map(|e| e.0), Some("b"));
        assert_eq!(m.insert("e", 1).map(|e| e.0), Some("c"));
        assert_eq!(m.insert("f", 1).map(|e| e.0), Some("a"));
        // A miss changes nothing; `contains` is not a use.
        assert_eq!(m.get(&"zz"), None);
        assert!(m.contains(&"d"));
        assert_eq!(m.insert("g", 1).map(|e| e.0), Some("d"));
        assert_eq!(m.evictions(), 4);
    }

    #[test]
    fn replacing_a_key_is_a_use_and_not_an_eviction() {
        let mut m = LruMap::new(2);
        m.insert(1, "one");
        m.insert(2, "two");
        assert_eq!(m.insert(1, "uno"), None);
        assert_eq!((m.len(), m.evictions()), (2, 0));
        assert_eq!(m.insert(3, "three"), Some((2, "two")), "1 was used last, 2 goes");
        assert_eq!(m.get(&1), Some(&"uno"));
    }

    /// Counts its drops, as a plan's descriptors are destroyed in its `Drop`.
    struct Counted(Rc<Cell<usize>>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn evicted_entries_are_dropped_and_counted_and_clear_drops_the_rest() {
        let dropped = Rc::new(Cell::new(0));
        let mut m = LruMap::new(2);
        for k in 0..5 {
            // The returned entry is dropped at the end of the statement.
            let _ = m.insert(k, Counted(dropped.clone()));
        }
        assert_eq!((dropped.get(), m.evictions(), m.len()), (3, 3, 2));
        // Shrinking evicts down to the new capacity; growing evicts nothing.
        m.set_capacity(1);
        assert_eq!((dropped.get(), m.evictions(), m.len()), (4, 4, 1));
        assert!(m.contains(&4), "the most recent stays");
        m.set_capacity(8);
        assert_eq!((m.evictions(), m.len()), (4, 1));
        m.clear();
        assert_eq!((dropped.get(), m.evictions(), m.len()), (5, 4, 0));
        assert!(m.is_empty());
    }

    #[test]
    fn a_capacity_of_zero_keeps_one_entry() {
        let mut m = LruMap::new(0);
        assert_eq!(m.capacity(), 1);
        assert!(m.insert('x', ()).is_none());
        assert_eq!(m.insert('y', ()), Some(('x', ())));
        assert_eq!(m.get(&'y'), Some(&()));
    }
}
