//! The first-request path: answers straight from DWARF through the
//! `addr2line` crate, which parses each compile unit lazily on first touch.
//! The batch is sorted and de-duplicated first (neighbouring addresses share
//! a unit and its parsed tables); names and files are interned as they are
//! met, each distinct name demangled once, and frames are handed out
//! borrowed, so a lookup allocates nothing per frame.

use std::borrow::Cow;

use rustc_hash::FxHashMap;

use crate::elf::{LoadedDwarf, Reader};
use crate::symtab::SymbolTable;
use crate::{demangle, Error, Frame, FrameRef, Inputs, LinkageName, Miss, Source};

/// One address's answer: frames innermost first, or why there are none.
pub type Answer = Result<(Source, Vec<Frame>), Miss>;

/// Symbolizes batches of addresses of one build-ID from its DWARF and
/// symbol tables.
pub struct DwarfSymbolizer<'data> {
    dwarf: Option<LoadedDwarf<'data>>,
    symbols: SymbolTable<'data>,
}

impl std::fmt::Debug for DwarfSymbolizer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfSymbolizer")
            .field("dwarf", &self.dwarf.is_some())
            .field("symbols", &self.symbols.symbols.len())
            .finish()
    }
}

/// A frame by interned ids, until the batch is done.
#[derive(Clone, Copy)]
struct RawFrame {
    name: u32,
    file: u32,
    line: u32,
    column: u32,
}

const NO_ID: u32 = u32::MAX;

/// Distinct names (demangled once) and files of one batch.
#[derive(Default)]
struct Interner<'s> {
    name_ids: FxHashMap<&'s [u8], u32>,
    names: Vec<(Cow<'s, str>, Option<String>)>,
    file_ids: FxHashMap<&'s str, u32>,
    files: Vec<&'s str>,
}

impl<'s> Interner<'s> {
    fn name(&mut self, raw: &'s [u8]) -> u32 {
        if let Some(&id) = self.name_ids.get(raw) {
            return id;
        }
        let text = String::from_utf8_lossy(raw);
        let demangled = demangle(&text);
        let id = self.names.len() as u32;
        self.names.push((text, demangled));
        self.name_ids.insert(raw, id);
        id
    }

    fn file(&mut self, path: &'s str) -> u32 {
        let next = self.files.len() as u32;
        *self.file_ids.entry(path).or_insert_with(|| {
            self.files.push(path);
            next
        })
    }

    fn frame(&self, f: &RawFrame) -> FrameRef<'_> {
        let (function, linkage_name) = match self.names.get(f.name as usize) {
            Some((raw, Some(demangled))) => (Some(demangled.as_str()), Some(LinkageName::text(raw))),
            Some((raw, None)) => (Some(raw.as_ref()), None),
            None => (None, None),
        };
        FrameRef {
            function,
            linkage_name,
            file: self.files.get(f.file as usize).copied(),
            line: f.line,
            column: f.column,
        }
    }
}

impl<'data> DwarfSymbolizer<'data> {
    /// Opens the inputs (cheap: no compile unit is parsed yet).
    pub fn new(inputs: &Inputs<'data>) -> Result<Self, Error> {
        let dwarf = LoadedDwarf::load(inputs)?;
        let dwarf = dwarf.primary.has_debug_info().then_some(dwarf);
        let symbols = SymbolTable::load(inputs)?;
        Ok(Self { dwarf, symbols })
    }

    /// The best source these files can answer from (`None`: no DWARF and
    /// no symbol table).
    pub fn best_source(&self) -> Option<Source> {
        if self.dwarf.is_some() {
            Some(Source::Dwarf)
        } else {
            self.symbols.source
        }
    }

    /// Answers for `addresses`, in their order, owned.
    pub fn symbolize(&self, addresses: &[u64]) -> Result<Vec<Answer>, Error> {
        let mut answers = vec![Err(Miss::NoSymbols); addresses.len()];
        self.symbolize_with(addresses, |i, answer, frames| {
            answers[i] = answer.map(|source| (source, frames.iter().map(FrameRef::to_owned).collect()));
        })?;
        Ok(answers)
    }

    /// Calls `each(i, answer, frames)` for every `addresses[i]`, in
    /// ascending address order, frames borrowed for the call.
    pub fn symbolize_with(
        &self,
        addresses: &[u64],
        mut each: impl FnMut(usize, Result<Source, Miss>, &[FrameRef<'_>]),
    ) -> Result<(), Error> {
        if addresses.len() > crate::MAX_BATCH {
            return Err(Error::BatchTooLarge(addresses.len()));
        }
        let mut order: Vec<(u64, usize)> = addresses.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let dwarf = self.dwarf.as_ref().map(|d| d.dwarf());
        let context = match dwarf {
            Some(dwarf) => Some(addr2line::Context::from_dwarf(dwarf)?),
            None => None,
        };
        let mut interner = Interner::default();
        // Per distinct address: its answer and its frames' span in `raw`.
        let mut raw: Vec<RawFrame> = Vec::new();
        let mut answers: Vec<(Result<Source, Miss>, usize, usize)> = Vec::new();
        let mut previous = None;
        for &(address, _) in &order {
            if previous == Some(address) {
                continue;
            }
            previous = Some(address);
            let start = raw.len();
            let found = context
                .as_ref()
                .is_some_and(|c| self.dwarf_frames(c, address, &mut interner, &mut raw));
            let answer = if found {
                Ok(Source::Dwarf)
            } else {
                raw.truncate(start);
                self.symbol_frame(address, &mut interner, &mut raw)
            };
            answers.push((answer, start, raw.len()));
        }
        let mut frames: Vec<FrameRef<'_>> = Vec::new();
        let mut slot = usize::MAX;
        let mut previous = None;
        for (address, i) in order {
            if previous != Some(address) {
                previous = Some(address);
                slot = slot.wrapping_add(1);
                let (_, start, end) = answers[slot];
                frames.clear();
                frames.extend(raw[start..end].iter().map(|f| interner.frame(f)));
            }
            each(i, answers[slot].0, &frames);
        }
        Ok(())
    }

    /// DWARF frames into `out`; `false` when DWARF has nothing here.
    /// Malformed DWARF for one address is treated like no DWARF for it.
    fn dwarf_frames<'c>(
        &'c self,
        context: &'c addr2line::Context<Reader<'_>>,
        address: u64,
        interner: &mut Interner<'c>,
        out: &mut Vec<RawFrame>,
    ) -> bool {
        let Ok(mut iter) = context.find_frames(address).skip_all_loads() else {
            return false;
        };
        let start = out.len();
        while let Ok(Some(frame)) = iter.next() {
            let name = frame
                .function
                .as_ref()
                .map_or(NO_ID, |f| interner.name(f.name.slice()));
            let (file, line, column) = match frame.location {
                Some(l) => (
                    l.file.map_or(NO_ID, |f| interner.file(f)),
                    l.line.unwrap_or(0),
                    l.column.unwrap_or(0),
                ),
                None => (NO_ID, 0, 0),
            };
            out.push(RawFrame {
                name,
                file,
                line,
                column,
            });
        }
        if out.len() == start {
            return false;
        }
        // Like llvm-symbolizer (and perf): the function that was not inlined
        // is named by the symbol table when it has a symbol here, which
        // tells `foo.cold` and `foo.isra.0` from `foo`.
        if let Some(symbol) = self.symbols.find(address) {
            out.last_mut().expect("not empty").name = interner.name(symbol.name.as_bytes());
        }
        true
    }

    fn symbol_frame<'c>(
        &'c self,
        address: u64,
        interner: &mut Interner<'c>,
        out: &mut Vec<RawFrame>,
    ) -> Result<Source, Miss> {
        let Some(source) = self.symbols.source else {
            return Err(if self.dwarf.is_some() {
                Miss::OutsideFunctions
            } else {
                Miss::NoSymbols
            });
        };
        let symbol = self.symbols.find(address).ok_or(Miss::OutsideFunctions)?;
        out.push(RawFrame {
            name: interner.name(symbol.name.as_bytes()),
            file: NO_ID,
            line: 0,
            column: 0,
        });
        Ok(source)
    }
}
