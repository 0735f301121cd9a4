//! Builds a symbol index from DWARF and symbol tables.
//!
//! One pass over the compile units, each parsed once and dropped: the line
//! program becomes rows, the `subprogram`/`inlined_subroutine` DIEs become
//! nested address intervals, and a sweep over every boundary address emits
//! `(start, entry)` ranges (see `units.rs`). Only the deduplicated tables
//! (scopes, locations, functions, files, strings) and the ranges outlive a
//! unit, so memory grows
//! with the index, not with the DWARF. Names are demangled once per distinct
//! function here, never at lookup.

use gimli::UnitRef;
use rustc_hash::FxHashMap;

use super::blocks::{self, Entry};
use super::format::{self, Location, Scope, StrRef, SymbolEntry, NONE};
use super::units::{all_unit_headers, RefResolver, UnitBuilder};
use crate::elf::LoadedDwarf;
use crate::symtab::SymbolTable;
use crate::{demangle, Error, Inputs, Source};

/// What a build produced, besides the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Compile units read.
    pub units: usize,
    /// Compile units skipped because their DWARF is malformed.
    pub bad_units: usize,
    /// Address ranges in the index.
    pub ranges: usize,
    /// Distinct scopes (function + call site chain).
    pub scopes: usize,
    /// Distinct call-site locations.
    pub locations: usize,
    /// Distinct functions.
    pub functions: usize,
}

/// Builds the index for `inputs`; see [`build_with_stats`].
pub fn build(inputs: &Inputs<'_>) -> Result<Vec<u8>, Error> {
    build_with_stats(inputs).map(|(bytes, _)| bytes)
}

/// Builds the index for `inputs` and says what went into it. Malformed
/// compile units are skipped (and counted); an unreadable ELF file is an
/// error.
pub fn build_with_stats(inputs: &Inputs<'_>) -> Result<(Vec<u8>, BuildStats), Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    build_with_threads(inputs, threads)
}

/// [`build_with_stats`] on `threads` threads: the compile units are cut into
/// that many contiguous shares of about equal size, each turned into its own
/// tables, which are then merged into the first share's (the output depends
/// only on the inputs and the thread count).
pub fn build_with_threads(
    inputs: &Inputs<'_>,
    threads: usize,
) -> Result<(Vec<u8>, BuildStats), Error> {
    let loaded = LoadedDwarf::load(inputs)?;
    let symbols = SymbolTable::load(inputs)?;
    let mut stats = BuildStats::default();
    let has_dwarf = loaded.primary.has_debug_info();
    let mut shares: Vec<Share> = Vec::new();
    if has_dwarf {
        let dwarf = loaded.dwarf();
        // Read once: the workers take their compile units from these, and
        // resolve references into any unit (partial ones included) by them.
        let (all, broken) = all_unit_headers(&dwarf);
        let sup = dwarf
            .sup()
            .map(|d| all_unit_headers(d).0)
            .unwrap_or_default();
        stats.bad_units += usize::from(broken);
        let compile: Vec<Header<'_>> = all
            .iter()
            .filter(|h| {
                !matches!(
                    h.type_(),
                    gimli::UnitType::Partial | gimli::UnitType::Type { .. }
                )
            })
            .copied()
            .collect();
        let parts = split_by_size(&compile, threads.max(1));
        let (dwarf, all, sup) = (&dwarf, &all[..], &sup[..]);
        shares = std::thread::scope(|scope| {
            let workers: Vec<_> = parts
                .iter()
                .map(|part| scope.spawn(move || build_share(dwarf, part, all, sup)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("index worker panicked"))
                .collect()
        });
    }
    let mut shares = shares.into_iter();
    let mut first = shares.next().unwrap_or_default();
    for share in shares {
        first.absorb(share);
    }
    let Share {
        mut tables,
        ranges,
        units,
        bad_units,
    } = first;
    stats.units += units;
    stats.bad_units += bad_units;
    let symbol_entries = tables.symbols(&symbols);
    let ranges = finish_ranges(ranges);
    stats.ranges = ranges.len();
    stats.scopes = tables.scopes.len();
    stats.locations = tables.locations.len();
    stats.functions = tables.functions.len();
    let mut flags = 0;
    if symbols.source == Some(Source::Dynsym) {
        flags |= format::FLAG_DYNSYM;
    }
    if has_dwarf {
        flags |= format::FLAG_DWARF;
    }
    let bytes = tables.write(flags, &ranges, &symbol_entries)?;
    Ok((bytes, stats))
}

type Header<'a> = gimli::UnitHeader<crate::elf::Reader<'a>>;

/// Contiguous runs of units of about equal total size.
fn split_by_size<'h, 'a>(headers: &'h [Header<'a>], parts: usize) -> Vec<&'h [Header<'a>]> {
    let total: usize = headers.iter().map(|h| h.length_including_self()).sum();
    let mut out = Vec::with_capacity(parts);
    let mut from = 0;
    let mut size = 0;
    for (i, h) in headers.iter().enumerate() {
        size += h.length_including_self();
        if out.len() + 1 < parts && size * parts >= total * (out.len() + 1) {
            out.push(&headers[from..=i]);
            from = i + 1;
        }
    }
    out.push(&headers[from..]);
    out
}

/// One thread's part of the build.
#[derive(Default)]
struct Share {
    tables: Tables,
    ranges: Vec<(u64, Entry)>,
    units: usize,
    bad_units: usize,
}

/// Builds the units `headers`; `all` and `sup` are every unit header of
/// the file and of its supplementary file, for references.
fn build_share<'a>(
    dwarf: &gimli::Dwarf<crate::elf::Reader<'a>>,
    headers: &[Header<'a>],
    all: &[Header<'a>],
    sup: &[Header<'a>],
) -> Share {
    let mut share = Share::default();
    let mut refs = RefResolver::new(dwarf, all, sup);
    for &header in headers {
        share.units += 1;
        let Ok(unit) = dwarf.unit(header) else {
            share.bad_units += 1;
            continue;
        };
        let before = share.ranges.len();
        let unit = UnitRef::new(dwarf, &unit);
        if UnitBuilder::new(unit, &mut share.tables, &mut refs)
            .run(&mut share.ranges)
            .is_err()
        {
            share.ranges.truncate(before);
            share.bad_units += 1;
        }
    }
    share
}

impl Share {
    /// Merges another share's tables and ranges into this one, renumbering
    /// its ids.
    fn absorb(&mut self, other: Share) {
        let Share {
            tables: theirs,
            ranges,
            units,
            bad_units,
        } = other;
        self.units += units;
        self.bad_units += bad_units;
        let ours = &mut self.tables;
        let str_of = |r: StrRef| {
            let start = r.offset as usize;
            std::str::from_utf8(&theirs.strings[start..start + r.len as usize]).unwrap_or("")
        };
        let files: Vec<u32> = theirs.files.iter().map(|&f| ours.file(str_of(f))).collect();
        let functions: Vec<u32> = theirs
            .functions
            .iter()
            .map(|f| {
                let raw = (f.raw != NONE).then(|| &*theirs.raws[f.raw as usize]);
                ours.function_parts(str_of(f.name), raw)
            })
            .collect();
        let map = |ids: &[u32], id: u32| if id == NONE { NONE } else { ids[id as usize] };
        let mut locations = Vec::with_capacity(theirs.locations.len());
        for l in &theirs.locations {
            let id = ours.location(Location {
                function: map(&functions, l.function),
                file: map(&files, l.file),
                line: l.line,
                column: l.column,
                inlined_into: map(&locations, l.inlined_into),
            });
            locations.push(id);
        }
        let scopes: Vec<u32> = theirs
            .scopes
            .iter()
            .map(|s| {
                ours.scope(Scope {
                    function: map(&functions, s.function),
                    inlined_into: map(&locations, s.inlined_into),
                })
            })
            .collect();
        self.ranges.extend(ranges.into_iter().map(|(start, e)| {
            let entry = if e.scope == NONE {
                e
            } else {
                Entry {
                    scope: scopes[e.scope as usize],
                    file: map(&files, e.file),
                    ..e
                }
            };
            (start, entry)
        }));
    }
}

/// Sorts ranges from all units, drops repeats and "nothing here" markers
/// where another unit has a real entry at the same address.
fn finish_ranges(mut ranges: Vec<(u64, Entry)>) -> Vec<(u64, Entry)> {
    ranges.sort_unstable_by_key(|&(start, e)| (start, e.scope == NONE));
    let mut out: Vec<(u64, Entry)> = Vec::with_capacity(ranges.len());
    for (start, entry) in ranges {
        match out.last() {
            Some(&(s, _)) if s == start => continue,
            Some(&(_, e)) if e == entry => continue,
            None if entry.scope == NONE => continue,
            _ => out.push((start, entry)),
        }
    }
    out
}

/// The deduplicated tables every unit adds to.
#[derive(Default)]
pub(super) struct Tables {
    strings: Vec<u8>,
    string_ids: FxHashMap<Box<str>, StrRef>,
    files: Vec<StrRef>,
    file_ids: FxHashMap<StrRef, u32>,
    functions: Vec<format::Function>,
    function_ids: FxHashMap<Box<str>, u32>,
    locations: Vec<Location>,
    location_ids: FxHashMap<Location, u32>,
    scopes: Vec<Scope>,
    scope_ids: FxHashMap<Scope, u32>,
    /// Linkage names that differ from the display name, by function.
    raws: Vec<Box<str>>,
}

impl std::hash::Hash for StrRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(((self.offset as u64) << 32) | self.len as u64);
    }
}

impl Tables {
    fn string(&mut self, s: &str) -> StrRef {
        if let Some(r) = self.string_ids.get(s) {
            return *r;
        }
        let r = StrRef {
            offset: u32::try_from(self.strings.len()).unwrap_or(u32::MAX),
            len: u32::try_from(s.len()).unwrap_or(0),
        };
        self.strings.extend_from_slice(s.as_bytes());
        self.string_ids.insert(s.into(), r);
        r
    }

    pub fn file(&mut self, path: &str) -> u32 {
        let s = self.string(path);
        let next = self.files.len() as u32;
        *self.file_ids.entry(s).or_insert_with(|| {
            self.files.push(s);
            next
        })
    }

    /// A function by its raw name; demangled here, once.
    pub fn function(&mut self, raw: &str) -> u32 {
        if let Some(&id) = self.function_ids.get(raw) {
            return id;
        }
        let demangled = demangle(raw);
        self.add_function(raw, demangled.as_deref())
    }

    /// A function whose display name is known: `raw` is `None` when it is
    /// the display name itself.
    fn function_parts(&mut self, display: &str, raw: Option<&str>) -> u32 {
        let key = raw.unwrap_or(display);
        if let Some(&id) = self.function_ids.get(key) {
            return id;
        }
        self.add_function(key, raw.map(|_| display))
    }

    fn add_function(&mut self, raw: &str, demangled: Option<&str>) -> u32 {
        let function = match demangled {
            Some(demangled) => {
                self.raws.push(raw.into());
                format::Function {
                    name: self.string(demangled),
                    raw: self.raws.len() as u32 - 1,
                    _pad: 0,
                }
            }
            None => format::Function {
                name: self.string(raw),
                raw: NONE,
                _pad: 0,
            },
        };
        let id = self.functions.len() as u32;
        self.functions.push(function);
        self.function_ids.insert(raw.into(), id);
        id
    }

    pub fn scope(&mut self, scope: Scope) -> u32 {
        let next = self.scopes.len() as u32;
        *self.scope_ids.entry(scope).or_insert_with(|| {
            self.scopes.push(scope);
            next
        })
    }

    pub fn location(&mut self, location: Location) -> u32 {
        let next = self.locations.len() as u32;
        *self.location_ids.entry(location).or_insert_with(|| {
            self.locations.push(location);
            next
        })
    }

    fn symbols(&mut self, table: &SymbolTable<'_>) -> Vec<SymbolEntry> {
        table
            .symbols
            .iter()
            .map(|s| SymbolEntry {
                address: s.address,
                size: s.size,
                function: self.function(s.name),
                _pad: 0,
            })
            .collect()
    }

    fn write(
        &self,
        flags: u32,
        ranges: &[(u64, Entry)],
        symbols: &[SymbolEntry],
    ) -> Result<Vec<u8>, Error> {
        let base = ranges.first().map_or(0, |r| r.0);
        let last = ranges.last().map_or(0, |r| r.0);
        if last - base > u64::from(u32::MAX) {
            return Err(Error::Unsupported(format!(
                "DWARF addresses span {:#x} bytes, more than the index's 4 GiB",
                last - base
            )));
        }
        let relative: Vec<(u32, Entry)> = ranges
            .iter()
            .map(|&(s, e)| ((s - base) as u32, e))
            .collect();
        let (starts, ends, data) = blocks::encode(&relative);
        if u32::try_from(data.len()).is_err() || u32::try_from(self.strings.len()).is_err() {
            return Err(Error::Unsupported(
                "more than 4 GiB of ranges or names".into(),
            ));
        }
        // Raw names sorted for front coding; functions point at ordinals.
        let mut order: Vec<u32> = (0..self.raws.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| self.raws[a as usize].cmp(&self.raws[b as usize]));
        let mut rank = vec![0u32; order.len()];
        for (ordinal, &i) in order.iter().enumerate() {
            rank[i as usize] = ordinal as u32;
        }
        let sorted: Vec<&str> = order.iter().map(|&i| &*self.raws[i as usize]).collect();
        let (raw_ends, raw_data) = blocks::encode_names(&sorted);
        let functions: Vec<format::Function> = self
            .functions
            .iter()
            .map(|f| format::Function {
                raw: if f.raw == NONE {
                    NONE
                } else {
                    rank[f.raw as usize]
                },
                ..*f
            })
            .collect();
        let count = |n: usize, what: &str| {
            u32::try_from(n).map_err(|_| Error::Unsupported(format!("more than 2^32 {what}")))
        };
        let header = format::Header {
            magic: format::MAGIC,
            version: format::VERSION,
            flags,
            base,
            blocks: count(starts.len(), "blocks")?,
            scopes: count(self.scopes.len(), "scopes")?,
            locations: count(self.locations.len(), "locations")?,
            functions: count(self.functions.len(), "functions")?,
            files: count(self.files.len(), "files")?,
            symbols: count(symbols.len(), "symbols")?,
            ranges: count(ranges.len(), "ranges")?,
            raw_names: count(sorted.len(), "linkage names")?,
            range_data_len: data.len() as u64,
            strings_len: self.strings.len() as u64,
            raw_data_len: raw_data.len() as u64,
        };
        let mut out = Vec::new();
        let mut push = |bytes: &[u8]| {
            out.extend_from_slice(bytes);
            out.resize(format::align8(out.len()), 0);
        };
        push(bytemuck::bytes_of(&header));
        push(bytemuck::cast_slice(&starts));
        push(bytemuck::cast_slice(&ends));
        push(&data);
        push(bytemuck::cast_slice(&self.scopes));
        push(bytemuck::cast_slice(&self.locations));
        push(bytemuck::cast_slice(&functions));
        push(bytemuck::cast_slice(&self.files));
        push(bytemuck::cast_slice(symbols));
        push(&self.strings);
        push(bytemuck::cast_slice(&raw_ends));
        push(&raw_data);
        Ok(out)
    }
}
