//! One compile unit to ranges: the line program becomes rows, the
//! `subprogram`/`inlined_subroutine` DIEs become nested address intervals,
//! and a sweep over every boundary address emits `(start, entry)` wherever
//! the innermost frame changes.

use std::collections::HashMap;
use std::rc::Rc;

use gimli::{AttributeValue, DebugInfoOffset, UnitRef};
use rustc_hash::FxHashMap;

use super::blocks::Entry;
use super::build::Tables;
use super::format::{Location, Scope, NONE};
use crate::elf::Reader;

/// Follow at most this many `abstract_origin`/`specification` links (a cycle
/// in malformed DWARF ends here).
const NAME_RECURSION_LIMIT: usize = 16;

/// Which DWARF file a reference points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DwarfFile {
    Primary,
    Supplementary,
}

/// Resolves `abstract_origin`/`specification` references to function names,
/// across units and into the supplementary file, memoised by target DIE.
pub(super) struct RefResolver<'d, 'a> {
    dwarf: &'d gimli::Dwarf<Reader<'a>>,
    /// Every unit header of the primary and the supplementary file.
    headers: [&'d [gimli::UnitHeader<Reader<'a>>]; 2],
    units: HashMap<(DwarfFile, usize), Rc<gimli::Unit<Reader<'a>>>>,
    names: FxHashMap<(DwarfFile, usize), u32>,
}

/// Every unit header of `dwarf` in order, and whether a broken header cut
/// the walk short.
pub(super) fn all_unit_headers<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
) -> (Vec<gimli::UnitHeader<Reader<'a>>>, bool) {
    let mut out = Vec::new();
    let mut iter = dwarf.units();
    loop {
        match iter.next() {
            Ok(Some(header)) => out.push(header),
            Ok(None) => return (out, false),
            Err(_) => return (out, true),
        }
    }
}

impl<'d, 'a> RefResolver<'d, 'a> {
    /// `primary` and `sup`: [`all_unit_headers`] of the file and of its
    /// supplementary file.
    pub fn new(
        dwarf: &'d gimli::Dwarf<Reader<'a>>,
        primary: &'d [gimli::UnitHeader<Reader<'a>>],
        sup: &'d [gimli::UnitHeader<Reader<'a>>],
    ) -> Self {
        Self {
            dwarf,
            headers: [primary, sup],
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
pub(super) struct UnitBuilder<'u, 'a, 'd, 'r> {
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
    pub fn new(
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

    pub fn run(mut self, out: &mut Vec<(u64, Entry)>) -> Result<(), gimli::Error> {
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
    /// innermost frame changes.
    fn sweep(&mut self, out: &mut Vec<(u64, Entry)>) {
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
        let mut last = Entry::EMPTY;
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
            let scope = match open.last() {
                Some(&(_, node)) => {
                    let inlined_into = self.outer_location(node);
                    Some(Scope {
                        function: self.nodes[node as usize].function,
                        inlined_into,
                    })
                }
                None if row.is_some() => Some(Scope {
                    function: NONE,
                    inlined_into: NONE,
                }),
                None => None,
            };
            let entry = match scope {
                Some(scope) => Entry {
                    scope: self.tables.scope(scope),
                    file,
                    line,
                    column,
                },
                None => Entry::EMPTY,
            };
            if entry != last {
                out.push((p, entry));
                last = entry;
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
