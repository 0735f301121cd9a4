//! A query's result before rendering: the aggregate of one profile type
//! and its resolved frames.

use crate::aggregate::{Aggregate, TypeInfo};
use crate::resolved::Resolved;

/// The CPU profile type agents send; chosen when a selection has several
/// types and the query named none.
pub const DEFAULT_TYPE: &str = "samples:count:cpu:nanoseconds";

/// A query's result before rendering.
pub struct Answer {
    /// The selected stacks and their values.
    pub agg: Aggregate,
    /// Their frames, named.
    pub resolved: Resolved,
    /// The profile type shown (None when nothing matched).
    pub profile_type: Option<String>,
}

impl Answer {
    /// The shown profile type's number in the aggregate's strings.
    fn type_id(&self) -> Option<u32> {
        self.agg.strings.find(self.profile_type.as_deref()?)
    }

    /// The shown type's units and period.
    pub fn type_info(&self) -> TypeInfo {
        self.type_id()
            .and_then(|t| self.agg.types.get(&t))
            .cloned()
            .unwrap_or_default()
    }

    /// Events of the shown type, per side.
    pub fn points(&self) -> [u64; 2] {
        self.type_id()
            .and_then(|t| self.agg.points.get(&t))
            .copied()
            .unwrap_or_default()
    }
}
