//! The facts the agent needs of an executable or library, read from its
//! headers, notes and symbol tables: its GNU build-ID, its PT_LOAD segments
//! (to turn a file offset into an ELF virtual address), where its CFI is,
//! its OpenTelemetry thread-context slot, its dynamic loader hook and its
//! memory-profiling probe sites. Each fact has its extractor (this module,
//! `threadctx`, `usdt`); [`Binary::parse`] runs them over one file.
//!
//! The file is hostile until read: every read goes through [`Bounded`],
//! which refuses a single read over [`MAX_READ_BYTES`] and, in all,
//! more than [`MAX_PARSE_BYTES`] (object's read cache keeps every
//! distinct read, so a file asking for the same huge string table under a
//! thousand names would otherwise cost a thousand copies), and every size
//! or address read from it is added with checked or wrapping arithmetic.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use object::{Object, ObjectSection, ObjectSegment, ReadRef};
use symtrace_elf::Quality;

use crate::cfi::SectionRef;

/// A loaded ELF file.
#[derive(Debug, Clone)]
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
    pub(crate) loads: Vec<(u64, u64, u64)>,
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
    /// `.debug_frame`, when stored uncompressed (code built with `-g` and
    /// no unwind tables describes itself there only): read into the
    /// file's unwind table with `.eh_frame`.
    pub debug_frame: Option<SectionRef>,
    /// `.text`'s address (a base of CFI pointer encodings).
    pub text_address: u64,
    /// Its `otel_memory` USDT probe sites (memory profiling), if any.
    pub memory_probes: Vec<crate::usdt::MemoryProbe>,
    /// The SHA-256 of its whole content (lowercase hex), when it was
    /// within `files::hash::MAX_HASH_BYTES`: sent with every mapping of it,
    /// so that the symbols an agent publishes from this file name only
    /// the frames of this very content.
    pub content_sha256: Option<String>,
    /// The server holds a CI or upstream file of its ID (`upload::Probe`):
    /// that file names its frames, so it was not hashed and is not offered.
    pub vouched: bool,
    /// Its owner's user ID (budgets are kept per owner).
    pub uid: u32,
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
            debug_frame: uncompressed(&file, ".debug_frame"),
            text_address: file.section_by_name(".text").map_or(0, |s| s.address()),
            thread_ctx_offset: crate::threadctx::executable_offset(&file, data),
            thread_ctx_library: crate::threadctx::library_slot(&file),
            dl_debug_state: dl_debug_state(&file),
            memory_probes: crate::usdt::memory_probes(&file, data),
            content_sha256: None,
            vouched: false,
            uid: 0,
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
                    .find(|(off, size, _)| (*off..off.saturating_add(*size)).contains(&map_offset))
            });
        match segment {
            // Wrapping: the segment's numbers are the file's.
            Some(&(off, _, vaddr)) => vaddr.wrapping_sub(off).wrapping_add(map_offset),
            None => map_offset,
        }
    }
}

/// Where section `name` is in the file, when it is stored as it is read
/// (not `SHF_COMPRESSED`: Go's `.debug_frame` is, and Go keeps frame
/// pointers).
fn uncompressed<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, name: &str) -> Option<SectionRef> {
    let s = file.section_by_name(name)?;
    let range = s.compressed_file_range().ok()?;
    if range.format != object::CompressionFormat::None || range.compressed_size == 0 {
        return None;
    }
    Some(SectionRef {
        offset: range.offset,
        size: range.compressed_size,
        address: s.address(),
    })
}

/// The file offset of `_dl_debug_state` in a dynamic loader's `.dynsym`
/// (glibc's and musl's ld.so both export it: debuggers stop there).
fn dl_debug_state<'d, R: ReadRef<'d>>(file: &object::File<'d, R>) -> Option<u64> {
    use object::ObjectSymbol;
    let address = file
        .dynamic_symbols()
        // The kind before the name (names are read from the file).
        .find(|s| {
            s.kind() == object::SymbolKind::Text
                && s.is_definition()
                && s.name() == Ok("_dl_debug_state")
        })?
        .address();
    file.segments().find_map(|s| {
        let (offset, size) = s.file_range();
        (s.address()..s.address().saturating_add(size))
            .contains(&address)
            .then(|| offset.checked_add(address - s.address()))?
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

/// Bytes one read of a mapped file may ask for: a section or note of a
/// hostile file claiming gigabytes (object's cache allocates what is asked)
/// fails instead of filling the agent's memory.
pub const MAX_READ_BYTES: u64 = 32 << 20;
/// Bytes all the reads of one parse may ask for together (what the read
/// cache may hold): the facts of the largest real files (node's, libjvm's
/// symbol tables) take a few MiB.
pub const MAX_PARSE_BYTES: u64 = 64 << 20;

/// The longest string (a section or symbol name) looked for: one without
/// its NUL within this many bytes is not one.
pub const MAX_STRING: u64 = 64 << 10;

/// Strings remembered per parse, at most.
const MAX_REMEMBERED_STRINGS: usize = 8192;

/// Where a string was found: the cached read holding it (offset, size)
/// and its place in it (start, length); `None`: not a string.
type Found = Option<(u64, u64, usize, usize)>;

/// What the reads of one parse may still cache, and what they cached.
pub struct ReadBudget {
    left: Cell<u64>,
    /// (offset, size) of every read charged: the cache holds each once.
    charged: RefCell<HashSet<(u64, u64)>>,
    /// Strings looked for before, by (start, delimiter): a name asked for
    /// again (every `section_by_name` reads every section's) is not
    /// scanned again.
    strings: RefCell<std::collections::HashMap<(u64, u8), Found>>,
}

impl ReadBudget {
    pub fn new(bytes: u64) -> Self {
        ReadBudget {
            left: Cell::new(bytes),
            charged: RefCell::default(),
            strings: RefCell::default(),
        }
    }

    /// Bytes left.
    #[cfg(test)]
    pub fn left(&self) -> u64 {
        self.left.get()
    }
}

/// A `ReadCache` whose single reads are bounded by `MAX_READ_BYTES`, and
/// what all of them cache together by a [`ReadBudget`]
/// (`MAX_PARSE_BYTES`).
pub struct Bounded<'a, R: object::ReadCacheOps> {
    cache: &'a object::ReadCache<R>,
    budget: &'a ReadBudget,
}

impl<'a, R: object::ReadCacheOps> Bounded<'a, R> {
    pub fn new(cache: &'a object::ReadCache<R>, budget: &'a ReadBudget) -> Self {
        Bounded { cache, budget }
    }

    /// Takes `size` bytes of the budget for a read the cache does not hold
    /// yet, or fails.
    fn charge(self, offset: u64, size: u64) -> Result<(), ()> {
        let mut charged = self.budget.charged.borrow_mut();
        if charged.contains(&(offset, size)) {
            return Ok(());
        }
        let left = self.budget.left.get().checked_sub(size).ok_or(())?;
        self.budget.left.set(left);
        charged.insert((offset, size));
        Ok(())
    }
}

impl<R: object::ReadCacheOps> Clone for Bounded<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: object::ReadCacheOps> Copy for Bounded<'_, R> {}

impl<'a, R: object::ReadCacheOps> ReadRef<'a> for Bounded<'a, R> {
    fn len(self) -> Result<u64, ()> {
        self.cache.len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size > MAX_READ_BYTES {
            return Err(());
        }
        self.charge(offset, size)?;
        self.cache.read_bytes_at(offset, size)
    }

    /// Strings (symbol names) are found in aligned blocks that the cache
    /// keeps, so a symbol table's names cost a few reads, not one each;
    /// each is looked for once (a second look takes the first's answer),
    /// and never further than [`MAX_STRING`] bytes.
    fn read_bytes_at_until(
        self,
        range: std::ops::Range<u64>,
        delimiter: u8,
    ) -> Result<&'a [u8], ()> {
        const BLOCK: u64 = 64 << 10;
        let key = (range.start, delimiter);
        let known = self.budget.strings.borrow().get(&key).copied();
        let found = match known {
            Some(found) => found,
            None => {
                let found = self.find_string(range, delimiter, BLOCK);
                // Section names are what is asked for again and again; a
                // symbol table's names once each: not all of those kept.
                let mut strings = self.budget.strings.borrow_mut();
                if strings.len() < MAX_REMEMBERED_STRINGS {
                    strings.insert(key, found);
                }
                found
            }
        };
        let (offset, size, start, len) = found.ok_or(())?;
        // A read made before: the cache answers it.
        let bytes = self.cache.read_bytes_at(offset, size)?;
        bytes.get(start..start + len).ok_or(())
    }
}

impl<R: object::ReadCacheOps> Bounded<'_, R> {
    /// Looks for the string at `range.start` in aligned blocks of growing
    /// size (at most `MAX_STRING` past its start).
    fn find_string(self, range: std::ops::Range<u64>, delimiter: u8, block_size: u64) -> Found {
        let end = range.end.min(range.start.saturating_add(MAX_STRING));
        if range.start >= end {
            return None;
        }
        let block = range.start & !(block_size - 1);
        let skip = usize::try_from(range.start - block).ok()?;
        let mut len = block_size;
        loop {
            let stop = block.saturating_add(len).min(end);
            let bytes = self.read_bytes_at(block, stop - block).ok()?;
            let rest = bytes.get(skip..)?;
            if let Some(at) = rest.iter().position(|&b| b == delimiter) {
                return Some((block, stop - block, skip, at));
            }
            if stop == end {
                return None;
            }
            len = len.saturating_mul(4);
        }
    }
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
        let budget = ReadBudget::new(MAX_PARSE_BYTES);
        let bounded = Bounded::new(&cache, &budget);
        assert!(bounded.read_bytes_at(0, MAX_READ_BYTES + 1).is_err());
        assert_eq!(bounded.read_bytes_at(0, 16).unwrap(), &[0; 16]);
        // A string without its NUL is cut at the bound, not read to the end.
        assert!(bounded
            .read_bytes_at_until(0..MAX_READ_BYTES * 2, 1)
            .is_err());
        assert!(budget.left() > MAX_PARSE_BYTES - 2 * MAX_STRING);
        assert!(Binary::parse(bounded).is_err(), "not an ELF file");
        // The reads together: a huge string read again and again from
        // other offsets (names pointing into it) is charged each time, and
        // the budget runs out; a read the cache holds is not charged again.
        let budget = ReadBudget::new(MAX_PARSE_BYTES);
        let bounded = Bounded::new(&cache, &budget);
        for _ in 0..100 {
            assert!(bounded.read_bytes_at(0, 4096).is_ok());
        }
        assert_eq!(budget.left(), MAX_PARSE_BYTES - 4096);
        let mut reads = 0;
        while bounded
            .read_bytes_at(1 + reads * 4096, MAX_READ_BYTES)
            .is_ok()
        {
            reads += 1;
        }
        assert_eq!(reads, MAX_PARSE_BYTES / MAX_READ_BYTES - 1);
        assert!(budget.left() < MAX_READ_BYTES);
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
            debug_frame: None,
            text_address: 0,
            memory_probes: Vec::new(),
            content_sha256: None,
            vouched: false,
            uid: 0,
        };
        assert_eq!(binary.vaddr_of_mapping(0x1d000), 0x1e000);
        assert_eq!(binary.vaddr_of_mapping(0), 0);
    }
}
