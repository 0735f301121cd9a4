//! Open symbol indexes by build-ID, least recently used dropped first once
//! their bytes exceed the budget. Each entry remembers which files it was
//! built from, so a newer debug file for the build-ID is never shadowed.

use std::sync::Arc;

use symtrace_symbolize::SymbolIndex;

use crate::lru::WeightedLru;

pub struct CachedIndex {
    pub key: String,
    pub index: SymbolIndex,
}

pub struct IndexCache(WeightedLru<Arc<CachedIndex>>);

impl IndexCache {
    pub fn new(budget: u64) -> Self {
        Self(WeightedLru::new(budget))
    }

    /// The index for `build_id` if it was built from the files `key` names.
    pub fn get(&self, build_id: &str, key: &str) -> Option<Arc<CachedIndex>> {
        let hit = self.0.get_if(build_id, |e| e.key == key);
        metrics::counter!("symtrace_symbol_index_cache_total",
            "result" => if hit.is_some() { "hit" } else { "miss" })
        .increment(1);
        hit
    }

    /// Adds (or replaces) the index for `build_id`, evicting the least
    /// recently used others beyond the budget.
    pub fn insert(&self, build_id: &str, key: &str, index: SymbolIndex) -> Arc<CachedIndex> {
        let weight = index.len() as u64;
        let entry = Arc::new(CachedIndex {
            key: key.to_owned(),
            index,
        });
        let total = self.0.insert(build_id, entry.clone(), weight);
        metrics::gauge!("symtrace_symbol_index_cache_bytes").set(total as f64);
        entry
    }
}
