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

    /// The rule the BPF walk finds for `pc` of process `pid` at the leaf
    /// (its search, in Rust).
    fn rule(&self, pid: u32, pc: u64) -> Option<UnwindRule> {
        let proc = self.procs.get(&pid)?;
        let ranges = &proc.ranges[..proc.count as usize];
        let i = ranges.partition_point(|r| r.start <= pc).checked_sub(1)?;
        let r = ranges[i];
        if pc - r.start >= u64::from(r.len) {
            return None;
        }
        let f = self.files[(r.file & !(UNWIND_RANGE_FRAMED as u32)) as usize];
        if f.count == 0 || f.pages == 0 {
            return None;
        }
        let off = u32::try_from(pc.wrapping_sub(r.adjust)).ok()?;
        // Through the file's page index, as the walk searches.
        let shift = (f.flags >> UNWIND_FILE_SHIFT_AT) & 63;
        let page = (u64::from(off) >> shift).min(u64::from(f.pages - 1)) as u32;
        let span = self.rows[(f.first + f.count + page) as usize];
        if span.rule < span.start || span.rule >= f.count {
            return None;
        }
        let rows = &self.rows[(f.first + span.start) as usize..=(f.first + span.rule) as usize];
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

fn ready(b: Built) -> Option<Ticket<BuildAnswer>> {
    Some(Ticket::ready(Ok(b)))
}

/// [`table`]`(0, 100)` of a file that keeps frame pointers, built.
fn framed() -> Option<Ticket<BuildAnswer>> {
    ready(Built {
        framed: true,
        ..table(0, 100)
    })
}

/// The slot of a loaded table.
fn slot_of(l: Lookup) -> u32 {
    match l {
        Lookup::Loaded { slot, .. } => slot,
        other => panic!("{other:?}"),
    }
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
        t.set_process(pid, vec![(lib, range)], true, &mut mem);
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
fn a_table_of_many_pages_finds_each_rule_through_its_page_index() {
    // 1,000 functions of 16 bytes: 16,000 bytes of code, four pages of
    // 4 KiB, rows crossing each page's edge.
    let mut mem = Memory::new(1 << 13);
    let mut t = Tables::new(1 << 13);
    let now = Instant::now();
    let lib = (1, 11, 0);
    let Lookup::Loaded { slot, base } = t.lookup(lib, now, &mut mem, || ready(table(0, 1000)))
    else {
        panic!("not loaded");
    };
    let f = mem.files[slot as usize];
    assert_eq!(f.pages, 4, "{f:?}");
    assert_eq!(
        (f.flags >> UNWIND_FILE_SHIFT_AT) & 63,
        UNWIND_PAGE_SHIFT as u32
    );
    let start = 0x7f00_0000_0000u64;
    let range = UnwindRange {
        start,
        adjust: start.wrapping_add(base),
        len: 0x8000,
        file: slot,
    };
    t.set_process(1, vec![(lib, range)], true, &mut mem);
    // Every offset the rows cover, and past the last row (the last
    // page's rows rule there): what the table itself says.
    for off in (0..16_100u64).chain([4095, 4096, 8191, 8192, 12287, 12288, 0x7fff]) {
        let (i, within) = (off / 16, off % 16);
        let want = if i >= 1000 {
            None // the table's last row: no rule
        } else if within < 4 {
            Some(8)
        } else {
            Some(16 + 8 * (i % 3) as i32)
        };
        let got = mem.rule(1, start + off);
        let got = got.filter(|r| r.kind != RULE_UNKNOWN as u8).map(|r| r.cfa);
        assert_eq!(got, want, "offset {off:#x}");
    }
}

#[test]
fn files_nobody_maps_make_room_and_mapped_ones_stay() {
    // Room for about two tables of 100 functions (201 rows each, and
    // one row of page index: they span one page).
    let mut mem = Memory::new(450);
    let mut t = Tables::new(450);
    let now = Instant::now();
    let (a, b, c) = ((1, 1, 0), (1, 2, 0), (1, 3, 0));
    let sa = slot_of(t.lookup(a, now, &mut mem, || ready(table(0, 100))));
    let _sb = slot_of(t.lookup(b, now, &mut mem, || ready(table(0, 100))));
    // a is mapped by a process, b by none.
    let range = UnwindRange {
        start: 0x10000,
        adjust: 0x10000,
        len: 0x1000,
        file: sa,
    };
    t.set_process(1, vec![(a, range)], true, &mut mem);
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
    t.set_process(2, vec![(c, range_c)], true, &mut mem);
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
    // Once no process maps c (and no lookup of this pass used it), it can go
    // for the next file.
    t.forget_process(2, &mut mem);
    let after = later + Duration::from_secs(1);
    assert!(matches!(
        t.lookup((1, 6, 0), after, &mut mem, || ready(table(0, 100))),
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
    t.set_process(3, ranges, true, &mut mem);
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
        t.lookup((9, 9, 9), now, &mut mem, || {
            Some(Ticket::ready(Err(NoTable::TooLarge)))
        }),
        Lookup::Absent
    );
    assert_eq!(
        t.lookup((9, 9, 9), now + Duration::from_secs(60), &mut mem, || {
            panic!("retried")
        }),
        Lookup::Absent
    );
    let stats = t.stats();
    assert_eq!((stats.build_failures, stats.too_large), (1, 1));
}

#[test]
fn a_build_refused_by_a_full_job_queue_is_tried_again_later() {
    let mut mem = Memory::new(64);
    let mut t = Tables::new(64);
    let now = Instant::now();
    let refused = || Some(Ticket::failed(crate::jobs::JobError::Refused));
    assert_eq!(t.lookup((9, 9, 9), now, &mut mem, refused), Lookup::Absent);
    // Not at once (a busy host is not asked again at every sample)...
    let soon = now + REFUSED_RETRY / 2;
    assert_eq!(
        t.lookup((9, 9, 9), soon, &mut mem, || panic!("retried at once")),
        Lookup::Absent
    );
    // ... but once the retry delay is over: a busy moment does not leave
    // the file walked by frame pointer for good.
    let later = now + REFUSED_RETRY;
    assert!(matches!(
        t.lookup((9, 9, 9), later, &mut mem, || ready(table(0, 10))),
        Lookup::Loaded { .. }
    ));
    let stats = t.stats();
    assert_eq!(
        (stats.builds, stats.build_failures, stats.jobs_failed),
        (2, 1, 1)
    );
    // A hung build is not tried again.
    let hung = || Some(Ticket::failed(crate::jobs::JobError::Hung));
    assert_eq!(t.lookup((8, 8, 8), now, &mut mem, hung), Lookup::Absent);
    assert_eq!(
        t.lookup((8, 8, 8), now + Duration::from_secs(600), &mut mem, || {
            panic!("a hung build retried")
        }),
        Lookup::Absent
    );
}

#[test]
fn a_file_unreadable_through_a_gone_process_is_read_again_through_another() {
    let mut mem = Memory::new(64);
    let mut t = Tables::new(64);
    let now = Instant::now();
    // A compile's short-lived process maps libc first and is gone before
    // its build reads the file.
    let gone = || Some(Ticket::ready(Err(NoTable::Unreadable)));
    assert_eq!(t.lookup((7, 7, 7), now, &mut mem, gone), Lookup::Absent);
    assert_eq!(
        t.lookup((7, 7, 7), now + REFUSED_RETRY / 2, &mut mem, || {
            panic!("retried at once")
        }),
        Lookup::Absent
    );
    // The next process that maps it, after the delay: loaded.
    assert!(matches!(
        t.lookup((7, 7, 7), now + REFUSED_RETRY, &mut mem, || ready(table(
            0, 10
        ))),
        Lookup::Loaded { .. }
    ));
    // A file no process lets the agent read is given up after
    // UNREADABLE_TRIES builds.
    let mut at = now;
    for _ in 0..UNREADABLE_TRIES {
        assert_eq!(t.lookup((6, 6, 6), at, &mut mem, gone), Lookup::Absent);
        at += REFUSED_RETRY;
    }
    assert_eq!(
        t.lookup((6, 6, 6), at + Duration::from_secs(600), &mut mem, || {
            panic!("an unreadable file built again after its tries")
        }),
        Lookup::Absent
    );
    assert_eq!(t.stats().unreadable, 1 + u64::from(UNREADABLE_TRIES));
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

#[test]
fn making_room_evicts_only_what_the_new_table_needs() {
    // Room for two tables of 100 functions (201 rows and a page-index row
    // each), and some.
    let mut mem = Memory::new(450);
    let mut t = Tables::new(450);
    // Both loaded a while ago, mapped by nobody now; the third comes at
    // the real time (the evicted rows are retired then, and reused at
    // once: a walk in flight lasts microseconds).
    let now = Instant::now();
    let before = now.checked_sub(Duration::from_secs(5)).unwrap();
    for inode in [1, 2] {
        assert!(matches!(
            t.lookup((1, inode, 0), before, &mut mem, || ready(table(0, 100))),
            Lookup::Loaded { .. }
        ));
    }
    assert!(matches!(
        t.lookup((1, 3, 0), now, &mut mem, || ready(table(0, 100))),
        Lookup::Loaded { .. }
    ));
    assert_eq!(t.stats().evictions, 1, "{:?}", t.stats());
    assert_eq!(t.stats().files, 2);
    assert_eq!(t.stats().refused_full, 0);
}

#[test]
fn a_table_looked_up_for_the_process_being_settled_is_not_evicted_for_its_next_file() {
    // Room for one table of 100 functions.
    let mut mem = Memory::new(300);
    let mut t = Tables::new(300);
    let t0 = Instant::now();
    let (a, b) = ((1, 1, 0), (1, 2, 0));
    slot_of(t.lookup(a, t0, &mut mem, || ready(table(0, 100))));
    // A process maps a and b: a is found, then b's build is done and
    // needs a's room; a is about to be named by the process's ranges.
    let t1 = t0 + Duration::from_secs(5);
    let sa = slot_of(t.lookup(a, t1, &mut mem, || panic!("a built twice")));
    assert_eq!(
        t.lookup(b, t1, &mut mem, || ready(table(0x5000, 100))),
        Lookup::Absent
    );
    assert_eq!((t.stats().evictions, t.stats().refused_full), (0, 1));
    let range = UnwindRange {
        start: 0x10000,
        adjust: 0x10000,
        len: 0x1000,
        file: sa,
    };
    t.set_process(1, vec![(a, range)], true, &mut mem);
    // a's rows are a's (not another file's in its slot).
    assert_eq!(mem.rule(1, 0x10000 + 5 * 16 + 6).unwrap().cfa, 32);
    // b is not built again at once, nor while a is mapped...
    let t2 = t1 + NO_ROOM_RETRY;
    assert_eq!(
        t.lookup(b, t1 + Duration::from_secs(1), &mut mem, || panic!(
            "rebuilt at once"
        )),
        Lookup::Absent
    );
    assert_eq!(
        t.lookup(b, t2, &mut mem, || panic!("rebuilt with no room")),
        Lookup::Absent
    );
    // ...but once nobody maps a, b's next process has it.
    t.forget_process(1, &mut mem);
    assert!(matches!(
        t.lookup(b, t2, &mut mem, || ready(table(0x5000, 100))),
        Lookup::Loaded { .. }
    ));
    assert_eq!(t.stats().evictions, 1);
    assert_eq!(t.stats().builds, 3);
}

#[test]
fn a_mapped_frame_pointer_files_table_makes_room_for_frameless_code() {
    // Room for one table of 100 functions.
    let mut mem = Memory::new(300);
    let mut t = Tables::new(300);
    let t0 = Instant::now();
    let (fp, frameless, other_fp) = ((1, 1, 0), (1, 2, 0), (1, 3, 0));
    let Lookup::Loaded { slot, .. } = t.lookup(fp, t0, &mut mem, framed) else {
        panic!("not loaded");
    };
    let range = |start: u64, file| UnwindRange {
        start,
        adjust: start,
        len: 0x1000,
        file,
    };
    // Two processes map it; one of them maps more (here, nothing loaded).
    t.set_process(1, vec![(fp, range(0x10000, slot))], true, &mut mem);
    t.set_process(2, vec![(fp, range(0x20000, slot))], true, &mut mem);
    // Its ranges say it keeps frame pointers (the walk does not read its
    // slot for a caller's frame); its leaves still find their rules.
    assert_eq!(
        mem.procs[&1].ranges[0].file,
        slot | UNWIND_RANGE_FRAMED as u32
    );
    assert!(mem.rule(1, 0x10000 + 6).is_some());
    // Each write of a process's ranges is a generation of its own: the
    // BPF walk's rule memo holds an entry only while it stays.
    let gens = [1, 2].map(|pid| mem.procs[&pid].gen);
    assert_ne!(gens[0], gens[1]);
    // Another framed file finds no room: framed tables do not displace
    // each other.
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(t.lookup(other_fp, t1, &mut mem, framed), Lookup::Absent);
    // A frameless file's table takes its room: both processes' ranges
    // drop the framed file first (their leaves go to user space).
    let Lookup::Loaded { slot: s2, .. } =
        t.lookup(frameless, t1, &mut mem, || ready(table(0x5000, 100)))
    else {
        panic!("frameless code refused: {:?}", t.stats());
    };
    assert_eq!(s2, slot, "the freed slot is reused");
    for pid in [1, 2] {
        let start = if pid == 1 { 0x10000 } else { 0x20000 };
        assert!(mem.rule(pid, start + 6).is_none(), "process {pid}");
        // Rewritten without the evicted file: a rule memoized from the
        // old ranges (the slot now holds another file's table) no
        // longer holds.
        assert!(!gens.contains(&mem.procs[&pid].gen), "process {pid}");
    }
    let stats = t.stats();
    assert_eq!((stats.evictions, stats.framed_given_up), (1, 1));
    assert_eq!(stats.files, 1);
    // While a process maps the frameless file, the framed one is not
    // built again (no room), and the frameless table in use is never
    // given up for a framed one.
    t.set_process(3, vec![(frameless, range(0x30000, s2))], true, &mut mem);
    assert_eq!(
        t.lookup(fp, t1 + NO_ROOM_RETRY, &mut mem, || panic!(
            "rebuilt with no room"
        )),
        Lookup::Absent
    );
    let t2 = t1 + NO_ROOM_RETRY + Duration::from_secs(1);
    assert_eq!(t.lookup((1, 4, 0), t2, &mut mem, framed), Lookup::Absent);
    assert_eq!(mem.rule(3, 0x30000 + 5 * 16 + 6).unwrap().cfa, 32);
}

#[test]
fn frameless_tables_outlive_framed_ones_when_room_is_needed() {
    // Room for two tables of 100 functions.
    let mut mem = Memory::new(450);
    let mut t = Tables::new(450);
    let t0 = Instant::now();
    let (fp, gone, next) = ((1, 1, 0), (1, 2, 0), (1, 3, 0));
    // A framed file still mapped, a frameless one whose process exited
    // (it was used later: the least recently used is the framed one).
    let Lookup::Loaded { slot, .. } = t.lookup(fp, t0, &mut mem, framed) else {
        panic!("not loaded");
    };
    let range = UnwindRange {
        start: 0x10000,
        adjust: 0x10000,
        len: 0x1000,
        file: slot,
    };
    t.set_process(1, vec![(fp, range)], true, &mut mem);
    let t1 = t0 + Duration::from_secs(1);
    assert!(matches!(
        t.lookup(gone, t1, &mut mem, || ready(table(0x5000, 100))),
        Lookup::Loaded { .. }
    ));
    // New frameless code gives up the mapped framed table, not the
    // frameless one a command run again would need.
    let t2 = t1 + Duration::from_secs(5);
    assert!(matches!(
        t.lookup(next, t2, &mut mem, || ready(table(0x9000, 100))),
        Lookup::Loaded { .. }
    ));
    let s = t.stats();
    assert_eq!(
        (s.evictions, s.framed_given_up, s.files),
        (1, 1, 2),
        "{s:?}"
    );
    assert!(mem.rule(1, 0x10000 + 6).is_none());
    let Lookup::Loaded {
        slot: gone_slot, ..
    } = t.lookup(gone, t2, &mut mem, || panic!("gone was evicted"))
    else {
        panic!("gone was evicted");
    };
    // A framed file takes the room of a frameless file nobody maps only
    // once nobody used it for FRAMELESS_KEPT; never a mapped one's.
    let gone_range = UnwindRange {
        file: gone_slot,
        ..range
    };
    t.set_process(2, vec![(gone, gone_range)], true, &mut mem);
    let late = (1, 4, 0);
    let t3 = t2 + Duration::from_secs(1);
    assert_eq!(t.lookup(late, t3, &mut mem, framed), Lookup::Absent);
    let t4 = t2 + FRAMELESS_KEPT + Duration::from_secs(1);
    assert!(matches!(
        t.lookup(late, t4, &mut mem, framed),
        Lookup::Loaded { .. }
    ));
    assert!(matches!(
        t.lookup(gone, t4, &mut mem, || panic!("gone was evicted")),
        Lookup::Loaded { .. }
    ));
    assert_eq!(t.stats().evictions, 2);
}
