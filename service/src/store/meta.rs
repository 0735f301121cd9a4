//! Metadata: which blobs exist and what they are, in SQLite (embedded
//! default) or PostgreSQL (shared by several replicas), through sqlx.
//!
//! Both databases run the same SQL: `$N` placeholders, `ON CONFLICT` and
//! `RETURNING` mean the same in each. Only the migrations differ.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};

use super::model::{
    Artifact, ArtifactKind, FileQuery, ListFilter, NewArtifact, ServedArtifact, SourceFile,
    WantedItem,
};

/// Metadata results: the store's error vocabulary.
pub type MetaResult<T> = super::error::Result<T>;

/// The narrow interface the rest of the server uses for metadata.
#[async_trait]
pub trait MetadataStore: ProfileMetadata + FileIdMetadata + Send + Sync + 'static {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    /// Cheap liveness query for `/readyz`.
    async fn ping(&self) -> MetaResult<()>;
    /// The candidate served for a request of `kind`: the highest quality, a
    /// `debuginfo` upload before an unstripped executable, the newest first.
    /// A `debuginfo` request also considers executables that carry DWARF.
    /// Never an agent's file (see [`Self::agent_artifact`]).
    async fn best_artifact(
        &self,
        build_id: &str,
        kind: ArtifactKind,
    ) -> MetaResult<Option<ServedArtifact>>;
    /// The best file an agent published for `build_id` from a file whose
    /// content hash is `content` (the same order as `best_artifact`).
    async fn agent_artifact(
        &self,
        build_id: &str,
        kind: ArtifactKind,
        content: &str,
    ) -> MetaResult<Option<ServedArtifact>>;
    /// Every candidate of a build-ID, best first.
    async fn artifacts_of(&self, build_id: &str) -> MetaResult<Vec<Artifact>>;
    /// Claims a blob before its object is written: from now on its row is
    /// live (not an orphan), so the collector leaves the object alone.
    /// Returns whether a committed artifact or source already references it
    /// (then its object exists and need not be written again).
    async fn claim_blob(&self, sha256: &str, size: i64, now: i64) -> MetaResult<bool>;
    /// Makes an artifact visible: blob row, artifact row and DWARF-named
    /// source paths in one transaction. Returns false if it already existed;
    /// `Error::NotFound` (and commits nothing) when the blob row claimed before
    /// the object was written is gone (the collector took it: store the
    /// blob again and retry).
    async fn commit_artifact(&self, new: &NewArtifact) -> MetaResult<bool>;
    /// The uploaded source file at a canonical path.
    async fn source(&self, build_id: &str, path: &str) -> MetaResult<Option<SourceFile>>;
    /// Whether the DWARF of `build_id` names `path`.
    async fn source_is_named(&self, build_id: &str, path: &str) -> MetaResult<bool>;
    /// Number of DWARF-named paths known for a build-ID.
    async fn source_name_count(&self, build_id: &str) -> MetaResult<i64>;
    /// Makes a source file visible (replacing an older upload of the path).
    /// `name_it` also records the path as named (for federated sources).
    /// `Error::NotFound` as for [`Self::commit_artifact`].
    async fn commit_source(&self, source: &SourceFile, name_it: bool) -> MetaResult<()>;
    /// Uploaded sources of a build-ID.
    async fn sources_of(&self, build_id: &str) -> MetaResult<Vec<SourceFile>>;
    /// For each wanted item, whether the server lacks it.
    async fn missing(&self, items: &[WantedItem]) -> MetaResult<Vec<bool>>;
    /// Artifacts matching a filter, newest first.
    async fn list(&self, filter: &ListFilter) -> MetaResult<Vec<Artifact>>;
    /// Artifacts for `/metadata`.
    async fn find_files(&self, query: &FileQuery, limit: i64) -> MetaResult<Vec<Artifact>>;
    /// Deletes a build-ID's artifacts (of one kind, or all with their
    /// sources). Returns the number of rows removed. Blobs are left to the
    /// collector.
    async fn delete(&self, build_id: &str, kind: Option<ArtifactKind>) -> MetaResult<u64>;
    /// Marks unreferenced blobs as orphans (at `now`). Returns how many.
    async fn mark_orphans(&self, now: i64) -> MetaResult<u64>;
    /// The stored symbol index for a source key: (blob sha256, size).
    async fn symbol_index(&self, source_key: &str) -> MetaResult<Option<(String, i64)>>;
    /// Records a symbol index whose blob is stored (claimed first, like any
    /// blob).
    async fn commit_symbol_index(
        &self,
        source_key: &str,
        primary_sha256: &str,
        sha256: &str,
        size: i64,
        now: i64,
    ) -> MetaResult<()>;
    /// Blobs orphaned before `cutoff` (candidates for [`Self::delete_orphan`]).
    async fn expired_orphans(&self, cutoff: i64) -> MetaResult<Vec<String>>;
    /// Deletes one expired orphan: in one transaction, re-checks that the row
    /// is still an unreferenced orphan, runs `delete_object`, and deletes the
    /// row. A concurrent claim waits for it (or wins, and the blob is kept),
    /// so an upload can never commit a reference to a deleted object.
    async fn delete_orphan<'a>(
        &'a self,
        sha256: &'a str,
        cutoff: i64,
        delete_object: futures::future::BoxFuture<'a, MetaResult<()>>,
    ) -> MetaResult<bool>;
    /// Which of these hashes have a blob row.
    async fn known_blobs(&self, hashes: &[String]) -> MetaResult<Vec<bool>>;
}

enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// [`MetadataStore`] over sqlx.
pub struct SqlMetadata {
    pool: Pool,
    /// Trace IDs of the uncompacted segments, read once per segment.
    traces: trace_index::TraceIndex,
}

/// Runs the same query code on whichever pool is configured.
macro_rules! on_pool {
    ($self:expr, $pool:ident => $body:expr) => {
        match &$self.pool {
            Pool::Sqlite($pool) => $crate::store::meta::into_store($body),
            Pool::Postgres($pool) => $crate::store::meta::into_store($body),
        }
    };
    // The body's own result, unconverted.
    (raw $self:expr, $pool:ident => $body:expr) => {
        match &$self.pool {
            Pool::Sqlite($pool) => $body,
            Pool::Postgres($pool) => $body,
        }
    };
}

/// A query's result in the store's error vocabulary.
pub fn into_store<T, E: Into<super::Error>>(r: Result<T, E>) -> MetaResult<T> {
    r.map_err(Into::into)
}

/// Clears the orphan mark of a blob row claimed before its object was
/// written; evaluates to false when the row is gone (the collector took the
/// blob, and the object may be gone too). Used by the source and segment
/// commits; `commit_artifact` does the same in one statement that also
/// records the sections.
macro_rules! blob_kept {
    ($tx:expr, $sha256:expr) => {
        sqlx::query("UPDATE blobs SET orphaned_at = NULL WHERE sha256 = $1")
            .bind($sha256)
            .execute(&mut *$tx)
            .await?
            .rows_affected()
            == 1
    };
}

mod file_ids;
mod profiles;
mod trace_index;
pub use file_ids::FileIdMetadata;
pub use profiles::ProfileMetadata;

const ARTIFACT_COLUMNS: &str = "build_id, kind, sha256, size, quality, has_dwarf, has_symtab, \
     has_dynsym, architecture, file_name, origin, created_at, owner, content_sha256";

/// The columns of a [`ServedArtifact`] (artifacts `a`, blobs `b`).
const SERVED_COLUMNS: &str = "a.build_id, a.kind, a.sha256, a.size, a.quality, a.has_dwarf, \
     a.has_symtab, a.has_dynsym, a.architecture, a.file_name, a.origin, a.created_at, a.owner, \
     a.content_sha256, b.sections";

/// Which artifacts serve a request of `kind`: a `debuginfo` request also
/// takes executables that carry DWARF.
fn kind_filter(kind: ArtifactKind) -> &'static str {
    match kind {
        ArtifactKind::Executable => "a.kind = 'executable'",
        ArtifactKind::Debuginfo => {
            "(a.kind = 'debuginfo' OR (a.kind = 'executable' AND a.has_dwarf))"
        }
    }
}

impl SqlMetadata {
    /// Opens the embedded SQLite database in `data_dir` (WAL mode, full sync:
    /// an acknowledged upload survives a power cut) and migrates it.
    pub async fn open_sqlite(file: &Path) -> MetaResult<Self> {
        let options = SqliteConnectOptions::new()
            .filename(file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        sqlx::migrate!("../migrations/sqlite").run(&pool).await?;
        Ok(Self {
            pool: Pool::Sqlite(pool),
            traces: Default::default(),
        })
    }

    /// Connects to PostgreSQL and migrates it (migrations take an advisory
    /// lock, so replicas starting together are safe).
    pub async fn open_postgres(url: &str) -> MetaResult<Self> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sqlx::migrate!("../migrations/postgres").run(&pool).await?;
        Ok(Self {
            pool: Pool::Postgres(pool),
            traces: Default::default(),
        })
    }

    /// Opens by URL: `postgres://…`/`postgresql://…`, `sqlite://PATH`, or a
    /// plain path to a SQLite file.
    pub async fn open(url: &str) -> MetaResult<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::open_postgres(url).await
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            let path = path.split('?').next().unwrap_or(path);
            Self::open_sqlite(Path::new(path)).await
        }
    }
}

#[async_trait]
impl MetadataStore for SqlMetadata {
    fn backend(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    async fn ping(&self) -> MetaResult<()> {
        on_pool!(self, p => sqlx::query("SELECT 1").execute(p).await.map(|_| ()))
    }

    async fn best_artifact(
        &self,
        build_id: &str,
        kind: ArtifactKind,
    ) -> MetaResult<Option<ServedArtifact>> {
        let sql = format!(
            "SELECT {SERVED_COLUMNS} FROM artifacts a JOIN blobs b ON b.sha256 = a.sha256 \
             WHERE a.build_id = $1 AND {filter} AND a.origin <> 'agent' \
             ORDER BY a.quality DESC, (a.kind = 'debuginfo') DESC, a.created_at DESC LIMIT 1",
            filter = kind_filter(kind)
        );
        on_pool!(self, p => sqlx::query_as::<_, ServedArtifact>(&sql)
            .bind(build_id)
            .fetch_optional(p)
            .await)
    }

    async fn agent_artifact(
        &self,
        build_id: &str,
        kind: ArtifactKind,
        content: &str,
    ) -> MetaResult<Option<ServedArtifact>> {
        let sql = format!(
            "SELECT {SERVED_COLUMNS} FROM artifacts a JOIN blobs b ON b.sha256 = a.sha256 \
             WHERE a.build_id = $1 AND {filter} AND a.origin = 'agent' \
             AND a.content_sha256 = $2 \
             ORDER BY a.quality DESC, (a.kind = 'debuginfo') DESC, a.created_at DESC LIMIT 1",
            filter = kind_filter(kind)
        );
        on_pool!(self, p => sqlx::query_as::<_, ServedArtifact>(&sql)
            .bind(build_id)
            .bind(content)
            .fetch_optional(p)
            .await)
    }

    async fn artifacts_of(&self, build_id: &str) -> MetaResult<Vec<Artifact>> {
        let sql = format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE build_id = $1 \
             ORDER BY kind, quality DESC, created_at DESC"
        );
        on_pool!(self, p => sqlx::query_as::<_, Artifact>(&sql).bind(build_id).fetch_all(p).await)
    }

    async fn claim_blob(&self, sha256: &str, size: i64, now: i64) -> MetaResult<bool> {
        let claim = "INSERT INTO blobs (sha256, size, sections, created_at, orphaned_at) \
                     VALUES ($1, $2, NULL, $3, NULL) \
                     ON CONFLICT (sha256) DO UPDATE SET orphaned_at = NULL";
        let referenced = "SELECT 1 WHERE EXISTS (SELECT 1 FROM artifacts WHERE sha256 = $1) \
                          OR EXISTS (SELECT 1 FROM sources WHERE sha256 = $1) \
                          OR EXISTS (SELECT 1 FROM symbol_indexes WHERE sha256 = $1) \
                          OR EXISTS (SELECT 1 FROM profile_segments WHERE sha256 = $1)";
        on_pool!(self, p => {
            sqlx::query(claim).bind(sha256).bind(size).bind(now).execute(p).await?;
            sqlx::query(referenced).bind(sha256).fetch_optional(p).await.map(|r| r.is_some())
        })
    }

    async fn commit_artifact(&self, new: &NewArtifact) -> MetaResult<bool> {
        let a = &new.artifact;
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            // The row the upload claimed before writing the object: if the
            // collector deleted it meanwhile (an upload slower than the
            // grace period), the object may be gone too — commit nothing.
            let kept = sqlx::query(
                "UPDATE blobs SET orphaned_at = NULL, sections = COALESCE(sections, $2) \
                 WHERE sha256 = $1",
            )
            .bind(&a.sha256)
            .bind(&new.sections)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if kept == 0 {
                tx.rollback().await?;
                return Err(super::Error::NotFound("the claimed blob row is gone".into()));
            }
            let inserted = sqlx::query(&format!(
                "INSERT INTO artifacts ({ARTIFACT_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                 ON CONFLICT (build_id, kind, sha256) DO UPDATE SET origin = excluded.origin, \
                 content_sha256 = excluded.content_sha256, owner = excluded.owner, \
                 file_name = excluded.file_name, created_at = excluded.created_at \
                 WHERE artifacts.origin = 'agent' AND excluded.origin <> 'agent'"
            ))
            .bind(&a.build_id)
            .bind(&a.kind)
            .bind(&a.sha256)
            .bind(a.size)
            .bind(a.quality)
            .bind(a.has_dwarf)
            .bind(a.has_symtab)
            .bind(a.has_dynsym)
            .bind(&a.architecture)
            .bind(&a.file_name)
            .bind(&a.origin)
            .bind(a.created_at)
            .bind(&a.owner)
            .bind(&a.content_sha256)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                > 0;
            // An agent's file's IDs lead to its key only for frames of its
            // content (`file_ids::keys_of`).
            let agent_content = if a.origin == "agent" {
                a.content_sha256.as_str()
            } else {
                ""
            };
            for (kind, id) in &new.file_ids {
                sqlx::query(
                    "INSERT INTO file_ids (id_kind, file_id, build_id, agent_content, created_at) \
                     VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (id_kind, file_id, build_id, agent_content) DO NOTHING",
                )
                .bind(kind.as_str())
                .bind(id)
                .bind(&a.build_id)
                .bind(agent_content)
                .bind(a.created_at)
                .execute(&mut *tx)
                .await?;
            }
            for chunk in new.source_names.chunks(500) {
                let mut sql = String::from("INSERT INTO source_names (build_id, path) VALUES ");
                for i in 0..chunk.len() {
                    if i > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("($1, ${})", i + 2));
                }
                sql.push_str(" ON CONFLICT (build_id, path) DO NOTHING");
                let mut q = sqlx::query(&sql).bind(&a.build_id);
                for path in chunk {
                    q = q.bind(path);
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(inserted)
        })
    }

    async fn source(&self, build_id: &str, path: &str) -> MetaResult<Option<SourceFile>> {
        let sql = "SELECT build_id, path, sha256, size, created_at, owner FROM sources \
                   WHERE build_id = $1 AND path = $2";
        on_pool!(self, p => sqlx::query_as::<_, SourceFile>(sql)
            .bind(build_id)
            .bind(path)
            .fetch_optional(p)
            .await)
    }

    async fn source_is_named(&self, build_id: &str, path: &str) -> MetaResult<bool> {
        let sql = "SELECT 1 FROM source_names WHERE build_id = $1 AND path = $2";
        on_pool!(self, p => sqlx::query(sql)
            .bind(build_id)
            .bind(path)
            .fetch_optional(p)
            .await
            .map(|r| r.is_some()))
    }

    async fn source_name_count(&self, build_id: &str) -> MetaResult<i64> {
        let sql = "SELECT COUNT(*) FROM source_names WHERE build_id = $1";
        on_pool!(self, p => sqlx::query_scalar::<_, i64>(sql).bind(build_id).fetch_one(p).await)
    }

    async fn commit_source(&self, s: &SourceFile, name_it: bool) -> MetaResult<()> {
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            // As in commit_artifact: only while the claimed row is there.
            if !blob_kept!(tx, &s.sha256) {
                tx.rollback().await?;
                return Err(super::Error::NotFound("the claimed blob row is gone".into()));
            }
            if name_it {
                sqlx::query(
                    "INSERT INTO source_names (build_id, path) VALUES ($1, $2) \
                     ON CONFLICT (build_id, path) DO NOTHING",
                )
                .bind(&s.build_id)
                .bind(&s.path)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "INSERT INTO sources (build_id, path, sha256, size, created_at, owner) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (build_id, path) DO UPDATE SET sha256 = excluded.sha256, \
                 size = excluded.size, created_at = excluded.created_at, owner = excluded.owner",
            )
            .bind(&s.build_id)
            .bind(&s.path)
            .bind(&s.sha256)
            .bind(s.size)
            .bind(s.created_at)
            .bind(&s.owner)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        })
    }

    async fn sources_of(&self, build_id: &str) -> MetaResult<Vec<SourceFile>> {
        let sql = "SELECT build_id, path, sha256, size, created_at, owner FROM sources \
                   WHERE build_id = $1 ORDER BY path";
        on_pool!(self, p => sqlx::query_as::<_, SourceFile>(sql).bind(build_id).fetch_all(p).await)
    }

    async fn missing(&self, items: &[WantedItem]) -> MetaResult<Vec<bool>> {
        let mut out = Vec::with_capacity(items.len());
        on_pool!(self, p => {
            let mut conn = p.acquire().await?;
            for item in items {
                // Claims are decided apart (`claims::claim`).
                let lacks = if item.claim.is_some() {
                    false
                } else if item.kind == "source" {
                    let path = symtrace_elf::canonical_path(item.path.as_deref().unwrap_or(""));
                    sqlx::query(
                        "SELECT 1 FROM sources WHERE build_id = $1 AND path = $2 AND sha256 = $3",
                    )
                    .bind(&item.build_id)
                    .bind(&path)
                    .bind(&item.sha256)
                    .fetch_optional(&mut *conn)
                    .await?
                    .is_none()
                } else {
                    // What agents published is no reason for CI not to
                    // upload: its files rank above them.
                    let same = sqlx::query(
                        "SELECT 1 FROM artifacts WHERE build_id = $1 AND kind = $2 AND sha256 = $3 \
                         AND origin <> 'agent'",
                    )
                    .bind(&item.build_id)
                    .bind(&item.kind)
                    .bind(&item.sha256)
                    .fetch_optional(&mut *conn)
                    .await?
                    .is_some();
                    let better = match item.quality {
                        Some(q) if !same => sqlx::query(
                            "SELECT 1 FROM artifacts WHERE build_id = $1 AND kind = $2 \
                             AND quality > $3 AND origin <> 'agent'",
                        )
                        .bind(&item.build_id)
                        .bind(&item.kind)
                        .bind(q)
                        .fetch_optional(&mut *conn)
                        .await?
                        .is_some(),
                        _ => false,
                    };
                    !same && !better
                };
                out.push(lacks);
            }
            Ok::<_, sqlx::Error>(())
        })?;
        Ok(out)
    }

    async fn list(&self, f: &ListFilter) -> MetaResult<Vec<Artifact>> {
        // The reader's tenants, in the query: a page is cut after them.
        let owners = match &f.owners {
            None => String::new(),
            Some(list) => {
                let marks: Vec<String> = (0..list.len()).map(|i| format!("${}", i + 6)).collect();
                if marks.is_empty() {
                    " AND owner = ''".to_owned()
                } else {
                    format!(" AND (owner = '' OR owner IN ({}))", marks.join(", "))
                }
            }
        };
        let sql = format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts \
             WHERE ($1 = '' OR build_id LIKE $1 || '%') AND ($2 = '' OR kind = $2) \
             AND ($3 = '' OR file_name LIKE '%' || $3 || '%'){owners} \
             ORDER BY created_at DESC, build_id, kind LIMIT $4 OFFSET $5"
        );
        let limit = f.limit.unwrap_or(100).clamp(1, 10_000);
        let offset = f.offset.unwrap_or(0).max(0);
        on_pool!(self, p => {
            let mut q = sqlx::query_as::<_, Artifact>(&sql)
                .bind(f.build_id.as_deref().unwrap_or(""))
                .bind(f.kind.as_deref().unwrap_or(""))
                .bind(f.file.as_deref().unwrap_or(""))
                .bind(limit)
                .bind(offset);
            for owner in f.owners.iter().flatten() {
                q = q.bind(owner);
            }
            q.fetch_all(p).await
        })
    }

    async fn find_files(&self, query: &FileQuery, limit: i64) -> MetaResult<Vec<Artifact>> {
        let (cond, value) = match query {
            FileQuery::Exact(v) => ("file_name = $1", v.clone()),
            FileQuery::Prefix(v) => ("file_name LIKE $1 || '%'", v.clone()),
            FileQuery::BuildId(v) => ("build_id = $1", v.clone()),
        };
        // Not agents' files: debuginfod clients cannot say which content
        // they hold, and are never served one.
        let sql = format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE {cond} AND origin <> 'agent' \
             ORDER BY build_id, kind, quality DESC LIMIT $2"
        );
        on_pool!(self, p => sqlx::query_as::<_, Artifact>(&sql)
            .bind(value)
            .bind(limit)
            .fetch_all(p)
            .await)
    }

    async fn delete(&self, build_id: &str, kind: Option<ArtifactKind>) -> MetaResult<u64> {
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            let mut removed = match kind {
                Some(kind) => sqlx::query("DELETE FROM artifacts WHERE build_id = $1 AND kind = $2")
                    .bind(build_id)
                    .bind(kind.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected(),
                None => sqlx::query("DELETE FROM artifacts WHERE build_id = $1")
                    .bind(build_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected(),
            };
            if kind.is_none() {
                removed += sqlx::query("DELETE FROM sources WHERE build_id = $1")
                    .bind(build_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query("DELETE FROM source_names WHERE build_id = $1")
                    .bind(build_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM file_ids WHERE build_id = $1")
                    .bind(build_id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(removed)
        })
    }

    async fn mark_orphans(&self, now: i64) -> MetaResult<u64> {
        // Indexes of files no artifact references any more go first; their
        // blobs are then unreferenced like any other.
        let stale = "DELETE FROM symbol_indexes WHERE NOT EXISTS \
                     (SELECT 1 FROM artifacts a WHERE a.sha256 = symbol_indexes.primary_sha256)";
        on_pool!(self, p => sqlx::query(stale).execute(p).await.map(|_| ()))?;
        let sql = "UPDATE blobs SET orphaned_at = $1 WHERE orphaned_at IS NULL \
                   AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM sources s WHERE s.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM symbol_indexes i WHERE i.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM profile_segments g WHERE g.sha256 = blobs.sha256)";
        on_pool!(self, p => sqlx::query(sql).bind(now).execute(p).await.map(|r| r.rows_affected()))
    }

    async fn symbol_index(&self, source_key: &str) -> MetaResult<Option<(String, i64)>> {
        let sql = "SELECT sha256, size FROM symbol_indexes WHERE source_key = $1";
        on_pool!(self, p => sqlx::query_as::<_, (String, i64)>(sql).bind(source_key).fetch_optional(p).await)
    }

    async fn commit_symbol_index(
        &self,
        source_key: &str,
        primary_sha256: &str,
        sha256: &str,
        size: i64,
        now: i64,
    ) -> MetaResult<()> {
        let sql = "INSERT INTO symbol_indexes (source_key, primary_sha256, sha256, size, created_at) \
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (source_key) DO UPDATE \
                   SET sha256 = excluded.sha256, size = excluded.size, created_at = excluded.created_at";
        on_pool!(self, p => sqlx::query(sql)
            .bind(source_key)
            .bind(primary_sha256)
            .bind(sha256)
            .bind(size)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ()))
    }

    async fn expired_orphans(&self, cutoff: i64) -> MetaResult<Vec<String>> {
        let sql = "SELECT sha256 FROM blobs WHERE orphaned_at IS NOT NULL AND orphaned_at < $1";
        on_pool!(self, p => sqlx::query_scalar::<_, String>(sql).bind(cutoff).fetch_all(p).await)
    }

    async fn delete_orphan<'a>(
        &'a self,
        sha256: &'a str,
        cutoff: i64,
        delete_object: futures::future::BoxFuture<'a, MetaResult<()>>,
    ) -> MetaResult<bool> {
        let sql = "DELETE FROM blobs WHERE sha256 = $1 AND orphaned_at IS NOT NULL \
                   AND orphaned_at < $2 \
                   AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM sources s WHERE s.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM symbol_indexes i WHERE i.sha256 = blobs.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM profile_segments g WHERE g.sha256 = blobs.sha256) \
                   RETURNING sha256";
        on_pool!(raw self, p => {
            let mut tx = p.begin().await?;
            let gone = sqlx::query_scalar::<_, String>(sql)
                .bind(sha256)
                .bind(cutoff)
                .fetch_optional(&mut *tx)
                .await?;
            if gone.is_none() {
                tx.rollback().await?;
                return Ok(false);
            }
            // The row stays locked while the object goes (one delete call);
            // if that fails, the rollback keeps the row for the next pass.
            delete_object.await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    async fn known_blobs(&self, hashes: &[String]) -> MetaResult<Vec<bool>> {
        // One query per 500 hashes (SQLite's and PostgreSQL's parameter
        // limits are far above that).
        let mut known = std::collections::HashSet::new();
        for chunk in hashes.chunks(500) {
            let list: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT sha256 FROM blobs WHERE sha256 IN ({})",
                list.join(", ")
            );
            let found: Vec<String> = on_pool!(self, p => {
                let mut q = sqlx::query_scalar::<_, String>(&sql);
                for h in chunk {
                    q = q.bind(h);
                }
                q.fetch_all(p).await
            })?;
            known.extend(found);
        }
        Ok(hashes.iter().map(|h| known.contains(h)).collect())
    }
}
