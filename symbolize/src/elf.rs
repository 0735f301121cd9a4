//! The ELF files one build-ID's answers come from, and their DWARF sections
//! (decompressed once, zlib or zstd, within a budget of decompressed bytes).

use std::borrow::Cow;

use gimli::{EndianSlice, RunTimeEndian, SectionId};
use object::Object;
use symtrace_elf::Budget;

use crate::Error;

/// The files describing one build-ID.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'data> {
    /// The best file: the debuginfo file, or the executable when that is all
    /// there is. Its DWARF and symbol tables are used first.
    pub primary: &'data [u8],
    /// The executable, when `primary` is a separate debug file: its
    /// `.symtab`/`.dynsym` are used when `primary` has none (a debug file
    /// made by `--only-keep-debug` keeps `.symtab` but never `.dynsym`).
    pub executable: Option<&'data [u8]>,
    /// The supplementary file (`.gnu_debugaltlink`, made by `dwz -m`).
    pub supplementary: Option<&'data [u8]>,
    /// Most bytes the compressed DWARF sections of `primary` and
    /// `supplementary` may decompress to, together. A section whose header
    /// claims more than is left fails with [`Error::Decompression`] before
    /// anything is allocated.
    pub max_decompressed_bytes: u64,
}

impl<'data> Inputs<'data> {
    /// Just one file, with the default decompression budget
    /// ([`symtrace_elf::DEFAULT_MAX_DECOMPRESSED_BYTES`], 4 GiB).
    pub fn new(primary: &'data [u8]) -> Self {
        Self {
            primary,
            executable: None,
            supplementary: None,
            max_decompressed_bytes: symtrace_elf::DEFAULT_MAX_DECOMPRESSED_BYTES,
        }
    }

    /// The same inputs with another decompression budget.
    pub fn with_max_decompressed_bytes(self, bytes: u64) -> Self {
        Self {
            max_decompressed_bytes: bytes,
            ..self
        }
    }
}

pub(crate) type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// The DWARF sections of one file, decompressed.
pub(crate) struct DwarfSections<'data> {
    endian: RunTimeEndian,
    sections: Vec<(SectionId, Cow<'data, [u8]>)>,
}

impl<'data> DwarfSections<'data> {
    /// Reads (and decompresses, charging `budget`) the DWARF sections of
    /// `file`.
    pub fn load(file: &object::File<'data>, budget: &mut Budget) -> Result<Self, Error> {
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut sections = Vec::new();
        for id in ALL_SECTIONS {
            if let Some(section) = file.section_by_name(id.name()) {
                let data =
                    symtrace_elf::section_data(&section, budget).map_err(Error::Decompression)?;
                sections.push((*id, data));
            }
        }
        Ok(Self { endian, sections })
    }

    pub fn has_debug_info(&self) -> bool {
        self.sections
            .iter()
            .any(|(id, data)| *id == SectionId::DebugInfo && !data.is_empty())
    }

    pub fn dwarf(&self) -> gimli::Dwarf<Reader<'_>> {
        let load = |id: SectionId| -> Result<Reader<'_>, gimli::Error> {
            let data = self
                .sections
                .iter()
                .find(|(s, _)| *s == id)
                .map(|(_, d)| d.as_ref())
                .unwrap_or(&[]);
            Ok(EndianSlice::new(data, self.endian))
        };
        let mut dwarf = gimli::Dwarf::load(load).expect("loading from memory cannot fail");
        dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        dwarf
    }
}

const ALL_SECTIONS: &[SectionId] = &[
    SectionId::DebugAbbrev,
    SectionId::DebugAddr,
    SectionId::DebugAranges,
    SectionId::DebugInfo,
    SectionId::DebugLine,
    SectionId::DebugLineStr,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
    SectionId::DebugRanges,
    SectionId::DebugRngLists,
];

/// The DWARF of `inputs`, with the supplementary file attached.
pub(crate) struct LoadedDwarf<'data> {
    pub primary: DwarfSections<'data>,
    pub sup: Option<DwarfSections<'data>>,
}

impl<'data> LoadedDwarf<'data> {
    /// The DWARF of `inputs`: the primary file's and the supplementary
    /// file's sections share one budget of `inputs.max_decompressed_bytes`.
    pub fn load(inputs: &Inputs<'data>) -> Result<Self, Error> {
        let mut budget = Budget::new(inputs.max_decompressed_bytes);
        let primary = DwarfSections::load(&object::File::parse(inputs.primary)?, &mut budget)?;
        let sup = match inputs.supplementary {
            Some(data) => Some(DwarfSections::load(
                &object::File::parse(data)?,
                &mut budget,
            )?),
            None => None,
        };
        Ok(Self { primary, sup })
    }

    pub fn dwarf(&self) -> gimli::Dwarf<Reader<'_>> {
        let mut dwarf = self.primary.dwarf();
        if let Some(sup) = &self.sup {
            dwarf.set_sup(sup.dwarf());
        }
        dwarf
    }
}
