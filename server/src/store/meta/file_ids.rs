//! The other IDs of stored files (htlhash, Go build-ID) and the keys they
//! lead to; the rows are written with their artifact, in its transaction
//! (`commit_artifact`).

use async_trait::async_trait;
use symtrace_profiles::model::BuildIdKind;

use super::{MetaResult, Pool, SqlMetadata};

/// Most keys one file ID leads to (a file stored by several publishers
/// under different keys is rare; a bound keeps a lookup cheap).
const MAX_KEYS: i64 = 16;

#[async_trait]
pub trait FileIdMetadata {
    /// The keys (build-IDs the store holds files under) of files known by
    /// this ID (`kind`: `Htlhash` or `Go`; the table has no other), newest
    /// first.
    async fn keys_of(&self, kind: BuildIdKind, id: &str) -> MetaResult<Vec<String>>;
    /// Whether the named lease is held and not expired at `now`.
    async fn lease_held(&self, name: &str, now: i64) -> MetaResult<bool>;
}

#[async_trait]
impl FileIdMetadata for SqlMetadata {
    async fn keys_of(&self, kind: BuildIdKind, id: &str) -> MetaResult<Vec<String>> {
        let sql = "SELECT build_id FROM file_ids WHERE id_kind = $1 AND file_id = $2 \
                   ORDER BY created_at DESC LIMIT $3";
        on_pool!(self, p => sqlx::query_scalar::<_, String>(sql)
            .bind(kind.as_str())
            .bind(id)
            .bind(MAX_KEYS)
            .fetch_all(p)
            .await)
    }

    async fn lease_held(&self, name: &str, now: i64) -> MetaResult<bool> {
        let sql = "SELECT 1 FROM leases WHERE name = $1 AND expires_at >= $2";
        on_pool!(self, p => sqlx::query(sql)
            .bind(name)
            .bind(now)
            .fetch_optional(p)
            .await
            .map(|r| r.is_some()))
    }
}
