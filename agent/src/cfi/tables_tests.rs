use super::*;
use crate::cfi::deltas::{self, Limits};

/// The maps in memory.
struct Memory {
    rows: Vec<UnwindRow>,
    rules: Vec<UnwindRule>,
    files: Vec<UnwindFile>,
    procs: HashMap<u32, UnwindProc>,
}

impl Memory {
    fn new(rows: usize) -> Self {
        Memory {
            rows: vec![UnwindRow::default(); rows],
            rules: vec![UnwindRule::default(); UNWIND_RULES],
            files: vec![UnwindFile::default(); UNWIND_FILES],
            procs: HashMap::new(),
        }
    }

    /// The rule the BPF walk finds for `pc` of process `pid` (its search,
    /// in Rust).
    fn rule(&self, pid: u32, pc: u64) -> Option<UnwindRule> {
        let proc = self.procs.get(&pid)?;
        let ranges = &proc.ranges[..proc.count as usize];
        let i = ranges.partition_point(|r| r.start <= pc).checked_sub(1)?;
        let r = ranges[i];
        if pc - r.start >= u64::from(r.len) {
            return None;
        }
        let f = self.files[r.file as usize];
        if f.count == 0 {
            return None;
        }
        let off = u32::try_from(pc.wrapping_sub(r.adjust)).ok()?;
        let rows = &self.rows[f.first as usize..(f.first + f.count) as usize];
        let j = rows
            .partition_point(|row| row.start <= off)
            .checked_sub(1)?;
        Some(self.rules[rows[j].rule as usize])
    }
}

impl Sink for Memory {
    fn rows(&mut self) -> &mut [UnwindRow] {
        &mut self.rows
    }
    fn rules(&mut self) -> &mut [UnwindRule] {
        &mut self.rules
    }
    fn files(&mut self) -> &mut [UnwindFile] {
        &mut self.files
    }
    fn set_proc(&mut self, pid: u32, proc: Option<&UnwindProc>) -> Result<(), SinkError> {
        match proc {
            Some(p) => self.procs.insert(pid, *p),
            None => self.procs.remove(&pid),
        };
        Ok(())
    }
}

/// A table of `n` functions of 16 bytes at ELF address `base`: 4 bytes
/// at CFA = %rsp + 8, then %rsp + 16 + 8 × (i mod 3).
fn table(base: u64, n: u64) -> Built {
    let mut rows = Vec::new();
    for i in 0..n {
        let at = base + i * 16;
        let step = |cfa| Rule::Step {
            base: CfaBase::Rsp,
            cfa,
            ra: -8,
            rbp: SavedRbp::Same,
        };
        rows.push((at, at + 4, step(8)));
        rows.push((at + 4, at + 16, step(16 + 8 * (i % 3) as i32)));
    }
    let table = deltas::assemble(rows, Limits::default()).unwrap();
    Built {
        table,
        framed: false,
        cpu: Duration::from_millis(3),
    }
}

fn ready(b: Built) -> Option<Ticket<Option<Built>>> {
    Some(Ticket::ready(Some(b)))
}

#[test]
fn a_process_finds_each_mappings_rule_through_its_file() {
    let mut mem = Memory::new(1 << 12);
    let mut t = Tables::new(1 << 12);
    let now = Instant::now();
    let lib = (1, 10, 0);
    let Lookup::Loaded { slot, base } = t.lookup(lib, now, &mut mem, || ready(table(0x1000, 100)))
    else {
        panic!("not loaded");
    };
    assert_eq!(base, 0x1000);
    // Two processes map it at different addresses: one table.
    for (pid, start) in [(7, 0x7f00_0000_0000u64), (8, 0x5500_0000_0000)] {
        // Mapped from ELF address 0x1000 at `start`.
        let adjust = start.wrapping_sub(0x1000).wrapping_add(base);
        let range = UnwindRange {
            start,
            adjust,
            len: 0x1000,
            file: slot,
        };
        t.set_process(pid, vec![(lib, range)], &mut mem);
        // Function 5 (i mod 3 = 2): its body at CFA = %rsp + 32.
        let body = start + 5 * 16 + 6;
        assert_eq!(mem.rule(pid, body).unwrap().cfa, 32);
        assert_eq!(mem.rule(pid, start + 5 * 16).unwrap().cfa, 8);
        assert_eq!(mem.rule(pid, body).unwrap().kind, RULE_RSP as u8);
        assert!(mem.rule(pid, start + 0x1000).is_none());
        assert!(mem.rule(pid, start - 1).is_none());
    }
    assert_eq!(t.stats().files, 1);
    assert_eq!(t.stats().processes, 2);
    // The build's CPU is charged once.
    assert_eq!(t.take_unpaid(lib), Duration::from_millis(3));
    assert_eq!(t.take_unpaid(lib), Duration::ZERO);
    assert_eq!(t.stats().builds, 1);
    // The same file again: no second build.
    assert_eq!(
        t.lookup(lib, now, &mut mem, || panic!("built twice")),
        Lookup::Loaded { slot, base }
    );
    t.forget_process(7, &mut mem);
    assert!(mem.rule(7, 0x7f00_0000_0000 + 6).is_none());
    assert!(mem.rule(8, 0x5500_0000_0000 + 6).is_some());
}

#[test]
fn files_nobody_maps_make_room_and_mapped_ones_stay() {
    // Room for about two tables of 100 functions (201 rows each).
    let mut mem = Memory::new(450);
    let mut t = Tables::new(450);
    let now = Instant::now();
    let (a, b, c) = ((1, 1, 0), (1, 2, 0), (1, 3, 0));
    let slot_of = |l| match l {
        Lookup::Loaded { slot, .. } => slot,
        other => panic!("{other:?}"),
    };
    let sa = slot_of(t.lookup(a, now, &mut mem, || ready(table(0, 100))));
    let _sb = slot_of(t.lookup(b, now, &mut mem, || ready(table(0, 100))));
    // a is mapped by a process, b by none.
    let range = UnwindRange {
        start: 0x10000,
        adjust: 0x10000,
        len: 0x1000,
        file: sa,
    };
    t.set_process(1, vec![(a, range)], &mut mem);
    // c needs room: b (unused) goes, a stays.
    let later = now + Duration::from_secs(5);
    let sc = slot_of(t.lookup(c, later, &mut mem, || ready(table(0, 100))));
    assert_eq!(t.stats().evictions, 1);
    assert!(matches!(
        t.lookup(a, later, &mut mem, || panic!("a was evicted")),
        Lookup::Loaded { .. }
    ));
    assert_eq!(mem.rule(1, 0x10000 + 6).unwrap().cfa, 16);
    assert_ne!(sc, sa);
    // A fourth file finds nothing to evict: refused, counted, no table.
    let range_c = UnwindRange {
        start: 0x20000,
        adjust: 0x20000,
        len: 0x1000,
        file: sc,
    };
    t.set_process(2, vec![(c, range_c)], &mut mem);
    let d = (1, 4, 0);
    assert_eq!(
        t.lookup(d, later, &mut mem, || ready(table(0, 100))),
        Lookup::Absent
    );
    assert_eq!(t.stats().refused_full, 1);
    // A table larger than the whole pool is refused too.
    assert_eq!(
        t.lookup((1, 5, 0), later, &mut mem, || ready(table(0, 1000))),
        Lookup::Absent
    );
    assert!(t.stats().bytes <= t.stats().capacity_bytes);
    // Once no process maps c, it can go for the next file.
    t.forget_process(2, &mut mem);
    assert!(matches!(
        t.lookup((1, 6, 0), later, &mut mem, || ready(table(0, 100))),
        Lookup::Loaded { .. }
    ));
}

#[test]
fn a_process_with_too_many_mappings_keeps_the_lowest_and_counts_the_rest() {
    let mut mem = Memory::new(1 << 12);
    let mut t = Tables::new(1 << 12);
    let now = Instant::now();
    let Lookup::Loaded { slot, .. } = t.lookup((1, 1, 0), now, &mut mem, || ready(table(0, 4)))
    else {
        panic!()
    };
    let ranges = (0..UNWIND_PROC_RANGES as u64 + 10)
        .rev()
        .map(|i| {
            let start = 0x100000 * (i + 1);
            (
                (1, 1, 0),
                UnwindRange {
                    start,
                    adjust: start,
                    len: 64,
                    file: slot,
                },
            )
        })
        .collect();
    t.set_process(3, ranges, &mut mem);
    assert_eq!(t.stats().ranges_dropped, 10);
    let p = mem.procs[&3];
    assert_eq!(p.count as usize, UNWIND_PROC_RANGES);
    assert!(p.ranges.windows(2).all(|w| w[0].start < w[1].start));
    assert_eq!(mem.rule(3, 0x100000 + 6).unwrap().cfa, 16);
    assert_eq!(mem.rule(3, 0x100000 + 20).unwrap().cfa, 24);
}

#[test]
fn a_failed_build_is_remembered_not_retried() {
    let mut mem = Memory::new(64);
    let mut t = Tables::new(64);
    let now = Instant::now();
    assert_eq!(
        t.lookup((9, 9, 9), now, &mut mem, || Some(Ticket::ready(None))),
        Lookup::Absent
    );
    assert_eq!(
        t.lookup((9, 9, 9), now, &mut mem, || panic!("retried")),
        Lookup::Absent
    );
    assert_eq!(t.stats().build_failures, 1);
}

#[test]
fn rules_are_shared_between_files() {
    let mut mem = Memory::new(1 << 12);
    let mut t = Tables::new(1 << 12);
    let now = Instant::now();
    t.lookup((1, 1, 0), now, &mut mem, || ready(table(0, 50)));
    t.lookup((1, 2, 0), now, &mut mem, || ready(table(0x4000, 50)));
    // %rsp + 8, 16, 24, 32 and the unknown gap rule.
    assert_eq!(t.stats().rules, 5);
}
