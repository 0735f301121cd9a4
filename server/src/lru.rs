//! A map of weighted values (bytes), least recently used dropped first once
//! the total weight exceeds a budget. Shared by the caches of open symbol
//! indexes and of decoded profile segments.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

struct Slot<V> {
    value: V,
    weight: u64,
    last_used: AtomicU64,
}

pub struct WeightedLru<V> {
    budget: u64,
    clock: AtomicU64,
    entries: Mutex<HashMap<String, Slot<V>>>,
}

impl<V: Clone> WeightedLru<V> {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            clock: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The value under `key` if `usable` accepts it (which makes it the most
    /// recently used).
    pub fn get_if(&self, key: &str, usable: impl FnOnce(&V) -> bool) -> Option<V> {
        let entries = self.entries.lock().expect("lru");
        let slot = entries.get(key).filter(|s| usable(&s.value))?;
        slot.last_used.store(self.tick(), Ordering::Relaxed);
        Some(slot.value.clone())
    }

    /// Adds (or replaces) `key`'s value, then drops the least recently used
    /// others while the total is over the budget. Returns the total weight.
    pub fn insert(&self, key: &str, value: V, weight: u64) -> u64 {
        let slot = Slot {
            value,
            weight,
            last_used: AtomicU64::new(self.tick()),
        };
        let mut entries = self.entries.lock().expect("lru");
        entries.insert(key.to_owned(), slot);
        let mut total: u64 = entries.values().map(|s| s.weight).sum();
        while total > self.budget {
            let Some(oldest) = entries
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .min_by_key(|(_, s)| s.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            total -= entries.remove(&oldest).map_or(0, |s| s.weight);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_least_recently_used_beyond_the_budget() {
        let lru = WeightedLru::new(10);
        assert_eq!(lru.insert("a", 1, 4), 4);
        assert_eq!(lru.insert("b", 2, 4), 8);
        assert_eq!(lru.get_if("a", |_| true), Some(1), "a is now the newest");
        assert_eq!(lru.insert("c", 3, 4), 8, "b dropped");
        assert_eq!(lru.get_if("b", |_| true), None);
        assert_eq!(lru.get_if("a", |v| *v == 2), None, "not usable");
        assert_eq!(lru.insert("a", 5, 4), 8, "replaced, not added");
        assert_eq!(lru.insert("big", 9, 20), 20, "the new one stays");
        assert_eq!(lru.get_if("c", |_| true), None);
    }
}
