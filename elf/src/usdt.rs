//! USDT probes: the SystemTap SDT notes (`.note.stapsdt`) of an ELF file —
//! where each probe is, its semaphore and where its arguments are — as a
//! profiler needs them to attach a uprobe per probe site (the OpenTelemetry
//! memory-profiling contract's `otel_memory:alloc` and `otel_memory:free`,
//! or any other provider).
//!
//! A note's descriptor is three addresses (the probe's `nop`, the link-time
//! address of `.stapsdt.base`, the semaphore or 0) and three strings
//! (provider, name, argument specs such as `8@%rdi -4@-20(%rbp) 8@$5`).
//! When the file was prelinked or otherwise moved, the difference between
//! `.stapsdt.base`'s address now and the recorded one moves the probe and
//! semaphore with it. Argument specs are parsed for x86-64 (the agent's
//! target): a register, a register plus offset to read from, or a constant;
//! a probe whose specs use other forms (an index register, a segment) keeps
//! its spec text and says it cannot be read.

use object::{Object, ObjectSection, ObjectSegment};
use thiserror::Error;

/// At most this many notes are read from one file: a bound on what a
/// hostile file makes the reader allocate (real libraries have dozens; the
/// notes of a whole libc are under 100).
pub const MAX_PROBES: usize = 65_536;

/// Why a file's USDT notes could not be read.
#[derive(Debug, Error)]
pub enum UsdtError {
    /// Not an ELF file object can read.
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    /// The note section is cut or its lengths point outside it.
    #[error("malformed .note.stapsdt: {0}")]
    Malformed(&'static str),
    /// More notes than [`MAX_PROBES`].
    #[error("more than {MAX_PROBES} USDT probes")]
    TooMany,
}

/// One probe site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtProbe {
    /// The provider (`otel_memory`).
    pub provider: String,
    /// The probe's name (`alloc`).
    pub name: String,
    /// The virtual address of the probe's `nop`, adjusted for a moved
    /// `.stapsdt.base`.
    pub address: u64,
    /// Its offset in the file (what a uprobe attaches at), when a loadable
    /// segment holds it.
    pub file_offset: Option<u64>,
    /// The semaphore's virtual address (a 16-bit counter tracers increment
    /// while attached), if the probe has one.
    pub semaphore: Option<u64>,
    /// The semaphore's offset in the file.
    pub semaphore_offset: Option<u64>,
    /// The argument specs as written.
    pub args_text: String,
    /// The parsed arguments, or why they cannot be read.
    pub args: Result<Vec<UsdtArg>, String>,
}

/// One argument: its size in bytes, signedness and where it is at the
/// probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsdtArg {
    /// 1, 2, 4 or 8.
    pub size: u8,
    /// A negative size in the spec: sign-extend.
    pub signed: bool,
    /// Where the value is.
    pub location: ArgLocation,
}

/// Where an argument's value is at the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgLocation {
    /// In a register (its low `size` bytes).
    Register(Reg),
    /// In memory at the register's value plus an offset.
    Memory {
        /// The base register.
        base: Reg,
        /// The displacement.
        offset: i64,
    },
    /// A constant.
    Constant(i64),
}

/// An x86-64 general-purpose register (or `%rip`), by its 64-bit name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Reg {
    Rax,
    Rbx,
    Rcx,
    Rdx,
    Rsi,
    Rdi,
    Rbp,
    Rsp,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
    Rip,
}

impl Reg {
    /// The register's offset in the kernel's x86-64 `struct pt_regs` (what
    /// a uprobe program reads).
    pub fn pt_regs_offset(self) -> usize {
        match self {
            Reg::R15 => 0,
            Reg::R14 => 8,
            Reg::R13 => 16,
            Reg::R12 => 24,
            Reg::Rbp => 32,
            Reg::Rbx => 40,
            Reg::R11 => 48,
            Reg::R10 => 56,
            Reg::R9 => 64,
            Reg::R8 => 72,
            Reg::Rax => 80,
            Reg::Rcx => 88,
            Reg::Rdx => 96,
            Reg::Rsi => 104,
            Reg::Rdi => 112,
            Reg::Rip => 128,
            Reg::Rsp => 152,
        }
    }

    /// The register any of its names (`%rax`, `%eax`, `%ax`, `%al`,
    /// `%r8d`, …) is part of, without the `%`.
    pub fn from_name(name: &str) -> Option<Reg> {
        use Reg::*;
        Some(match name {
            // (%ah & co. are bits 8-15, not the low byte: not read.)
            "rax" | "eax" | "ax" | "al" => Rax,
            "rbx" | "ebx" | "bx" | "bl" => Rbx,
            "rcx" | "ecx" | "cx" | "cl" => Rcx,
            "rdx" | "edx" | "dx" | "dl" => Rdx,
            "rsi" | "esi" | "si" | "sil" => Rsi,
            "rdi" | "edi" | "di" | "dil" => Rdi,
            "rbp" | "ebp" | "bp" | "bpl" => Rbp,
            "rsp" | "esp" | "sp" | "spl" => Rsp,
            "rip" => Rip,
            _ => {
                let n = name.strip_prefix('r')?;
                let digits = n.trim_end_matches(['d', 'w', 'b']);
                match digits {
                    "8" => R8,
                    "9" => R9,
                    "10" => R10,
                    "11" => R11,
                    "12" => R12,
                    "13" => R13,
                    "14" => R14,
                    "15" => R15,
                    _ => return None,
                }
            }
        })
    }
}

/// The USDT probes of an ELF file (none when it has no `.note.stapsdt`).
pub fn usdt_probes(data: &[u8]) -> Result<Vec<UsdtProbe>, UsdtError> {
    let file = object::File::parse(data)?;
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let layout = NoteLayout {
        little_endian: file.is_little_endian(),
        is_64: file.is_64(),
        stapsdt_base: file.section_by_name(".stapsdt.base").map(|s| s.address()),
        segments: file
            .segments()
            .map(|seg| {
                let (start, size) = seg.file_range();
                (seg.address(), size.min(seg.size()), start)
            })
            .collect(),
        file_len: data.len() as u64,
    };
    probes_from_notes(section.data()?, layout)
}

/// What [`probes_from_notes`] needs of the file besides its notes: for a
/// reader that parses the ELF file itself (with another `object` version,
/// or through a bounded read cache).
#[derive(Debug, Clone, Default)]
pub struct NoteLayout {
    /// The file's byte order.
    pub little_endian: bool,
    /// ELFCLASS64 (8-byte addresses in the notes).
    pub is_64: bool,
    /// The address of `.stapsdt.base` in the file, when it has one.
    pub stapsdt_base: Option<u64>,
    /// Loadable segments: (virtual address, file bytes, file offset).
    pub segments: Vec<(u64, u64, u64)>,
    /// The file's length.
    pub file_len: u64,
}

/// The probes of a `.note.stapsdt` section's bytes.
pub fn probes_from_notes(notes: &[u8], layout: NoteLayout) -> Result<Vec<UsdtProbe>, UsdtError> {
    // Where .stapsdt.base is now; the notes say where it was at link time.
    let base_now = layout.stapsdt_base;
    // Loadable segments by address, for a binary search per probe (a
    // hostile file may have as many segments as probes).
    let mut segments = layout.segments;
    segments.sort_unstable();
    let file_len = layout.file_len;
    let offset_of = |vaddr: u64| {
        let i = segments.partition_point(|s| s.0 <= vaddr).checked_sub(1)?;
        let (address, size, start) = segments[i];
        let at = vaddr - address;
        let offset = start.checked_add(at)?;
        (at < size && offset < file_len).then_some(offset)
    };
    let mut probes = Vec::new();
    for note in parse_notes(notes, layout.little_endian, layout.is_64)? {
        if probes.len() == MAX_PROBES {
            return Err(UsdtError::TooMany);
        }
        let shift = |addr: u64| match base_now {
            Some(now) => addr.wrapping_add(now.wrapping_sub(note.base)),
            None => addr,
        };
        let address = shift(note.pc);
        let semaphore = (note.semaphore != 0).then(|| shift(note.semaphore));
        probes.push(UsdtProbe {
            file_offset: offset_of(address),
            semaphore_offset: semaphore.and_then(offset_of),
            address,
            semaphore,
            args: parse_args(&note.args),
            args_text: note.args,
            provider: note.provider,
            name: note.name,
        });
    }
    Ok(probes)
}

/// A stapsdt note as written.
#[derive(Debug, PartialEq, Eq)]
struct RawNote {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
    args: String,
}

const NT_STAPSDT: u32 = 3;

/// The stapsdt notes of a note section (other owners and types skipped).
fn parse_notes(mut data: &[u8], little: bool, is_64: bool) -> Result<Vec<RawNote>, UsdtError> {
    let word = |b: &[u8]| {
        let a: [u8; 4] = b.try_into().unwrap();
        if little {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    // Addresses are 8 bytes in 64-bit files, 4 in 32-bit ones.
    let width = if is_64 { 8 } else { 4 };
    let addr = |b: &[u8]| {
        if width == 4 {
            u64::from(word(b))
        } else {
            let a: [u8; 8] = b.try_into().unwrap();
            if little {
                u64::from_le_bytes(a)
            } else {
                u64::from_be_bytes(a)
            }
        }
    };
    let pad = |n: usize| n.div_ceil(4).saturating_mul(4);
    let mut notes = Vec::new();
    while !data.is_empty() {
        if data.len() < 12 {
            return Err(UsdtError::Malformed("a note header is cut"));
        }
        let (namesz, descsz, kind) = (
            word(&data[0..4]) as usize,
            word(&data[4..8]) as usize,
            word(&data[8..12]),
        );
        let name_end = 12usize
            .checked_add(pad(namesz))
            .ok_or(UsdtError::Malformed("a name size overflows"))?;
        let end = name_end
            .checked_add(pad(descsz))
            .ok_or(UsdtError::Malformed("a descriptor size overflows"))?;
        if end > data.len() || 12 + namesz > data.len() || name_end + descsz > data.len() {
            return Err(UsdtError::Malformed("a note runs past its section"));
        }
        let owner = &data[12..12 + namesz];
        let desc = &data[name_end..name_end + descsz];
        data = &data[end..];
        if kind != NT_STAPSDT || owner != b"stapsdt\0" {
            continue;
        }
        if notes.len() == MAX_PROBES {
            return Err(UsdtError::TooMany);
        }
        if desc.len() < 3 * width {
            return Err(UsdtError::Malformed(
                "a probe descriptor is shorter than its addresses",
            ));
        }
        let mut strings = desc[3 * width..].split(|b| *b == 0);
        let mut text = || {
            strings
                .next()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .ok_or(UsdtError::Malformed("a probe's strings are cut"))
        };
        let (provider, name, args) = (text()?, text()?, text().unwrap_or_default());
        notes.push(RawNote {
            pc: addr(&desc[0..width]),
            base: addr(&desc[width..2 * width]),
            semaphore: addr(&desc[2 * width..3 * width]),
            provider,
            name,
            args,
        });
    }
    Ok(notes)
}

/// Parses x86-64 argument specs (`8@%rdi -4@-20(%rbp) 8@$5`).
pub fn parse_args(text: &str) -> Result<Vec<UsdtArg>, String> {
    text.split_whitespace().map(parse_arg).collect()
}

fn parse_arg(spec: &str) -> Result<UsdtArg, String> {
    let (size, operand) = spec
        .split_once('@')
        .ok_or_else(|| format!("{spec:?}: no size@"))?;
    let n: i8 = size
        .parse()
        .map_err(|_| format!("{spec:?}: size {size:?}"))?;
    let bytes = n.unsigned_abs();
    if !matches!(bytes, 1 | 2 | 4 | 8) {
        return Err(format!("{spec:?}: size {n}"));
    }
    let reg = |r: &str| {
        r.strip_prefix('%')
            .and_then(Reg::from_name)
            .ok_or_else(|| format!("{spec:?}: register {r:?}"))
    };
    let location = if let Some(imm) = operand.strip_prefix('$') {
        ArgLocation::Constant(parse_int(imm).ok_or_else(|| format!("{spec:?}: constant"))?)
    } else if operand.starts_with('%') {
        ArgLocation::Register(reg(operand)?)
    } else if let Some((disp, rest)) = operand.split_once('(') {
        let inner = rest
            .strip_suffix(')')
            .ok_or_else(|| format!("{spec:?}: unclosed ("))?;
        if inner.contains(',') {
            return Err(format!("{spec:?}: indexed operands are not read"));
        }
        let offset = if disp.is_empty() {
            0
        } else {
            parse_int(disp).ok_or_else(|| format!("{spec:?}: displacement"))?
        };
        ArgLocation::Memory {
            base: reg(inner)?,
            offset,
        }
    } else {
        return Err(format!("{spec:?}: operand {operand:?} is not read"));
    };
    Ok(UsdtArg {
        size: bytes,
        signed: n < 0,
        location,
    })
}

/// A decimal or `0x` hexadecimal integer, optionally negative.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let (radix, digits) = match digits.strip_prefix("0x") {
        Some(hex) => (16, hex),
        None => (10, digits),
    };
    // from_str_radix takes a sign of its own: no second one.
    if !digits.chars().next()?.is_ascii_hexdigit() {
        return None;
    }
    let v = i64::from_str_radix(digits, radix).ok()?;
    if neg {
        v.checked_neg()
    } else {
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(owner: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend((owner.len() as u32).to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(owner);
        out.resize(out.len().div_ceil(4) * 4, 0);
        out.extend(desc);
        out.resize(out.len().div_ceil(4) * 4, 0);
        out
    }

    fn probe_desc(pc: u64, base: u64, sem: u64, strings: &str) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend(pc.to_le_bytes());
        d.extend(base.to_le_bytes());
        d.extend(sem.to_le_bytes());
        d.extend(strings.as_bytes());
        d
    }

    #[test]
    fn reads_stapsdt_notes_and_skips_others() {
        let mut section = note(b"GNU\0", 3, &[1; 20]);
        section.extend(note(
            b"stapsdt\0",
            3,
            &probe_desc(
                0x1b60,
                0x2081,
                0,
                "otel_memory\0alloc\08@%rdi 8@%rsi 8@%rdx\0",
            ),
        ));
        section.extend(note(
            b"stapsdt\0",
            3,
            &probe_desc(0x1b78, 0x2081, 0x4010, "otel_memory\0free\0-8@-8(%rbp)\0"),
        ));
        let notes = parse_notes(&section, true, true).unwrap();
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0].name, "alloc");
        assert_eq!(notes[0].pc, 0x1b60);
        assert_eq!(notes[1].semaphore, 0x4010);
        assert_eq!(notes[1].args, "-8@-8(%rbp)");
    }

    #[test]
    fn cut_or_lying_notes_are_errors_not_panics() {
        let good = note(b"stapsdt\0", 3, &probe_desc(1, 2, 0, "p\0n\0\0"));
        for cut in 0..good.len() {
            let r = parse_notes(&good[..cut], true, true);
            assert!(cut == 0 || r.is_err(), "cut at {cut}: {r:?}");
        }
        let mut lying = good.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_notes(&lying, true, true).is_err());
        let short = note(b"stapsdt\0", 3, &[0; 10]);
        assert!(parse_notes(&short, true, true).is_err());
        let no_strings = note(b"stapsdt\0", 3, &[0; 24]);
        assert!(parse_notes(&no_strings, true, true).is_err());
    }

    #[test]
    fn argument_specs_of_gcc_clang_and_rust() {
        let args = parse_args("8@%rdi -4@-20(%rbp) 8@$5 4@%r8d 2@(%rax) 8@0x10(%rsp)").unwrap();
        assert_eq!(
            args[0],
            UsdtArg {
                size: 8,
                signed: false,
                location: ArgLocation::Register(Reg::Rdi)
            }
        );
        assert_eq!(
            args[1],
            UsdtArg {
                size: 4,
                signed: true,
                location: ArgLocation::Memory {
                    base: Reg::Rbp,
                    offset: -20
                }
            }
        );
        assert_eq!(args[2].location, ArgLocation::Constant(5));
        assert_eq!(args[3].location, ArgLocation::Register(Reg::R8));
        assert_eq!(
            args[4].location,
            ArgLocation::Memory {
                base: Reg::Rax,
                offset: 0
            }
        );
        assert_eq!(
            args[5].location,
            ArgLocation::Memory {
                base: Reg::Rsp,
                offset: 16
            }
        );
        assert!(parse_args("8@8(%rax,%rbx,4)").is_err());
        assert!(parse_args("3@%rax").is_err());
        assert!(parse_args("8@%xmm0").is_err());
        assert!(parse_args("rdi").is_err());
        assert!(
            parse_args("1@%ah").is_err(),
            "bits 8-15 are not the low byte"
        );
        for bad in [
            "8@$--9223372036854775808",
            "8@$-0x-8",
            "8@$--5",
            "8@$0x+5",
            "8@$+5",
        ] {
            assert!(parse_args(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_args("8@$-9223372036854775807").unwrap()[0].location,
            ArgLocation::Constant(-i64::MAX)
        );
        assert_eq!(
            parse_args("8@$0x10").unwrap()[0].location,
            ArgLocation::Constant(16)
        );
        assert_eq!(parse_args("").unwrap(), vec![]);
        assert_eq!(Reg::Rdi.pt_regs_offset(), 112);
    }

    #[test]
    fn notes_of_32_bit_files_have_4_byte_addresses() {
        let mut desc = Vec::new();
        desc.extend(0x1000u32.to_le_bytes());
        desc.extend(0x2000u32.to_le_bytes());
        desc.extend(0u32.to_le_bytes());
        desc.extend(b"p\0n\0");
        desc.extend(b"4@8(%esp)\0");
        let notes = parse_notes(&note(b"stapsdt\0", 3, &desc), true, false).unwrap();
        assert_eq!(
            (notes[0].pc, notes[0].base, notes[0].semaphore),
            (0x1000, 0x2000, 0)
        );
        assert_eq!(notes[0].args, "4@8(%esp)");
    }

    #[test]
    fn a_file_without_notes_has_no_probes() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(usdt_probes(&exe).unwrap(), vec![]);
        assert!(usdt_probes(b"not elf").is_err());
    }
}
