//! From stored frames to the frames a flamegraph shows: native frames go
//! through the symbolizer (one batch per build-ID, inline frames expanded),
//! named ones keep their names, and what cannot be named shows as
//! `module+0xaddress` with its build-ID — never dropped.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use indexmap::IndexSet;
use rustc_hash::{FxBuildHasher, FxHashMap};
use symtrace_elf::BuildId;

use super::aggregate::{Aggregate, RawFrame};
use super::names::{self, Frames, NameCache};
use crate::federation::Forwarding;
use crate::profiles::model::BuildIdKind;
use crate::symbolize::{Outcome, SymbolizeService};

/// A frame as shown. Lines are not part of the identity, so a function
/// is one node whatever line of it was sampled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shown {
    pub name: u32,
    pub file: u32,
    /// `native`, `inlined`, `kernel`, `unsymbolized`, … (a string index).
    pub kind: u32,
    /// For native frames: the build-ID (a string index, 0 = none).
    pub build_id: u32,
}

/// Every raw frame of an aggregate, resolved.
pub struct Resolved {
    pub shown: IndexSet<Shown, FxBuildHasher>,
    /// The first line seen per shown frame.
    pub lines: Vec<u32>,
    /// Per raw frame: shown frames, leaf (innermost) first.
    pub expansion: Vec<Vec<u32>>,
    /// Build-IDs asked and how they answered (`ok`, `symbols_only`,
    /// `no_symbols`, `unknown_build_id`, `not_gnu`, `error: …`).
    pub build_ids: Vec<(String, String)>,
}

impl Resolved {
    fn add(&mut self, shown: Shown, line: u32) -> u32 {
        let (i, new) = self.shown.insert_full(shown);
        if new {
            self.lines.push(line);
        }
        i as u32
    }
}

/// One build-ID's frames: (build-ID string index, build-ID, (raw frame,
/// address) pairs).
type Job = (u32, String, Vec<(u32, u64)>);

/// Parallel symbolizer calls per query (each uses the symbolizer's own
/// per-core limit).
const PARALLEL_BUILD_IDS: usize = 4;

/// The frames of each address of one build-ID (cached ones from `names`,
/// the others from the symbolizer), and how the build-ID answered.
async fn names_of(
    build_id: &str,
    kind: BuildIdKind,
    addresses: &[u64],
    symbolizer: &Arc<SymbolizeService>,
    names: &NameCache,
    from: &Forwarding,
) -> (String, Vec<Option<Frames>>) {
    let none = || vec![None; addresses.len()];
    let parsed = match (kind, build_id.parse::<BuildId>()) {
        (BuildIdKind::Gnu, Ok(parsed)) => parsed,
        _ => return ("not_gnu".to_owned(), none()),
    };
    let key = match symbolizer.source_key(&parsed, from).await {
        Ok(Some(key)) => key,
        Ok(None) => return ("unknown_build_id".to_owned(), none()),
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
        return (status.unwrap_or("ok").to_owned(), found);
    }
    let outcome = match symbolizer.symbolize(&parsed, missing.clone(), from).await {
        Ok(o) => o,
        Err(e) => return (error(build_id, e), found),
    };
    let (best, answers) = match outcome {
        Outcome::Unknown => return ("unknown_build_id".to_owned(), found),
        Outcome::Answered { best, answers, .. } => (best, answers),
    };
    let status = match best {
        Some(symtrace_symbolize::Source::Dwarf) => "ok",
        Some(_) => "symbols_only",
        None => "no_symbols",
    };
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
    let mut fresh = names.insert(build_id, &key, status, answers).into_iter();
    for slot in found.iter_mut().filter(|f| f.is_none()) {
        *slot = fresh.next();
    }
    (status.to_owned(), found)
}

fn error(build_id: &str, e: impl std::fmt::Display) -> String {
    tracing::warn!(build_id, error = %e, "symbolizing a query's frames failed");
    format!("error: {e}")
}

pub async fn resolve(
    agg: &mut Aggregate,
    symbolizer: &Arc<SymbolizeService>,
    names: &NameCache,
    from: &Forwarding,
) -> Resolved {
    // Addresses per build-ID.
    let mut by_build_id: FxHashMap<u32, Vec<(u32, u64)>> = FxHashMap::default();
    for (i, f) in agg.frames.iter().enumerate() {
        if f.is_native_unsymbolized() {
            by_build_id
                .entry(f.build_id)
                .or_default()
                .push((i as u32, f.address));
        }
    }
    let jobs: Vec<Job> = by_build_id
        .into_iter()
        .map(|(b, frames)| (b, agg.str(b).to_owned(), frames))
        .collect();
    let answers: Vec<_> = stream::iter(jobs)
        .map(|(b, build_id, frames)| {
            let kind = agg.frames[frames[0].0 as usize].build_id_kind;
            async move {
                let addresses: Vec<u64> = frames.iter().map(|&(_, a)| a).collect();
                let (status, found) =
                    names_of(&build_id, kind, &addresses, symbolizer, names, from).await;
                (b, build_id, frames, status, found)
            }
        })
        .buffer_unordered(PARALLEL_BUILD_IDS)
        .collect()
        .await;

    let native = agg.intern("native");
    let inlined = agg.intern("inlined");
    let unsymbolized = agg.intern("unsymbolized");
    let mut out = Resolved {
        shown: IndexSet::default(),
        lines: Vec::new(),
        expansion: vec![Vec::new(); agg.frames.len()],
        build_ids: Vec::new(),
    };
    // Shared names → this query's string numbers, by pointer.
    let mut interned: FxHashMap<*const u8, u32> = FxHashMap::default();
    let mut intern = |agg: &mut Aggregate, s: &Arc<str>| -> u32 {
        *interned.entry(s.as_ptr()).or_insert_with(|| agg.intern(s))
    };
    for (b, build_id, frames, status, found) in answers {
        out.build_ids.push((build_id, status));
        for ((frame, _), named) in frames.iter().zip(found) {
            let mut shown = Vec::new();
            if let Some(named) = named {
                let n = named.len();
                for (depth, fr) in named.iter().enumerate() {
                    let name = intern(agg, &fr.function);
                    let file = intern(agg, &fr.file);
                    let kind = if depth + 1 < n { inlined } else { native };
                    shown.push(out.add(
                        Shown {
                            name,
                            file,
                            kind,
                            build_id: b,
                        },
                        fr.line,
                    ));
                }
            }
            if shown.is_empty() {
                let raw = agg.frames[*frame as usize].clone();
                shown.push(unnamed(agg, &mut out, &raw, unsymbolized));
            }
            out.expansion[*frame as usize] = shown;
        }
    }
    // Frames the sender named, and native frames without a build-ID.
    for i in 0..agg.frames.len() {
        if !out.expansion[i].is_empty() {
            continue;
        }
        let raw = agg.frames[i].clone();
        let mut shown = Vec::new();
        for &(function, system_name, file, line) in raw.lines.iter() {
            let name = if agg.str(function).is_empty() {
                system_name
            } else {
                function
            };
            if agg.str(name).is_empty() {
                continue;
            }
            shown.push(out.add(
                Shown {
                    name,
                    file,
                    kind: raw.kind,
                    build_id: raw.build_id,
                },
                line.clamp(0, u32::MAX as i64) as u32,
            ));
        }
        if shown.is_empty() {
            shown.push(unnamed(agg, &mut out, &raw, unsymbolized));
        }
        out.expansion[i] = shown;
    }
    out
}

/// `module+0xaddress`: the mapping's file name (or the build-ID when the
/// sender gave no name) and the ELF virtual address.
fn unnamed(agg: &mut Aggregate, out: &mut Resolved, raw: &RawFrame, kind: u32) -> u32 {
    let module = agg.str(raw.module);
    let module = module.rsplit('/').next().unwrap_or(module);
    let module = if !module.is_empty() {
        module.to_owned()
    } else if raw.build_id != 0 {
        let b = agg.str(raw.build_id);
        b[..b.len().min(16)].to_owned()
    } else {
        agg.str(raw.kind).to_owned()
    };
    let name = agg.intern(&format!("{module}+{:#x}", raw.address));
    out.add(
        Shown {
            name,
            file: 0,
            kind,
            build_id: raw.build_id,
        },
        0,
    )
}
