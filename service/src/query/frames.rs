//! Naming a query's native frames: the distinct addresses of each
//! build-ID go to the symbolizer once (cached names first), and
//! [`Resolved::build`] turns the answers into shown frames.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use symtrace_profiles::aggregate::Aggregate;
use symtrace_profiles::model::BuildIdKind;
use symtrace_profiles::resolved::{
    native_jobs, BuildIdStatus, Frames, NativeAnswer, NativeJob, Resolved,
};

use super::names::{self, NameCache};
use crate::claims;
use crate::federation::Forwarding;
use crate::store::SymbolStore;
use crate::symbolize::{Outcome, SymbolizeService};

/// Parallel symbolizer calls per query (each uses the symbolizer's own
/// per-core limit).
const PARALLEL_BUILD_IDS: usize = 4;

/// The frames of each address of one build-ID (cached ones from `names`,
/// the others from the symbolizer), and how the build-ID answered.
#[allow(clippy::too_many_arguments)]
async fn names_of(
    build_id: &str,
    kind: BuildIdKind,
    content: Option<&str>,
    addresses: &[u64],
    symbolizer: &Arc<SymbolizeService>,
    names: &NameCache,
    from: &Forwarding,
) -> (BuildIdStatus, Vec<Option<Frames>>) {
    let none = || vec![None; addresses.len()];
    let store = symbolizer.store();
    // A file without a GNU build-ID is found by its other ID (htlhash, Go).
    let parsed = match claims::key_of(store, kind, build_id, content).await {
        Ok(Some(key)) => key,
        Ok(None) => return (unknown(store, kind, build_id).await, none()),
        Err(e) => return (error(build_id, e), none()),
    };
    let key = match symbolizer.source_key(&parsed, content, from).await {
        Ok(Some(key)) => key,
        Ok(None) => return (unknown(store, kind, parsed.as_str()).await, none()),
        Err(e) => return (error(build_id, e), none()),
    };
    let (mut found, status) = names.get(build_id, &key, addresses);
    let missing: Vec<u64> = addresses
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(&a, _)| a)
        .collect();
    if missing.is_empty() {
        return (status.unwrap_or(BuildIdStatus::Ok), found);
    }
    let outcome = match symbolizer
        .symbolize(&parsed, content, missing.clone(), from)
        .await
    {
        Ok(o) => o,
        Err(e) => return (error(build_id, e), found),
    };
    let (best, answers) = match outcome {
        Outcome::Unknown => return (BuildIdStatus::UnknownBuildId, found),
        Outcome::Answered { best, answers, .. } => (best, answers),
    };
    let status = crate::symbolize::status_of(best);
    let answers: Vec<names::Answer> = missing
        .iter()
        .zip(answers)
        .map(|(&address, answer)| {
            let frames = match answer {
                Ok((_, frames)) => frames
                    .into_iter()
                    .filter_map(|f| Some((f.function?, f.file.unwrap_or_default(), f.line)))
                    .collect(),
                Err(_) => Vec::new(),
            };
            (address, frames)
        })
        .collect();
    let mut fresh = names
        .insert(build_id, &key, status.clone(), answers)
        .into_iter();
    for slot in found.iter_mut().filter(|f| f.is_none()) {
        *slot = fresh.next();
    }
    (status, found)
}

/// The status of a file nothing is stored for: an agent may be publishing
/// it (`upload_pending`), else `unknown_build_id`.
async fn unknown(store: &SymbolStore, kind: BuildIdKind, key: &str) -> BuildIdStatus {
    let pending = matches!(kind, BuildIdKind::Gnu | BuildIdKind::Htlhash)
        && claims::pending(store, key).await.unwrap_or(false);
    if pending {
        BuildIdStatus::UploadPending
    } else {
        BuildIdStatus::UnknownBuildId
    }
}

fn error(build_id: &str, e: impl std::fmt::Display) -> BuildIdStatus {
    tracing::warn!(build_id, error = %e, "symbolizing a query's frames failed");
    BuildIdStatus::Error(e.to_string())
}

/// Names every frame of `agg`.
pub async fn resolve(
    agg: &mut Aggregate,
    symbolizer: &Arc<SymbolizeService>,
    names: &NameCache,
    from: &Forwarding,
) -> Resolved {
    let answers: Vec<NativeAnswer> = stream::iter(native_jobs(agg))
        .map(|job: NativeJob| async move {
            let (status, found) = names_of(
                &job.build_id_text,
                job.kind,
                job.content.as_deref(),
                &job.addresses(),
                symbolizer,
                names,
                from,
            )
            .await;
            NativeAnswer { job, status, found }
        })
        .buffer_unordered(PARALLEL_BUILD_IDS)
        .collect()
        .await;
    let named_at = std::time::Instant::now();
    let out = Resolved::build(agg, answers);
    tracing::debug!(
        expand_ms = named_at.elapsed().as_millis() as u64,
        "frames resolved"
    );
    out
}
