use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use crate::{check_section, Budget, BuildId, Error};

/// How much a file can tell a symbolizer or a debugger, best last.
///
/// Uploads of the same build-ID and kind are ranked by this: a file of higher
/// quality replaces one of lower quality, never the other way around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Quality {
    /// No symbols at all.
    None = 0,
    /// Only the dynamic symbol table (exported functions).
    DynSym = 1,
    /// A full `.symtab`: every function, no lines.
    SymTab = 2,
    /// DWARF: functions, inlines, files and lines.
    Dwarf = 3,
}

impl Quality {
    /// The ranking as a number (what the database stores).
    pub fn rank(self) -> i32 {
        self as i32
    }

    /// A stable lowercase name for APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::DynSym => "dynsym",
            Self::SymTab => "symtab",
            Self::Dwarf => "dwarf",
        }
    }
}

/// The ELF file type, as far as symbol storage cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `ET_EXEC`.
    Executable,
    /// `ET_DYN`: a shared library or a position-independent executable.
    Dynamic,
    /// `ET_REL`: an object file or a kernel module.
    Relocatable,
    /// `ET_CORE`.
    Core,
    /// Anything else.
    Other,
}

/// One entry of the section header table, with the file bytes it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionEntry {
    /// Section name, e.g. `.debug_info`.
    pub name: String,
    /// Offset of its bytes in the file; meaningless when `nobits`.
    pub offset: u64,
    /// Size of its bytes in the file (the compressed size for SHF_COMPRESSED).
    pub size: u64,
    /// `SHT_NOBITS`: the section occupies no bytes in this file.
    pub nobits: bool,
}

/// What an ELF file is and what it carries.
#[derive(Debug, Clone)]
pub struct ElfInfo {
    /// The GNU build-ID note, when present.
    pub build_id: Option<BuildId>,
    /// ELF file type.
    pub file_kind: FileKind,
    /// `e_machine` architecture, as the object crate names it.
    pub architecture: String,
    /// 64-bit ELF.
    pub is_64: bool,
    /// Has `.debug_info` (or legacy `.zdebug_info`) with contents.
    pub has_dwarf: bool,
    /// Has a `.symtab` with function symbols.
    pub has_symtab: bool,
    /// Has a `.dynsym` with function symbols.
    pub has_dynsym: bool,
    /// Has executable code with contents (`.text` is not NOBITS): a runnable
    /// binary rather than an `--only-keep-debug` file.
    pub has_code: bool,
    /// Some debug section is compressed (SHF_COMPRESSED or `.zdebug_*`).
    pub compressed_debug: bool,
    /// `.gnu_debuglink` file name.
    pub debuglink: Option<String>,
    /// `.gnu_debugaltlink`: the dwz supplementary file's name and build-ID.
    pub debugaltlink: Option<(String, Option<BuildId>)>,
    /// The section header table.
    pub sections: Vec<SectionEntry>,
    /// The OpenTelemetry eBPF profiler's file ID ([`crate::htlhash`]).
    pub htlhash: String,
    /// The Go toolchain's build-ID, when the file has one.
    pub go_build_id: Option<String>,
}

impl ElfInfo {
    /// The quality rank of the debug data this file carries.
    pub fn quality(&self) -> Quality {
        if self.has_dwarf {
            Quality::Dwarf
        } else if self.has_symtab {
            Quality::SymTab
        } else if self.has_dynsym {
            Quality::DynSym
        } else {
            Quality::None
        }
    }

    /// The key the symbol store keeps this file under: its GNU build-ID,
    /// else the [`crate::go_key`] of its Go build-ID, else its htlhash.
    pub fn storage_key(&self) -> BuildId {
        let key = match (&self.build_id, &self.go_build_id) {
            (Some(id), _) => return id.clone(),
            (None, Some(go)) => crate::go_key(go),
            (None, None) => self.htlhash.clone(),
        };
        key.parse().expect("32 hex digits are a valid key")
    }

    /// The section named `name` that has bytes in this file.
    pub fn section(&self, name: &str) -> Option<&SectionEntry> {
        self.sections.iter().find(|s| s.name == name && !s.nobits)
    }
}

/// Reads what an ELF file is. Fails on anything that is not a well-formed ELF
/// file: wrong magic, a truncated header, sections pointing past the end, a
/// compressed debug section that does not decompress within the default
/// [`Budget`] (see [`inspect_with`]).
pub fn inspect(data: &[u8]) -> Result<ElfInfo, Error> {
    inspect_with(data, &mut Budget::default())
}

/// [`inspect`], with every compressed debug section (`SHF_COMPRESSED`
/// `.debug_*`, or `.zdebug_*`) checked to really decompress to the size its
/// header claims, within `budget` (shared by all of them): streamed and
/// counted, never kept. A file whose DWARF could not be read later is
/// refused here, with [`Error::Decompression`] naming the section, instead of
/// being ranked as DWARF.
pub fn inspect_with(data: &[u8], budget: &mut Budget) -> Result<ElfInfo, Error> {
    match object::FileKind::parse(data) {
        Ok(object::FileKind::Elf32 | object::FileKind::Elf64) => {}
        Ok(other) => return Err(Error::NotElf(format!("this is a {other:?} file, not ELF"))),
        Err(_) if data.len() < 4 || &data[..4] != b"\x7fELF" => {
            return Err(Error::NotElf("missing ELF magic \\x7fELF".into()))
        }
        Err(e) => return Err(Error::Malformed(e.to_string())),
    }
    let file = object::File::parse(data).map_err(|e| Error::Malformed(e.to_string()))?;
    let build_id = match file.build_id() {
        Ok(Some(bytes)) => Some(
            BuildId::from_bytes(bytes)
                .map_err(|e| Error::Malformed(format!("build-ID note: {e}")))?,
        ),
        Ok(None) => None,
        Err(e) => return Err(Error::Malformed(format!("note section: {e}"))),
    };

    let mut sections = Vec::new();
    let mut has_dwarf = false;
    let mut has_code = false;
    let mut compressed_debug = false;
    for section in file.sections() {
        let name = section
            .name()
            .map_err(|e| Error::Malformed(format!("section name: {e}")))?
            .to_owned();
        let entry = match section.file_range() {
            Some((offset, size)) => {
                if offset
                    .checked_add(size)
                    .is_none_or(|end| end > data.len() as u64)
                {
                    return Err(Error::Malformed(format!(
                        "section {name} ({size} bytes at offset {offset}) extends past the end \
                         of the {}-byte file (truncated upload?)",
                        data.len()
                    )));
                }
                SectionEntry {
                    name,
                    offset,
                    size,
                    nobits: false,
                }
            }
            None => SectionEntry {
                name,
                offset: 0,
                size: 0,
                nobits: true,
            },
        };
        if !entry.nobits && entry.size > 0 {
            if entry.name == ".debug_info" || entry.name == ".zdebug_info" {
                has_dwarf = true;
            }
            if section.kind() == SectionKind::Text {
                has_code = true;
            }
            if entry.name.starts_with(".zdebug_") || entry.name.starts_with(".debug_") {
                // An unreadable compression header is refused too: no DWARF
                // reader could use the section.
                let compressed = section
                    .compressed_file_range()
                    .map_or(true, |r| r.format != object::CompressionFormat::None);
                if entry.name.starts_with(".zdebug_") || compressed {
                    compressed_debug = true;
                    check_section(&section, budget)?;
                }
            }
        }
        sections.push(entry);
    }

    let has_functions = |mut symbols: object::SymbolIterator<'_, '_>| {
        symbols.any(|s| s.kind() == SymbolKind::Text && s.address() != 0)
    };
    let has_symtab = has_functions(file.symbols());
    let has_dynsym = has_functions(file.dynamic_symbols());

    let debuglink = file
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned());
    let debugaltlink = file.gnu_debugaltlink().ok().flatten().map(|(name, id)| {
        (
            String::from_utf8_lossy(name).into_owned(),
            BuildId::from_bytes(id).ok(),
        )
    });

    let file_kind = match file.kind() {
        object::ObjectKind::Executable => FileKind::Executable,
        object::ObjectKind::Dynamic => FileKind::Dynamic,
        object::ObjectKind::Relocatable => FileKind::Relocatable,
        object::ObjectKind::Core => FileKind::Core,
        _ => FileKind::Other,
    };

    Ok(ElfInfo {
        build_id,
        file_kind,
        architecture: format!("{:?}", file.architecture()).to_lowercase(),
        is_64: file.is_64(),
        has_dwarf,
        has_symtab,
        has_dynsym,
        has_code,
        compressed_debug,
        debuglink,
        debugaltlink,
        sections,
        htlhash: crate::htlhash_bytes(data),
        go_build_id: crate::go_build_id(&file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_elf() {
        assert!(matches!(
            inspect(b"#!/bin/sh\necho hi\n"),
            Err(Error::NotElf(_))
        ));
        assert!(matches!(inspect(b""), Err(Error::NotElf(_))));
    }

    #[test]
    fn rejects_truncated_elf() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(inspect(&me).is_ok());
        let cut = &me[..me.len() / 2];
        assert!(
            matches!(inspect(cut), Err(Error::Malformed(_))),
            "{:?}",
            inspect(cut)
        );
    }

    #[test]
    fn reads_own_test_binary() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let info = inspect(&me).unwrap();
        assert!(info.has_code);
        assert!(info.has_symtab);
        assert!(info.section(".text").is_some());
        assert!(info.quality() >= Quality::SymTab);
    }
}
