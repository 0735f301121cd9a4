//! Finding a process's OpenTelemetry contexts:
//!
//! - the thread context (OTEP 4947): `otel_thread_ctx_v1`, an `STT_TLS`
//!   symbol in the executable's `.dynsym` (or `.symtab`), becomes an offset
//!   from the thread pointer that the BPF program adds to `fsbase`; in a
//!   shared library's `.dynsym`, the address of the GOT entry of its TLS
//!   relocation, which the BPF program follows (static TLS, or dynamic TLS
//!   through the thread's DTV for a library loaded with dlopen);
//! - the process context (OTEP 4719): the `OTEL_CTX` mapping, read through
//!   `/proc/PID/mem`, gives `service.name`, other resource attributes and
//!   the names of the thread-context attribute keys.

use std::os::unix::fs::FileExt;
use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};
use prost::Message;
use symtrace_proto::common::any_value::Value;
use symtrace_proto::processcontext::ProcessContext;

use crate::record::{ThreadCtxLoc, CTX_GD, CTX_TLSDESC, CTX_TP_OFFSET};

const SYMBOL: &str = "otel_thread_ctx_v1";

/// The TLS offset of `otel_thread_ctx_v1` from the thread pointer when an
/// executable defines it (x86-64, TLS variant II: the executable's block
/// ends at the thread pointer, so the offset is negative).
///
/// The block starts `roundup(memsz - firstbyte, align) + firstbyte` below
/// the thread pointer, `firstbyte` being the alignment slack of `p_vaddr`
/// (glibc's `_dl_determine_tlsoffset` for the first module; musl agrees for
/// the executable). Every TLS model the linker may have relaxed the access
/// to (TLSDESC, GD, IE, LE) ends at that same address in an executable.
pub fn executable_offset<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    elf: R,
) -> Option<i64> {
    // The kind before the name: reading every name of a big symbol table
    // (node's) through the file's read cache held 47 MB at once
    // (heaptrack); TLS symbols are few.
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.kind() == SymbolKind::Tls && !s.is_undefined() && s.name() == Ok(SYMBOL))?;
    let tls = tls_segment(elf)?;
    // The segment's numbers are the file's: checked.
    let align = tls.align.max(1);
    let firstbyte = align.wrapping_sub(tls.vaddr & (align - 1)) & (align - 1);
    let block = (tls.memsz.saturating_sub(firstbyte))
        .div_ceil(align)
        .checked_mul(align)?
        .checked_add(firstbyte)?;
    (symbol.address() as i64).checked_sub(i64::try_from(block).ok()?)
}

/// How a shared library that defines `otel_thread_ctx_v1` reaches it: the
/// GOT entry of its TLS relocation, which the dynamic loader fills in with
/// the slot's place (read by the BPF program at every sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibrarySlot {
    /// `R_X86_64_TLSDESC` (what OTEP 4947 asks of writers) or general
    /// dynamic (`R_X86_64_DTPMOD64`, gcc's and LLVM's default with `-fPIC`).
    pub dialect: Dialect,
    /// The GOT entry's ELF virtual address.
    pub got: u64,
    /// The slot's offset in the library's TLS block (the symbol's value).
    pub tls_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Tlsdesc,
    GeneralDynamic,
}

/// The slot of a shared library, from its `.dynsym` and dynamic
/// relocations: a TLSDESC entry first, else a general-dynamic one.
pub fn library_slot<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Option<LibrarySlot> {
    use object::{ObjectSymbolTable, RelocationFlags, RelocationTarget};
    const R_X86_64_DTPMOD64: u32 = 16;
    const R_X86_64_TLSDESC: u32 = 36;
    let dynsym = file.dynamic_symbol_table()?;
    let symbol = dynsym
        .symbols()
        .find(|s| s.kind() == SymbolKind::Tls && !s.is_undefined() && s.name() == Ok(SYMBOL))?;
    let tls_offset = symbol.address();
    let mut general_dynamic = None;
    for (offset, r) in file.dynamic_relocations()? {
        let RelocationFlags::Elf { r_type } = r.flags() else {
            continue;
        };
        let ours = match r.target() {
            RelocationTarget::Symbol(i) => i == symbol.index() && r.addend() == 0,
            // Resolved locally (-Bsymbolic): no symbol, the value as addend.
            RelocationTarget::Absolute => r.addend() == tls_offset as i64,
            _ => false,
        };
        match r_type {
            R_X86_64_TLSDESC if ours => {
                return Some(LibrarySlot {
                    dialect: Dialect::Tlsdesc,
                    got: offset,
                    tls_offset,
                })
            }
            // Against the symbol only: a local-dynamic entry (the module
            // alone, symbol 0) says nothing of which variable it serves.
            R_X86_64_DTPMOD64
                if general_dynamic.is_none()
                    && matches!(r.target(), RelocationTarget::Symbol(i) if i == symbol.index()) =>
            {
                general_dynamic = Some(LibrarySlot {
                    dialect: Dialect::GeneralDynamic,
                    got: offset,
                    tls_offset,
                });
            }
            _ => {}
        }
    }
    general_dynamic
}

/// The BPF map's value for a process whose slot is `slot` of a library
/// loaded with `bias` (its run-time address minus its ELF address).
pub fn library_location(slot: LibrarySlot, bias: u64) -> ThreadCtxLoc {
    ThreadCtxLoc {
        tp_offset: 0,
        got: slot.got.wrapping_add(bias),
        tls_offset: slot.tls_offset,
        kind: match slot.dialect {
            Dialect::Tlsdesc => CTX_TLSDESC,
            Dialect::GeneralDynamic => CTX_GD,
        },
        pad: 0,
    }
}

/// The BPF map's value for a process whose executable defines the slot.
pub fn executable_location(tp_offset: i64) -> ThreadCtxLoc {
    ThreadCtxLoc {
        tp_offset,
        kind: CTX_TP_OFFSET,
        ..ThreadCtxLoc::default()
    }
}

struct TlsSegment {
    vaddr: u64,
    memsz: u64,
    align: u64,
}

fn tls_segment<'d, R: object::ReadRef<'d>>(elf: R) -> Option<TlsSegment> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let header = object::elf::FileHeader64::<object::Endianness>::parse(elf).ok()?;
    let endian = header.endian().ok()?;
    let phdrs = header.program_headers(endian, elf).ok()?;
    let tls = phdrs
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_TLS)?;
    Some(TlsSegment {
        vaddr: tls.p_vaddr(endian),
        memsz: tls.p_memsz(endian),
        align: tls.p_align(endian),
    })
}

/// What a process published in its `OTEL_CTX` mapping.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProcessContextInfo {
    /// Resource attributes with string (or scalar) values, `service.name`
    /// among them when set.
    pub resource: Vec<(String, String)>,
    /// `threadlocal.attribute_key_map`: key index → attribute name.
    pub attribute_keys: Vec<String>,
}

const MAX_PAYLOAD: u32 = 64 << 10;

/// Reads a process's context, whose `OTEL_CTX` mapping starts at `at`:
/// header, payload, header again (a writer sets `published_at` to 0 while
/// it updates), three tries. Reads the process's memory: run in a job.
pub fn read_process_context(proc_root: &Path, pid: u32, at: u64) -> Option<ProcessContextInfo> {
    let dir = proc_root.join(pid.to_string());
    let mem = std::fs::File::open(dir.join("mem")).ok()?;
    for _ in 0..3 {
        let mut header = [0u8; 32];
        mem.read_exact_at(&mut header, at).ok()?;
        if &header[..8] != b"OTEL_CTX" || u32::from_ne_bytes(header[8..12].try_into().ok()?) != 2 {
            return None;
        }
        let size = u32::from_ne_bytes(header[12..16].try_into().ok()?);
        let stamp = u64::from_ne_bytes(header[16..24].try_into().ok()?);
        let ptr = u64::from_ne_bytes(header[24..32].try_into().ok()?);
        if stamp == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        if size > MAX_PAYLOAD {
            return None;
        }
        let mut payload = vec![0u8; size as usize];
        mem.read_exact_at(&mut payload, ptr).ok()?;
        let mut again = [0u8; 8];
        mem.read_exact_at(&mut again, at.checked_add(16)?).ok()?;
        if u64::from_ne_bytes(again) != stamp {
            continue;
        }
        return decode(&payload);
    }
    None
}

fn scalar(value: &Value) -> Option<String> {
    Some(match value {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        _ => return None,
    })
}

pub fn decode(payload: &[u8]) -> Option<ProcessContextInfo> {
    let cx = ProcessContext::decode(payload).ok()?;
    let resource = cx
        .resource
        .map(|r| r.attributes)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|kv| Some((kv.key, scalar(kv.value?.value.as_ref()?)?)))
        .collect();
    let attribute_keys = cx
        .attributes
        .into_iter()
        .find(|kv| kv.key == "threadlocal.attribute_key_map")
        .and_then(|kv| match kv.value?.value? {
            Value::ArrayValue(a) => Some(
                a.values
                    .into_iter()
                    .map(|v| v.value.as_ref().and_then(scalar).unwrap_or_default())
                    .collect(),
            ),
            _ => None,
        })
        .unwrap_or_default();
    Some(ProcessContextInfo {
        resource,
        attribute_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use symtrace_proto::common::{AnyValue, ArrayValue, KeyValue};
    use symtrace_proto::resource::Resource;

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    #[test]
    fn decodes_resource_and_key_map() {
        let payload = ProcessContext {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::StringValue("cart".into())),
                    kv("service.instance.id", Value::IntValue(7)),
                ],
                ..Default::default()
            }),
            attributes: vec![
                kv(
                    "threadlocal.schema_version",
                    Value::StringValue("tlsdesc_v1_dev".into()),
                ),
                kv(
                    "threadlocal.attribute_key_map",
                    Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(Value::StringValue("http.route".into())),
                        }],
                    }),
                ),
            ],
        }
        .encode_to_vec();
        let info = decode(&payload).unwrap();
        assert_eq!(
            info.resource,
            vec![
                ("service.name".into(), "cart".into()),
                ("service.instance.id".into(), "7".into())
            ]
        );
        assert_eq!(info.attribute_keys, vec!["http.route".to_string()]);
        assert!(decode(b"\xff\xff").is_none());
    }

    #[test]
    fn finds_the_mapping_by_any_of_its_names() {
        for name in [
            "[anon:OTEL_CTX]",
            "/memfd:OTEL_CTX (deleted)",
            "[anon_shmem:OTEL_CTX]",
        ] {
            let maps = format!(
                "55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1234   /usr/bin/app\n\
                 7f0000000000-7f0000001000 rw-p 00000000 00:01 5      {name}\n"
            );
            let read = crate::process::maps::read_from(maps.as_bytes()).unwrap();
            assert_eq!(read.process_context, Some(0x7f0000000000), "{name}");
        }
        let other = "7f00-7f01 rw-p 0 00:00 0 [anon:other]\n";
        let read = crate::process::maps::read_from(other.as_bytes()).unwrap();
        assert_eq!(read.process_context, None);
    }

    #[test]
    fn locations_for_the_bpf_program() {
        let slot = LibrarySlot {
            dialect: Dialect::Tlsdesc,
            got: 0x652e0,
            tls_offset: 0x2c8,
        };
        let loc = library_location(slot, 0x7f00_0000_0000);
        assert_eq!(
            (loc.got, loc.tls_offset, loc.kind),
            (0x7f00_0006_52e0, 0x2c8, CTX_TLSDESC)
        );
        let gd = LibrarySlot {
            dialect: Dialect::GeneralDynamic,
            ..slot
        };
        assert_eq!(library_location(gd, 0).kind, CTX_GD);
        let exe = executable_location(-0x48);
        assert_eq!((exe.tp_offset, exe.kind), (-0x48, CTX_TP_OFFSET));
    }

    #[test]
    fn no_symbol_no_offset() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        assert_eq!(
            executable_offset(&file, &exe),
            None,
            "the test binary defines no otel_thread_ctx_v1"
        );
        assert_eq!(library_slot(&file), None);
    }
}
