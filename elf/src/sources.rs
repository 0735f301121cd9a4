use std::borrow::Cow;
use std::collections::BTreeSet;

use gimli::{EndianSlice, RunTimeEndian};
use object::{Object, ObjectSection};

use crate::{canonical_path, section_data, Budget, Error};

/// The source files a file's DWARF names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceFiles {
    /// Canonical paths, sorted and unique. Absolute when the DWARF gave a
    /// `DW_AT_comp_dir` or an absolute directory.
    pub paths: Vec<String>,
    /// The units' compilation directories (`DW_AT_comp_dir`), canonical,
    /// sorted and unique: where a build's own sources are.
    pub comp_dirs: Vec<String>,
    /// Names the DWARF refers to through a dwz supplementary file
    /// (`DW_FORM_GNU_strp_alt`/`DW_FORM_strp_sup`) and that could not be read
    /// without it.
    pub unresolved: usize,
}

/// Lists the source files that the DWARF line tables of an ELF file name
/// (not the units' `DW_AT_name`: rustc names codegen units
/// `src/lib.rs/@/crate.hash-cgu.0`, which is no file, and C's primary file is
/// in the line table anyway): `DW_AT_comp_dir` + include directory + file name,
/// canonicalised with [`canonical_path`]. DWARF 2–5, compressed sections
/// (zlib, zstd, `.zdebug`) included, within the default [`Budget`] of
/// decompressed bytes. A file without DWARF has no sources.
pub fn source_files(data: &[u8]) -> Result<SourceFiles, Error> {
    source_files_with(data, &mut Budget::default())
}

/// [`source_files`] with the sections it decompresses charged to `budget`:
/// a section whose header claims more than is left fails with
/// [`Error::Decompression`] before anything is allocated.
pub fn source_files_with(data: &[u8], budget: &mut Budget) -> Result<SourceFiles, Error> {
    let file = object::File::parse(data).map_err(|e| Error::Malformed(e.to_string()))?;
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Cow<'_, [u8]>, Error> {
        let section = file
            .section_by_name(id.name())
            .or_else(|| file.section_by_name(&id.name().replacen(".debug_", ".zdebug_", 1)));
        match section {
            Some(s) if s.file_range().is_some() => section_data(&s, budget),
            _ => Ok(Cow::Borrowed(&[][..])),
        }
    };
    let sections = gimli::DwarfSections::load(load)?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));

    let mut paths = BTreeSet::new();
    let mut comp_dirs = BTreeSet::new();
    let mut unresolved = 0usize;
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(dwarf_err)? {
        let unit = dwarf.unit(header).map_err(dwarf_err)?;
        let comp_dir = unit.comp_dir.map(|d| d.to_string_lossy().into_owned());
        if let Some(dir) = comp_dir.as_deref().filter(|d| d.starts_with('/')) {
            comp_dirs.insert(canonical_path(dir));
        }
        let join = |dir: Option<&str>, name: &str| -> String {
            let mut full = String::new();
            if !name.starts_with('/') {
                if let Some(dir) = dir.filter(|d| !d.is_empty()) {
                    if !dir.starts_with('/') {
                        if let Some(comp) = comp_dir.as_deref() {
                            full.push_str(comp);
                            full.push('/');
                        }
                    }
                    full.push_str(dir);
                    full.push('/');
                } else if let Some(comp) = comp_dir.as_deref() {
                    full.push_str(comp);
                    full.push('/');
                }
            }
            full.push_str(name);
            canonical_path(&full)
        };
        let Some(program) = unit.line_program.as_ref() else {
            continue;
        };
        let header = program.header();
        for entry in header.file_names() {
            let name = match dwarf.attr_string(&unit, entry.path_name()) {
                Ok(s) => s.to_string_lossy().into_owned(),
                Err(_) => {
                    unresolved += 1;
                    continue;
                }
            };
            let dir = match entry.directory(header) {
                Some(value) => match dwarf.attr_string(&unit, value) {
                    Ok(s) => Some(s.to_string_lossy().into_owned()),
                    Err(_) => {
                        unresolved += 1;
                        continue;
                    }
                },
                None => None,
            };
            if name.is_empty() || name.starts_with('<') {
                continue;
            }
            paths.insert(join(dir.as_deref(), &name));
        }
    }
    Ok(SourceFiles {
        paths: paths.into_iter().collect(),
        comp_dirs: comp_dirs.into_iter().collect(),
        unresolved,
    })
}

fn dwarf_err(e: gimli::Error) -> Error {
    Error::Dwarf(e.to_string())
}
