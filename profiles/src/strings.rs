//! Interned strings, numbered in insertion order; number 0 is `""`.

use indexmap::IndexSet;
use rustc_hash::FxBuildHasher;

/// Interned strings, numbered in order of first use, `""` first.
pub struct Strings(IndexSet<Box<str>, FxBuildHasher>);

impl Default for Strings {
    fn default() -> Self {
        let mut set = IndexSet::default();
        set.insert(Box::from(""));
        Self(set)
    }
}

impl Strings {
    /// The number of `s`, adding it if new.
    pub fn intern(&mut self, s: &str) -> u32 {
        match self.0.get_index_of(s) {
            Some(i) => i as u32,
            None => self.0.insert_full(Box::from(s)).0 as u32,
        }
    }

    /// The number of `s`, if it is there.
    pub fn find(&self, s: &str) -> Option<u32> {
        self.0.get_index_of(s).map(|i| i as u32)
    }

    /// The string numbered `i`.
    pub fn get(&self, i: u32) -> &str {
        &self.0[i as usize]
    }
}
