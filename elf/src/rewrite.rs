//! Streaming ELF rewriting: the two transformations a symbol publisher needs,
//! done natively (no binutils) with memory bounded by the headers, not by the
//! file. Inputs are read with positioned reads ([`Input`]: a byte slice or a
//! file), section contents are copied in 1 MiB pieces, and nothing is mapped,
//! so even a multi-gigabyte binary costs a few megabytes.
//!
//! - [`only_keep_debug`]: what `objcopy --only-keep-debug` writes — every
//!   section header kept (so indexes, links and addresses stay valid),
//!   allocated sections turned into `SHT_NOBITS` except notes (the build-ID
//!   stays), non-allocated sections (DWARF, `.symtab`, `.strtab`, `.comment`)
//!   copied; program headers keep their addresses, and file bytes only for
//!   what is still in the file (headers and notes).
//! - [`strip_debug`]: what `objcopy --strip-debug --add-gnu-debuglink=F`
//!   writes for executables and shared libraries — `.debug_*`/`.zdebug_*`
//!   sections removed, allocated contents byte-identical at the same offsets,
//!   other sections packed after them, and a `.gnu_debuglink` naming the
//!   debug file with its CRC32.

use std::io::{self, Write};

use crate::Error;

const SHT_NOBITS: u32 = 8;
const SHT_NOTE: u32 = 7;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const SHT_REL: u32 = 9;
const SHT_RELA: u32 = 4;
const SHF_ALLOC: u64 = 2;
const SHF_INFO_LINK: u64 = 0x40;
const PT_NOTE: u32 = 4;
const PT_PHDR: u32 = 6;
const SHN_LORESERVE: u32 = 0xff00;
/// Bytes copied per read.
const CHUNK: u64 = 1 << 20;

/// Random-access input for the rewriters.
pub trait Input {
    /// Total length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

impl Input for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        let src = self.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl Input for std::fs::File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// `len` bytes at `offset`, checked against the input's size before
/// anything is allocated.
fn read_vec(input: &(impl Input + ?Sized), offset: u64, len: u64) -> Result<Vec<u8>, Error> {
    let size = input.size().map_err(|e| Error::Malformed(e.to_string()))?;
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::Malformed(format!(
            "{len} bytes at offset {offset} are past the end of the {size}-byte file"
        )));
    }
    let mut buf = vec![0u8; len as usize];
    input
        .read_at(offset, &mut buf)
        .map_err(|e| Error::Malformed(format!("reading {len} bytes at offset {offset}: {e}")))?;
    Ok(buf)
}

/// The class and byte order of a file.
#[derive(Clone, Copy)]
struct Layout {
    is_64: bool,
    big_endian: bool,
}

impl Layout {
    fn read(ident: &[u8]) -> Result<Self, Error> {
        if ident.len() < 6 || &ident[..4] != b"\x7fELF" {
            return Err(Error::NotElf("missing ELF magic \\x7fELF".into()));
        }
        let is_64 = match ident[4] {
            1 => false,
            2 => true,
            c => return Err(Error::Malformed(format!("unknown ELF class {c}"))),
        };
        let big_endian = match ident[5] {
            1 => false,
            2 => true,
            d => return Err(Error::Malformed(format!("unknown ELF data encoding {d}"))),
        };
        Ok(Self { is_64, big_endian })
    }

    fn get(&self, data: &[u8], at: usize, size: usize) -> Result<u64, Error> {
        let bytes = data
            .get(at..at + size)
            .ok_or_else(|| Error::Malformed(format!("header field at {at} is out of range")))?;
        let fold = |v: u64, b: &u8| (v << 8) | u64::from(*b);
        Ok(if self.big_endian {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        })
    }

    fn put(&self, buf: &mut [u8], at: usize, size: usize, value: u64) {
        for i in 0..size {
            let shift = if self.big_endian {
                8 * (size - 1 - i)
            } else {
                8 * i
            };
            buf[at + i] = (value >> shift) as u8;
        }
    }

    /// Size of an address/offset field.
    fn word(&self) -> usize {
        if self.is_64 {
            8
        } else {
            4
        }
    }

    /// Offsets of section header fields: flags, offset, size, link, info, align.
    fn shdr_fields(&self) -> [usize; 6] {
        if self.is_64 {
            [8, 24, 32, 40, 44, 48]
        } else {
            [8, 16, 20, 24, 28, 32]
        }
    }

    /// Offsets of e_shoff, e_shnum, e_shstrndx.
    fn ehdr_section_fields(&self) -> (usize, usize, usize) {
        if self.is_64 {
            (0x28, 0x3c, 0x3e)
        } else {
            (0x20, 0x30, 0x32)
        }
    }

    /// Offsets of p_offset and p_filesz in a program header.
    fn phdr_fields(&self) -> (usize, usize) {
        if self.is_64 {
            (8, 32)
        } else {
            (4, 16)
        }
    }
}

/// One section header, decoded, with its raw bytes for re-encoding.
#[derive(Clone)]
struct Shdr {
    raw: Vec<u8>,
    name: u32,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
}

impl Shdr {
    fn has_bytes(&self) -> bool {
        self.kind != SHT_NOBITS && self.size > 0
    }
}

/// The headers of an ELF file: everything the rewriters need but contents.
struct Elf {
    l: Layout,
    /// Bytes from the start of the file to the end of the program headers.
    head: Vec<u8>,
    shstrndx: u32,
    phoff: u64,
    phentsize: usize,
    phnum: usize,
    sections: Vec<Shdr>,
    /// Contents of the section name table.
    names: Vec<u8>,
    /// The input's length.
    file_len: u64,
}

/// Largest section alignment honoured when sections are laid out anew:
/// real files ask for at most a page or two; a header that asks for more
/// would only make the output grow by padding.
const MAX_SECTION_ALIGN: u64 = 1 << 20;

/// `pos` rounded up to a multiple of `align`, checked.
fn align_up(pos: u64, align: u64) -> Result<u64, Error> {
    let align = align.max(1);
    if align > MAX_SECTION_ALIGN {
        return Err(Error::Malformed(format!(
            "a section asks for {align}-byte alignment (at most {MAX_SECTION_ALIGN} is laid out)"
        )));
    }
    pos.div_ceil(align)
        .checked_mul(align)
        .ok_or_else(|| Error::Malformed("section offsets overflow".into()))
}

/// Refuses a layout whose output would be far larger than its input: a
/// rewrite only drops or moves what the input holds (plus a debuglink and
/// names), so anything more comes from lying headers.
fn check_output_size(output: u64, input: u64) -> Result<(), Error> {
    let max = input.saturating_mul(2).saturating_add(1 << 20);
    if output > max {
        return Err(Error::Malformed(format!(
            "the rewritten file would be {output} bytes from a {input}-byte input \
             (its headers ask for more than the file holds)"
        )));
    }
    Ok(())
}

impl Elf {
    fn parse(input: &(impl Input + ?Sized)) -> Result<Self, Error> {
        let file_len = input.size().map_err(|e| Error::Malformed(e.to_string()))?;
        let ehdr = read_vec(input, 0, file_len.min(64))?;
        let l = Layout::read(&ehdr)?;
        let w = l.word();
        let (phoff_at, shoff_at) = if l.is_64 { (0x20, 0x28) } else { (0x1c, 0x20) };
        let at = |o64, o32| if l.is_64 { o64 } else { o32 };
        let phoff = l.get(&ehdr, phoff_at, w)?;
        let shoff = l.get(&ehdr, shoff_at, w)?;
        let phentsize = l.get(&ehdr, at(0x36, 0x2a), 2)? as usize;
        let phnum = l.get(&ehdr, at(0x38, 0x2c), 2)? as usize;
        let shentsize = l.get(&ehdr, at(0x3a, 0x2e), 2)?;
        let shnum = l.get(&ehdr, at(0x3c, 0x30), 2)?;
        let shstrndx = l.get(&ehdr, at(0x3e, 0x32), 2)?;
        if shoff == 0 || shentsize == 0 {
            return Err(Error::Malformed(
                "the file has no section header table".into(),
            ));
        }
        let f = l.shdr_fields();
        let decode = |raw: Vec<u8>| -> Result<Shdr, Error> {
            Ok(Shdr {
                name: l.get(&raw, 0, 4)? as u32,
                kind: l.get(&raw, 4, 4)? as u32,
                flags: l.get(&raw, f[0], w)?,
                offset: l.get(&raw, f[1], w)?,
                size: l.get(&raw, f[2], w)?,
                link: l.get(&raw, f[3], 4)? as u32,
                info: l.get(&raw, f[4], 4)? as u32,
                align: l.get(&raw, f[5], w)?,
                raw,
            })
        };
        let first = decode(read_vec(input, shoff, shentsize)?)?;
        // Extended numbering: counts that do not fit live in section 0.
        let shnum = if shnum == 0 { first.size } else { shnum };
        let shstrndx = if shstrndx == 0xffff {
            first.link
        } else {
            shstrndx as u32
        };
        if shoff.saturating_add(shnum.saturating_mul(shentsize)) > file_len {
            return Err(Error::Malformed(
                "the section header table extends past the end of the file".into(),
            ));
        }
        let table = read_vec(input, shoff, shnum * shentsize)?;
        let sections = table
            .chunks_exact(shentsize as usize)
            .map(|raw| decode(raw.to_vec()))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, s) in sections.iter().enumerate() {
            if s.kind != SHT_NOBITS
                && s.offset
                    .checked_add(s.size)
                    .is_none_or(|end| end > file_len)
            {
                return Err(Error::Malformed(format!(
                    "section {i} extends past the end of the file"
                )));
            }
        }
        let names = match sections.get(shstrndx as usize) {
            Some(s) if s.kind != SHT_NOBITS => read_vec(input, s.offset, s.size)?,
            _ => return Err(Error::Malformed("the section name table is missing".into())),
        };
        let ehsize: u64 = if l.is_64 { 64 } else { 52 };
        let head_len = (phnum as u64 * phentsize as u64)
            .checked_add(phoff)
            .map_or(u64::MAX, |end| end.max(ehsize));
        if head_len > file_len {
            return Err(Error::Malformed(
                "the program headers extend past the end of the file".into(),
            ));
        }
        let head = read_vec(input, 0, head_len)?;
        Ok(Self {
            l,
            head,
            shstrndx,
            phoff,
            phentsize,
            phnum,
            sections,
            names,
            file_len,
        })
    }

    fn name(&self, s: &Shdr) -> &str {
        let bytes = self.names.get(s.name as usize..).unwrap_or(&[]);
        let len = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..len]).unwrap_or("")
    }

    fn encode_shdr(&self, s: &Shdr) -> Vec<u8> {
        let f = self.l.shdr_fields();
        let w = self.l.word();
        let mut raw = s.raw.clone();
        self.l.put(&mut raw, 0, 4, u64::from(s.name));
        self.l.put(&mut raw, 4, 4, u64::from(s.kind));
        self.l.put(&mut raw, f[0], w, s.flags);
        self.l.put(&mut raw, f[1], w, s.offset);
        self.l.put(&mut raw, f[2], w, s.size);
        self.l.put(&mut raw, f[3], 4, u64::from(s.link));
        self.l.put(&mut raw, f[4], 4, u64::from(s.info));
        self.l.put(&mut raw, f[5], w, s.align);
        raw
    }

    /// (offset at of p_offset, old p_offset, old p_filesz, p_type) per program header.
    fn segments(&self) -> Result<Vec<(usize, u64, u64, u32)>, Error> {
        let (off_at, filesz_at) = self.l.phdr_fields();
        let w = self.l.word();
        (0..self.phnum)
            .map(|p| {
                let at = self.phoff as usize + p * self.phentsize;
                let (offset, size) = (
                    self.l.get(&self.head, at + off_at, w)?,
                    self.l.get(&self.head, at + filesz_at, w)?,
                );
                if offset
                    .checked_add(size)
                    .is_none_or(|end| end > self.file_len)
                {
                    return Err(Error::Malformed(format!(
                        "program header {p} ({size} bytes at offset {offset}) extends past \
                         the end of the {}-byte file",
                        self.file_len
                    )));
                }
                Ok((at, offset, size, self.l.get(&self.head, at, 4)? as u32))
            })
            .collect()
    }
}

/// Counts bytes written, for offsets.
struct Out<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Out<W> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.inner.write_all(bytes).map_err(io_err)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Pads with zeros up to `to`.
    fn pad_to(&mut self, to: u64) -> Result<(), Error> {
        while self.pos < to {
            let n = (to - self.pos).min(CHUNK);
            self.write(&vec![0u8; n as usize])?;
        }
        Ok(())
    }

    /// Copies `len` bytes from `offset` of the input, through `edit`.
    fn copy(
        &mut self,
        input: &(impl Input + ?Sized),
        offset: u64,
        len: u64,
        mut edit: impl FnMut(&mut [u8]) -> Result<(), Error>,
        unit: u64,
    ) -> Result<(), Error> {
        let step = (CHUNK / unit.max(1)).max(1) * unit.max(1);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(step);
            let mut buf = read_vec(input, offset + done, n)?;
            edit(&mut buf)?;
            self.write(&buf)?;
            done += n;
        }
        Ok(())
    }
}

fn io_err(e: io::Error) -> Error {
    Error::Malformed(format!("writing the output failed: {e}"))
}

fn unchanged(_: &mut [u8]) -> Result<(), Error> {
    Ok(())
}

fn is_debug_name(name: &str) -> bool {
    name.starts_with(".debug_")
        || name.starts_with(".zdebug_")
        || name.starts_with(".gnu.debuglto_")
}

/// Writes the debug-only counterpart of an ELF file (see the module docs).
/// Returns the number of bytes written.
pub fn only_keep_debug<W: Write>(input: &(impl Input + ?Sized), out: W) -> Result<u64, Error> {
    let elf = Elf::parse(input)?;
    let l = elf.l;
    let w = l.word();
    let mut head = elf.head.clone();

    // Lay out sections in their original file order.
    let mut order: Vec<usize> = (1..elf.sections.len()).collect();
    order.sort_by_key(|&i| elf.sections[i].offset);
    let mut new = elf.sections.clone();
    let mut body: Vec<(usize, u64)> = Vec::new(); // (section, new offset) with contents
    let mut pos = head.len() as u64;
    for &i in &order {
        let s = &elf.sections[i];
        let keep = s.kind != SHT_NOBITS && (s.flags & SHF_ALLOC == 0 || s.kind == SHT_NOTE);
        if keep {
            pos = align_up(pos, s.align)?;
            new[i].offset = pos;
            body.push((i, pos));
            pos += s.size;
        } else {
            if s.flags & SHF_ALLOC != 0 {
                new[i].kind = SHT_NOBITS;
            }
            new[i].offset = pos;
        }
    }
    let shoff = pos.div_ceil(8) * 8;
    check_output_size(shoff, elf.file_len)?;

    // Program headers keep their addresses; file bytes only for what stays.
    let (off_at, filesz_at) = l.phdr_fields();
    for (at, old_off, old_size, kind) in elf.segments()? {
        match kind {
            PT_PHDR => {}
            PT_NOTE => {
                if let Some(i) = (1..elf.sections.len()).find(|&i| {
                    elf.sections[i].kind == SHT_NOTE && elf.sections[i].offset == old_off
                }) {
                    l.put(&mut head, at + off_at, w, new[i].offset);
                }
            }
            _ => {
                let new_off = if old_off == 0 {
                    0
                } else {
                    order
                        .iter()
                        .find(|&&i| elf.sections[i].offset >= old_off)
                        .map_or(0, |&i| new[i].offset)
                };
                let mut end = if old_off == 0 && old_size > 0 {
                    head.len() as u64
                } else {
                    new_off
                };
                for &(i, at_new) in &body {
                    let s = &elf.sections[i];
                    let inside = s.offset >= old_off && s.offset + s.size <= old_off + old_size;
                    if inside && s.flags & SHF_ALLOC != 0 {
                        end = end.max(at_new + s.size);
                    }
                }
                let (mut new_off, mut end) = (new_off, end);
                if end == new_off {
                    // No bytes left: keep p_offset ≡ p_vaddr (mod p_align),
                    // as loaders and eu-elflint expect (objcopy does too).
                    let (vaddr_at, align_at) = if l.is_64 { (16, 48) } else { (8, 28) };
                    let vaddr = l.get(&head, at + vaddr_at, w)?;
                    let align = l.get(&head, at + align_at, w)?;
                    if align > 1 {
                        // In u128: p_align is the file's word, any value.
                        let (v, a, o) = (vaddr as u128, align as u128, new_off as u128);
                        let shift = ((v % a + a - o % a) % a) as u64;
                        new_off = new_off.checked_add(shift).ok_or_else(|| {
                            Error::Malformed(format!(
                                "program header alignment {align} overflows the file offset"
                            ))
                        })?;
                        end = new_off;
                    }
                }
                l.put(&mut head, at + off_at, w, new_off);
                l.put(&mut head, at + filesz_at, w, end - new_off);
            }
        }
    }
    let (shoff_at, _, _) = l.ehdr_section_fields();
    l.put(&mut head, shoff_at, w, shoff);

    let mut out = Out { inner: out, pos: 0 };
    out.write(&head)?;
    for (i, at) in body {
        let s = &elf.sections[i];
        out.pad_to(at)?;
        out.copy(input, s.offset, s.size, unchanged, 1)?;
    }
    out.pad_to(shoff)?;
    for s in &new {
        out.write(&elf.encode_shdr(s))?;
    }
    Ok(out.pos)
}

/// The `.gnu_debuglink` contents: the file name, NUL, padding to 4, CRC32.
pub fn debuglink_section(file_name: &str, crc: u32, big_endian: bool) -> Vec<u8> {
    let mut v = file_name.as_bytes().to_vec();
    v.push(0);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v.extend_from_slice(&if big_endian {
        crc.to_be_bytes()
    } else {
        crc.to_le_bytes()
    });
    v
}

/// Writes the file without its DWARF, plus a `.gnu_debuglink` to
/// `debug_file_name` (whose contents have CRC32 `debug_crc`). Executables and
/// shared libraries only: their allocated contents keep their offsets, so
/// nothing that runs changes. Returns the number of bytes written.
pub fn strip_debug<W: Write>(
    input: &(impl Input + ?Sized),
    debug_file_name: &str,
    debug_crc: u32,
    out: W,
) -> Result<u64, Error> {
    let elf = Elf::parse(input)?;
    let l = elf.l;
    let w = l.word();
    if elf.sections.len() >= SHN_LORESERVE as usize {
        return Err(Error::Malformed(format!(
            "{} sections: files with extended section numbering are not stripped here (use objcopy)",
            elf.sections.len()
        )));
    }
    let e_type = l.get(&elf.head, 16, 2)?;
    if e_type != 2 && e_type != 3 {
        return Err(Error::Malformed(format!(
            "only executables and shared libraries can be stripped here (e_type {e_type})"
        )));
    }
    // New index of each kept section; debug sections (and an old debuglink) go.
    let mut map = vec![0u32; elf.sections.len()];
    let mut kept: Vec<Shdr> = Vec::new();
    for (i, s) in elf.sections.iter().enumerate() {
        let name = elf.name(s);
        let relocates_debug = (s.kind == SHT_REL || s.kind == SHT_RELA)
            && elf
                .sections
                .get(s.info as usize)
                .is_some_and(|t| is_debug_name(elf.name(t)));
        let drop = i != 0 && (is_debug_name(name) || name == ".gnu_debuglink" || relocates_debug);
        if !drop {
            map[i] = kept.len() as u32;
            kept.push(s.clone());
        }
    }
    let remap = |idx: u32| -> u32 {
        if idx == 0 || idx >= SHN_LORESERVE || idx as usize >= map.len() {
            idx
        } else {
            map[idx as usize]
        }
    };
    for s in &mut kept {
        s.link = remap(s.link);
        if s.flags & SHF_INFO_LINK != 0 || s.kind == SHT_REL || s.kind == SHT_RELA {
            s.info = remap(s.info);
        }
    }
    let shstrndx_new = remap(elf.shstrndx) as usize;

    // Allocated contents (and whatever the segments cover) keep their offsets.
    let mut fixed: Vec<(u64, u64)> = elf
        .segments()?
        .into_iter()
        .filter(|(_, _, size, _)| *size > 0)
        .map(|(_, off, size, _)| (off, off + size))
        .collect();
    fixed.extend(
        kept.iter()
            .skip(1)
            .filter(|s| s.flags & SHF_ALLOC != 0 && s.has_bytes())
            .map(|s| (s.offset, s.offset + s.size)),
    );
    fixed.sort();
    let head_len = elf.head.len() as u64;
    let fixed_end = fixed.iter().map(|r| r.1).max().unwrap_or(0).max(head_len);

    // Non-allocated sections are packed after them, then the new tables.
    let mut sections = kept.clone();
    let mut moved: Vec<(usize, u64)> = Vec::new(); // (new index, old offset)
    let mut pos = fixed_end;
    for (new_i, s) in kept.iter().enumerate() {
        if new_i == 0 || new_i == shstrndx_new || s.flags & SHF_ALLOC != 0 || s.kind == SHT_NOBITS {
            continue;
        }
        pos = align_up(pos, s.align)?;
        sections[new_i].offset = pos;
        pos += s.size;
        moved.push((new_i, s.offset));
    }
    let mut names = elf.names.clone();
    let link_name = names.len() as u32;
    names.extend_from_slice(b".gnu_debuglink\0");
    let link = debuglink_section(debug_file_name, debug_crc, l.big_endian);
    let link_off = pos.div_ceil(4) * 4;
    let names_off = link_off + link.len() as u64;
    let shoff = (names_off + names.len() as u64).div_ceil(8) * 8;
    check_output_size(shoff, elf.file_len)?;
    sections[shstrndx_new].offset = names_off;
    sections[shstrndx_new].size = names.len() as u64;
    let mut debuglink = sections[0].clone(); // address and entsize stay 0
    debuglink.name = link_name;
    debuglink.kind = 1; // SHT_PROGBITS
    debuglink.flags = 0;
    debuglink.offset = link_off;
    debuglink.size = link.len() as u64;
    debuglink.link = 0;
    debuglink.info = 0;
    debuglink.align = 4;
    sections.push(debuglink);

    let mut head = elf.head.clone();
    let (shoff_at, shnum_at, shstrndx_at) = l.ehdr_section_fields();
    l.put(&mut head, shoff_at, w, shoff);
    let count = sections.len() as u64;
    if count < u64::from(SHN_LORESERVE) {
        l.put(&mut head, shnum_at, 2, count);
    } else {
        l.put(&mut head, shnum_at, 2, 0);
        sections[0].size = count;
    }
    if (shstrndx_new as u32) < SHN_LORESERVE {
        l.put(&mut head, shstrndx_at, 2, shstrndx_new as u64);
    } else {
        l.put(&mut head, shstrndx_at, 2, 0xffff);
        sections[0].link = shstrndx_new as u32;
    }

    let mut out = Out { inner: out, pos: 0 };
    out.write(&head)?;
    for (start, stop) in fixed {
        let start = start.max(out.pos);
        if stop > start {
            out.pad_to(start)?;
            out.copy(input, start, stop - start, unchanged, 1)?;
        }
    }
    out.pad_to(fixed_end)?;
    let (entsize, shndx_at) = if l.is_64 { (24u64, 6) } else { (16, 14) };
    for (i, old_offset) in moved {
        let s = &sections[i];
        out.pad_to(s.offset)?;
        if s.kind == SHT_SYMTAB || s.kind == SHT_DYNSYM {
            // Symbols name their section by index: follow the renumbering.
            let edit = |buf: &mut [u8]| -> Result<(), Error> {
                for sym in buf.chunks_exact_mut(entsize as usize) {
                    let old = l.get(sym, shndx_at, 2)? as u32;
                    l.put(sym, shndx_at, 2, u64::from(remap(old)));
                }
                Ok(())
            };
            out.copy(input, old_offset, s.size, edit, entsize)?;
        } else {
            out.copy(input, old_offset, s.size, unchanged, 1)?;
        }
    }
    out.pad_to(link_off)?;
    out.write(&link)?;
    out.write(&names)?;
    out.pad_to(shoff)?;
    for s in &sections {
        out.write(&elf.encode_shdr(s))?;
    }
    Ok(out.pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_strip_our_own_test_binary() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let info = crate::inspect(&me).unwrap();
        let mut debug = Vec::new();
        only_keep_debug(&me[..], &mut debug).unwrap();
        let d = crate::inspect(&debug).unwrap();
        assert_eq!(d.build_id, info.build_id);
        assert!(!d.has_code, "code must be gone from the debug file");
        assert_eq!(d.has_symtab, info.has_symtab);
        assert_eq!(d.has_dwarf, info.has_dwarf);
        assert_eq!(d.sections.len(), info.sections.len());

        let mut stripped = Vec::new();
        strip_debug(&me[..], "me.debug", 0x1234_5678, &mut stripped).unwrap();
        let s = crate::inspect(&stripped).unwrap();
        assert_eq!(s.build_id, info.build_id);
        assert!(!s.has_dwarf);
        assert!(s.has_code && s.has_symtab == info.has_symtab);
        assert_eq!(s.debuglink.as_deref(), Some("me.debug"));
        // Code is byte-identical at the same offset.
        let (a, b) = (info.section(".text").unwrap(), s.section(".text").unwrap());
        assert_eq!((a.offset, a.size), (b.offset, b.size));
        assert_eq!(
            me[a.offset as usize..(a.offset + a.size) as usize],
            stripped[b.offset as usize..(b.offset + b.size) as usize]
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(matches!(
            only_keep_debug(&b"not elf at all"[..], Vec::new()),
            Err(Error::NotElf(_))
        ));
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let cut = &me[..me.len() - 100];
        assert!(only_keep_debug(cut, Vec::new()).is_err());
    }

    /// Found by the `elf_split` fuzz target: a program header whose
    /// p_filesz reaches far past the file made strip_debug pad its output
    /// to gigabytes; and a section asking for a huge alignment would do the
    /// same when laid out anew.
    #[test]
    fn lying_headers_are_refused_before_anything_is_written() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = Elf::parse(&me[..]).unwrap();
        let (_, filesz_at) = elf.l.phdr_fields();
        let w = elf.l.word();
        let phdr = elf.phoff as usize;
        let mut huge_segment = me.clone();
        elf.l
            .put(&mut huge_segment[..], phdr + filesz_at, w, 1 << 40);
        let mut out = Vec::new();
        let e = strip_debug(&huge_segment[..], "x.debug", 0, &mut out).unwrap_err();
        assert!(e.to_string().contains("extends past the end"), "{e}");
        assert!(out.is_empty(), "nothing is written");

        // A non-allocated section (moved by strip, kept by split) asking
        // for 2^40-byte alignment.
        let f = elf.l.shdr_fields();
        let (i, _) = elf
            .sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.flags & SHF_ALLOC == 0 && s.kind != SHT_NOBITS && s.size > 0)
            .unwrap();
        let shoff = elf
            .l
            .get(&me, if elf.l.is_64 { 0x28 } else { 0x20 }, w)
            .unwrap() as usize;
        let entsize = elf.sections[0].raw.len();
        let mut aligned = me.clone();
        elf.l
            .put(&mut aligned[..], shoff + i * entsize + f[5], w, 1 << 40);
        let mut out = Vec::new();
        let e = only_keep_debug(&aligned[..], &mut out).unwrap_err();
        assert!(e.to_string().contains("alignment"), "{e}");
        let e = strip_debug(&aligned[..], "x.debug", 0, Vec::new()).unwrap_err();
        assert!(e.to_string().contains("alignment"), "{e}");
    }

    /// Found by the `elf_split` fuzz target in CI: an `e_phoff` of
    /// 2^64 - 1 overflowed the end of the program header table (a panic in
    /// debug builds, a wrapped and too-short header in release ones).
    #[test]
    fn a_program_header_table_past_the_address_space_is_refused() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = Elf::parse(&me[..]).unwrap();
        let w = elf.l.word();
        let at = if elf.l.is_64 { 0x20 } else { 0x1c };
        let mut bad = me.clone();
        elf.l.put(&mut bad[..], at, w, u64::MAX);
        for e in [
            only_keep_debug(&bad[..], Vec::new()).unwrap_err(),
            strip_debug(&bad[..], "x.debug", 0, Vec::new()).unwrap_err(),
        ] {
            assert!(e.to_string().contains("program headers"), "{e}");
        }
    }
}
