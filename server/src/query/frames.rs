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
    /// Per raw frame: its run of `expansion_items`.
    expansion_spans: Vec<(u32, u32)>,
    /// Shown frames of each raw frame, leaf (innermost) first.
    expansion_items: Vec<u32>,
    /// Build-IDs asked and how they answered (`ok`, `symbols_only`,
    /// `no_symbols`, `unknown_build_id`, `not_gnu`, `error: …`).
    pub build_ids: Vec<(String, String)>,
}

impl Resolved {
    pub fn new(raw_frames: usize) -> Self {
        Self {
            shown: IndexSet::default(),
            lines: Vec::new(),
            expansion_spans: vec![(0, 0); raw_frames],
            expansion_items: Vec::with_capacity(raw_frames * 2),
            build_ids: Vec::new(),
        }
    }

    /// The shown frames of a raw frame, leaf first.
    pub fn expansion(&self, raw: u32) -> &[u32] {
        let (start, len) = self.expansion_spans[raw as usize];
        &self.expansion_items[start as usize..(start + len) as usize]
    }

    #[cfg(test)]
    pub fn push_expansion(&mut self, raw: u32, shown: &[u32]) {
        let start = self.expansion_items.len();
        self.expansion_items.extend_from_slice(shown);
        self.expand(raw, start);
    }

    /// Sets a raw frame's shown frames to what was pushed since `start`.
    fn expand(&mut self, raw: u32, start: usize) {
        self.expansion_spans[raw as usize] =
            (start as u32, (self.expansion_items.len() - start) as u32);
    }

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

    let named_at = std::time::Instant::now();
    let native = agg.intern("native");
    let inlined = agg.intern("inlined");
    let unsymbolized = agg.intern("unsymbolized");
    let mut out = Resolved::new(agg.frames.len());
    // (function, file) of the shared names, by pointer, with the kind and
    // build-ID → shown frame: one lookup per frame, no string hashing.
    let mut by_pointer: FxHashMap<(*const u8, *const u8, u32, u32), u32> = FxHashMap::default();
    for (b, build_id, frames, status, found) in answers {
        out.build_ids.push((build_id, status));
        by_pointer.reserve(frames.len());
        for ((frame, _), named) in frames.iter().zip(found) {
            let start = out.expansion_items.len();
            if let Some(named) = named {
                let n = named.len();
                for (depth, fr) in named.iter().enumerate() {
                    let kind = if depth + 1 < n { inlined } else { native };
                    let key = (fr.function.as_ptr(), fr.file.as_ptr(), kind, b);
                    let shown = match by_pointer.get(&key) {
                        Some(&shown) => shown,
                        None => {
                            let shown = Shown {
                                name: agg.intern(&fr.function),
                                file: agg.intern(&fr.file),
                                kind,
                                build_id: b,
                            };
                            let id = out.add(shown, fr.line);
                            by_pointer.insert(key, id);
                            id
                        }
                    };
                    out.expansion_items.push(shown);
                }
            }
            if out.expansion_items.len() == start {
                let raw = agg.frames[*frame as usize].clone();
                let shown = unnamed(agg, &mut out, &raw, unsymbolized);
                out.expansion_items.push(shown);
            }
            out.expand(*frame, start);
        }
    }
    tracing::debug!(
        expand_ms = named_at.elapsed().as_millis() as u64,
        "native frames expanded"
    );
    // Frames the sender named, and native frames without a build-ID.
    for i in 0..agg.frames.len() {
        if out.expansion_spans[i].1 != 0 {
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
        let start = out.expansion_items.len();
        out.expansion_items.extend(shown);
        out.expand(i as u32, start);
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
