//! The BPF maps of the unwind tables (`cfi::tables`'s [`Sink`]): the rows,
//! rules and files arrays are memory-mapped (`BPF_F_MMAPABLE`), so a
//! table of hundreds of thousands of rows is written with stores, not one
//! syscall per row; each process's ranges go through the hash map.

use std::os::fd::AsRawFd;

use aya::maps::{HashMap, MapData};

use crate::cfi::tables::{Sink, SinkError};
use crate::record::{UnwindFile, UnwindProc, UnwindRow, UnwindRule};

// SAFETY: #[repr(C)] plain data, every bit pattern valid.
unsafe impl aya::Pod for UnwindProc {}

/// One memory-mapped BPF array.
struct Mapped<T> {
    ptr: *mut T,
    len: usize,
    bytes: usize,
    _map: MapData,
}

// SAFETY: the mapping is owned by this value and only reached through
// &mut self.
unsafe impl<T: Send> Send for Mapped<T> {}

impl<T> Mapped<T> {
    fn new(map: MapData, len: usize) -> std::io::Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| std::io::Error::other("array size overflows"))?;
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of the array's own pages (the kernel
        // checks the size against the map's); unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped {
            ptr: ptr.cast(),
            len,
            bytes,
            _map: map,
        })
    }

    fn slice(&mut self) -> &mut [T] {
        // SAFETY: `len` elements of T mapped read-write at `ptr` (T is
        // plain data), borrowed mutably through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

use std::os::fd::AsFd;

/// The unwind maps, taken from the loaded BPF object.
pub struct UnwindMaps {
    rows: Mapped<UnwindRow>,
    rules: Mapped<UnwindRule>,
    files: Mapped<UnwindFile>,
    procs: HashMap<MapData, u32, UnwindProc>,
    asked: HashMap<MapData, u32, u8>,
}

impl UnwindMaps {
    pub fn take(bpf: &mut aya::Ebpf, rows: u32) -> anyhow::Result<UnwindMaps> {
        use anyhow::Context;
        let mut take = |name: &str| -> anyhow::Result<MapData> {
            match bpf.take_map(name) {
                Some(aya::maps::Map::Array(data)) => Ok(data),
                _ => anyhow::bail!("BPF map {name} is not an array"),
            }
        };
        Ok(UnwindMaps {
            rows: Mapped::new(take("unwind_rows")?, rows as usize)
                .context("memory-mapping the unwind rows")?,
            rules: Mapped::new(take("unwind_rules")?, crate::record::UNWIND_RULES)
                .context("memory-mapping the unwind rules")?,
            files: Mapped::new(take("unwind_files")?, crate::record::UNWIND_FILES)
                .context("memory-mapping the unwind files")?,
            procs: HashMap::try_from(
                bpf.take_map("unwind_procs")
                    .context("BPF map unwind_procs")?,
            )?,
            asked: HashMap::try_from(
                bpf.take_map("unwind_asked")
                    .context("BPF map unwind_asked")?,
            )?,
        })
    }
}

impl Sink for UnwindMaps {
    fn rows(&mut self) -> &mut [UnwindRow] {
        self.rows.slice()
    }

    fn rules(&mut self) -> &mut [UnwindRule] {
        self.rules.slice()
    }

    fn files(&mut self) -> &mut [UnwindFile] {
        self.files.slice()
    }

    fn set_proc(&mut self, pid: u32, proc: Option<&UnwindProc>) -> Result<(), SinkError> {
        let done = match proc {
            Some(p) => self.procs.insert(pid, *p, 0),
            None => match self.procs.remove(&pid) {
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                other => other,
            },
        };
        done.map_err(|e| SinkError {
            pid,
            reason: e.to_string(),
        })
    }

    fn forgotten(&mut self, pid: u32) {
        let _ = self.asked.remove(&pid); // (absent: never asked)
    }
}
