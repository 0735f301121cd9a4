//! Files known by an ID other than a GNU build-ID, and agents' claims to
//! publish what no CI uploaded.
//!
//! A profiler names a file by its GNU build-ID, or — for a file without
//! one, a plain `go build` for instance — by its htlhash (the
//! OpenTelemetry eBPF profiler's file ID) or its Go build-ID. The store
//! keeps every file under one key (its GNU build-ID, else the key of its Go
//! build-ID, else its htlhash: `ElfInfo::storage_key`) and indexes it by
//! its other IDs too ([`key_of`]).
//!
//! An agent that samples a file the server has no symbols for asks, in a
//! `missing` request, to *claim* it: the claim is granted to one agent of
//! the fleet at a time, for [`CLAIM_MS`] (a lease named after the key), so
//! that a file is uploaded once, not once per host; if that agent never
//! finishes, the lease runs out and another may.

use symtrace_elf::BuildId;
use symtrace_profiles::model::BuildIdKind;

use crate::error::{ApiError, ApiResult};
use crate::store::model::{now_ms, WantedItem};
use crate::store::SymbolStore;

/// How long a granted claim keeps other agents from uploading the file.
pub const CLAIM_MS: i64 = 10 * 60 * 1000;
/// Longest claimant name.
const MAX_HOLDER: usize = 200;

fn lease_name(key: &str) -> String {
    format!("upload:{key}")
}

/// The key under which files known by `id` (of `kind`) are stored: the
/// GNU build-ID itself, else the newest key the ID leads to. `None` when no
/// such file is stored (or the ID is malformed).
pub async fn key_of(
    store: &SymbolStore,
    kind: BuildIdKind,
    id: &str,
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
    let keys = store.meta.keys_of(kind, id).await?;
    Ok(keys.into_iter().find_map(|k| k.parse().ok()))
}

/// Whether an agent holds a claim to publish the file stored (or to be
/// stored) under `key`.
pub async fn pending(store: &SymbolStore, key: &str) -> crate::store::Result<bool> {
    store.meta.lease_held(&lease_name(key), now_ms()).await
}

/// Checks a claim item's fields (`build_id` of its `id_kind`, the holder).
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

/// Decides a (validated) claim: `Some(key)` — upload under that key — when
/// nothing of the item's quality or better is stored for the file and no
/// other agent holds a claim on it; the claim is then this holder's.
pub async fn claim(store: &SymbolStore, item: &WantedItem) -> ApiResult<Option<String>> {
    let kind = match item.id_kind.as_deref() {
        Some("htlhash") => BuildIdKind::Htlhash,
        _ => BuildIdKind::Gnu,
    };
    let key = match key_of(store, kind, &item.build_id).await? {
        Some(key) => key.to_string(),
        None if kind == BuildIdKind::Htlhash => item.build_id.clone(),
        None => return Err(ApiError::bad_request("invalid build-ID")),
    };
    let wanted = item.quality.unwrap_or(0);
    let stored = store.meta.artifacts_of(&key).await?;
    if stored.iter().any(|a| a.quality >= wanted) {
        return Ok(None);
    }
    let holder = item.claim.as_deref().unwrap_or("");
    let granted = store
        .meta
        .acquire_lease(&lease_name(&key), holder, now_ms(), CLAIM_MS)
        .await?;
    Ok(granted.then_some(key))
}
