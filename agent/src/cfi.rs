//! Call-frame information (`.eh_frame`, through `.eh_frame_hdr`'s sorted
//! table when there is one) of the files whose code samples land in, read
//! with gimli: what the agent needs to step out of the leaf function when the
//! frame-pointer chain cannot (a frameless leaf, or a function in its
//! prologue or epilogue).
//!
//! A file's two sections are read once, on its first leaf sample, into
//! memory, in a job (`files::Binaries::load_cfi`: bounded per file and in
//! total; nothing stays mapped, so a file truncated underneath cannot fault
//! the agent); the rule at each leaf address is computed once and kept
//! (bounded per file).
//!
//! [`deltas`] builds a file's whole unwind table at once (the form the BPF
//! walk of issue #40 will search); `symtrace-agent unwind-table` prints
//! it. The leaf step here evaluates lazily, per sampled address: it needs
//! a few rules of a file, not all of them.

/// Whole-file unwind tables (the `symtrace-unwind` crate).
pub use symtrace_unwind as deltas;
pub mod inspect;
pub mod tables;

use std::collections::HashMap;

use crate::jobs::{Ticket, Waiting};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};

/// Where a section is in its file and in the ELF's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SectionRef {
    pub offset: u64,
    pub size: u64,
    pub address: u64,
}

/// How to leave the function at one address, for the leaf frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafRule {
    /// The canonical frame address is `%rbp`-based: the function has set up
    /// its frame, and the frame-pointer chain is right from here.
    Framed,
    /// `%rsp`-based: a frameless function, or a prologue or epilogue. The
    /// return address is at `%rsp + ra`; the caller's `%rbp` is at
    /// `%rsp + rbp` when this function saved it, else `%rbp` still is it.
    Frameless { ra: i64, rbp: Option<i64> },
    /// The return address is undefined: the outermost frame (`_start`).
    Outermost,
    /// No CFI for this address, or a rule the agent does not evaluate (a
    /// DWARF expression, as in the PLT).
    Unknown,
}

/// A table rule as the leaf step reads it.
pub fn leaf_of(rule: deltas::Rule) -> LeafRule {
    use deltas::{CfaBase, Rule, SavedRbp};
    match rule {
        Rule::Step {
            base: CfaBase::Rbp, ..
        } => LeafRule::Framed,
        Rule::Step {
            base: CfaBase::Rsp,
            cfa,
            ra,
            rbp,
        } => LeafRule::Frameless {
            ra: i64::from(cfa) + i64::from(ra),
            rbp: match rbp {
                SavedRbp::Same => None,
                SavedRbp::AtCfa(o) => Some(i64::from(cfa) + i64::from(o)),
            },
        },
        Rule::Outermost => LeafRule::Outermost,
        Rule::Unknown => LeafRule::Unknown,
    }
}

/// Address rules kept per file before its cache starts over.
const RULES_PER_FILE: usize = 16 * 1024;

/// One file's CFI.
pub struct FileCfi {
    eh_frame: Vec<u8>,
    eh_frame_hdr: Vec<u8>,
    bases: BaseAddresses,
    /// FDE start address → offset in `.eh_frame`, sorted; built only when
    /// there is no `.eh_frame_hdr` table.
    index: Vec<(u64, usize)>,
    rules: HashMap<u64, LeafRule>,
}

impl FileCfi {
    /// The CFI of a file from its sections' bytes and addresses. `None`
    /// when there is no `.eh_frame`.
    pub fn new(
        eh_frame: (Vec<u8>, u64),
        eh_frame_hdr: Option<(Vec<u8>, u64)>,
        text_address: u64,
    ) -> Option<FileCfi> {
        if eh_frame.0.is_empty() {
            return None;
        }
        let (hdr, hdr_address) = eh_frame_hdr.unwrap_or_default();
        let bases = BaseAddresses::default()
            .set_eh_frame(eh_frame.1)
            .set_eh_frame_hdr(hdr_address)
            .set_text(text_address);
        let mut cfi = FileCfi {
            eh_frame: eh_frame.0,
            eh_frame_hdr: hdr,
            bases,
            index: Vec::new(),
            rules: HashMap::new(),
        };
        if cfi.hdr_table_ok().is_none() {
            cfi.eh_frame_hdr.clear();
            cfi.index = cfi.build_index();
        }
        Some(cfi)
    }

    /// Bytes held (sections, index, rules).
    pub fn bytes(&self) -> usize {
        self.eh_frame.len()
            + self.eh_frame_hdr.len()
            + self.index.len() * 16
            + self.rules.len() * (8 + std::mem::size_of::<LeafRule>())
    }

    fn sections(
        &self,
    ) -> (
        EhFrame<EndianSlice<'_, LittleEndian>>,
        EhFrameHdr<EndianSlice<'_, LittleEndian>>,
    ) {
        (
            EhFrame::new(&self.eh_frame, LittleEndian),
            EhFrameHdr::new(&self.eh_frame_hdr, LittleEndian),
        )
    }

    fn hdr_table_ok(&self) -> Option<()> {
        let (_, hdr) = self.sections();
        let parsed = hdr.parse(&self.bases, 8).ok()?;
        parsed.table().map(|_| ())
    }

    fn build_index(&self) -> Vec<(u64, usize)> {
        let (eh_frame, _) = self.sections();
        let mut index = Vec::new();
        let mut entries = eh_frame.entries(&self.bases);
        while let Ok(Some(entry)) = entries.next() {
            if let gimli::CieOrFde::Fde(partial) = entry {
                if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
                    index.push((fde.initial_address(), fde.offset()));
                }
            }
        }
        index.sort_unstable();
        index
    }

    /// The rule at ELF virtual address `address` (a leaf's exact `%rip`).
    pub fn rule(&mut self, address: u64, ctx: &mut UnwindContext<usize>) -> LeafRule {
        if let Some(&rule) = self.rules.get(&address) {
            return rule;
        }
        let rule = self.evaluate(address, ctx).unwrap_or(LeafRule::Unknown);
        if self.rules.len() >= RULES_PER_FILE {
            self.rules.clear();
        }
        self.rules.insert(address, rule);
        rule
    }

    fn evaluate(&self, address: u64, ctx: &mut UnwindContext<usize>) -> Option<LeafRule> {
        let (eh_frame, hdr) = self.sections();
        let fde = if self.eh_frame_hdr.is_empty() {
            let at = self.index.partition_point(|&(start, _)| start <= address);
            let &(_, offset) = self.index.get(at.checked_sub(1)?)?;
            let fde = eh_frame
                .fde_from_offset(&self.bases, offset.into(), EhFrame::cie_from_offset)
                .ok()?;
            fde.contains(address).then_some(fde)?
        } else {
            let parsed = hdr.parse(&self.bases, 8).ok()?;
            parsed
                .table()?
                .fde_for_address(&eh_frame, &self.bases, address, EhFrame::cie_from_offset)
                .ok()?
        };
        let row = fde
            .unwind_info_for_address(&eh_frame, &self.bases, ctx, address)
            .ok()?;
        Some(classify(
            row.cfa(),
            row.register(X86_64::RA),
            row.register(X86_64::RBP),
        ))
    }
}

/// A row's rule as the leaf step reads it: the unwind table's rule
/// ([`deltas::rule_of`]), one reading of CFI for both.
fn classify(cfa: &CfaRule<usize>, ra: RegisterRule<usize>, rbp: RegisterRule<usize>) -> LeafRule {
    leaf_of(deltas::rule_of(cfa, ra, rbp))
}

/// What the cache holds, for `--stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheStats {
    pub files: usize,
    pub bytes: usize,
    /// Times the cache was emptied to stay within its bound.
    pub resets: u64,
}

/// A file's CFI: read (`None`: it has none, or it was unreadable), or
/// being read.
enum Loaded {
    Ready(Option<Box<FileCfi>>),
    Loading(Ticket<Option<FileCfi>>),
}

/// The CFI of every file seen as a leaf, by (device, inode), within a total
/// byte budget; a file without `.eh_frame` (or unreadable) is kept as
/// `None` so it is not read again.
pub struct CfiCache {
    by_file: HashMap<(u64, u64), Loaded>,
    ctx: Box<UnwindContext<usize>>,
    budget: usize,
    bytes: usize,
    resets: u64,
}

impl CfiCache {
    pub fn new(budget: usize) -> Self {
        Self {
            by_file: HashMap::new(),
            ctx: Box::new(UnwindContext::new()),
            budget,
            bytes: 0,
            resets: 0,
        }
    }

    /// The rule at `address` of file `key`, loading its CFI with `load`
    /// the first time (a job, waited for within `waiting`; while it runs,
    /// `None`). `None` when the file has no usable CFI.
    pub fn rule(
        &mut self,
        key: (u64, u64),
        address: u64,
        waiting: &mut Waiting,
        load: impl FnOnce() -> Ticket<Option<FileCfi>>,
    ) -> Option<LeafRule> {
        let answer = match self.by_file.get(&key) {
            None => {
                let ticket = load();
                match waiting.wait(&ticket) {
                    Some(answer) => Some(answer.ok().flatten()),
                    None => {
                        self.by_file.insert(key, Loaded::Loading(ticket));
                        return None;
                    }
                }
            }
            Some(Loaded::Loading(ticket)) => Some(ticket.try_take()?.ok().flatten()),
            Some(Loaded::Ready(_)) => None,
        };
        if let Some(cfi) = answer {
            let cfi = cfi.filter(|c| c.bytes() <= self.budget);
            let size = cfi.as_ref().map_or(0, FileCfi::bytes);
            if self.bytes + size > self.budget {
                self.by_file.clear();
                self.bytes = 0;
                self.resets += 1;
            }
            self.bytes += size;
            self.by_file.insert(key, Loaded::Ready(cfi.map(Box::new)));
        }
        let Some(Loaded::Ready(Some(cfi))) = self.by_file.get_mut(&key) else {
            return None;
        };
        let before = cfi.rules.len();
        let rule = cfi.rule(address, &mut self.ctx);
        let after = cfi.rules.len();
        let rule_size = 8 + std::mem::size_of::<LeafRule>();
        self.bytes = (self.bytes + after * rule_size).saturating_sub(before * rule_size);
        Some(rule)
    }

    /// The rule at `address` of file `key` if its CFI is in memory already
    /// (nothing is read).
    pub fn cached_rule(&mut self, key: (u64, u64), address: u64) -> Option<LeafRule> {
        let Some(Loaded::Ready(Some(cfi))) = self.by_file.get_mut(&key) else {
            return None;
        };
        if let Some(&rule) = cfi.rules.get(&address) {
            return Some(rule);
        }
        let before = cfi.rules.len();
        let rule = cfi.rule(address, &mut self.ctx);
        let rule_size = 8 + std::mem::size_of::<LeafRule>();
        self.bytes = (self.bytes + cfi.rules.len() * rule_size).saturating_sub(before * rule_size);
        Some(rule)
    }

    pub fn forget_all(&mut self) {
        self.by_file.clear();
        self.bytes = 0;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            files: self
                .by_file
                .values()
                .filter(|c| matches!(c, Loaded::Ready(Some(_))))
                .count(),
            bytes: self.bytes,
            resets: self.resets,
        }
    }
}

/// Reads `.eh_frame` and `.eh_frame_hdr` of an ELF image in memory (the
/// vDSO; tests).
pub fn from_image(image: &[u8]) -> Option<FileCfi> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(image).ok()?;
    let section = |name: &str| {
        let s = file.section_by_name(name)?;
        Some((s.data().ok()?.to_vec(), s.address()))
    };
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    FileCfi::new(section(".eh_frame")?, section(".eh_frame_hdr"), text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn table_rules_read_as_leaf_rules() {
        use deltas::{CfaBase, Rule, SavedRbp};
        let pushed = Rule::Step {
            base: CfaBase::Rsp,
            cfa: 16,
            ra: -8,
            rbp: SavedRbp::AtCfa(-16),
        };
        assert_eq!(
            leaf_of(pushed),
            LeafRule::Frameless {
                ra: 8,
                rbp: Some(0)
            }
        );
        let framed = Rule::Step {
            base: CfaBase::Rbp,
            cfa: 16,
            ra: -8,
            rbp: SavedRbp::AtCfa(-16),
        };
        assert_eq!(leaf_of(framed), LeafRule::Framed);
        assert_eq!(leaf_of(Rule::Outermost), LeafRule::Outermost);
        assert_eq!(leaf_of(Rule::Unknown), LeafRule::Unknown);
    }

    #[test]
    fn rules_of_our_own_code() {
        // This test binary: Rust keeps frame pointers here (the workspace
        // builds with them), so inside a function body the CFA is
        // %rbp-based, and at its first instruction %rsp-based.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let mut cfi = from_image(&exe).expect("rustc emits .eh_frame");
        let mut ctx = UnwindContext::new();
        let file = object::File::parse(&*exe).unwrap();
        use object::{Object, ObjectSymbol};
        let sym = file
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("rules_of_our_own_code")) && s.size() > 32)
            .expect("this test's symbol");
        assert_eq!(
            cfi.rule(sym.address(), &mut ctx),
            LeafRule::Frameless { ra: 0, rbp: None },
            "at the first instruction the return address is at %rsp"
        );
        assert_eq!(
            cfi.rule(sym.address() + sym.size() / 2, &mut ctx),
            LeafRule::Framed
        );
        assert_eq!(cfi.rule(1, &mut ctx), LeafRule::Unknown, "no FDE there");
        assert!(cfi.bytes() > 0);

        // Without .eh_frame_hdr the same answers come from the built index.
        let mut indexed = {
            use object::ObjectSection;
            let s = file.section_by_name(".eh_frame").unwrap();
            let text = file.section_by_name(".text").unwrap().address();
            FileCfi::new((s.data().unwrap().to_vec(), s.address()), None, text).unwrap()
        };
        assert!(!indexed.index.is_empty());
        assert_eq!(
            indexed.rule(sym.address(), &mut ctx),
            LeafRule::Frameless { ra: 0, rbp: None }
        );
        assert_eq!(
            indexed.rule(sym.address() + sym.size() / 2, &mut ctx),
            LeafRule::Framed
        );
    }

    #[test]
    fn classifies_cfa_rules() {
        let sp = |offset| CfaRule::RegisterAndOffset {
            register: X86_64::RSP,
            offset,
        };
        let at = RegisterRule::Offset;
        // After `push %rbp`: CFA = rsp+16, RA at CFA-8, rbp at CFA-16.
        assert_eq!(
            classify(&sp(16), at(-8), at(-16)),
            LeafRule::Frameless {
                ra: 8,
                rbp: Some(0)
            }
        );
        assert_eq!(
            classify(&sp(8), at(-8), RegisterRule::SameValue),
            LeafRule::Frameless { ra: 0, rbp: None }
        );
        let bp = CfaRule::RegisterAndOffset {
            register: X86_64::RBP,
            offset: 16,
        };
        assert_eq!(classify(&bp, at(-8), at(-16)), LeafRule::Framed);
        assert_eq!(
            classify(&sp(8), RegisterRule::Undefined, RegisterRule::SameValue),
            LeafRule::Outermost
        );
        let expr = CfaRule::Expression(gimli::UnwindExpression {
            offset: 0,
            length: 0,
        });
        assert_eq!(classify(&expr, at(-8), at(-16)), LeafRule::Unknown);
    }

    #[test]
    fn the_cache_stays_within_its_budget() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let size = from_image(&exe).unwrap().bytes();
        let mut cache = CfiCache::new(size + size / 2);
        let mut w = Waiting::new(Duration::from_secs(10), 1.0, Duration::from_secs(10));
        let image = || Ticket::ready(from_image(&exe));
        assert!(cache.rule((1, 1), 1, &mut w, image).is_some());
        assert_eq!(cache.stats().files, 1);
        // A second file does not fit next to the first: the cache starts over.
        assert!(cache.rule((1, 2), 1, &mut w, image).is_some());
        let stats = cache.stats();
        assert_eq!((stats.files, stats.resets), (1, 1));
        assert!(stats.bytes <= size + size / 2);
        // A file larger than the whole budget is not kept; nor read twice.
        let mut small = CfiCache::new(16);
        assert_eq!(small.rule((1, 1), 1, &mut w, image), None);
        assert_eq!(small.rule((1, 1), 1, &mut w, || panic!("read again")), None);
        // No .eh_frame: None, remembered.
        assert_eq!(cache.rule((2, 2), 1, &mut w, || Ticket::ready(None)), None);
        assert_eq!(cache.rule((2, 2), 1, &mut w, || panic!("read again")), None);
        // Being read: None until the job answers, then the rule.
        let pool = crate::jobs::Pool::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let exe2 = exe.clone();
        let ticket = pool.submit(crate::jobs::About::default(), move || {
            rx.recv().unwrap();
            from_image(&exe2)
        });
        let mut once = Some(ticket);
        let mut no_wait = Waiting::new(Duration::ZERO, 0.0, Duration::ZERO);
        assert_eq!(
            cache.rule((3, 3), 1, &mut no_wait, || once.take().unwrap()),
            None
        );
        tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut rule = None;
        while rule.is_none() && std::time::Instant::now() < deadline {
            rule = cache.rule((3, 3), 1, &mut no_wait, || panic!("read again"));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(rule.is_some());
    }
}
