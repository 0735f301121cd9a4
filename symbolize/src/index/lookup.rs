//! Lookups over an opened index's tables.

use super::blocks::{BlockReader, Entry};
use super::format::{self, Function, Location, Scope, StrRef, SymbolEntry, NONE};
use crate::{FrameRef, LinkageName, Miss, Source};

/// The typed tables of a [`super::SymbolIndex`], borrowed for one call.
pub(super) struct View<'a> {
    pub base: u64,
    pub symbols_from_dynsym: bool,
    pub block_starts: &'a [u32],
    pub block_ends: &'a [u32],
    pub range_data: &'a [u8],
    pub scopes: &'a [Scope],
    pub locations: &'a [Location],
    pub functions: &'a [Function],
    pub files: &'a [StrRef],
    pub symbols: &'a [SymbolEntry],
    pub strings: &'a [u8],
    pub raw_ends: &'a [u32],
    pub raw_data: &'a [u8],
}

impl<'a> View<'a> {
    pub fn file(&self, id: u32) -> Option<&'a str> {
        self.files.get(id as usize).map(|f| self.str(*f))
    }

    fn symbol_source(&self) -> Source {
        if self.symbols_from_dynsym {
            Source::Dynsym
        } else {
            Source::Symtab
        }
    }

    fn linkage_name(&self, ordinal: u32) -> Option<LinkageName<'a>> {
        if ordinal == NONE {
            return None;
        }
        let ordinal = ordinal as usize;
        let bucket = ordinal / format::NAME_BUCKET;
        let ends = self.raw_ends;
        let from = match bucket.checked_sub(1) {
            Some(b) => *ends.get(b)? as usize,
            None => 0,
        };
        let data = self.raw_data.get(from..*ends.get(bucket)? as usize)?;
        Some(LinkageName::coded(data, ordinal % format::NAME_BUCKET))
    }

    fn str(&self, r: StrRef) -> &'a str {
        let start = r.offset as usize;
        let bytes = &self.strings[start..start + r.len as usize];
        // SAFETY: `new` checked that the whole string table is UTF-8 and
        // that every `StrRef` (function names, files) lies inside it on
        // character boundaries; the bytes are immutable afterwards. Checking
        // again here would cost more than the rest of a lookup.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    fn function(&self, id: u32) -> (Option<&'a str>, Option<LinkageName<'a>>) {
        match self.functions.get(id as usize) {
            Some(f) => (Some(self.str(f.name)), self.linkage_name(f.raw)),
            None => (None, None),
        }
    }

    pub fn symbol_index(&self, address: u64) -> Option<usize> {
        let symbols = self.symbols;
        let i = symbols.partition_point(|s| s.address <= address);
        let s = symbols.get(i.checked_sub(1)?)?;
        // Inside the symbol's extent only (filled in for a size-0 symbol
        // when built), never "the nearest symbol before" (see
        // `symtab::Symbol::size`).
        let end = s.address.saturating_add(s.size.max(1));
        (address < end).then_some(i - 1)
    }

    /// The innermost frame's entry for `address`. `cursor` keeps the block
    /// being decoded: an address at or after the previous one in the same
    /// block continues from where that one stopped.
    pub fn entry_at(&self, address: u64, cursor: &mut Option<Cursor<'a>>) -> Option<Entry> {
        let rel = u32::try_from(address.checked_sub(self.base)?).ok()?;
        let starts = self.block_starts;
        let reusable = cursor.as_ref().is_some_and(|c| {
            c.current.0 <= rel && starts.get(c.block + 1).is_none_or(|&next| rel < next)
        });
        if !reusable {
            let block = starts.partition_point(|&s| s <= rel).checked_sub(1)?;
            let ends = self.block_ends;
            let from = block.checked_sub(1).map_or(0, |b| ends[b] as usize);
            let data = self.range_data.get(from..ends[block] as usize)?;
            let mut reader = BlockReader::new(data, starts[block]);
            let current = reader.next()?;
            let pending = reader.next();
            *cursor = Some(Cursor {
                block,
                reader,
                current,
                pending,
            });
        }
        let c = cursor.as_mut()?;
        while let Some(next) = c.pending.filter(|p| p.0 <= rel) {
            c.current = next;
            c.pending = c.reader.next();
        }
        Some(c.current.1).filter(|e| e.scope != NONE)
    }

    /// Frames for the innermost `entry` and the symbol (by
    /// [`Self::symbol_index`]) covering the same address.
    pub fn frames_at(
        &self,
        entry: Option<Entry>,
        symbol: Option<usize>,
        out: &mut Vec<FrameRef<'a>>,
    ) -> Result<Source, Miss> {
        out.clear();
        let symbol: Option<&SymbolEntry> = symbol.and_then(|i| self.symbols.get(i));
        if let Some(e) = entry {
            if let Some(scope) = self.scopes.get(e.scope as usize) {
                let (function, linkage_name) = self.function(scope.function);
                out.push(FrameRef {
                    function,
                    linkage_name,
                    file: self.file(e.file),
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
            if let Some(s) = symbol {
                (outermost.function, outermost.linkage_name) = self.function(s.function);
            }
            return Ok(Source::Dwarf);
        }
        match symbol {
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
            None if self.block_starts.is_empty() && self.symbols.is_empty() => Err(Miss::NoSymbols),
            None => Err(Miss::OutsideFunctions),
        }
    }

    /// Frames of the call sites `loc` and its own callers.
    fn push_callers(&self, mut loc: u32, out: &mut Vec<FrameRef<'a>>) {
        let locations = self.locations;
        while let Some(l) = locations.get(loc as usize) {
            let (function, linkage_name) = self.function(l.function);
            out.push(FrameRef {
                function,
                linkage_name,
                file: self.file(l.file),
                line: l.line,
                column: l.column,
            });
            loc = l.inlined_into;
        }
    }
}

/// Where the decoding of a block stopped, for sorted batches.
pub(super) struct Cursor<'a> {
    block: usize,
    reader: BlockReader<'a>,
    current: (u32, Entry),
    pending: Option<(u32, Entry)>,
}
