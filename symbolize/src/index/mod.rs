//! The per-build-ID symbol index: built once ([`build`]), then read in place
//! ([`SymbolIndex`]) with one binary search per address.

mod blocks;
mod build;
pub mod format;
mod units;

use std::ops::Range;

pub use build::{build, build_with_stats, BuildStats};
use blocks::{BlockReader, Entry};
use format::{Function, Header, Location, Scope, StrRef, SymbolEntry, HEADER_LEN, NONE};

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
            || self.block_ends().last().is_some_and(|&e| e as usize != data_len)
        {
            return Err(bad("range blocks overlap or overrun their data"));
        }
        let ok_location = |l: u32| l == NONE || l < h.locations;
        if !self
            .scopes()
            .iter()
            .all(|s| (s.function == NONE || s.function < h.functions) && ok_location(s.inlined_into))
        {
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
            .all(|f| check_str(&f.name) && check_str(&f.raw))
            || !self.files().iter().all(check_str)
        {
            return Err(bad("a name lies outside the string table"));
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

    fn str(&self, r: StrRef) -> &str {
        let start = r.offset as usize;
        let bytes = &self.strings()[start..start + r.len as usize];
        // SAFETY: `new` checked that the whole string table is UTF-8 and
        // that every `StrRef` (function names, files) lies inside it on
        // character boundaries; the bytes are immutable afterwards. Checking
        // again here would cost more than the rest of a lookup.
        unsafe { std::str::from_utf8_unchecked(bytes) }
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

    fn function(&self, id: u32) -> (Option<&str>, Option<&str>) {
        match self.functions().get(id as usize) {
            Some(f) => (
                Some(self.str(f.name)),
                (f.raw.len > 0).then(|| self.str(f.raw)),
            ),
            None => (None, None),
        }
    }

    fn symbol_index(&self, address: u64) -> Option<usize> {
        let symbols = self.symbols();
        let i = symbols.partition_point(|s| s.address <= address);
        let s = symbols.get(i.checked_sub(1)?)?;
        let end = match s.size {
            0 => symbols.get(i).map_or(u64::MAX, |n| n.address),
            size => s.address.saturating_add(size),
        };
        (address < end).then_some(i - 1)
    }

    fn symbol_at(&self, address: u64) -> Option<&SymbolEntry> {
        self.symbols().get(self.symbol_index(address)?)
    }

    /// Frames for `address`, innermost first, into `out` (cleared first).
    pub fn lookup<'a>(&'a self, address: u64, out: &mut Vec<FrameRef<'a>>) -> Result<Source, Miss> {
        let entry = self.entry_at(address, &mut Cursor::default());
        self.frames_at(address, entry, out)
    }

    /// Answers a batch: calls `each(i, answer, frames)` for every
    /// `addresses[i]`, in ascending address order. The batch is sorted
    /// first, so blocks are decoded once for all the addresses they cover,
    /// and addresses with the same innermost frame and symbol reuse one
    /// answer.
    pub fn lookup_batch<'a>(
        &'a self,
        addresses: &[u64],
        mut each: impl FnMut(usize, Result<Source, Miss>, &[FrameRef<'a>]),
    ) {
        let mut order: Vec<(u64, usize)> = addresses.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let mut frames = Vec::new();
        let mut cursor = Cursor::default();
        let mut last: Option<(Option<Entry>, Option<usize>)> = None;
        let mut answer = Err(Miss::NoSymbols);
        for (address, i) in order {
            let entry = self.entry_at(address, &mut cursor);
            let key = (entry, self.symbol_index(address));
            if last != Some(key) {
                answer = self.frames_at(address, entry, &mut frames);
                last = Some(key);
            }
            each(i, answer, &frames);
        }
    }

    /// The innermost frame's entry for `address`; `cursor` keeps the last
    /// decoded block, which sorted batches reuse.
    fn entry_at(&self, address: u64, cursor: &mut Cursor) -> Option<Entry> {
        let rel = u32::try_from(address.checked_sub(self.header.base)?).ok()?;
        let starts = self.block_starts();
        let block = starts.partition_point(|&s| s <= rel).checked_sub(1)?;
        if cursor.block != Some(block) {
            let ends = self.block_ends();
            let from = block.checked_sub(1).map_or(0, |b| ends[b] as usize);
            let data = self.range_data().get(from..ends[block] as usize)?;
            cursor.ranges.clear();
            cursor.ranges.extend(BlockReader::new(data, starts[block]));
            cursor.block = Some(block);
        }
        let ranges = &cursor.ranges;
        let i = ranges.partition_point(|r| r.0 <= rel).checked_sub(1)?;
        Some(ranges[i].1).filter(|e| e.scope != NONE)
    }

    fn frames_at<'a>(
        &'a self,
        address: u64,
        entry: Option<Entry>,
        out: &mut Vec<FrameRef<'a>>,
    ) -> Result<Source, Miss> {
        out.clear();
        if let Some(e) = entry {
            if let Some(scope) = self.scopes().get(e.scope as usize) {
                let (function, linkage_name) = self.function(scope.function);
                out.push(FrameRef {
                    function,
                    linkage_name,
                    file: self.files().get(e.file as usize).map(|f| self.str(*f)),
                    line: e.line,
                    column: e.column,
                });
                self.push_callers(scope.inlined_into, out);
            }
        }
        if let Some(outermost) = out.last_mut() {
            // Like llvm-symbolizer (and perf): the function that was not
            // inlined is named by the symbol table when it has a symbol
            // here, which tells `foo.cold` and `foo.isra.0` from `foo`.
            if let Some(s) = self.symbol_at(address) {
                (outermost.function, outermost.linkage_name) = self.function(s.function);
            }
            return Ok(Source::Dwarf);
        }
        match self.symbol_at(address) {
            Some(s) => {
                let (function, linkage_name) = self.function(s.function);
                out.push(FrameRef {
                    function,
                    linkage_name,
                    file: None,
                    line: 0,
                    column: 0,
                });
                Ok(self.symbol_source())
            }
            None if self.best_source().is_none() => Err(Miss::NoSymbols),
            None => Err(Miss::OutsideFunctions),
        }
    }

    /// Frames of the call sites `loc` and its own callers.
    fn push_callers<'a>(&'a self, mut loc: u32, out: &mut Vec<FrameRef<'a>>) {
        let locations = self.locations();
        while let Some(l) = locations.get(loc as usize) {
            let (function, linkage_name) = self.function(l.function);
            out.push(FrameRef {
                function,
                linkage_name,
                file: self.files().get(l.file as usize).map(|f| self.str(*f)),
                line: l.line,
                column: l.column,
            });
            loc = l.inlined_into;
        }
    }
}

/// The last decoded block, reused by sorted batches.
#[derive(Default)]
struct Cursor {
    block: Option<usize>,
    ranges: Vec<(u32, Entry)>,
}
