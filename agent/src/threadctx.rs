//! Finding a process's OpenTelemetry contexts:
//!
//! - the thread context (OTEP 4947): `otel_thread_ctx_v1`, an `STT_TLS`
//!   symbol in the executable's `.dynsym` (or `.symtab`), becomes an offset
//!   from the thread pointer that the BPF program adds to `fsbase`;
//! - the process context (OTEP 4719): the `OTEL_CTX` mapping, read through
//!   `/proc/PID/mem`, gives `service.name`, other resource attributes and
//!   the names of the thread-context attribute keys.

use std::os::unix::fs::FileExt;
use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};
use prost::Message;
use symtrace_proto::common::any_value::Value;
use symtrace_proto::processcontext::ProcessContext;

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
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok(SYMBOL) && s.kind() == SymbolKind::Tls && !s.is_undefined())?;
    let tls = tls_segment(elf)?;
    let align = tls.align.max(1);
    let firstbyte = align.wrapping_sub(tls.vaddr & (align - 1)) & (align - 1);
    let block = (tls.memsz.saturating_sub(firstbyte)).div_ceil(align) * align + firstbyte;
    Some(symbol.address() as i64 - block as i64)
}

/// When a shared library defines `otel_thread_ctx_v1` and reaches it
/// through TLSDESC (what OTEP 4947 asks of writers): the ELF address of the
/// GOT entry of its `R_X86_64_TLSDESC` relocation. Once the dynamic loader
/// has resolved it, the entry's second word is the slot's offset from the
/// thread pointer when the library's TLS is static (loaded at start-up).
pub fn library_tlsdesc_got<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Option<u64> {
    use object::{ObjectSymbolTable, RelocationFlags, RelocationTarget};
    const R_X86_64_TLSDESC: u32 = 36;
    let dynsym = file.dynamic_symbol_table()?;
    let symbol = dynsym
        .symbols()
        .find(|s| s.name() == Ok(SYMBOL) && s.kind() == SymbolKind::Tls && !s.is_undefined())?;
    file.dynamic_relocations()?.find_map(|(offset, r)| {
        let tlsdesc =
            matches!(r.flags(), RelocationFlags::Elf { r_type } if r_type == R_X86_64_TLSDESC);
        let ours = match r.target() {
            RelocationTarget::Symbol(i) => i == symbol.index(),
            // Resolved locally (-Bsymbolic): no symbol, the value as addend.
            RelocationTarget::Absolute => r.addend() == symbol.address() as i64,
            _ => false,
        };
        (tlsdesc && ours).then_some(offset)
    })
}

/// The slot's offset from the thread pointer, from a resolved TLSDESC GOT
/// entry (`resolver`, `argument`): glibc's static-TLS resolver returns the
/// argument as the offset, a small negative number on x86-64. A library
/// loaded with dlopen gets dynamic TLS (the argument is then a pointer):
/// not read.
pub fn tlsdesc_offset(entry: [u64; 2]) -> Option<i64> {
    let offset = entry[1] as i64;
    (entry[0] != 0 && (-(1 << 30)..0).contains(&offset)).then_some(offset)
}

/// Reads a resolved TLSDESC GOT entry of process `pid`.
pub fn read_tlsdesc_entry(proc_root: &Path, pid: u32, address: u64) -> Option<[u64; 2]> {
    let mem = std::fs::File::open(proc_root.join(pid.to_string()).join("mem")).ok()?;
    let mut bytes = [0u8; 16];
    mem.read_exact_at(&mut bytes, address).ok()?;
    Some([
        u64::from_ne_bytes(bytes[..8].try_into().ok()?),
        u64::from_ne_bytes(bytes[8..].try_into().ok()?),
    ])
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
const NAMES: [&str; 3] = [
    "[anon:OTEL_CTX]",
    "[anon_shmem:OTEL_CTX]",
    "/memfd:OTEL_CTX",
];

/// The start of the `OTEL_CTX` mapping in `/proc/PID/maps` text.
pub fn process_context_address(maps: &str) -> Option<u64> {
    crate::maps::start_of(maps, &NAMES)
}

/// Reads a process's context (`maps`: its `/proc/PID/maps` text): header,
/// payload, header again (a writer sets `published_at` to 0 while it
/// updates), three tries.
pub fn read_process_context(proc_root: &Path, pid: u32, maps: &str) -> Option<ProcessContextInfo> {
    let dir = proc_root.join(pid.to_string());
    let at = process_context_address(maps)?;
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
        mem.read_exact_at(&mut again, at + 16).ok()?;
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
            assert_eq!(
                process_context_address(&maps),
                Some(0x7f0000000000),
                "{name}"
            );
        }
        assert_eq!(
            process_context_address("7f00-7f01 rw-p 0 00:00 0 [anon:other]\n"),
            None
        );
    }

    #[test]
    fn tlsdesc_entries_of_static_tls_only() {
        assert_eq!(
            tlsdesc_offset([0x7f00_0000_1000, (-0x48i64) as u64]),
            Some(-0x48)
        );
        assert_eq!(tlsdesc_offset([0, (-0x48i64) as u64]), None, "unresolved");
        assert_eq!(
            tlsdesc_offset([0x7f00_0000_1000, 0x5555_0000_2000]),
            None,
            "dynamic TLS"
        );
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
        assert_eq!(library_tlsdesc_got(&file), None);
    }
}
