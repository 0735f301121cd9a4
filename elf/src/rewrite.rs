//! Streaming ELF rewriting: the two transformations a symbol publisher needs,
//! done natively (no binutils) and with memory bounded by the headers, not by
//! the file: section contents are copied straight from the input slice (an
//! mmap) to the output writer.
//!
//! - [`only_keep_debug`]: what `objcopy --only-keep-debug` writes — every
//!   section header kept (so indexes, links and addresses stay valid),
//!   allocated sections turned into `SHT_NOBITS` except notes (the build-ID
//!   stays), non-allocated sections (DWARF, `.symtab`, `.strtab`, `.comment`)
//!   copied; program headers kept with their addresses, file sizes zeroed
//!   except for notes.
//! - [`strip_debug`]: what `objcopy --strip-debug --add-gnu-debuglink=F`
//!   writes for executables and shared libraries — `.debug_*`/`.zdebug_*`
//!   sections removed, everything else byte-identical at the same offsets,
//!   and a `.gnu_debuglink` section naming the debug file with its CRC32.

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

/// The parts of an ELF header the rewriters need, in either class and byte order.
#[derive(Clone, Copy)]
struct Layout {
    is_64: bool,
    big_endian: bool,
}

impl Layout {
    fn read(data: &[u8]) -> Result<Self, Error> {
        if data.len() < 52 || &data[..4] != b"\x7fELF" {
            return Err(Error::NotElf("missing ELF magic \\x7fELF".into()));
        }
        let is_64 = match data[4] {
            1 => false,
            2 => true,
            c => return Err(Error::Malformed(format!("unknown ELF class {c}"))),
        };
        let big_endian = match data[5] {
            1 => false,
            2 => true,
            d => return Err(Error::Malformed(format!("unknown ELF data encoding {d}"))),
        };
        if is_64 && data.len() < 64 {
            return Err(Error::Malformed("truncated ELF header".into()));
        }
        Ok(Self { is_64, big_endian })
    }

    fn get(&self, data: &[u8], at: usize, size: usize) -> Result<u64, Error> {
        let bytes = data
            .get(at..at + size)
            .ok_or_else(|| Error::Malformed(format!("header field at {at} past the end")))?;
        let mut v = 0u64;
        if self.big_endian {
            for b in bytes {
                v = (v << 8) | u64::from(*b);
            }
        } else {
            for b in bytes.iter().rev() {
                v = (v << 8) | u64::from(*b);
            }
        }
        Ok(v)
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

/// Offsets of section header fields: (flags, offset, size, link, info, align).
fn shdr_fields(l: Layout) -> [usize; 6] {
    if l.is_64 {
        [8, 24, 32, 40, 44, 48]
    } else {
        [8, 16, 20, 24, 28, 32]
    }
}

struct Elf<'a> {
    data: &'a [u8],
    l: Layout,
    shstrndx: u32,
    phoff: u64,
    phentsize: usize,
    phnum: usize,
    sections: Vec<Shdr>,
}

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, Error> {
        let l = Layout::read(data)?;
        let w = l.word();
        let (phoff_at, shoff_at) = if l.is_64 { (0x20, 0x28) } else { (0x1c, 0x20) };
        let phoff = l.get(data, phoff_at, w)?;
        let shoff = l.get(data, shoff_at, w)?;
        let (phentsize, phnum, shentsize, shnum, shstrndx) = if l.is_64 {
            (
                l.get(data, 0x36, 2)?,
                l.get(data, 0x38, 2)?,
                l.get(data, 0x3a, 2)?,
                l.get(data, 0x3c, 2)?,
                l.get(data, 0x3e, 2)?,
            )
        } else {
            (
                l.get(data, 0x2a, 2)?,
                l.get(data, 0x2c, 2)?,
                l.get(data, 0x2e, 2)?,
                l.get(data, 0x30, 2)?,
                l.get(data, 0x32, 2)?,
            )
        };
        if shoff == 0 {
            return Err(Error::Malformed(
                "the file has no section header table".into(),
            ));
        }
        let shentsize = shentsize as usize;
        let f = shdr_fields(l);
        let read_shdr = |i: u64| -> Result<Shdr, Error> {
            let at = shoff as usize + i as usize * shentsize;
            let raw = data
                .get(at..at + shentsize)
                .ok_or_else(|| {
                    Error::Malformed(format!("section header {i} is past the end of the file"))
                })?
                .to_vec();
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
        let first = read_shdr(0)?;
        // Extended numbering: counts that do not fit live in section 0.
        let shnum = if shnum == 0 { first.size } else { shnum };
        let shstrndx = if shstrndx == 0xffff {
            first.link
        } else {
            shstrndx as u32
        };
        let mut sections = vec![first];
        for i in 1..shnum {
            sections.push(read_shdr(i)?);
        }
        for (i, s) in sections.iter().enumerate() {
            if s.kind != SHT_NOBITS
                && s.offset
                    .checked_add(s.size)
                    .is_none_or(|end| end > data.len() as u64)
            {
                return Err(Error::Malformed(format!(
                    "section {i} extends past the end of the file"
                )));
            }
        }
        Ok(Self {
            data,
            l,
            shstrndx,
            phoff,
            phentsize: phentsize as usize,
            phnum: phnum as usize,
            sections,
        })
    }

    fn name(&self, s: &Shdr) -> &str {
        let Some(table) = self.sections.get(self.shstrndx as usize) else {
            return "";
        };
        let start = (table.offset + u64::from(s.name)) as usize;
        let end = (table.offset + table.size) as usize;
        let bytes = self.data.get(start..end.max(start)).unwrap_or(&[]);
        let len = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..len]).unwrap_or("")
    }

    fn encode_shdr(&self, s: &Shdr) -> Vec<u8> {
        let f = shdr_fields(self.l);
        let w = self.l.word();
        let mut raw = s.raw.clone();
        self.l.put(&mut raw, 0, 4, u64::from(s.name));
        self.l.put(&mut raw, 4, 4, u64::from(s.kind));
        self.l.put(&mut raw, f[0], w, s.flags);
        self.l.put(&mut raw, f[1], w, s.offset);
        self.l.put(&mut raw, f[2], w, s.size);
        self.l.put(&mut raw, f[3], 4, u64::from(s.link));
        self.l.put(&mut raw, f[4], 4, u64::from(s.info));
        raw
    }

    fn headers_end(&self) -> usize {
        let ehsize = if self.l.is_64 { 64 } else { 52 };
        ehsize.max(self.phoff as usize + self.phnum * self.phentsize)
    }
}

/// Counts bytes written, for offsets.
struct Out<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Out<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn align(&mut self, align: u64) -> io::Result<()> {
        let align = align.max(1);
        let pad = (align - self.pos % align) % align;
        self.write(&vec![0u8; pad as usize])
    }
}

fn io_err(e: io::Error) -> Error {
    Error::Malformed(format!("writing the output failed: {e}"))
}

fn is_debug_name(name: &str) -> bool {
    name.starts_with(".debug_")
        || name.starts_with(".zdebug_")
        || name.starts_with(".gnu.debuglto_")
}

/// Writes the debug-only counterpart of an ELF file (see the module docs).
/// Returns the number of bytes written.
pub fn only_keep_debug<W: Write>(data: &[u8], out: W) -> Result<u64, Error> {
    let elf = Elf::parse(data)?;
    let l = elf.l;
    let mut out = Out { inner: out, pos: 0 };
    let mut head = data[..elf.headers_end()].to_vec();

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
            let align = s.align.max(1);
            pos = pos.div_ceil(align) * align;
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

    // Program headers: keep addresses; only notes (and the PHDR table) keep file bytes.
    let w = l.word();
    let (off_at, filesz_at) = if l.is_64 { (8, 32) } else { (4, 16) };
    for p in 0..elf.phnum {
        let at = elf.phoff as usize + p * elf.phentsize;
        let kind = l.get(&head, at, 4)? as u32;
        let old_off = l.get(&head, at + off_at, w)?;
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
                // The segment keeps the bytes still in the file that it
                // covered before (headers and notes in the first LOAD).
                let old_size = l.get(&head, at + filesz_at, w)?;
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
                    if s.offset >= old_off
                        && s.offset + s.size <= old_off + old_size
                        && s.flags & SHF_ALLOC != 0
                    {
                        end = end.max(at_new + s.size);
                    }
                }
                l.put(&mut head, at + off_at, w, new_off);
                l.put(&mut head, at + filesz_at, w, end - new_off);
            }
        }
    }
    let shoff_at = if l.is_64 { 0x28 } else { 0x20 };
    l.put(&mut head, shoff_at, w, shoff);

    out.write(&head).map_err(io_err)?;
    for (i, at) in body {
        let s = &elf.sections[i];
        out.write(&vec![0u8; (at - out.pos) as usize])
            .map_err(io_err)?;
        out.write(&data[s.offset as usize..(s.offset + s.size) as usize])
            .map_err(io_err)?;
    }
    out.align(8).map_err(io_err)?;
    debug_assert_eq!(out.pos, shoff);
    for s in &new {
        out.write(&elf.encode_shdr(s)).map_err(io_err)?;
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
    if big_endian {
        v.extend_from_slice(&crc.to_be_bytes());
    } else {
        v.extend_from_slice(&crc.to_le_bytes());
    }
    v
}

/// Writes the file without its DWARF, plus a `.gnu_debuglink` to
/// `debug_file_name` (whose contents have CRC32 `debug_crc`). Executables and
/// shared libraries only: their allocated contents keep their offsets, so
/// nothing that runs changes. Returns the number of bytes written.
pub fn strip_debug<W: Write>(
    data: &[u8],
    debug_file_name: &str,
    debug_crc: u32,
    out: W,
) -> Result<u64, Error> {
    let elf = Elf::parse(data)?;
    let l = elf.l;
    let e_type = l.get(data, 16, 2)?;
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
        let drop = i != 0 && (is_debug_name(name) || name == ".gnu_debuglink")
            || ((s.kind == SHT_REL || s.kind == SHT_RELA)
                && (s.info as usize) < elf.sections.len()
                && is_debug_name(elf.name(&elf.sections[s.info as usize])));
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

    // Section name table: the old one plus ".gnu_debuglink".
    let old_names = &elf.sections[elf.shstrndx as usize];
    let mut names =
        data[old_names.offset as usize..(old_names.offset + old_names.size) as usize].to_vec();
    let link_name = names.len() as u32;
    names.extend_from_slice(b".gnu_debuglink\0");
    let link = debuglink_section(debug_file_name, debug_crc, l.big_endian);

    // Allocated contents (and whatever the segments cover) keep their offsets;
    // non-allocated sections are packed after them, then the new tables.
    let w = l.word();
    let (off_at, filesz_at) = if l.is_64 { (8, 32) } else { (4, 16) };
    let mut fixed: Vec<(u64, u64)> = Vec::new();
    for p in 0..elf.phnum {
        let at = elf.phoff as usize + p * elf.phentsize;
        let off = l.get(data, at + off_at, w)?;
        let size = l.get(data, at + filesz_at, w)?;
        if size > 0 {
            fixed.push((off, off + size));
        }
    }
    for s in kept.iter().skip(1) {
        if s.flags & SHF_ALLOC != 0 && s.kind != SHT_NOBITS && s.size > 0 {
            fixed.push((s.offset, s.offset + s.size));
        }
    }
    fixed.sort();
    let fixed_end = fixed
        .iter()
        .map(|r| r.1)
        .max()
        .unwrap_or(0)
        .max(elf.headers_end() as u64);

    let mut sections = kept.clone();
    // (new index, old offset, rewritten contents when a symbol table changed)
    let mut moved: Vec<(usize, u64, Option<Vec<u8>>)> = Vec::new();
    let mut pos = fixed_end;
    for (new_i, s) in kept.iter().enumerate() {
        if new_i == 0 || new_i == shstrndx_new || s.flags & SHF_ALLOC != 0 || s.kind == SHT_NOBITS {
            continue;
        }
        let mut rewritten = None;
        if s.kind == SHT_SYMTAB || s.kind == SHT_DYNSYM {
            let entsize = if l.is_64 { 24 } else { 16 };
            let shndx_at = if l.is_64 { 6 } else { 14 };
            let table = &data[s.offset as usize..(s.offset + s.size) as usize];
            let mut changed = false;
            for sym in table.chunks_exact(entsize) {
                let old = l.get(sym, shndx_at, 2)? as u32;
                changed |= remap(old) != old;
            }
            if changed {
                let mut copy = table.to_vec();
                for sym in copy.chunks_exact_mut(entsize) {
                    let old = l.get(sym, shndx_at, 2)? as u32;
                    l.put(sym, shndx_at, 2, u64::from(remap(old)));
                }
                rewritten = Some(copy);
            }
        }
        let align = s.align.max(1);
        pos = pos.div_ceil(align) * align;
        sections[new_i].offset = pos;
        pos += s.size;
        moved.push((new_i, s.offset, rewritten));
    }
    let link_off = pos.div_ceil(4) * 4;
    pos = link_off + link.len() as u64;
    let names_off = pos;
    pos += names.len() as u64;
    let shoff = pos.div_ceil(8) * 8;
    sections[shstrndx_new].offset = names_off;
    sections[shstrndx_new].size = names.len() as u64;
    let mut debuglink = sections[0].clone();
    debuglink.name = link_name;
    debuglink.kind = 1; // SHT_PROGBITS; address and entsize stay 0 as in section 0
    debuglink.flags = 0;
    debuglink.offset = link_off;
    debuglink.size = link.len() as u64;
    debuglink.link = 0;
    debuglink.info = 0;
    let f = shdr_fields(l);
    l.put(&mut debuglink.raw, f[5], w, 4);
    sections.push(debuglink);

    let mut head = data[..elf.headers_end()].to_vec();
    let (shoff_at, shnum_at, shstrndx_at) = if l.is_64 {
        (0x28, 0x3c, 0x3e)
    } else {
        (0x20, 0x30, 0x32)
    };
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
    out.write(&head).map_err(io_err)?;
    for (start, stop) in fixed {
        let start = start.max(out.pos);
        if stop <= start {
            continue;
        }
        out.write(&vec![0u8; (start - out.pos) as usize])
            .map_err(io_err)?;
        out.write(&data[start as usize..stop as usize])
            .map_err(io_err)?;
    }
    out.write(&vec![0u8; (fixed_end - out.pos) as usize])
        .map_err(io_err)?;
    for (i, old_offset, rewritten) in &moved {
        out.write(&vec![0u8; (sections[*i].offset - out.pos) as usize])
            .map_err(io_err)?;
        let size = sections[*i].size;
        let contents = match rewritten {
            Some(table) => &table[..],
            None => &data[*old_offset as usize..(*old_offset + size) as usize],
        };
        out.write(contents).map_err(io_err)?;
    }
    out.write(&vec![0u8; (link_off - out.pos) as usize])
        .map_err(io_err)?;
    out.write(&link).map_err(io_err)?;
    out.write(&names).map_err(io_err)?;
    out.align(8).map_err(io_err)?;
    for s in &sections {
        out.write(&elf.encode_shdr(s)).map_err(io_err)?;
    }
    Ok(out.pos)
}
