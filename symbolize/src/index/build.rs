//! Builds a symbol index from DWARF and symbol tables.
//!
//! One pass over the compile units, each parsed once and dropped: the line
//! program becomes rows, the `subprogram`/`inlined_subroutine` DIEs become
//! nested address intervals, and a sweep over every boundary address emits
//! `(start, location)` ranges. Only the deduplicated tables (locations,
//! functions, files, strings) and the ranges outlive a unit, so memory grows
//! with the index, not with the DWARF. Names are demangled once per distinct
//! function here, never at lookup.

use std::collections::HashMap;
use std::rc::Rc;

use gimli::{AttributeValue, DebugInfoOffset, UnitRef};
use rustc_hash::FxHashMap;

use super::format::{self, Location, StrRef, SymbolEntry, NONE};
use crate::elf::{LoadedDwarf, Reader};
use crate::symtab::SymbolTable;
use crate::{demangle, Error, Inputs, Source};

/// Follow at most this many `abstract_origin`/`specification` links (a cycle
/// in malformed DWARF ends here).
const NAME_RECURSION_LIMIT: usize = 16;

/// What a build produced, besides the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Compile units read.
    pub units: usize,
    /// Compile units skipped because their DWARF is malformed.
    pub bad_units: usize,
    /// Address ranges in the index.
    pub ranges: usize,
    /// Distinct source locations.
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
    let loaded = LoadedDwarf::load(inputs)?;
    let symbols = SymbolTable::load(inputs)?;
    let mut tables = Tables::default();
    let mut ranges: Vec<(u64, u32)> = Vec::new();
    let mut stats = BuildStats::default();
    let has_dwarf = loaded.primary.has_debug_info();
    if has_dwarf {
        let dwarf = loaded.dwarf();
        let mut refs = RefResolver::new(&dwarf);
        let mut headers = dwarf.units();
        loop {
            let header = match headers.next() {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(_) => {
                    // A broken unit header: the rest of .debug_info cannot be
                    // walked.
                    stats.bad_units += 1;
                    break;
                }
            };
            if matches!(
                header.type_(),
                gimli::UnitType::Partial | gimli::UnitType::Type { .. }
            ) {
                continue;
            }
            stats.units += 1;
            let Ok(unit) = dwarf.unit(header) else {
                stats.bad_units += 1;
                continue;
            };
            let before = ranges.len();
            let unit = UnitRef::new(&dwarf, &unit);
            if UnitBuilder::new(unit, &mut tables, &mut refs)
                .run(&mut ranges)
                .is_err()
            {
                ranges.truncate(before);
                stats.bad_units += 1;
            }
        }
    }
    let symbol_entries = tables.symbols(&symbols);
    let ranges = finish_ranges(ranges);
    stats.ranges = ranges.len();
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

/// Sorts ranges from all units, drops repeats and "no location" markers
/// where another unit has a real one at the same address.
fn finish_ranges(mut ranges: Vec<(u64, u32)>) -> Vec<(u64, u32)> {
    ranges.sort_unstable_by_key(|&(start, loc)| (start, loc == NONE));
    let mut out: Vec<(u64, u32)> = Vec::with_capacity(ranges.len());
    for (start, loc) in ranges {
        match out.last() {
            Some(&(s, _)) if s == start => continue,
            Some(&(_, l)) if l == loc => continue,
            None if loc == NONE => continue,
            _ => out.push((start, loc)),
        }
    }
    out
}

/// The deduplicated tables every unit adds to.
#[derive(Default)]
struct Tables {
    strings: Vec<u8>,
    string_ids: FxHashMap<Box<str>, StrRef>,
    files: Vec<StrRef>,
    file_ids: FxHashMap<StrRef, u32>,
    functions: Vec<format::Function>,
    function_ids: FxHashMap<Box<str>, u32>,
    locations: Vec<Location>,
    location_ids: FxHashMap<Location, u32>,
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

    fn file(&mut self, path: &str) -> u32 {
        let s = self.string(path);
        let next = self.files.len() as u32;
        *self.file_ids.entry(s).or_insert_with(|| {
            self.files.push(s);
            next
        })
    }

    /// A function by its raw name; demangled here, once.
    fn function(&mut self, raw: &str) -> u32 {
        if let Some(&id) = self.function_ids.get(raw) {
            return id;
        }
        let function = match demangle(raw) {
            Some(demangled) => format::Function {
                name: self.string(&demangled),
                raw: self.string(raw),
            },
            None => format::Function {
                name: self.string(raw),
                raw: StrRef { offset: 0, len: 0 },
            },
        };
        let id = self.functions.len() as u32;
        self.functions.push(function);
        self.function_ids.insert(raw.into(), id);
        id
    }

    fn location(&mut self, location: Location) -> u32 {
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
        ranges: &[(u64, u32)],
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
        let count = |n: usize, what: &str| {
            u32::try_from(n).map_err(|_| Error::Unsupported(format!("more than 2^32 {what}")))
        };
        let header = format::Header {
            magic: format::MAGIC,
            version: format::VERSION,
            flags,
            base,
            ranges: count(ranges.len(), "ranges")?,
            locations: count(self.locations.len(), "locations")?,
            functions: count(self.functions.len(), "functions")?,
            files: count(self.files.len(), "files")?,
            symbols: count(symbols.len(), "symbols")?,
            _reserved: 0,
            strings_len: self.strings.len() as u64,
            _reserved2: [0; 2],
        };
        if u32::try_from(self.strings.len()).is_err() {
            return Err(Error::Unsupported("more than 4 GiB of names".into()));
        }
        let starts: Vec<u32> = ranges.iter().map(|r| (r.0 - base) as u32).collect();
        let locs: Vec<u32> = ranges.iter().map(|r| r.1).collect();
        let mut out = Vec::new();
        let mut push = |bytes: &[u8]| {
            out.extend_from_slice(bytes);
            out.resize(format::align8(out.len()), 0);
        };
        push(bytemuck::bytes_of(&header));
        push(bytemuck::cast_slice(&starts));
        push(bytemuck::cast_slice(&locs));
        push(bytemuck::cast_slice(&self.locations));
        push(bytemuck::cast_slice(&self.functions));
        push(bytemuck::cast_slice(&self.files));
        push(bytemuck::cast_slice(symbols));
        push(&self.strings);
        Ok(out)
    }
}

/// Which DWARF file a reference points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DwarfFile {
    Primary,
    Supplementary,
}

/// Resolves `abstract_origin`/`specification` references to function names,
/// across units and into the supplementary file, memoised by target DIE.
struct RefResolver<'d, 'a> {
    dwarf: &'d gimli::Dwarf<Reader<'a>>,
    headers: [Vec<gimli::UnitHeader<Reader<'a>>>; 2],
    units: HashMap<(DwarfFile, usize), Rc<gimli::Unit<Reader<'a>>>>,
    names: FxHashMap<(DwarfFile, usize), u32>,
}

impl<'d, 'a> RefResolver<'d, 'a> {
    fn new(dwarf: &'d gimli::Dwarf<Reader<'a>>) -> Self {
        let headers_of = |d: &gimli::Dwarf<Reader<'a>>| {
            let mut out = Vec::new();
            let mut iter = d.units();
            while let Ok(Some(h)) = iter.next() {
                out.push(h);
            }
            out
        };
        let sup = dwarf.sup().map(headers_of).unwrap_or_default();
        Self {
            dwarf,
            headers: [headers_of(dwarf), sup],
            units: HashMap::new(),
            names: FxHashMap::default(),
        }
    }

    fn dwarf_of(&self, file: DwarfFile) -> Option<&'d gimli::Dwarf<Reader<'a>>> {
        match file {
            DwarfFile::Primary => Some(self.dwarf),
            DwarfFile::Supplementary => self.dwarf.sup(),
        }
    }

    /// The unit containing `offset` in `file`.
    fn unit_at(
        &mut self,
        file: DwarfFile,
        offset: DebugInfoOffset,
    ) -> Option<Rc<gimli::Unit<Reader<'a>>>> {
        let headers = &self.headers[file as usize];
        let i = headers.partition_point(|h| {
            h.offset()
                .as_debug_info_offset()
                .is_some_and(|o| o.0 <= offset.0)
        });
        let header = *headers.get(i.checked_sub(1)?)?;
        let start = header.offset().as_debug_info_offset()?.0;
        if let Some(unit) = self.units.get(&(file, start)) {
            return Some(unit.clone());
        }
        let unit = Rc::new(self.dwarf_of(file)?.unit(header).ok()?);
        self.units.insert((file, start), unit.clone());
        Some(unit)
    }

    /// The function name a reference attribute leads to, or `NONE`.
    fn name(
        &mut self,
        tables: &mut Tables,
        file: DwarfFile,
        unit: UnitRef<'_, Reader<'a>>,
        value: AttributeValue<Reader<'a>>,
        limit: usize,
    ) -> u32 {
        if limit == 0 {
            return NONE;
        }
        let (file, target) = match value {
            AttributeValue::UnitRef(offset) => match offset.to_debug_info_offset(&unit.header) {
                Some(target) => (file, target),
                None => return NONE,
            },
            AttributeValue::DebugInfoRef(target) => (file, target),
            AttributeValue::DebugInfoRefSup(target) => (DwarfFile::Supplementary, target),
            _ => return NONE,
        };
        if let Some(&id) = self.names.get(&(file, target.0)) {
            return id;
        }
        let id = self.read_name(tables, file, target, limit).unwrap_or(NONE);
        self.names.insert((file, target.0), id);
        id
    }

    fn read_name(
        &mut self,
        tables: &mut Tables,
        file: DwarfFile,
        target: DebugInfoOffset,
        limit: usize,
    ) -> Option<u32> {
        let unit = self.unit_at(file, target)?;
        let dwarf = self.dwarf_of(file)?;
        let unit_ref = UnitRef::new(dwarf, &unit);
        let offset = target.to_unit_offset(&unit.header)?;
        let mut entries = unit_ref.entries_raw(Some(offset)).ok()?;
        let abbrev = entries.read_abbreviation().ok()??;
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec).ok()?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(s) = unit_ref.attr_string(attr.value()) {
                        return Some(tables.function(&s.to_string_lossy()));
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(s) = unit_ref.attr_string(attr.value()) {
                        name = Some(s);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                    next = Some(attr.value());
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            return Some(tables.function(&name.to_string_lossy()));
        }
        let next = next?;
        Some(self.name(tables, file, unit_ref, next, limit - 1))
    }
}

/// A line-table row.
#[derive(Debug, Clone, Copy)]
struct Row {
    address: u64,
    file: u32,
    line: u32,
    column: u32,
    end: bool,
}

/// A function DIE with code: a subprogram or an inlined call.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// For inlined calls, the function they are inlined into.
    parent: u32,
    function: u32,
    call_file: u32,
    call_line: u32,
    call_column: u32,
}

#[derive(Debug, Clone, Copy)]
struct Interval {
    begin: u64,
    end: u64,
    node: u32,
}

/// Turns one compile unit into ranges.
struct UnitBuilder<'u, 'a, 'd, 'r> {
    unit: UnitRef<'u, Reader<'a>>,
    tables: &'u mut Tables,
    refs: &'r mut RefResolver<'d, 'a>,
    file_ids: FxHashMap<u64, u32>,
    nodes: Vec<Node>,
    intervals: Vec<Interval>,
    rows: Vec<Row>,
    outer: Vec<u32>,
}

const UNSET: u32 = NONE - 1;

impl<'u, 'a, 'd, 'r> UnitBuilder<'u, 'a, 'd, 'r> {
    fn new(
        unit: UnitRef<'u, Reader<'a>>,
        tables: &'u mut Tables,
        refs: &'r mut RefResolver<'d, 'a>,
    ) -> Self {
        Self {
            unit,
            tables,
            refs,
            file_ids: FxHashMap::default(),
            nodes: Vec::new(),
            intervals: Vec::new(),
            rows: Vec::new(),
            outer: Vec::new(),
        }
    }

    fn run(mut self, out: &mut Vec<(u64, u32)>) -> Result<(), gimli::Error> {
        self.read_lines()?;
        self.read_functions()?;
        self.sweep(out);
        Ok(())
    }

    /// The global id of the unit's file `index`, `NONE` if it has none.
    fn file(&mut self, index: u64) -> u32 {
        if let Some(&id) = self.file_ids.get(&index) {
            return id;
        }
        let id = self
            .render_file(index)
            .map_or(NONE, |path| self.tables.file(&path));
        self.file_ids.insert(index, id);
        id
    }

    /// The file's path the way `addr2line` renders it: the compilation
    /// directory, then the include directory, then the name; an absolute
    /// component replaces what came before.
    fn render_file(&self, index: u64) -> Option<String> {
        let program = self.unit.line_program.as_ref()?;
        let header = program.header();
        let file = header.file(index)?;
        let mut path = match &self.unit.comp_dir {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => String::new(),
        };
        if file.directory_index() != 0 {
            if let Some(dir) = file.directory(header) {
                let dir = self.unit.attr_string(dir).ok()?;
                path_push(&mut path, &dir.to_string_lossy());
            }
        }
        let name = self.unit.attr_string(file.path_name()).ok()?;
        path_push(&mut path, &name.to_string_lossy());
        Some(path)
    }

    fn read_lines(&mut self) -> Result<(), gimli::Error> {
        let Some(program) = self.unit.line_program.clone() else {
            return Ok(());
        };
        let mut rows = program.rows();
        let mut sequence_start = self.rows.len();
        while let Some((_, row)) = rows.next_row()? {
            let address = row.address();
            if row.end_sequence() {
                // Rows at the end address cover nothing.
                while self.rows.len() > sequence_start
                    && self.rows.last().is_some_and(|r| r.address >= address)
                {
                    self.rows.pop();
                }
                // Sequences of discarded code (linked at 0) are noise.
                if self
                    .rows
                    .get(sequence_start)
                    .is_some_and(|r| r.address == 0)
                {
                    self.rows.truncate(sequence_start);
                } else if self.rows.len() > sequence_start {
                    self.rows.push(Row {
                        address,
                        file: NONE,
                        line: 0,
                        column: 0,
                        end: true,
                    });
                }
                sequence_start = self.rows.len();
                continue;
            }
            let file_index = row.file_index();
            let line = row
                .line()
                .map_or(0, |l| u32::try_from(l.get()).unwrap_or(u32::MAX));
            let column = match row.column() {
                gimli::ColumnType::LeftEdge => 0,
                gimli::ColumnType::Column(c) => u32::try_from(c.get()).unwrap_or(u32::MAX),
            };
            let file = self.file(file_index);
            let new = Row {
                address,
                file,
                line,
                column,
                end: false,
            };
            let in_sequence = self.rows.len() > sequence_start;
            match self.rows.last_mut() {
                Some(last) if in_sequence && last.address == address => *last = new,
                _ => self.rows.push(new),
            }
        }
        Ok(())
    }

    fn read_functions(&mut self) -> Result<(), gimli::Error> {
        let unit = self.unit;
        let mut entries = unit.entries_raw(None)?;
        // (DIE depth, node or NONE) of the enclosing function DIEs.
        let mut stack: Vec<(isize, u32)> = Vec::new();
        while !entries.is_empty() {
            let depth = entries.next_depth();
            let Some(abbrev) = entries.read_abbreviation()? else {
                continue;
            };
            while stack.last().is_some_and(|&(d, _)| d >= depth) {
                stack.pop();
            }
            let tag = abbrev.tag();
            if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
                entries.skip_attributes(abbrev.attributes())?;
                continue;
            }
            let inlined = tag == gimli::DW_TAG_inlined_subroutine;
            let mut low_pc = None;
            let mut high_pc = None;
            let mut size = None;
            let mut ranges_offset = None;
            let mut linkage_name = None;
            let mut name = None;
            let mut origin = None;
            let mut call_file = None;
            let mut call_line = 0;
            let mut call_column = 0;
            for spec in abbrev.attributes() {
                let attr = entries.read_attribute(*spec)?;
                match attr.name() {
                    gimli::DW_AT_low_pc => match attr.value() {
                        AttributeValue::Addr(a) => low_pc = Some(a),
                        AttributeValue::DebugAddrIndex(i) => low_pc = Some(unit.address(i)?),
                        _ => {}
                    },
                    gimli::DW_AT_high_pc => match attr.value() {
                        AttributeValue::Addr(a) => high_pc = Some(a),
                        AttributeValue::DebugAddrIndex(i) => high_pc = Some(unit.address(i)?),
                        AttributeValue::Udata(s) => size = Some(s),
                        _ => {}
                    },
                    gimli::DW_AT_ranges => ranges_offset = unit.attr_ranges_offset(attr.value())?,
                    gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                        linkage_name = unit.attr_string(attr.value()).ok()
                    }
                    gimli::DW_AT_name => name = unit.attr_string(attr.value()).ok(),
                    gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                        origin = Some(attr.value())
                    }
                    gimli::DW_AT_call_file => {
                        // DWARF 5 numbers files from 0; before, 0 meant none.
                        if let AttributeValue::FileIndex(fi) = attr.value() {
                            if fi > 0 || unit.header.version() >= 5 {
                                call_file = Some(fi);
                            }
                        }
                    }
                    gimli::DW_AT_call_line => {
                        call_line = attr
                            .udata_value()
                            .map_or(0, |v| v.min(u32::MAX as u64) as u32)
                    }
                    gimli::DW_AT_call_column => {
                        call_column = attr
                            .udata_value()
                            .map_or(0, |v| v.min(u32::MAX as u64) as u32)
                    }
                    _ => {}
                }
            }
            let first_interval = self.intervals.len();
            let node = self.nodes.len() as u32;
            let mut add = |begin: u64, end: u64| {
                if begin != 0 && begin < end {
                    self.intervals.push(Interval { begin, end, node });
                }
            };
            if let Some(offset) = ranges_offset {
                let mut list = unit.ranges(offset)?;
                while let Some(r) = list.next()? {
                    add(r.begin, r.end);
                }
            } else if let (Some(begin), Some(end)) = (low_pc, high_pc) {
                add(begin, end);
            } else if let (Some(begin), Some(size)) = (low_pc, size) {
                add(begin, begin.wrapping_add(size));
            }
            if self.intervals.len() == first_interval {
                // No code (a declaration or an abstract instance): whatever
                // it contains is not inlined into anything that runs.
                stack.push((depth, NONE));
                continue;
            }
            let function = if let Some(raw) = linkage_name {
                self.tables.function(&raw.to_string_lossy())
            } else if let Some(raw) = name {
                self.tables.function(&raw.to_string_lossy())
            } else if let Some(origin) = origin {
                self.refs.name(
                    self.tables,
                    DwarfFile::Primary,
                    unit,
                    origin,
                    NAME_RECURSION_LIMIT,
                )
            } else {
                NONE
            };
            let parent = match (inlined, stack.last()) {
                (true, Some(&(_, parent))) => parent,
                _ => NONE,
            };
            let call_file = match call_file {
                Some(index) => self.file(index),
                None => NONE,
            };
            self.nodes.push(Node {
                parent,
                function,
                call_file,
                call_line,
                call_column,
            });
            stack.push((depth, node));
        }
        Ok(())
    }

    /// The location an inlined call's frame continues in (its caller, at
    /// the call site), interned outermost first so `inlined_into` always
    /// points at a smaller index.
    fn outer_location(&mut self, node: u32) -> u32 {
        if self.outer.len() < self.nodes.len() {
            self.outer.resize(self.nodes.len(), UNSET);
        }
        let mut chain = Vec::new();
        let mut n = node;
        while n != NONE && self.outer[n as usize] == UNSET {
            chain.push(n);
            n = self.nodes[n as usize].parent;
            if chain.len() > self.nodes.len() {
                break; // cannot happen with parents from a DIE tree
            }
        }
        let mut above = if n == NONE {
            NONE
        } else {
            self.outer[n as usize]
        };
        for &n in chain.iter().rev() {
            let Node {
                parent,
                call_file,
                call_line,
                call_column,
                ..
            } = self.nodes[n as usize];
            above = if parent == NONE {
                NONE
            } else {
                self.tables.location(Location {
                    function: self.nodes[parent as usize].function,
                    file: call_file,
                    line: call_line,
                    column: call_column,
                    inlined_into: above,
                })
            };
            self.outer[n as usize] = above;
        }
        above
    }

    /// Walks every boundary address in order, tracking the current line row
    /// and the innermost function interval, and emits a range wherever the
    /// location changes.
    fn sweep(&mut self, out: &mut Vec<(u64, u32)>) {
        self.rows.sort_by_key(|r| (r.address, !r.end));
        self.intervals
            .sort_unstable_by_key(|i| (i.begin, std::cmp::Reverse(i.end), i.node));
        let mut points: Vec<u64> = Vec::with_capacity(self.rows.len() + 2 * self.intervals.len());
        points.extend(self.rows.iter().map(|r| r.address));
        points.extend(self.intervals.iter().flat_map(|i| [i.begin, i.end]));
        points.sort_unstable();
        points.dedup();

        let mut row_at = 0;
        let mut row: Option<Row> = None;
        let mut interval_at = 0;
        let mut open: Vec<(u64, u32)> = Vec::new();
        let mut last = NONE;
        let intervals = std::mem::take(&mut self.intervals);
        for &p in &points {
            while let Some(r) = self.rows.get(row_at).filter(|r| r.address <= p) {
                row = (!r.end).then_some(*r);
                row_at += 1;
            }
            while open.last().is_some_and(|&(end, _)| end <= p) {
                open.pop();
            }
            while let Some(i) = intervals.get(interval_at).filter(|i| i.begin <= p) {
                if i.end > p {
                    open.push((i.end, i.node));
                }
                interval_at += 1;
            }
            let (file, line, column) = row.map_or((NONE, 0, 0), |r| (r.file, r.line, r.column));
            let location = match open.last() {
                Some(&(_, node)) => {
                    let inlined_into = self.outer_location(node);
                    self.tables.location(Location {
                        function: self.nodes[node as usize].function,
                        file,
                        line,
                        column,
                        inlined_into,
                    })
                }
                None if row.is_some() => self.tables.location(Location {
                    function: NONE,
                    file,
                    line,
                    column,
                    inlined_into: NONE,
                }),
                None => NONE,
            };
            if location != last {
                out.push((p, location));
                last = location;
            }
        }
    }
}

fn path_push(path: &mut String, p: &str) {
    if p.starts_with('/') {
        *path = p.to_owned();
    } else {
        if !path.is_empty() && !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(p);
    }
}
