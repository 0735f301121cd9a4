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
    /// this ID (`kind`: `Htlhash` or `Go`; the table has no other): where
    /// CI's and upstream files carrying it are, then where agents' files
    /// of `content` carrying it are (none when it is empty), each newest
    /// first. An ID only agents' files of other contents carry leads
    /// nowhere, whatever else is stored under their keys.
    async fn keys_of(&self, kind: BuildIdKind, id: &str, content: &str) -> MetaResult<Vec<String>>;
    /// Whether the named lease is held and not expired at `now`.
    async fn lease_held(&self, name: &str, now: i64) -> MetaResult<bool>;
    /// Deletes a lease, whoever holds it (a claim whose upload is done).
    async fn drop_lease(&self, name: &str) -> MetaResult<()>;
    /// Deletes the claims (`upload:` leases) that ran out before `now`;
    /// how many.
    async fn delete_expired_claims(&self, now: i64) -> MetaResult<u64>;
}

#[async_trait]
impl FileIdMetadata for SqlMetadata {
    async fn keys_of(&self, kind: BuildIdKind, id: &str, content: &str) -> MetaResult<Vec<String>> {
        // A row says which file carries the ID: a CI or upstream one
        // (agent_content '') or an agent's of that content; the key must
        // still hold a file that may name these frames.
        let sql = "SELECT f.build_id FROM file_ids f \
                   WHERE f.id_kind = $1 AND f.file_id = $2 \
                   AND (f.agent_content = '' OR ($3 <> '' AND f.agent_content = $3)) \
                   AND EXISTS (SELECT 1 FROM artifacts a WHERE a.build_id = f.build_id \
                       AND (a.origin <> 'agent' OR ($3 <> '' AND a.content_sha256 = $3))) \
                   GROUP BY f.build_id \
                   ORDER BY MIN(CASE WHEN f.agent_content = '' THEN 0 ELSE 1 END), \
                   MAX(f.created_at) DESC LIMIT $4";
        on_pool!(self, p => sqlx::query_scalar::<_, String>(sql)
            .bind(kind.as_str())
            .bind(id)
            .bind(content)
            .bind(MAX_KEYS)
            .fetch_all(p)
            .await)
    }

    async fn drop_lease(&self, name: &str) -> MetaResult<()> {
        on_pool!(self, p => sqlx::query("DELETE FROM leases WHERE name = $1")
            .bind(name)
            .execute(p)
            .await
            .map(|_| ()))
    }

    async fn delete_expired_claims(&self, now: i64) -> MetaResult<u64> {
        let sql = "DELETE FROM leases WHERE expires_at < $1 AND name LIKE 'upload:%'";
        on_pool!(self, p => sqlx::query(sql)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
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
