//! Memory profiling's probes: the `otel_memory:alloc` and `otel_memory:free`
//! USDT probe sites of a file (read with the rest of a binary, from its
//! `.note.stapsdt`) and their argument specs for the BPF program; which
//! files' sites are attached, and when, is [`attached`].

mod attached;

pub use attached::{Attach, MemoryProbes, ProbeStats, DEFAULT_FILES};

use object::{Object, ObjectSection, ObjectSegment, ReadRef};
use symtrace_elf::usdt::{ArgLocation, NoteLayout, Reg, UsdtArg};

use crate::record::{
    UsdtArgSpec, UsdtSpec, USDT_ARGS, USDT_ARG_CONST, USDT_ARG_MEM, USDT_ARG_REG, USDT_PROBE_ALLOC,
    USDT_PROBE_FREE,
};

/// Bytes of `.note.stapsdt` read at most.
const MAX_NOTES_BYTES: u64 = 1 << 20;

/// One `otel_memory` probe site of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryProbe {
    /// Where the uprobe goes: the site's offset in the file.
    pub file_offset: u64,
    /// `USDT_PROBE_ALLOC` or `USDT_PROBE_FREE`.
    pub probe: u32,
    /// Its arguments, as the BPF program reads them.
    pub spec: UsdtSpec,
    /// The site has a semaphore (a counter that enables it, which the
    /// agent does not set: such sites are not attached).
    pub semaphore: bool,
}

/// The `otel_memory` probe sites of a parsed ELF file (empty for most).
/// A site whose arguments cannot be read (another architecture's spec,
/// `%rip`-relative memory) is left out, with a debug log.
pub fn memory_probes<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, data: R) -> Vec<MemoryProbe> {
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Vec::new();
    };
    let Some((offset, size)) = section.file_range() else {
        return Vec::new();
    };
    if size > MAX_NOTES_BYTES {
        tracing::debug!(size, "a .note.stapsdt too large to read");
        return Vec::new();
    }
    let Ok(notes) = data.read_bytes_at(offset, size) else {
        return Vec::new();
    };
    let layout = NoteLayout {
        little_endian: file.is_little_endian(),
        is_64: file.is_64(),
        stapsdt_base: file.section_by_name(".stapsdt.base").map(|s| s.address()),
        segments: file
            .segments()
            .map(|s| {
                let (start, size) = s.file_range();
                (s.address(), size.min(s.size()), start)
            })
            .collect(),
        file_len: data.len().unwrap_or(0),
    };
    let probes = match symtrace_elf::usdt::probes_from_notes(notes, layout) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!("unreadable USDT notes: {e}");
            return Vec::new();
        }
    };
    probes
        .into_iter()
        .filter(|p| p.provider == "otel_memory")
        .filter_map(|p| {
            let probe = match p.name.as_str() {
                "alloc" => USDT_PROBE_ALLOC,
                "free" => USDT_PROBE_FREE,
                _ => return None,
            };
            let wanted = if probe == USDT_PROBE_ALLOC { 3 } else { 1 };
            let spec = match p.args.as_deref().map_err(String::clone).and_then(|args| {
                if args.len() < wanted {
                    return Err(format!("{} arguments, {wanted} needed", args.len()));
                }
                spec_of(probe, &args[..wanted])
            }) {
                Ok(spec) => spec,
                Err(why) => {
                    tracing::debug!(probe = %p.name, args = %p.args_text, "probe left out: {why}");
                    return None;
                }
            };
            Some(MemoryProbe {
                file_offset: p.file_offset?,
                probe,
                spec,
                semaphore: p.semaphore.is_some(),
            })
        })
        .collect()
}

/// The BPF program's spec of a probe's arguments.
pub fn spec_of(probe: u32, args: &[UsdtArg]) -> Result<UsdtSpec, String> {
    let mut spec = UsdtSpec {
        probe,
        ..Default::default()
    };
    for (slot, arg) in spec.args.iter_mut().zip(args).take(USDT_ARGS) {
        let size = i8::try_from(arg.size).map_err(|_| "an argument wider than 8 bytes")?;
        if !matches!(arg.size, 1 | 2 | 4 | 8) {
            return Err(format!("an argument of {} bytes", arg.size));
        }
        *slot = match arg.location {
            ArgLocation::Constant(value) => UsdtArgSpec {
                value,
                kind: USDT_ARG_CONST,
                ..Default::default()
            },
            ArgLocation::Register(Reg::Rip) | ArgLocation::Memory { base: Reg::Rip, .. } => {
                return Err("a %rip-relative argument".into())
            }
            ArgLocation::Register(reg) => UsdtArgSpec {
                kind: USDT_ARG_REG,
                reg_off: reg.pt_regs_offset() as u16,
                ..Default::default()
            },
            ArgLocation::Memory { base, offset } => UsdtArgSpec {
                value: offset,
                kind: USDT_ARG_MEM,
                reg_off: base.pt_regs_offset() as u16,
                ..Default::default()
            },
        };
        slot.size = if arg.signed { -size } else { size };
    }
    Ok(spec)
}

/// Builds the preload library (alloc/preload) into `dir`, for tests.
#[cfg(test)]
pub(crate) fn build_preload(dir: &std::path::Path) -> std::path::PathBuf {
    let status = std::process::Command::new("make")
        .args(["-s", "-C"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../alloc/preload"))
        .arg(format!("O={}", dir.display()))
        .status()
        .expect("make is needed to build the preload library");
    assert!(status.success());
    dir.join("libsymtrace_alloc_preload.so")
}

#[cfg(test)]
mod tests {
    use super::*;
    use symtrace_elf::usdt::parse_args;

    #[test]
    fn argument_specs_for_the_bpf_program() {
        let args = parse_args("8@%rdi -4@-20(%rbp) 8@$5").unwrap();
        let spec = spec_of(USDT_PROBE_ALLOC, &args).unwrap();
        assert_eq!(spec.probe, USDT_PROBE_ALLOC);
        assert_eq!(
            spec.args[0],
            UsdtArgSpec {
                value: 0,
                kind: USDT_ARG_REG,
                reg_off: Reg::Rdi.pt_regs_offset() as u16,
                size: 8,
                pad: 0
            }
        );
        assert_eq!(
            (spec.args[1].kind, spec.args[1].value, spec.args[1].size),
            (USDT_ARG_MEM, -20, -4)
        );
        assert_eq!((spec.args[2].kind, spec.args[2].value), (USDT_ARG_CONST, 5));
        let rip = parse_args("8@16(%rip)").unwrap();
        assert!(spec_of(USDT_PROBE_FREE, &rip).is_err());
    }

    #[test]
    fn reads_the_probes_of_the_preload_library() {
        // Built here from the same source as alloc/tests build it.
        let dir = tempfile::tempdir().unwrap();
        let lib = std::fs::read(build_preload(dir.path())).unwrap();
        let file = object::File::parse(&lib[..]).unwrap();
        let probes = memory_probes(&file, &lib[..]);
        let kinds: Vec<u32> = probes.iter().map(|p| p.probe).collect();
        assert!(kinds.contains(&USDT_PROBE_ALLOC) && kinds.contains(&USDT_PROBE_FREE));
        for p in &probes {
            assert!(!p.semaphore);
            assert!(p.file_offset > 0 && (p.file_offset as usize) < lib.len());
            assert!(p.spec.args[0].kind != 0);
        }
        // Our own test binary has no notes.
        let me = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&me[..]).unwrap();
        assert!(memory_probes(&file, &me[..]).is_empty());
    }
}
