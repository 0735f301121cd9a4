//! The first-request path: answers straight from DWARF through the
//! `addr2line` crate, which parses each compile unit lazily on first touch.
//! The batch is sorted and de-duplicated first (neighbouring addresses share
//! a unit and its parsed tables); names and files are interned as they are
//! met, each distinct name demangled once, and frames are handed out
//! borrowed, so a lookup allocates nothing per frame.

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

/// One share of a batch, resolved: distinct names (demangled once) and
/// files, every distinct address's frames by id. Owned, so shares can be
/// resolved on several threads.
#[derive(Default)]
struct Resolved {
    names: Vec<(String, Option<String>)>,
    files: Vec<Box<str>>,
    frames: Vec<RawFrame>,
    /// Per distinct address: its answer and its frames' span in `frames`.
    answers: Vec<(Result<Source, Miss>, usize, usize)>,
}

impl Resolved {
    fn frame(&self, f: &RawFrame) -> FrameRef<'_> {
        let (function, linkage_name) = match self.names.get(f.name as usize) {
            Some((raw, Some(demangled))) => {
                (Some(demangled.as_str()), Some(LinkageName::text(raw)))
            }
            Some((raw, None)) => (Some(raw.as_str()), None),
            None => (None, None),
        };
        FrameRef {
            function,
            linkage_name,
            file: self.files.get(f.file as usize).map(|f| &**f),
            line: f.line,
            column: f.column,
        }
    }
}

/// Interns names and files into a [`Resolved`] without copying repeats.
struct Interner<'s, 'r> {
    out: &'r mut Resolved,
    name_ids: FxHashMap<&'s [u8], u32>,
    file_ids: FxHashMap<&'s str, u32>,
}

impl<'s> Interner<'s, '_> {
    fn name(&mut self, raw: &'s [u8]) -> u32 {
        if let Some(&id) = self.name_ids.get(raw) {
            return id;
        }
        let text = String::from_utf8_lossy(raw).into_owned();
        let demangled = demangle(&text);
        let id = self.out.names.len() as u32;
        self.out.names.push((text, demangled));
        self.name_ids.insert(raw, id);
        id
    }

    fn file(&mut self, path: &'s str) -> u32 {
        if let Some(&id) = self.file_ids.get(path) {
            return id;
        }
        let id = self.out.files.len() as u32;
        self.out.files.push(path.into());
        self.file_ids.insert(path, id);
        id
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
            answers[i] =
                answer.map(|source| (source, frames.iter().map(FrameRef::to_owned).collect()));
        })?;
        Ok(answers)
    }

    /// Calls `each(i, answer, frames)` for every `addresses[i]`, in
    /// ascending address order, frames borrowed for the call.
    pub fn symbolize_with(
        &self,
        addresses: &[u64],
        each: impl FnMut(usize, Result<Source, Miss>, &[FrameRef<'_>]),
    ) -> Result<(), Error> {
        self.symbolize_on(addresses, 1, each)
    }

    /// [`Self::symbolize_with`] on up to `threads` threads: the sorted
    /// batch is cut into contiguous shares, each resolved with its own
    /// lazily parsed DWARF context (worth it for large batches only).
    pub fn symbolize_on(
        &self,
        addresses: &[u64],
        threads: usize,
        mut each: impl FnMut(usize, Result<Source, Miss>, &[FrameRef<'_>]),
    ) -> Result<(), Error> {
        if addresses.len() > crate::MAX_BATCH {
            return Err(Error::BatchTooLarge(addresses.len()));
        }
        let mut order: Vec<(u64, usize)> = addresses.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let mut distinct: Vec<u64> = order.iter().map(|&(a, _)| a).collect();
        distinct.dedup();
        let threads = threads.clamp(1, 1 + distinct.len() / 4096);
        let shares: Vec<Resolved> = if threads == 1 {
            vec![self.resolve(&distinct)?]
        } else {
            let size = distinct.len().div_ceil(threads);
            std::thread::scope(|scope| {
                let workers: Vec<_> = distinct
                    .chunks(size)
                    .map(|share| scope.spawn(|| self.resolve(share)))
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().expect("symbolizer thread panicked"))
                    .collect::<Result<Vec<_>, Error>>()
            })?
        };
        let mut slots = shares
            .iter()
            .flat_map(|share| share.answers.iter().map(move |a| (share, a)));
        let mut frames: Vec<FrameRef<'_>> = Vec::new();
        let mut current = (Err(Miss::NoSymbols), 0, 0);
        let mut previous = None;
        for (address, i) in order {
            if previous != Some(address) {
                previous = Some(address);
                let (share, answer) = slots.next().expect("one answer per distinct address");
                current = *answer;
                frames.clear();
                frames.extend(
                    share.frames[answer.1..answer.2]
                        .iter()
                        .map(|f| share.frame(f)),
                );
            }
            each(i, current.0, &frames);
        }
        Ok(())
    }

    /// Frames for sorted, distinct addresses.
    fn resolve(&self, distinct: &[u64]) -> Result<Resolved, Error> {
        let context = match &self.dwarf {
            Some(dwarf) => Some(addr2line::Context::from_dwarf(dwarf.dwarf())?),
            None => None,
        };
        let mut resolved = Resolved::default();
        let mut frames = Vec::new();
        let mut answers = Vec::with_capacity(distinct.len());
        {
            let mut interner = Interner {
                out: &mut resolved,
                name_ids: FxHashMap::default(),
                file_ids: FxHashMap::default(),
            };
            for &address in distinct {
                let start = frames.len();
                let found = context
                    .as_ref()
                    .is_some_and(|c| self.dwarf_frames(c, address, &mut interner, &mut frames));
                let answer = if found {
                    Ok(Source::Dwarf)
                } else {
                    frames.truncate(start);
                    self.symbol_frame(address, &mut interner, &mut frames)
                };
                answers.push((answer, start, frames.len()));
            }
        }
        resolved.frames = frames;
        resolved.answers = answers;
        Ok(resolved)
    }

    /// DWARF frames into `out`; `false` when DWARF has nothing here.
    /// Malformed DWARF for one address is treated like no DWARF for it.
    fn dwarf_frames<'c>(
        &'c self,
        context: &'c addr2line::Context<Reader<'_>>,
        address: u64,
        interner: &mut Interner<'c, '_>,
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
        interner: &mut Interner<'c, '_>,
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
