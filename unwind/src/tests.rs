use super::*;

use gimli::{EndianSlice, UnwindTableRow};

const STEP_RSP: fn(i32, i32) -> Rule = |cfa, rbp| Rule::Step {
    base: CfaBase::Rsp,
    cfa,
    ra: -8,
    rbp: if rbp == 0 {
        SavedRbp::Same
    } else {
        SavedRbp::AtCfa(rbp)
    },
};

fn rows(rows: &[(u64, u64, Rule)]) -> Vec<(u64, u64, Rule)> {
    rows.to_vec()
}

#[test]
fn ranges_are_sorted_merged_and_their_gaps_unknown() {
    let a = STEP_RSP(8, 0);
    let b = STEP_RSP(16, -16);
    let t = assemble(
        rows(&[
            (0x1010, 0x1020, b),
            (0x1000, 0x1004, a),
            (0x1004, 0x1010, a), // merged with the one before
            (0x1030, 0x1040, a), // after a gap
        ]),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(t.base, 0x1000);
    assert_eq!(t.starts, vec![0, 0x10, 0x20, 0x30, 0x40]);
    assert_eq!(t.rules.len(), 3, "{:?}", t.rules);
    for (address, rule) in [
        (0xfff, Rule::Unknown),
        (0x1000, a),
        (0x100f, a),
        (0x1010, b),
        (0x101f, b),
        (0x1020, Rule::Unknown),
        (0x1030, a),
        (0x103f, a),
        (0x1040, Rule::Unknown),
        (u64::MAX, Rule::Unknown),
        (0, Rule::Unknown),
    ] {
        assert_eq!(t.rule(address), rule, "{address:#x}");
    }
    assert_eq!(t.bytes(), 5 * 6 + 3 * std::mem::size_of::<Rule>());
    assert_eq!(
        t.coverage(),
        Coverage {
            rbp: 0,
            rsp: 0x30,
            outermost: 0,
            unknown: 0x10
        }
    );
}

#[test]
fn overlapping_rows_leave_no_wrong_rule() {
    let (a, b) = (STEP_RSP(8, 0), STEP_RSP(16, -16));
    // B inside A: A's rule up to B, B's, then unknown (A's rest is not
    // trusted).
    let t = assemble(rows(&[(0, 100, a), (10, 20, b)]), Limits::default()).unwrap();
    assert_eq!(
        [t.rule(5), t.rule(10), t.rule(19), t.rule(20), t.rule(99)],
        [a, b, b, Rule::Unknown, Rule::Unknown]
    );
    // Two rows at one start: the longer (later in order) one.
    let t = assemble(rows(&[(0, 10, a), (0, 20, b)]), Limits::default()).unwrap();
    assert_eq!([t.rule(0), t.rule(15), t.rule(20)], [b, b, Rule::Unknown]);
    // Nothing at all: everything unknown.
    let t = assemble(Vec::new(), Limits::default()).unwrap();
    assert_eq!(t.rule(0), Rule::Unknown);
}

#[test]
fn bounds_are_errors_not_panics() {
    let many: Vec<_> = (0..100u64)
        .map(|i| (i * 2, i * 2 + 1, STEP_RSP(8 + i as i32 * 8, 0)))
        .collect();
    let limits = |ranges, rules| Limits {
        ranges,
        rules,
        rows: usize::MAX,
        ..Limits::default()
    };
    assert_eq!(
        assemble(many.clone(), limits(50, 1000)),
        Err(Error::TooLarge {
            what: "address ranges",
            limit: 50
        })
    );
    assert_eq!(
        assemble(many.clone(), limits(1000, 10)),
        Err(Error::TooLarge {
            what: "distinct rules",
            limit: 10
        })
    );
    assert!(assemble(many, limits(1000, 1000)).is_ok());
    let wide = rows(&[
        (0, 1, Rule::Outermost),
        (1 << 33, (1 << 33) + 1, Rule::Outermost),
    ]);
    assert!(matches!(
        assemble(wide, Limits::default()),
        Err(Error::TooWide { .. })
    ));
    assert_eq!(build(&[], 0, 0, Limits::default()), Err(Error::Empty));
}

#[test]
fn register_rules_become_table_rules() {
    let sp = |offset| CfaRule::RegisterAndOffset {
        register: X86_64::RSP,
        offset,
    };
    let bp = CfaRule::RegisterAndOffset {
        register: X86_64::RBP,
        offset: 16,
    };
    let at = RegisterRule::Offset;
    // After `push %rbp`: CFA = rsp+16, RA at CFA-8, rbp at CFA-16.
    let pushed = rule_of(&sp(16), at(-8), at(-16));
    assert_eq!(pushed, STEP_RSP(16, -16));
    let entry = rule_of(&sp(8), at(-8), RegisterRule::SameValue);
    assert_eq!(entry, STEP_RSP(8, 0));
    assert_eq!(
        rule_of(&bp, at(-8), at(-16)),
        Rule::Step {
            base: CfaBase::Rbp,
            cfa: 16,
            ra: -8,
            rbp: SavedRbp::AtCfa(-16)
        }
    );
    assert_eq!(
        rule_of(&sp(8), RegisterRule::Undefined, RegisterRule::SameValue),
        Rule::Outermost
    );
    let expr = CfaRule::Expression(gimli::UnwindExpression {
        offset: 0,
        length: 0,
    });
    assert_eq!(rule_of(&expr, at(-8), at(-16)), Rule::Unknown);
    // Another CFA register, a register-held return address, offsets past
    // 32 bits: not expressed.
    let r12 = CfaRule::RegisterAndOffset {
        register: X86_64::R12,
        offset: 8,
    };
    assert_eq!(rule_of(&r12, at(-8), at(-16)), Rule::Unknown);
    assert_eq!(
        rule_of(&sp(8), RegisterRule::Register(X86_64::RAX), at(-16)),
        Rule::Unknown
    );
    assert_eq!(rule_of(&sp(1 << 40), at(-8), at(-16)), Rule::Unknown);
}

/// A file's `.eh_frame` (bytes, address) and `.text` address.
fn sections(path: &std::path::Path) -> (Vec<u8>, u64, u64) {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let s = file.section_by_name(".eh_frame").unwrap();
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    (s.data().unwrap().to_vec(), s.address(), text)
}

/// The rule gimli evaluates at `address` on its own: the FDE found by a
/// search of its own, its row for the address.
struct Reference<'a> {
    section: EhFrame<EndianSlice<'a, LittleEndian>>,
    bases: BaseAddresses,
    fdes: Vec<(u64, u64, usize)>,
    ctx: Box<UnwindContext<usize>>,
}

impl<'a> Reference<'a> {
    fn new(bytes: &'a [u8], address: u64, text: u64) -> Self {
        let section = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(address)
            .set_text(text);
        let mut fdes = Vec::new();
        let mut entries = section.entries(&bases);
        while let Some(entry) = entries.next().unwrap() {
            if let gimli::CieOrFde::Fde(partial) = entry {
                let fde = partial.parse(EhFrame::cie_from_offset).unwrap();
                fdes.push((fde.initial_address(), fde.end_address(), fde.offset()));
            }
        }
        fdes.sort_unstable();
        Reference {
            section,
            bases,
            fdes,
            ctx: Box::new(UnwindContext::new()),
        }
    }

    fn rule(&mut self, address: u64) -> Rule {
        let at = self.fdes.partition_point(|f| f.0 <= address);
        let Some(&(start, end, offset)) = at.checked_sub(1).and_then(|i| self.fdes.get(i)) else {
            return Rule::Unknown;
        };
        if address < start || address >= end {
            return Rule::Unknown;
        }
        let fde = self
            .section
            .fde_from_offset(&self.bases, offset.into(), EhFrame::cie_from_offset)
            .unwrap();
        let row: &UnwindTableRow<usize> = fde
            .unwind_info_for_address(&self.section, &self.bases, &mut self.ctx, address)
            .unwrap();
        rule_of(
            row.cfa(),
            row.register(X86_64::RA),
            row.register(X86_64::RBP),
        )
    }
}

/// The table of a real file answers, at (a spread of) every address its
/// FDEs cover and around them, what gimli evaluates there itself.
fn agrees_with_gimli(path: &std::path::Path) -> Table {
    let (bytes, address, text) = sections(path);
    let table = build(&bytes, address, text, Limits::default()).unwrap();
    let mut reference = Reference::new(&bytes, address, text);
    let covered: u64 = reference.fdes.iter().map(|f| f.1 - f.0).sum();
    // About 200,000 addresses per file, each FDE's first ones always.
    let step = (covered / 200_000).max(1);
    let fdes = reference.fdes.clone();
    let mut checked = 0;
    for &(start, end, _) in &fdes {
        let mut a = start.saturating_sub(1);
        while a <= end {
            assert_eq!(
                table.rule(a),
                reference.rule(a),
                "{}: {a:#x} (FDE {start:#x}..{end:#x})",
                path.display()
            );
            checked += 1;
            a += if a < start + 16 { 1 } else { step };
        }
    }
    assert!(checked > 1000, "{}: {checked}", path.display());
    table
}

fn mapped(name: &str) -> std::path::PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(name)))
        .unwrap_or_else(|| panic!("{name} not mapped"))
        .into()
}

#[test]
fn tables_of_real_files_agree_with_gimli() {
    // Our own code (frame pointers), the distribution's libc (none).
    let own = agrees_with_gimli(std::path::Path::new("/proc/self/exe"));
    let libc = agrees_with_gimli(&mapped("libc.so"));
    // Frameless code has more distinct rules than framed code, and few
    // in all: the rule table stays small.
    assert!(libc.rules.len() > 20, "{}", libc.rules.len());
    assert!(libc.rules.len() < 4096 && own.rules.len() < 4096);
    assert!(libc
        .rules
        .iter()
        .any(|r| matches!(r, Rule::Step { base: CfaBase::Rsp, cfa, .. } if *cfa > 8)));
    // Debian's libc keeps no frame pointers; our code does.
    let (l, o) = (libc.coverage(), own.coverage());
    assert!(l.rsp > 2 * l.rbp, "{l:?}");
    assert!(o.rbp > o.rsp, "{o:?}");
    // Debian's zlib and libstdc++, when the machine has them.
    for lib in [
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    ] {
        let path = std::path::Path::new(lib);
        if path.exists() || std::env::var_os("CI").is_some() {
            agrees_with_gimli(path);
        }
    }
}

#[test]
fn damaged_sections_are_errors_not_panics() {
    let (bytes, address, text) = sections(&mapped("libc.so"));
    // Cut anywhere, or with bytes flipped: an error or a table, never a
    // panic, never past the limits.
    let limits = Limits {
        ranges: 1 << 16,
        rules: 1 << 10,
        rows: 1 << 18,
        ..Limits::default()
    };
    for cut in [1, 7, 100, bytes.len() / 3, bytes.len() - 1] {
        if let Ok(t) = build(&bytes[..cut], address, text, limits) {
            assert!(t.starts.len() <= limits.ranges);
        }
    }
    // One FDE damaged: only its addresses become unknown.
    let t = build(&bytes, address, text, Limits::default()).unwrap();
    assert_eq!(t.skipped, 0);
    let mut reference = Reference::new(&bytes, address, text);
    let (start, end, offset) = reference.fdes[reference.fdes.len() / 2];
    let before = reference.rule(start);
    let mut one = bytes.clone();
    // The FDE's CIE pointer (after its 4-byte length: the distance back
    // from that field to its CIE) now points at an FDE before it.
    let previous = reference
        .fdes
        .iter()
        .map(|f| f.2)
        .filter(|&o| o < offset)
        .max()
        .unwrap();
    let back = u32::try_from(offset + 4 - previous).unwrap();
    one[offset + 4..offset + 8].copy_from_slice(&back.to_le_bytes());
    let damaged = build(&one, address, text, Limits::default()).unwrap();
    assert_eq!(damaged.skipped, 1);
    assert_eq!(damaged.rule(start), Rule::Unknown);
    assert_eq!(damaged.rule(end - 1), Rule::Unknown);
    assert_ne!(before, Rule::Unknown);
    let (other, _, _) = reference.fdes[reference.fdes.len() / 2 + 1];
    assert_eq!(
        damaged.rule(other),
        reference.rule(other),
        "{start:#x}..{end:#x}, next {other:#x}"
    );
    let mut flipped = bytes.clone();
    let mut x: u32 = 12345;
    for _ in 0..2000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let i = (x as usize >> 4) % flipped.len();
        flipped[i] ^= (x >> 24) as u8 | 1;
    }
    if let Ok(t) = build(&flipped, address, text, limits) {
        assert!(t.starts.len() <= limits.ranges && t.rules.len() <= limits.rules);
    }
    // The row bound holds on a real file.
    let few = Limits {
        rows: 10,
        ..Limits::default()
    };
    assert_eq!(
        build(&bytes, address, text, few),
        Err(Error::TooLarge {
            what: "rows",
            limit: 10
        })
    );
}

/// An `.eh_frame` of one CIE whose initial instructions end in `nops`
/// padding bytes, and `fdes` FDEs of 16 bytes of code each that use it.
fn shared_cie(nops: usize, fdes: u64) -> Vec<u8> {
    let mut out = Vec::new();
    // CIE: id 0, version 1, no augmentation, code align 1, data align -8,
    // return address in r16; CFA = %rsp + 8, r16 at CFA - 8; nops.
    let mut cie = vec![
        0, 0, 0, 0, 1, 0, 1, 0x78, 0x10, 0x0c, 0x07, 0x08, 0x90, 0x01,
    ];
    cie.resize(cie.len() + nops, 0);
    out.extend_from_slice(&(cie.len() as u32).to_le_bytes());
    out.extend_from_slice(&cie);
    for i in 0..fdes {
        let at = out.len() as u32;
        let mut fde = Vec::new();
        // The CIE pointer: from this field back to the CIE (at 0).
        fde.extend_from_slice(&(at + 4).to_le_bytes());
        fde.extend_from_slice(&(0x1000 + i * 16).to_le_bytes());
        fde.extend_from_slice(&16u64.to_le_bytes());
        out.extend_from_slice(&(fde.len() as u32).to_le_bytes());
        out.extend_from_slice(&fde);
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

#[test]
fn a_cie_replayed_by_every_fde_is_bounded_by_the_section_size() {
    // Honest: a small CIE, many FDEs: a table.
    let honest = build(&shared_cie(2, 4000), 0, 0, Limits::default()).unwrap();
    assert_eq!(honest.rule(0x1000 + 5), STEP_RSP(8, 0));
    // Hostile: a 60 KB CIE replayed by 4,000 FDEs would be 240 MB of
    // instructions for a 180 KB section.
    let hostile = shared_cie(60_000, 4000);
    match build(&hostile, 0, 0, Limits::default()) {
        Err(Error::TooLarge { what, limit }) => {
            assert_eq!(what, "bytes of CFI instructions replayed");
            assert_eq!(limit, 16 * hostile.len() + (1 << 16));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn files_that_keep_frame_pointers_are_told_from_frameless_ones() {
    let rbp = Rule::Step {
        base: CfaBase::Rbp,
        cfa: 16,
        ra: -8,
        rbp: SavedRbp::AtCfa(-16),
    };
    // n framed functions of 100 bytes: push (1 byte), mov (3), body, ret
    // (1 byte after pop); and `frameless` bytes of one frameless function.
    let file = |n: u64, frameless: u64| {
        let mut rows = Vec::new();
        for i in 0..n {
            let at = i * 100;
            rows.push((at, at + 1, STEP_RSP(8, 0)));
            rows.push((at + 1, at + 4, STEP_RSP(16, -16)));
            rows.push((at + 4, at + 99, rbp));
            rows.push((at + 99, at + 100, STEP_RSP(8, 0)));
        }
        let at = n * 100;
        if frameless > 0 {
            rows.push((at, at + frameless, STEP_RSP(24, 0)));
        }
        assemble(rows, Limits::default()).unwrap()
    };
    // Prologues and epilogues are not frameless code.
    assert_eq!(file(50, 0).frameless_share(), 0.0);
    assert!(file(50, 0).framed());
    // 100 bytes of 5,100: 2%, a C runtime's share: still framed (the
    // last framed function's `ret` byte joins the frameless run).
    let some = file(50, 100);
    assert!((some.frameless_share() - 101.0 / 5100.0).abs() < 1e-9);
    assert!(some.framed());
    // 500 of 5,500: 9%, real frameless code: walked by the table.
    assert!(!file(50, 500).framed());
    // All frameless (libc, zlib).
    assert_eq!(file(0, 4000).frameless_share(), 1.0);
    assert!(!file(0, 4000).framed());
}
