//! Files known by an ID other than a GNU build-ID, and agents' claims to
//! publish what no CI uploaded.
//!
//! A profiler names a file by its GNU build-ID, or — for a file without
//! one, a plain `go build` for instance — by its htlhash (the
//! OpenTelemetry eBPF profiler's file ID) or its Go build-ID. The store
//! keeps every file under one key (its GNU build-ID, else the key of its Go
//! build-ID, else its htlhash: `ElfInfo::storage_key`) and indexes it by
//! its other IDs too ([`key_of`]). A key an agent's file brought leads
//! there only for frames of that file's content: a file with a fresh
//! build-ID and a copied Go build-ID note names nobody else's frames.
//!
//! An agent that samples a file the server has no symbols for asks, in a
//! `missing` request, to *claim* it: the claim is granted to one agent of
//! the fleet at a time, for [`CLAIM_MS`] (a lease named after the key and
//! the file's content), so that a file is uploaded once, not once per
//! host; if that agent never finishes, the lease runs out and another may.
//! A file of other content under the same ID (a forgery, or a rebuild that
//! kept its ID) is another claim: a forger's file never keeps the real one
//! from being published.

use symtrace_elf::BuildId;
use symtrace_profiles::model::BuildIdKind;

use crate::store::model::{now_ms, WantedItem};
use crate::store::SymbolStore;
pub use symtrace_wire::missing::MissingItem;

/// How long a granted claim keeps other agents from uploading the file.
pub const CLAIM_MS: i64 = 10 * 60 * 1000;
/// Longest claimant name.
const MAX_HOLDER: usize = 200;

/// The lease of a claim: `upload:KEY`, and `:CONTENT` when the claim named
/// the file's content.
pub fn lease_name(key: &str, content: Option<&str>) -> String {
    match content {
        Some(c) => format!("upload:{key}:{c}"),
        None => format!("upload:{key}"),
    }
}

/// The key under which files known by `id` (of `kind`) are stored: the
/// GNU build-ID itself, else the newest key the ID leads to — among CI's
/// and upstream files first, else among agents' files of `content` (the
/// frame's mapping's content hash). `None` when no such file is stored
/// (or the ID is malformed).
pub async fn key_of(
    store: &SymbolStore,
    kind: BuildIdKind,
    id: &str,
    content: Option<&str>,
) -> crate::store::Result<Option<BuildId>> {
    let well_formed = match kind {
        BuildIdKind::Gnu => return Ok(id.parse().ok()),
        BuildIdKind::Htlhash => symtrace_elf::is_htlhash(id),
        BuildIdKind::Go => symtrace_elf::is_go_build_id(id),
        BuildIdKind::None => false,
    };
    if !well_formed {
        return Ok(None);
    }
    let keys = store.meta.keys_of(kind, id, content.unwrap_or("")).await?;
    Ok(keys.into_iter().find_map(|k| k.parse().ok()))
}

/// Whether an agent holds a claim to publish a file stored (or to be
/// stored) under `key`.
pub async fn pending(store: &SymbolStore, key: &str) -> crate::store::Result<bool> {
    store
        .meta
        .lease_held(&lease_name(key, None), now_ms())
        .await
}

/// Checks a claim item's fields (`build_id` of its `id_kind`, the holder,
/// the content hash).
pub fn validate(item: &WantedItem) -> Result<(), String> {
    let holder = item.claim.as_deref().unwrap_or("");
    if holder.is_empty() || holder.len() > MAX_HOLDER {
        return Err(format!(
            "claim must name its holder in 1 to {MAX_HOLDER} bytes"
        ));
    }
    if !matches!(item.kind.as_str(), "executable" | "debuginfo") {
        return Err("a claim is for an executable or debuginfo".into());
    }
    if let Some(c) = &item.content_sha256 {
        if !crate::store::is_sha256_hex(c) {
            return Err("content_sha256 is 64 lowercase hex digits".into());
        }
    }
    match item.id_kind.as_deref().unwrap_or("gnu") {
        "gnu" => item
            .build_id
            .parse::<BuildId>()
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "htlhash" if symtrace_elf::is_htlhash(&item.build_id) => Ok(()),
        "htlhash" => Err("an htlhash is 32 lowercase hex digits".into()),
        other => Err(format!("unknown id_kind {other:?}: use gnu or htlhash")),
    }
}

/// What a (validated) claim's `build_id` is.
fn id_kind(item: &WantedItem) -> BuildIdKind {
    match item.id_kind.as_deref() {
        Some("htlhash") => BuildIdKind::Htlhash,
        _ => BuildIdKind::Gnu,
    }
}

/// Whether a CI or upstream file of the (validated) probe's ID, of its
/// quality or better, is stored: what names the frames of every file of
/// that ID, whatever its content, so the agent asking needs no content
/// hash of its own file (ADR 0003). Files of agents do not count: they
/// name only mappings of their own content.
pub async fn vouched(store: &SymbolStore, item: &WantedItem) -> crate::store::Result<bool> {
    let kind = id_kind(item);
    let Some(key) = key_of(store, kind, &item.build_id, None).await? else {
        return Ok(false);
    };
    let wanted = item.quality.unwrap_or(0);
    let stored = store.meta.artifacts_of(key.as_ref()).await?;
    Ok(stored
        .iter()
        .any(|a| a.origin != "agent" && a.quality >= wanted))
}

/// Why a claim could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The item's build-ID is not one (the request's fault).
    #[error("invalid build-ID")]
    InvalidBuildId,
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Decides a (validated) claim: `Some(key)` — upload under that key — when
/// nothing of the item's quality or better that names its frames is
/// stored (a CI or upstream file of its ID, or an agent's of its
/// content), and no other agent holds a claim on it; the claim is then
/// this holder's.
pub async fn claim(
    store: &SymbolStore,
    item: &WantedItem,
    caller: &str,
) -> Result<Option<String>, ClaimError> {
    let kind = id_kind(item);
    let content = item.content_sha256.as_deref();
    let key = match key_of(store, kind, &item.build_id, content).await? {
        Some(key) => key.to_string(),
        None if kind == BuildIdKind::Htlhash => item.build_id.clone(),
        None => return Err(ClaimError::InvalidBuildId),
    };
    let wanted = item.quality.unwrap_or(0);
    let stored = store.meta.artifacts_of(&key).await?;
    // What would name the file's frames: a CI or upstream file, an agent's
    // whole file of this content (its hash checked here), and — for a
    // claim of an extract (`kind` debuginfo: the agent will send one) —
    // an agent's extract said to be of this content. An extract is only
    // the uploader's word: it never stands in the way of a whole file.
    let extract = item.kind == "debuginfo";
    let names_it = |a: &&crate::store::model::Artifact| {
        a.origin != "agent"
            || match content {
                Some(c) => a.content_sha256 == c && (a.kind == "executable" || extract),
                // (An agent that sends no content hash: its file will be
                // bound to its own bytes.)
                None => true,
            }
    };
    if stored.iter().filter(names_it).any(|a| a.quality >= wanted) {
        return Ok(None);
    }
    // The holder's name within its token's: one token's agents cannot
    // renew or take another's claims.
    let holder = format!("{caller}/{}", item.claim.as_deref().unwrap_or(""));
    let holder = holder.as_str();
    let granted = store
        .meta
        .acquire_lease(&lease_name(&key, content), holder, now_ms(), CLAIM_MS)
        .await?;
    if granted && content.is_some() {
        // The claim of the file's key too (what `pending` looks for):
        // renewed by any holder, released with the upload.
        store
            .meta
            .acquire_lease(&lease_name(&key, None), holder, now_ms(), CLAIM_MS)
            .await?;
    }
    Ok(granted.then_some(key))
}

/// The answer to a (validated) `missing` request: the items the server
/// lacks — a CI item not stored, a claim granted to `caller`, a probe of a
/// file no CI or upstream file vouches for. `bound_owner`: the tenant a
/// bound publisher publishes for, which is told a source is there only
/// when it or everyone published it (another tenant's file is neither
/// confirmed to it nor a reason not to upload its own).
pub async fn answer(
    store: &SymbolStore,
    items: Vec<WantedItem>,
    caller: &str,
    bound_owner: Option<&str>,
) -> Result<Vec<MissingItem>, ClaimError> {
    if items.iter().any(|i| i.claim.is_some()) {
        sweep(store).await;
    }
    let mut lacks = store.meta.missing(&items).await?;
    let mut upload_as = vec![None; items.len()];
    for (i, item) in items.iter().enumerate() {
        if item.claim.is_some() && item.probe {
            lacks[i] = !vouched(store, item).await?;
        } else if item.claim.is_some() {
            upload_as[i] = claim(store, item, caller).await?;
            lacks[i] = upload_as[i].is_some();
        }
    }
    if let Some(owner) = bound_owner {
        for (item, lacks) in items.iter().zip(lacks.iter_mut()) {
            if *lacks || item.kind != "source" {
                continue;
            }
            let path = item.path.as_deref().unwrap_or("");
            let theirs = store.meta.source(&item.build_id, path).await?;
            if theirs.is_some_and(|s| !s.owner.is_empty() && s.owner != owner) {
                *lacks = true;
            }
        }
    }
    Ok(items
        .into_iter()
        .zip(lacks)
        .zip(upload_as)
        .enumerate()
        .filter(|(_, ((_, lacks), _))| *lacks)
        .map(|(index, ((item, _), upload_as))| MissingItem {
            index,
            item,
            upload_as,
        })
        .collect())
}

/// Deletes the claims that ran out, at most once a minute per replica (the
/// `missing` handler calls it; the orphan collector does too).
pub async fn sweep(store: &SymbolStore) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_ms();
    let last = LAST.load(Ordering::Relaxed);
    if now - last < 60_000
        || LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    match store.meta.delete_expired_claims(now).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(n, "expired claims deleted"),
        Err(e) => tracing::warn!(error = %e, "deleting expired claims"),
    }
}

/// The agent's upload of `key` (of `content`) is stored: its claims end.
pub async fn done(store: &SymbolStore, key: &str, content: Option<&str>) {
    for name in [lease_name(key, content), lease_name(key, None)] {
        if let Err(e) = store.meta.drop_lease(&name).await {
            tracing::warn!(lease = %name, error = %e, "releasing a claim");
        }
    }
}
