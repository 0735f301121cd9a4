//! What the agent needs of an executable or library: its GNU build-ID and
//! its PT_LOAD segments (to turn a file offset into an ELF virtual address).
//! Read once per file (device + inode) through the sampled process's view of
//! it — `/proc/PID/map_files/…`, else `/proc/PID/root/PATH` resolved inside
//! the process's root (see `safefile`) — so files inside containers work,
//! and with `pread`, never a mapping, so a file truncated underneath cannot
//! fault the agent.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ReadRef};
use symtrace_elf::Quality;

use crate::cfi::SectionRef;
use crate::maps::MapEntry;
use crate::safefile::{self, Skip};

/// A loaded ELF file.
#[derive(Debug)]
pub struct Binary {
    /// Lowercase hex GNU build-ID; `None` when the file has none.
    pub build_id: Option<String>,
    /// For a file without a GNU build-ID: its htlhash (the OpenTelemetry
    /// eBPF profiler's file ID), which the server knows it by.
    pub htlhash: Option<String>,
    /// What names its code, as the server ranks it (from the section
    /// headers alone).
    pub symbols: Quality,
    /// Its size in bytes (0 when parsed from memory).
    pub size: u64,
    /// PT_LOAD segments: (file offset, file size, virtual address).
    loads: Vec<(u64, u64, u64)>,
    /// When this file, as a process's executable, defines the OTEP 4947
    /// `otel_thread_ctx_v1` slot: its offset from the thread pointer.
    pub thread_ctx_offset: Option<i64>,
    /// When this file, as a shared library, defines the slot: the GOT
    /// entry of its TLS relocation.
    pub thread_ctx_library: Option<crate::threadctx::LibrarySlot>,
    /// When this file is a dynamic loader: the file offset of its debugger
    /// hook `_dl_debug_state`, called at every dlopen and dlclose.
    pub dl_debug_state: Option<u64>,
    /// Where its call-frame information is (read when a leaf needs it).
    pub eh_frame: Option<SectionRef>,
    pub eh_frame_hdr: Option<SectionRef>,
    /// `.text`'s address (a base of CFI pointer encodings).
    pub text_address: u64,
    /// Its `otel_memory` USDT probe sites (memory profiling), if any.
    pub memory_probes: Vec<crate::usdt::MemoryProbe>,
}

impl Binary {
    pub fn parse<'d, R: ReadRef<'d>>(data: R) -> Result<Binary, object::Error> {
        let file = object::File::parse(data)?;
        let build_id = file.build_id()?.filter(|id| !id.is_empty()).map(hex);
        let loads = file
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let (offset, size) = s.file_range()?;
            Some(SectionRef {
                offset,
                size,
                address: s.address(),
            })
        };
        let present = |names: &[&str]| {
            names.iter().any(|n| {
                file.section_by_name(n)
                    .and_then(|s| s.file_range())
                    .is_some_and(|(_, size)| size > 0)
            })
        };
        let symbols = if present(&[".debug_info", ".zdebug_info"]) {
            Quality::Dwarf
        } else if present(&[".symtab"]) {
            Quality::SymTab
        } else if present(&[".dynsym"]) {
            Quality::DynSym
        } else {
            Quality::None
        };
        Ok(Binary {
            build_id,
            htlhash: None,
            symbols,
            size: 0,
            loads,
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            text_address: file.section_by_name(".text").map_or(0, |s| s.address()),
            thread_ctx_offset: crate::threadctx::executable_offset(&file, data),
            thread_ctx_library: crate::threadctx::library_slot(&file),
            dl_debug_state: dl_debug_state(&file),
            memory_probes: crate::usdt::memory_probes(&file, data),
        })
    }

    /// The ELF virtual address (what the symbolizer and the debug info
    /// speak) of the first byte of a mapping of this file at `map_offset`.
    ///
    /// The mapping is the PT_LOAD segment whose offset rounds down to
    /// `map_offset`: the page-aligned start of a mapping can lie in the
    /// previous segment's file range, and linkers like lld do not keep
    /// virtual address = file offset, so the segment is chosen by the
    /// mapping, not by the offset alone.
    pub fn vaddr_of_mapping(&self, map_offset: u64) -> u64 {
        let page = page_size();
        let segment = self
            .loads
            .iter()
            .find(|(off, _, _)| off & !(page - 1) == map_offset)
            .or_else(|| {
                self.loads
                    .iter()
                    .find(|(off, size, _)| (*off..off + size).contains(&map_offset))
            });
        match segment {
            Some(&(off, _, vaddr)) => (vaddr as i128 - off as i128 + map_offset as i128) as u64,
            None => map_offset,
        }
    }
}

/// The file offset of `_dl_debug_state` in a dynamic loader's `.dynsym`
/// (glibc's and musl's ld.so both export it: debuggers stop there).
fn dl_debug_state<'d, R: ReadRef<'d>>(file: &object::File<'d, R>) -> Option<u64> {
    use object::ObjectSymbol;
    let address = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("_dl_debug_state") && s.is_definition())?
        .address();
    file.segments().find_map(|s| {
        let (offset, size) = s.file_range();
        (s.address()..s.address() + size)
            .contains(&address)
            .then(|| offset + (address - s.address()))
    })
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Binaries by (device, inode); a file that could not be read is cached as
/// `None` too, so it is not retried for every sample.
#[derive(Default)]
pub struct Binaries {
    by_file: HashMap<(u64, u64), Option<Arc<Binary>>>,
    /// Files not read, by `Skip::index`.
    pub skipped: [u64; 6],
    /// Where sampled files go to be published (`--no-upload-binaries`:
    /// nowhere).
    pub offers: Option<crate::upload::Offers>,
}

impl Binaries {
    pub fn get(&mut self, proc_root: &Path, pid: u32, map: &MapEntry) -> Option<Arc<Binary>> {
        if !map.is_file() {
            return None;
        }
        if let Some(found) = self.by_file.get(&(map.dev, map.inode)) {
            return found.clone();
        }
        let read = read(proc_root, pid, map);
        if let Err(why) = &read {
            tracing::debug!(pid, path = %map.path, ?why, "mapped file not read");
            self.skipped[why.index()] += 1;
        }
        let binary = read.ok().map(Arc::new);
        self.by_file.insert((map.dev, map.inode), binary.clone());
        binary
    }

    pub fn len(&self) -> usize {
        self.by_file.len()
    }

    /// Offers the file of `map`, whose code process `pid` was sampled in,
    /// for publishing — once per file, held open from now on.
    pub fn offer_sampled(&mut self, proc_root: &Path, pid: u32, map: &MapEntry) {
        let Some(offers) = &self.offers else { return };
        let Some(Some(binary)) = self.by_file.get(&(map.dev, map.inode)) else {
            return;
        };
        let Some(id) = binary.build_id.clone().or_else(|| binary.htlhash.clone()) else {
            return;
        };
        if !offers.wants(map, binary.symbols, binary.size, binary.build_id.is_some()) {
            return;
        }
        let Ok(file) = safefile::open_mapped(proc_root, pid, map) else {
            return;
        };
        offers.offer(crate::upload::Offer {
            file,
            map: map.clone(),
            id,
            htlhash: binary.build_id.is_none(),
            symbols: binary.symbols,
            attempts: 0,
        });
    }

    /// Forgets every binary: run now and then, so a file replaced under the
    /// same inode (rare: inodes are reused after deletion) is read again.
    pub fn clear(&mut self) {
        self.by_file.clear();
    }
}

/// Bytes one read of a mapped file may ask for: a section or note of a
/// hostile file claiming gigabytes (object's cache allocates what is asked)
/// fails instead of filling the agent's memory.
const MAX_READ_BYTES: u64 = 64 << 20;

/// A `ReadCache` whose single reads are bounded by `MAX_READ_BYTES`.
struct Bounded<'a, R: object::ReadCacheOps>(&'a object::ReadCache<R>);

impl<R: object::ReadCacheOps> Clone for Bounded<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: object::ReadCacheOps> Copy for Bounded<'_, R> {}

impl<'a, R: object::ReadCacheOps> ReadRef<'a> for Bounded<'a, R> {
    fn len(self) -> Result<u64, ()> {
        self.0.len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size > MAX_READ_BYTES {
            return Err(());
        }
        self.0.read_bytes_at(offset, size)
    }

    /// Strings (symbol names) are found in aligned blocks that the cache
    /// keeps, so a symbol table's names cost a few reads, not one each.
    fn read_bytes_at_until(
        self,
        range: std::ops::Range<u64>,
        delimiter: u8,
    ) -> Result<&'a [u8], ()> {
        const BLOCK: u64 = 64 << 10;
        let end = range.end.min(range.start.saturating_add(MAX_READ_BYTES));
        if range.start >= end {
            return Err(());
        }
        let block = range.start & !(BLOCK - 1);
        let skip = (range.start - block) as usize;
        let mut len = BLOCK;
        loop {
            let stop = block.saturating_add(len).min(end);
            let bytes = self.0.read_bytes_at(block, stop - block)?;
            if let Some(at) = bytes[skip..].iter().position(|&b| b == delimiter) {
                return Ok(&bytes[skip..skip + at]);
            }
            if stop == end {
                return Err(());
            }
            len = len.saturating_mul(4);
        }
    }
}

fn read(proc_root: &Path, pid: u32, map: &MapEntry) -> Result<Binary, Skip> {
    let opened = safefile::open_mapped(proc_root, pid, map)?;
    let cache = object::ReadCache::new(&opened.file);
    let mut binary = Binary::parse(Bounded(&cache)).map_err(|_| Skip::Unparsable)?;
    drop(cache);
    binary.size = opened.size;
    if binary.build_id.is_none() {
        binary.htlhash = Some(symtrace_elf::htlhash(&mut &opened.file).map_err(|_| Skip::Changed)?);
    }
    if !opened.unchanged() {
        return Err(Skip::Changed);
    }
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_build_id_and_translates_offsets() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let binary = Binary::parse(&exe[..]).unwrap();
        let id = binary
            .build_id
            .as_deref()
            .expect("rustc links with a build-ID");
        assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        // Every segment: its mapping starts at the page holding p_offset,
        // and p_offset itself lands on p_vaddr.
        for &(off, _, vaddr) in &binary.loads {
            let map_offset = off & !(page_size() - 1);
            let start = binary.vaddr_of_mapping(map_offset);
            assert_eq!(start + (off - map_offset), vaddr);
        }
        assert!(Binary::parse(&b"not an elf file"[..]).is_err());
    }

    #[test]
    fn reads_of_a_file_are_bounded() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(MAX_READ_BYTES * 2).unwrap(); // sparse: nothing written
        let cache = object::ReadCache::new(&file);
        let bounded = Bounded(&cache);
        assert!(bounded.read_bytes_at(0, MAX_READ_BYTES + 1).is_err());
        assert_eq!(bounded.read_bytes_at(0, 16).unwrap(), &[0; 16]);
        // A string without its NUL is cut at the bound, not read to the end.
        assert!(bounded
            .read_bytes_at_until(0..MAX_READ_BYTES * 2, 1)
            .is_err());
        assert!(Binary::parse(bounded).is_err(), "not an ELF file");
    }

    #[test]
    fn segments_whose_address_is_not_their_offset() {
        // lld's layout: text at offset 0x1d570 but address 0x1e570; its
        // mapping starts at offset 0x1d000, inside the first segment's range.
        let binary = Binary {
            build_id: None,
            htlhash: None,
            symbols: Quality::None,
            size: 0,
            loads: vec![(0, 0x1d570, 0), (0x1d570, 0x4eb80, 0x1e570)],
            thread_ctx_offset: None,
            thread_ctx_library: None,
            dl_debug_state: None,
            eh_frame: None,
            eh_frame_hdr: None,
            text_address: 0,
            memory_probes: Vec::new(),
        };
        assert_eq!(binary.vaddr_of_mapping(0x1d000), 0x1e000);
        assert_eq!(binary.vaddr_of_mapping(0), 0);
    }
}
