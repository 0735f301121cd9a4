//! The OpenTelemetry process context (OTEP 4719): a mapping named `OTEL_CTX`
//! that a profiler finds in `/proc/PID/maps` and reads with
//! `/proc/PID/mem`, holding the process's resource (`service.name`, …) and
//! the thread-context conventions (schema version, attribute key map).
//!
//! Header, 32 bytes, native endian: `"OTEL_CTX"`, `u32 version = 2`,
//! `u32 payload_size`, `u64 published_at` (CLOCK_BOOTTIME ns; 0 while an
//! update is in progress), `u64 payload_ptr`; the payload is a protobuf
//! `opentelemetry.proto.processcontext.v1development.ProcessContext`,
//! stored in the same mapping after the header.

use std::io;
use std::sync::atomic::{compiler_fence, fence, AtomicU64, Ordering};
use std::sync::Mutex;

/// `threadlocal.schema_version` of what `crate::thread` writes.
pub const SCHEMA_VERSION: &str = "tlsdesc_v1_dev";
const SIGNATURE: &[u8; 8] = b"OTEL_CTX";
const VERSION: u32 = 2;
const HEADER: usize = 32;

struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is only touched under the PUBLISHED lock.
unsafe impl Send for Mapping {}

static PUBLISHED: Mutex<Option<Mapping>> = Mutex::new(None);

/// Publishes (or replaces) this process's context: resource attributes
/// (`service.name` first among them, by convention) and the names of the
/// thread-context attribute keys, in key-index order (append-only across
/// updates).
pub fn publish(resource: &[(&str, &str)], thread_attribute_keys: &[&str]) -> io::Result<()> {
    let payload = encode(resource, thread_attribute_keys);
    let needed = HEADER + payload.len();
    let mut published = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    if published.as_ref().is_none_or(|m| m.len < needed) {
        let fresh = map(needed)?;
        if let Some(old) = published.replace(fresh) {
            // SAFETY: our own mapping, no longer referenced.
            unsafe { libc::munmap(old.base.cast(), old.len) };
        }
    }
    let m = published.as_ref().unwrap();
    // SAFETY: `m` is our mapping of at least `needed` bytes, written only
    // here, under the lock; readers are other processes, which check
    // `published_at` before and after reading.
    unsafe {
        let stamp = &*(m.base.add(16) as *const AtomicU64);
        stamp.store(0, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        std::ptr::copy_nonoverlapping(SIGNATURE.as_ptr(), m.base, 8);
        (m.base.add(8) as *mut u32).write(VERSION);
        (m.base.add(12) as *mut u32).write(payload.len() as u32);
        (m.base.add(24) as *mut u64).write(m.base.add(HEADER) as u64);
        std::ptr::copy_nonoverlapping(payload.as_ptr(), m.base.add(HEADER), payload.len());
        compiler_fence(Ordering::SeqCst);
        fence(Ordering::SeqCst);
        stamp.store(boottime_ns().max(1), Ordering::Relaxed);
    }
    Ok(())
}

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A private mapping named OTEL_CTX: a memfd (`/memfd:OTEL_CTX`), else
/// anonymous memory named with PR_SET_VMA_ANON_NAME (`[anon:OTEL_CTX]`);
/// not inherited by children (MADV_DONTFORK).
fn map(len: usize) -> io::Result<Mapping> {
    // SAFETY: plain syscalls on our own descriptors and memory.
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize;
        let len = len.div_ceil(page) * page;
        let fd = libc::memfd_create(c"OTEL_CTX".as_ptr(), libc::MFD_CLOEXEC);
        let base = if fd >= 0 {
            let base = if libc::ftruncate(fd, len as libc::off_t) == 0 {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            };
            libc::close(fd);
            base
        } else {
            libc::MAP_FAILED
        };
        let base = if base == libc::MAP_FAILED {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            // PR_SET_VMA = 0x53564d41, PR_SET_VMA_ANON_NAME = 0 (Linux 5.17+);
            // without a name the context cannot be found, so say so.
            if libc::prctl(
                0x5356_4d41,
                0,
                base as libc::c_ulong,
                len,
                c"OTEL_CTX".as_ptr(),
            ) != 0
            {
                let e = io::Error::last_os_error();
                libc::munmap(base, len);
                return Err(e);
            }
            base
        } else {
            base
        };
        libc::madvise(base, len, libc::MADV_DONTFORK);
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }
}

// Protobuf, by hand: five small messages do not warrant a code generator
// in every application that links this crate.

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field << 3 | 2));
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `AnyValue{string_value = 1}`.
fn string_value(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    bytes_field(&mut v, 1, s.as_bytes());
    v
}

/// `KeyValue{key = 1, value = 2}`.
fn key_value(key: &str, value: &[u8]) -> Vec<u8> {
    let mut kv = Vec::new();
    bytes_field(&mut kv, 1, key.as_bytes());
    bytes_field(&mut kv, 2, value);
    kv
}

/// `ProcessContext{resource = 1: Resource{attributes = 1}, attributes = 2}`.
pub fn encode(resource: &[(&str, &str)], thread_attribute_keys: &[&str]) -> Vec<u8> {
    let mut res = Vec::new();
    for (k, v) in resource {
        bytes_field(&mut res, 1, &key_value(k, &string_value(v)));
    }
    let mut out = Vec::new();
    bytes_field(&mut out, 1, &res);
    bytes_field(
        &mut out,
        2,
        &key_value("threadlocal.schema_version", &string_value(SCHEMA_VERSION)),
    );
    // AnyValue{array_value = 5: ArrayValue{values = 1}}.
    let mut array = Vec::new();
    for k in thread_attribute_keys {
        bytes_field(&mut array, 1, &string_value(k));
    }
    let mut any = Vec::new();
    bytes_field(&mut any, 5, &array);
    bytes_field(
        &mut out,
        2,
        &key_value("threadlocal.attribute_key_map", &any),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishes_a_findable_mapping_with_header_and_payload() {
        publish(&[("service.name", "checkout")], &["http.route"]).unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.contains("OTEL_CTX"))
            .unwrap_or_else(|| panic!("no OTEL_CTX mapping:\n{maps}"));
        let start = usize::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
        // SAFETY: our own mapping, at least one page.
        let header = unsafe { std::slice::from_raw_parts(start as *const u8, 32) };
        assert_eq!(&header[..8], b"OTEL_CTX");
        assert_eq!(u32::from_ne_bytes(header[8..12].try_into().unwrap()), 2);
        let size = u32::from_ne_bytes(header[12..16].try_into().unwrap()) as usize;
        assert!(u64::from_ne_bytes(header[16..24].try_into().unwrap()) > 0);
        let ptr = u64::from_ne_bytes(header[24..32].try_into().unwrap()) as usize;
        // SAFETY: the payload the header points at, in the same mapping.
        let payload = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
        assert_eq!(
            payload,
            encode(&[("service.name", "checkout")], &["http.route"])
        );
        // A second publish with a larger payload still leaves one mapping.
        let long = "x".repeat(5000);
        publish(&[("service.name", &long)], &[]).unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert_eq!(
            maps.lines().filter(|l| l.contains("OTEL_CTX")).count(),
            1,
            "{maps}"
        );
    }

    #[test]
    fn encodes_known_protobuf_bytes() {
        let bytes = encode(&[("a", "b")], &["k"]);
        // resource{attributes{key "a", value{string_value "b"}}}
        let resource = [
            0x0a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, b'a', 0x12, 0x03, 0x0a, 0x01, b'b',
        ];
        assert_eq!(&bytes[..resource.len()], &resource);
        assert!(bytes.windows(14).any(|w| w == b"tlsdesc_v1_dev"));
        assert!(bytes
            .windows(29)
            .any(|w| w == b"threadlocal.attribute_key_map"));
    }
}
