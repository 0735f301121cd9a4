//! A file's unwind table, compact: every address range of its `.eh_frame`
//! (and `.debug_frame`, for code built without unwind tables) with the
//! rule that leaves the function there, sorted, adjacent equal rules
//! merged, the rules themselves deduplicated into a small table — the form
//! symtrace-agent's BPF walk searches ("stack deltas", as the OpenTelemetry
//! eBPF profiler calls them). Built once per file, from the sections' bytes
//! alone: pure logic, no I/O. Every FDE row gimli evaluates becomes one
//! range; addresses no FDE covers are [`Rule::UNKNOWN`]. A crate of its own
//! so that it is optimized even in debug builds (the agent's tests build
//! the tables of hundred-MB debug binaries).

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, DebugFrame, EhFrame, EndianSlice, LittleEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};

/// The register the canonical frame address is relative to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CfaBase {
    /// The stack pointer (a frameless function, a prologue or epilogue).
    Rsp,
    /// The frame pointer (the function has set up its frame).
    Rbp,
}

/// Where the caller's `%rbp` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SavedRbp {
    /// Still in `%rbp` (not saved, or not yet clobbered).
    Same,
    /// On the stack at CFA + this offset.
    AtCfa(i32),
}

/// How to leave a function at an address: the CFA is `base` + `cfa`, the
/// return address at CFA + `ra`, the caller's `%rbp` where `rbp` says; or
/// the outermost frame; or unknown (no CFI, or a rule this table does not
/// express: a DWARF expression, a register other than `%rsp`/`%rbp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A step to the caller.
    Step {
        /// The CFA's register.
        base: CfaBase,
        /// The CFA's offset from it.
        cfa: i32,
        /// The return address's offset from the CFA (-8 on x86-64).
        ra: i32,
        /// Where the caller's `%rbp` is.
        rbp: SavedRbp,
    },
    /// The return address is undefined: the outermost frame (`_start`).
    Outermost,
    /// Nothing known here.
    Unknown,
}

impl Rule {
    /// No rule known.
    pub const UNKNOWN: Rule = Rule::Unknown;
}

/// Bounds on one file's table: a file past them gets none (its frames are
/// walked by frame pointer only).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Address ranges kept (after merging).
    pub ranges: usize,
    /// Distinct rules (the table's index is 16 bits).
    pub rules: usize,
    /// FDE rows evaluated (the work done for one file).
    pub rows: usize,
    /// Bytes of CFI instructions evaluated, per byte of `.eh_frame`: each
    /// FDE replays its CIE's initial instructions, so a hostile file with
    /// one huge CIE shared by many FDEs would cost its square.
    pub work_per_byte: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            ranges: 1 << 21,
            rules: 1 << 15,
            rows: 1 << 23,
            work_per_byte: 16,
        }
    }
}

/// Why a file gets no table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// No section, or only empty ones.
    #[error("the file has no .eh_frame or .debug_frame")]
    Empty,
    /// A bound of [`Limits`] crossed.
    #[error("more than {limit} {what} in the file's CFI")]
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// Its bound.
        limit: usize,
    },
    /// Code addresses that do not fit 32-bit offsets.
    #[error("code addresses span more than 4 GiB ({low:#x}..{high:#x})")]
    TooWide {
        /// The lowest address.
        low: u64,
        /// The highest.
        high: u64,
    },
}

/// One file's unwind table: `starts[i]` (relative to `base`) begins a
/// range ruled by `rules[rule_of[i]]` up to the next start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The ELF address the starts are relative to.
    pub base: u64,
    /// Each range's start, sorted.
    pub starts: Vec<u32>,
    /// Each range's rule, an index in `rules`.
    pub rule_of: Vec<u16>,
    /// The distinct rules.
    pub rules: Vec<Rule>,
    /// FDEs left out as malformed (their addresses are unknown), and a
    /// malformed entry list that ended the reading.
    pub skipped: usize,
}

impl Table {
    /// The rule at ELF virtual address `address`.
    pub fn rule(&self, address: u64) -> Rule {
        let Some(offset) = address
            .checked_sub(self.base)
            .and_then(|o| u32::try_from(o).ok())
        else {
            return Rule::UNKNOWN;
        };
        let at = self.starts.partition_point(|&s| s <= offset);
        match at.checked_sub(1) {
            Some(i) => self.rules[usize::from(self.rule_of[i])],
            None => Rule::UNKNOWN,
        }
    }

    /// Bytes of address space (from the first range to the end of the
    /// last) under each kind of rule: CFA from `%rbp` (the function keeps
    /// a frame pointer there), from `%rsp`, the outermost frame, unknown.
    pub fn coverage(&self) -> Coverage {
        let mut c = Coverage::default();
        for (i, pair) in self.starts.windows(2).enumerate() {
            let len = u64::from(pair[1] - pair[0]);
            match self.rules[usize::from(self.rule_of[i])] {
                Rule::Step {
                    base: CfaBase::Rbp, ..
                } => c.rbp += len,
                Rule::Step { .. } => c.rsp += len,
                Rule::Outermost => c.outermost += len,
                Rule::Unknown => c.unknown += len,
            }
        }
        c
    }

    /// The share of the file's code (bytes with a rule) in functions that
    /// keep no frame pointer: runs of `%rsp`-based rules longer than
    /// [`FRAMED_RUN`] bytes (a prologue before `mov %rsp,%rbp`, or the
    /// `ret` after `pop %rbp`, is shorter; a frameless function's body is
    /// longer).
    pub fn frameless_share(&self) -> f64 {
        let (mut run, mut frameless, mut code) = (0u64, 0u64, 0u64);
        for (i, pair) in self.starts.windows(2).enumerate() {
            let len = u64::from(pair[1] - pair[0]);
            match self.rules[usize::from(self.rule_of[i])] {
                Rule::Step {
                    base: CfaBase::Rsp, ..
                } => {
                    run += len;
                    code += len;
                    continue;
                }
                Rule::Step { .. } | Rule::Outermost => code += len,
                Rule::Unknown => {}
            }
            if run > FRAMED_RUN {
                frameless += run;
            }
            run = 0;
        }
        if run > FRAMED_RUN {
            frameless += run;
        }
        frameless as f64 / code.max(1) as f64
    }

    /// Whether the file keeps frame pointers: at most [`FRAMED_SHARE`] of
    /// its code is in frameless functions (a team's build with frame
    /// pointers, linked with the C runtime's few frameless functions).
    /// Its functions' callers are then found by frame pointer at every
    /// call site, and only the leaf needs the table.
    pub fn framed(&self) -> bool {
        self.frameless_share() <= FRAMED_SHARE
    }

    /// Bytes held: 6 per range, and the rules.
    pub fn bytes(&self) -> usize {
        self.starts.len() * 6 + self.rules.len() * std::mem::size_of::<Rule>()
    }
}

/// The longest run of `%rsp`-based rules a function keeping its frame
/// pointer has: `endbr64; push %rbp; mov %rsp,%rbp` (8 bytes).
pub const FRAMED_RUN: u64 = 8;

/// The share of frameless code a file that keeps frame pointers may have:
/// the C runtime's start files and libraries linked in precompiled (Rust's
/// std) are frameless. Measured: a small C program built with frame
/// pointers 1.4%, symtrace-agent 2.1%; node 5.8%, libjvm 5.7% (their
/// frameless parts are real code, walked by the table); libc 83%.
pub const FRAMED_SHARE: f64 = 0.03;

/// [`Table::coverage`]'s answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// Bytes whose CFA is `%rbp`-based.
    pub rbp: u64,
    /// ... `%rsp`-based.
    pub rsp: u64,
    /// ... of outermost frames.
    pub outermost: u64,
    /// ... without a rule.
    pub unknown: u64,
}

/// Which section a file's CFI bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `.eh_frame` (loaded with the code, pointer encodings).
    EhFrame,
    /// `.debug_frame` (what `-g` without unwind tables emits; absolute
    /// addresses).
    DebugFrame,
}

/// One CFI section of a file: its kind, bytes and ELF address.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// Which section.
    pub kind: Kind,
    /// Its bytes.
    pub bytes: &'a [u8],
    /// Its address in the ELF's address space (`.debug_frame`'s is 0).
    pub address: u64,
}

/// Builds the table of `.eh_frame` (its bytes, and its address in the
/// ELF's address space; `text` is `.text`'s address, for FDEs that encode
/// addresses relative to it).
pub fn build(eh_frame: &[u8], address: u64, text: u64, limits: Limits) -> Result<Table, Error> {
    build_parts(
        &[Part {
            kind: Kind::EhFrame,
            bytes: eh_frame,
            address,
        }],
        text,
        limits,
    )
}

/// Builds one table of all of a file's CFI sections: a file may describe
/// some of its code in `.eh_frame` (the C runtime's start files) and the
/// rest in `.debug_frame` (units built with `-g` and no unwind tables).
/// Where both describe an address, the rows overlap as [`assemble`] says.
pub fn build_parts(parts: &[Part<'_>], text: u64, limits: Limits) -> Result<Table, Error> {
    if parts.iter().all(|p| p.bytes.is_empty()) {
        return Err(Error::Empty);
    }
    // Every row, in section order.
    let mut rows = Rows::new(limits);
    let mut skipped = 0;
    for part in parts.iter().filter(|p| !p.bytes.is_empty()) {
        let bases = BaseAddresses::default()
            .set_eh_frame(part.address)
            .set_text(text);
        skipped += match part.kind {
            Kind::EhFrame => rows_of(
                EhFrame::new(part.bytes, LittleEndian),
                part.bytes.len(),
                &bases,
                limits,
                &mut rows,
            )?,
            Kind::DebugFrame => {
                let mut section = DebugFrame::new(part.bytes, LittleEndian);
                section.set_address_size(8);
                rows_of(section, part.bytes.len(), &bases, limits, &mut rows)?
            }
        };
    }
    let mut table = rows.assemble(limits)?;
    table.skipped = skipped;
    Ok(table)
}

/// One row as built: `[start, start + len)` under the rule at `rule` in
/// [`Rows`]'s rules. 16 bytes: node's 2.7 MB `.eh_frame` evaluates to
/// over a million FDE rows, which as `(u64, u64, Rule)` held 64 MB at the
/// peak of its build (heaptrack); as these, merged as they come, 8 MB.
#[derive(Debug, Clone, Copy)]
struct Row {
    start: u64,
    len: u32,
    rule: u16,
}

impl Row {
    fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }
}

/// The rows of a file's sections as they are evaluated: each distinct rule
/// once, each row compact ([`Row`]).
struct Rows {
    rows: Vec<Row>,
    rules: Vec<Rule>,
    index: HashMap<Rule, u16>,
    /// Distinct rules allowed (at most 65536: the index is 16 bits).
    max_rules: usize,
    /// FDE rows evaluated (merged or not), against `Limits::rows`.
    evaluated: usize,
}

impl Rows {
    fn new(limits: Limits) -> Rows {
        Rows {
            rows: Vec::new(),
            rules: Vec::new(),
            index: HashMap::new(),
            max_rules: limits.rules.min(usize::from(u16::MAX) + 1),
            evaluated: 0,
        }
    }

    fn rule_index(&mut self, rule: Rule) -> Result<u16, Error> {
        if let Some(&i) = self.index.get(&rule) {
            return Ok(i);
        }
        if self.rules.len() >= self.max_rules {
            return Err(Error::TooLarge {
                what: "distinct rules",
                limit: self.max_rules,
            });
        }
        let i = self.rules.len() as u16; // < max_rules ≤ 65536
        self.rules.push(rule);
        self.index.insert(rule, i);
        Ok(i)
    }

    /// Adds `[start, end)` (`start < end`); with `merge`, a row that
    /// continues the last one under the same rule extends it.
    fn push(&mut self, start: u64, end: u64, rule: Rule, merge: bool) -> Result<(), Error> {
        let len = end - start;
        let too_wide = Error::TooWide {
            low: start,
            high: end,
        };
        let rule = self.rule_index(rule)?;
        if merge {
            if let Some(last) = self.rows.last_mut() {
                if last.rule == rule && last.end() == start {
                    last.len = u32::try_from(u64::from(last.len) + len).map_err(|_| too_wide)?;
                    return Ok(());
                }
            }
        }
        let len = u32::try_from(len).map_err(|_| too_wide)?;
        self.rows.push(Row { start, len, rule });
        Ok(())
    }

    /// The table of the rows: see [`assemble`].
    fn assemble(self, limits: Limits) -> Result<Table, Error> {
        let Rows {
            mut rows, rules, ..
        } = self;
        let limits = Limits {
            rules: limits.rules.min(usize::from(u16::MAX) + 1),
            ..limits
        };
        // Nearly sorted as a rule (linkers lay FDEs out in address order).
        rows.sort_unstable_by_key(|r| (r.start, r.end()));
        let low = rows.first().map_or(0, |r| r.start);
        let high = rows.iter().map(Row::end).max().unwrap_or(0);
        if high - low > u64::from(u32::MAX) {
            return Err(Error::TooWide { low, high });
        }
        let mut table = Table {
            base: low,
            starts: Vec::new(),
            rule_of: Vec::new(),
            rules: Vec::new(),
            skipped: 0,
        };
        // The table's index of each of `rules` (and of the unknown rule of
        // the gaps), given in order of first use.
        let mut index: HashMap<Rule, u16> = HashMap::new();
        let mut push = |table: &mut Table, at: u64, rule: Rule| -> Result<(), Error> {
            if table.rule_of.last().map(|&i| table.rules[usize::from(i)]) == Some(rule) {
                return Ok(());
            }
            let i = match index.get(&rule) {
                Some(&i) => i,
                None => {
                    if table.rules.len() >= limits.rules {
                        return Err(Error::TooLarge {
                            what: "distinct rules",
                            limit: limits.rules,
                        });
                    }
                    let i = table.rules.len() as u16; // < limits.rules ≤ 65536
                    table.rules.push(rule);
                    index.insert(rule, i);
                    i
                }
            };
            if table.starts.len() >= limits.ranges {
                return Err(Error::TooLarge {
                    what: "address ranges",
                    limit: limits.ranges,
                });
            }
            // `at - low` ≤ `high - low`, checked above to fit.
            table.starts.push((at - low) as u32);
            table.rule_of.push(i);
            Ok(())
        };
        let mut covered = low;
        for (i, row) in rows.iter().enumerate() {
            let (start, end) = (row.start, row.end());
            if start > covered {
                push(&mut table, covered, Rule::UNKNOWN)?;
            }
            // A later row starting inside this one cuts it short.
            let end = rows
                .get(i + 1)
                .map_or(end, |next| end.min(next.start.max(start)));
            // (Of two rows at one start, the later, longer one is kept.)
            if end > start {
                push(&mut table, start, rules[usize::from(row.rule)])?;
            }
            covered = covered.max(end);
        }
        push(&mut table, covered, Rule::UNKNOWN)?;
        table.starts.shrink_to_fit();
        table.rule_of.shrink_to_fit();
        Ok(table)
    }
}

/// Appends the rows of one section (`len` bytes) to `rows`; returns how
/// many entries were skipped as malformed.
fn rows_of<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: S,
    len: usize,
    bases: &BaseAddresses,
    limits: Limits,
    rows: &mut Rows,
) -> Result<usize, Error> {
    let mut ctx = Box::new(UnwindContext::<usize>::new());
    // One FDE's rows, kept until all of them evaluated (a malformed one
    // drops the FDE's rows), merged as they come.
    let mut fde_rows: Vec<(u64, u64, Rule)> = Vec::new();
    // A malformed FDE leaves its addresses unknown, not the whole file's;
    // a malformed entry list ends the reading there.
    let mut skipped = 0;
    let mut entries = section.entries(bases);
    let work_limit = limits
        .work_per_byte
        .saturating_mul(len)
        .saturating_add(1 << 16);
    let mut work = 0usize;
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(_) => {
                skipped += 1;
                break;
            }
        };
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            skipped += 1;
            continue;
        };
        work = work
            .saturating_add(fde.entry_len())
            .saturating_add(fde.cie().entry_len());
        if work > work_limit {
            return Err(Error::TooLarge {
                what: "bytes of CFI instructions replayed",
                limit: work_limit,
            });
        }
        let Ok(mut table) = fde.rows(&section, bases, &mut ctx) else {
            skipped += 1;
            continue;
        };
        fde_rows.clear();
        let complete = loop {
            let row = match table.next_row() {
                Ok(Some(row)) => row,
                Ok(None) => break true,
                Err(_) => break false,
            };
            if row.start_address() >= row.end_address() {
                continue;
            }
            if rows.evaluated >= limits.rows {
                return Err(Error::TooLarge {
                    what: "rows",
                    limit: limits.rows,
                });
            }
            rows.evaluated += 1;
            let (start, end) = (row.start_address(), row.end_address());
            let rule = rule_of(
                row.cfa(),
                row.register(X86_64::RA),
                row.register(X86_64::RBP),
            );
            match fde_rows.last_mut() {
                Some(last) if last.1 == start && last.2 == rule => last.1 = end,
                _ => fde_rows.push((start, end, rule)),
            }
        };
        if !complete {
            skipped += 1;
            continue;
        }
        for &(start, end, rule) in &fde_rows {
            rows.push(start, end, rule, true)?;
        }
    }
    Ok(skipped)
}

/// The table of rows (start, end, rule), in any order: sorted, gaps
/// filled with [`Rule::UNKNOWN`], adjacent equal rules merged. Where rows
/// overlap (malformed or duplicated FDEs), the later start wins and the
/// rest of the earlier row is unknown.
pub fn assemble(rows: Vec<(u64, u64, Rule)>, limits: Limits) -> Result<Table, Error> {
    let mut compact = Rows::new(limits);
    for (start, end, rule) in rows {
        if start < end {
            compact.push(start, end, rule, false)?;
        }
    }
    compact.assemble(limits)
}

/// The rule of one row: its CFA, return-address and `%rbp` rules.
pub fn rule_of(cfa: &CfaRule<usize>, ra: RegisterRule<usize>, rbp: RegisterRule<usize>) -> Rule {
    let CfaRule::RegisterAndOffset { register, offset } = *cfa else {
        return Rule::Unknown;
    };
    let base = match register {
        X86_64::RSP => CfaBase::Rsp,
        X86_64::RBP => CfaBase::Rbp,
        _ => return Rule::Unknown,
    };
    let ra = match ra {
        RegisterRule::Offset(o) => o,
        RegisterRule::Undefined => return Rule::Outermost,
        _ => return Rule::Unknown,
    };
    let rbp = match rbp {
        RegisterRule::Offset(o) => match i32::try_from(o) {
            Ok(o) => SavedRbp::AtCfa(o),
            Err(_) => return Rule::Unknown,
        },
        RegisterRule::SameValue | RegisterRule::Undefined => SavedRbp::Same,
        _ if base == CfaBase::Rbp => SavedRbp::Same,
        _ => return Rule::Unknown,
    };
    match (i32::try_from(offset), i32::try_from(ra)) {
        (Ok(cfa), Ok(ra)) => Rule::Step { base, cfa, ra, rbp },
        _ => Rule::Unknown,
    }
}

pub mod pages;

#[cfg(test)]
mod tests;
