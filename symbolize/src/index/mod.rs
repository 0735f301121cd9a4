//! The per-build-ID symbol index: built once ([`build`]), then read in place
//! ([`SymbolIndex`]) with one binary search per address.

pub(crate) mod blocks;
mod build;
pub mod format;
mod lookup;
mod units;

use std::ops::Range;

use blocks::Entry;
pub use build::{build, build_with_stats, build_with_threads, BuildStats};
use format::{Function, Header, Location, Scope, StrRef, SymbolEntry, HEADER_LEN, NONE};
use lookup::View;

use crate::{Error, FrameRef, Miss, Source};

/// An opened, validated index. Holds its bytes (a `Vec`, an mmap, a
/// `bytes::Bytes`…) and borrows every answer from them.
pub struct SymbolIndex {
    data: Box<dyn AsRef<[u8]> + Send + Sync>,
    /// Copy of `data` when it was not 8-byte aligned.
    aligned: Option<Vec<u64>>,
    header: Header,
    block_starts: Range<usize>,
    block_ends: Range<usize>,
    range_data: Range<usize>,
    scopes: Range<usize>,
    locations: Range<usize>,
    functions: Range<usize>,
    files: Range<usize>,
    symbols: Range<usize>,
    strings: Range<usize>,
    raw_ends: Range<usize>,
    raw_data: Range<usize>,
}

impl std::fmt::Debug for SymbolIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolIndex")
            .field("bytes", &self.bytes().len())
            .field("ranges", &self.header.ranges)
            .field("scopes", &self.header.scopes)
            .field("locations", &self.header.locations)
            .field("functions", &self.header.functions)
            .finish()
    }
}

fn bad(what: impl Into<String>) -> Error {
    Error::Index(what.into())
}

impl SymbolIndex {
    /// Opens an index, checking every table and cross-reference once so
    /// that lookups cannot fail or panic later.
    pub fn new(data: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Self, Error> {
        let data: Box<dyn AsRef<[u8]> + Send + Sync> = Box::new(data);
        let bytes = AsRef::<[u8]>::as_ref(&*data);
        let aligned = (bytes.as_ptr() as usize % 8 != 0).then(|| {
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
            words
        });
        let mut index = Self {
            data,
            aligned,
            header: bytemuck::Zeroable::zeroed(),
            block_starts: 0..0,
            block_ends: 0..0,
            range_data: 0..0,
            scopes: 0..0,
            locations: 0..0,
            functions: 0..0,
            files: 0..0,
            symbols: 0..0,
            strings: 0..0,
            raw_ends: 0..0,
            raw_data: 0..0,
        };
        index.layout()?;
        index.validate()?;
        Ok(index)
    }

    fn bytes(&self) -> &[u8] {
        match &self.aligned {
            Some(words) => &bytemuck::cast_slice(words)[..AsRef::<[u8]>::as_ref(&*self.data).len()],
            None => AsRef::<[u8]>::as_ref(&*self.data),
        }
    }

    fn layout(&mut self) -> Result<(), Error> {
        let bytes = self.bytes();
        let head = bytes
            .get(..HEADER_LEN)
            .ok_or_else(|| bad(format!("{} bytes is shorter than the header", bytes.len())))?;
        let header: Header = bytemuck::pod_read_unaligned(head);
        if header.magic != format::MAGIC {
            return Err(bad("not a symtrace symbol index (bad magic)"));
        }
        if header.version != format::VERSION {
            return Err(bad(format!(
                "format version {}, this build reads version {}",
                header.version,
                format::VERSION
            )));
        }
        let len = bytes.len();
        let mut at = format::align8(HEADER_LEN);
        let mut next = |count: u64, size: usize| -> Result<Range<usize>, Error> {
            let n = usize::try_from(count)
                .ok()
                .and_then(|c| c.checked_mul(size))
                .ok_or_else(|| bad("table size overflows"))?;
            let end = at.checked_add(n).filter(|&e| e <= len);
            let end =
                end.ok_or_else(|| bad(format!("truncated: a table ends past {len} bytes")))?;
            let range = at..end;
            at = format::align8(end);
            Ok(range)
        };
        self.block_starts = next(header.blocks.into(), 4)?;
        self.block_ends = next(header.blocks.into(), 4)?;
        self.range_data = next(header.range_data_len, 1)?;
        self.scopes = next(header.scopes.into(), size_of::<Scope>())?;
        self.locations = next(header.locations.into(), size_of::<Location>())?;
        self.functions = next(header.functions.into(), size_of::<Function>())?;
        self.files = next(header.files.into(), size_of::<StrRef>())?;
        self.symbols = next(header.symbols.into(), size_of::<SymbolEntry>())?;
        self.strings = next(header.strings_len, 1)?;
        let raw_buckets = (u64::from(header.raw_names)).div_ceil(format::NAME_BUCKET as u64);
        self.raw_ends = next(raw_buckets, 4)?;
        self.raw_data = next(header.raw_data_len, 1)?;
        self.header = header;
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        let h = &self.header;
        let strings = std::str::from_utf8(self.strings())
            .map_err(|e| bad(format!("names are not UTF-8: {e}")))?;
        let check_str = |r: &StrRef| {
            let (start, end) = (r.offset as usize, r.offset as usize + r.len as usize);
            end <= strings.len() && strings.is_char_boundary(start) && strings.is_char_boundary(end)
        };
        if !self.block_starts().windows(2).all(|w| w[0] < w[1]) {
            return Err(bad("range blocks are not sorted"));
        }
        let data_len = self.range_data().len();
        if !self.block_ends().windows(2).all(|w| w[0] <= w[1])
            || self
                .block_ends()
                .last()
                .is_some_and(|&e| e as usize != data_len)
        {
            return Err(bad("range blocks overlap or overrun their data"));
        }
        let ok_location = |l: u32| l == NONE || l < h.locations;
        if !self.scopes().iter().all(|s| {
            (s.function == NONE || s.function < h.functions) && ok_location(s.inlined_into)
        }) {
            return Err(bad("a scope points past its tables"));
        }
        for (i, l) in self.locations().iter().enumerate() {
            let ok = (l.function == NONE || l.function < h.functions)
                && (l.file == NONE || l.file < h.files)
                && (l.inlined_into == NONE || (l.inlined_into as usize) < i);
            if !ok {
                return Err(bad(format!("location {i} is inconsistent")));
            }
        }
        if !self
            .functions()
            .iter()
            .all(|f| check_str(&f.name) && (f.raw == NONE || f.raw < h.raw_names))
            || !self.files().iter().all(check_str)
        {
            return Err(bad("a name lies outside the string table"));
        }
        let raw_len = self.raw_data().len();
        if !self.raw_ends().windows(2).all(|w| w[0] <= w[1])
            || self
                .raw_ends()
                .last()
                .is_some_and(|&e| e as usize != raw_len)
        {
            return Err(bad("linkage name buckets overlap or overrun their data"));
        }
        let symbols = self.symbols();
        if !symbols.windows(2).all(|w| w[0].address < w[1].address)
            || !symbols.iter().all(|s| s.function < h.functions)
        {
            return Err(bad("the symbol table is inconsistent"));
        }
        Ok(())
    }

    fn block_starts(&self) -> &[u32] {
        bytemuck::cast_slice(&self.bytes()[self.block_starts.clone()])
    }
    fn block_ends(&self) -> &[u32] {
        bytemuck::cast_slice(&self.bytes()[self.block_ends.clone()])
    }
    fn range_data(&self) -> &[u8] {
        &self.bytes()[self.range_data.clone()]
    }
    fn scopes(&self) -> &[Scope] {
        bytemuck::cast_slice(&self.bytes()[self.scopes.clone()])
    }
    fn locations(&self) -> &[Location] {
        bytemuck::cast_slice(&self.bytes()[self.locations.clone()])
    }
    fn functions(&self) -> &[Function] {
        bytemuck::cast_slice(&self.bytes()[self.functions.clone()])
    }
    fn files(&self) -> &[StrRef] {
        bytemuck::cast_slice(&self.bytes()[self.files.clone()])
    }
    fn symbols(&self) -> &[SymbolEntry] {
        bytemuck::cast_slice(&self.bytes()[self.symbols.clone()])
    }
    fn strings(&self) -> &[u8] {
        &self.bytes()[self.strings.clone()]
    }
    fn raw_ends(&self) -> &[u32] {
        bytemuck::cast_slice(&self.bytes()[self.raw_ends.clone()])
    }
    fn raw_data(&self) -> &[u8] {
        &self.bytes()[self.raw_data.clone()]
    }

    /// Size of the index in bytes.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether the index describes nothing at all.
    pub fn is_empty(&self) -> bool {
        self.header.ranges == 0 && self.header.symbols == 0
    }

    /// Whether the indexed file had DWARF.
    pub fn has_dwarf(&self) -> bool {
        self.header.flags & format::FLAG_DWARF != 0
    }

    /// The best source this index can answer from.
    pub fn best_source(&self) -> Option<Source> {
        if self.header.ranges > 0 {
            Some(Source::Dwarf)
        } else if self.header.symbols > 0 {
            Some(self.symbol_source())
        } else {
            None
        }
    }

    fn symbol_source(&self) -> Source {
        if self.header.flags & format::FLAG_DYNSYM != 0 {
            Source::Dynsym
        } else {
            Source::Symtab
        }
    }

    /// The typed tables, borrowed once per call.
    fn view(&self) -> View<'_> {
        View {
            base: self.header.base,
            symbols_from_dynsym: self.header.flags & format::FLAG_DYNSYM != 0,
            block_starts: self.block_starts(),
            block_ends: self.block_ends(),
            range_data: self.range_data(),
            scopes: self.scopes(),
            locations: self.locations(),
            functions: self.functions(),
            files: self.files(),
            symbols: self.symbols(),
            strings: self.strings(),
            raw_ends: self.raw_ends(),
            raw_data: self.raw_data(),
        }
    }

    /// Frames for `address`, innermost first, into `out` (cleared first).
    pub fn lookup<'a>(&'a self, address: u64, out: &mut Vec<FrameRef<'a>>) -> Result<Source, Miss> {
        let view = self.view();
        let entry = view.entry_at(address, &mut None);
        view.frames_at(entry, view.symbol_index(address), out)
    }

    /// Answers a batch: calls `each(i, answer, frames)` for every
    /// `addresses[i]`, in ascending address order. The batch is sorted
    /// first, so each block is decoded at most once, forward, for all the
    /// addresses it covers, and addresses with the same innermost frame and
    /// symbol reuse one answer.
    pub fn lookup_batch<'a>(
        &'a self,
        addresses: &[u64],
        mut each: impl FnMut(usize, Result<Source, Miss>, &[FrameRef<'a>]),
    ) {
        let mut order: Vec<(u64, usize)> = addresses.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let view = self.view();
        let mut frames: Vec<FrameRef<'a>> = Vec::new();
        let mut cursor = None;
        let mut last: Option<(Option<Entry>, Option<usize>)> = None;
        let mut answer = Err(Miss::NoSymbols);
        for (address, i) in order {
            let entry = view.entry_at(address, &mut cursor);
            let key = (entry, view.symbol_index(address));
            match (last, entry) {
                (Some(previous), _) if previous == key => {}
                // Same function and call chain, another line: only the
                // innermost frame's position changes.
                (Some((Some(before), symbol)), Some(now))
                    if before.scope == now.scope && symbol == key.1 && !frames.is_empty() =>
                {
                    frames[0].file = view.file(now.file);
                    frames[0].line = now.line;
                    frames[0].column = now.column;
                }
                _ => answer = view.frames_at(entry, key.1, &mut frames),
            }
            last = Some(key);
            each(i, answer, &frames);
        }
    }
}
