//! One user stack resolved against one process: each address to its
//! mapping (build-ID, ELF address), the leaf's caller inserted by CFI, every
//! return address checked (see `unwind`), the code and CFI read through the
//! process's view of its files.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::binaries::Binaries;
use crate::cfi::{CfiCache, FileCfi, LeafRule};
use crate::maps::{self, MapEntry};
use crate::procs::{
    mapping_of, reread, Mapping, Process, UserFrame, CODE_CHECKS_MAX, MAPS_MISS_INTERVAL,
};
use crate::record::call_site;
use crate::unwind::{self, Cut};
use crate::vdso::Vdso;

/// A leaf frame resolved, with what its CFI lookup needs.
pub(crate) struct Leaf {
    pub frame: UserFrame,
    /// The CFI's key: (device, inode), or `VDSO_KEY`.
    key: (u64, u64),
    map: usize,
}

const VDSO_KEY: (u64, u64) = (u64::MAX, 0);
const ANON_KEY: u64 = u64::MAX - 1;

/// One stack's resolution against one process.
pub(crate) struct Resolver<'a> {
    pub root: &'a Path,
    pub pid: u32,
    pub process: &'a mut Process,
    pub binaries: &'a mut Binaries,
    pub unknown: &'a Arc<Mapping>,
    pub vdso: Option<&'a Vdso>,
    pub jit: &'a Arc<crate::jit::Shared>,
    pub now: Instant,
}

impl Resolver<'_> {
    /// The frame of the instruction at `address`, `None` outside every
    /// executable mapping.
    pub(crate) fn frame(&mut self, address: u64) -> Option<Leaf> {
        let mut at = maps::find(&self.process.maps, address);
        if at.is_none() && self.now.duration_since(self.process.maps_read) > MAPS_MISS_INTERVAL {
            reread(self.root, self.pid, self.process, self.now);
            at = maps::find(&self.process.maps, address);
        }
        let Some(i) = at else {
            // Outside every executable mapping: generated code the maps
            // did not show yet, maybe.
            let name = self.jit_symbol(address)?;
            return Some(Leaf {
                frame: UserFrame {
                    mapping: self.unknown.clone(),
                    address,
                    name: Some(name),
                },
                key: (0, 0),
                map: usize::MAX,
            });
        };
        let map = &self.process.maps[i];
        let mapping = match &self.process.mappings[i] {
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(mapping_of(
                    self.binaries,
                    self.root,
                    self.pid,
                    map,
                    self.vdso,
                ));
                self.binaries.offer_sampled(self.root, self.pid, map);
                self.process.mappings[i] = Some(m.clone());
                m
            }
        };
        let runtime_address = address;
        let (dev, inode) = (map.dev, map.inode);
        let address = address - map.start + mapping.start;
        let is_vdso = map.path == "[vdso]";
        let name = if is_vdso {
            self.vdso.and_then(|v| v.name(address))
        } else if mapping.build_id.is_none() {
            // No file names this code: a runtime's generated code.
            self.jit_symbol(runtime_address)
        } else {
            None
        };
        let key = if is_vdso { VDSO_KEY } else { (dev, inode) };
        Some(Leaf {
            frame: UserFrame {
                mapping,
                address,
                name,
            },
            key,
            map: i,
        })
    }

    /// The name a runtime gave the generated code at `address`.
    fn jit_symbol(&mut self, address: u64) -> Option<Arc<crate::jit::Symbol>> {
        let p = &mut *self.process;
        let jit = p.jit.get_or_insert_with(|| {
            let exe = p.info.executable_path.as_deref();
            Box::new(crate::jit::ProcessJit::new(
                self.jit, self.root, self.pid, exe, &p.maps,
            ))
        });
        jit.symbol(self.root, self.pid, &p.maps, address, self.now)
    }

    pub(crate) fn unknown_frame(&self, address: u64) -> UserFrame {
        UserFrame {
            mapping: self.unknown.clone(),
            address,
            name: None,
        }
    }

    /// The CFI rule at the leaf, `None` when its file has no usable CFI.
    pub(crate) fn leaf_rule(&mut self, cfi: &mut CfiCache, leaf: &Leaf) -> Option<LeafRule> {
        let address = leaf.frame.address;
        if leaf.key == VDSO_KEY {
            let vdso = self.vdso?;
            return cfi.rule(VDSO_KEY, address, || vdso.cfi());
        }
        let map = self.process.maps.get(leaf.map)?;
        if !map.is_file() {
            return None;
        }
        let binary = self.binaries.get(self.root, self.pid, map)?;
        let (root, pid) = (self.root, self.pid);
        cfi.rule(leaf.key, address, || load_cfi(root, pid, map, &binary))
    }

    /// Checks a return address and pushes its frame; on a failed check sets
    /// `cut` and returns false.
    pub(crate) fn check_and_push(
        &mut self,
        checks: &mut FxHashMap<(u64, u64, u64), bool>,
        ret: u64,
        root_frame: bool,
        out: &mut Vec<UserFrame>,
        cut: &mut Option<Cut>,
    ) -> bool {
        let Some(caller) = self.frame(call_site(1, ret)) else {
            *cut = Some(Cut::OutsideCode);
            return false;
        };
        let key = match caller.key {
            (0, 0) => (ANON_KEY, u64::from(self.pid), ret),
            (dev, inode) => (dev, inode, caller.frame.address + 1),
        };
        let ok = match checks.get(&key) {
            Some(&ok) => ok,
            None => match read_code(self.pid, ret) {
                Some(code) => {
                    let ok = unwind::after_call(&code[..unwind::CODE_BEFORE])
                        || unwind::is_sigreturn(&code[unwind::CODE_BEFORE..]);
                    if checks.len() >= CODE_CHECKS_MAX {
                        checks.clear();
                    }
                    checks.insert(key, ok);
                    ok
                }
                // The process is gone (or the page is not readable): the
                // address is in its code, which is all that can be checked
                // — unless it is in no mapping (a JIT symbol of code freed
                // since: perf maps never forget).
                None => caller.map != usize::MAX,
            },
        };
        if !ok && !root_frame {
            *cut = Some(Cut::NotAfterCall);
            return false;
        }
        out.push(caller.frame);
        true
    }
}

/// The code around a return address of process `pid`: `CODE_BEFORE` bytes
/// before it and `CODE_AFTER` from it (one `process_vm_readv`).
fn read_code(pid: u32, ret: u64) -> Option<[u8; unwind::CODE_BEFORE + unwind::CODE_AFTER]> {
    let mut code = [0u8; unwind::CODE_BEFORE + unwind::CODE_AFTER];
    let local = libc::iovec {
        iov_base: code.as_mut_ptr().cast(),
        iov_len: code.len(),
    };
    let remote = libc::iovec {
        iov_base: ret.checked_sub(unwind::CODE_BEFORE as u64)? as *mut libc::c_void,
        iov_len: code.len(),
    };
    // SAFETY: one local buffer of exactly iov_len bytes; the remote side is
    // only read, by the kernel, under its access checks.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    (n == code.len() as isize).then_some(code)
}

/// Bytes of `.eh_frame` (+ `.eh_frame_hdr`) read from one file at most.
const MAX_CFI_FILE_BYTES: u64 = 64 << 20;

/// Reads a file's CFI sections through the process's view of it.
fn load_cfi(
    root: &Path,
    pid: u32,
    map: &MapEntry,
    binary: &crate::binaries::Binary,
) -> Option<FileCfi> {
    use std::os::unix::fs::FileExt;
    let eh_frame = binary.eh_frame?;
    let hdr = binary.eh_frame_hdr;
    if eh_frame.size + hdr.map_or(0, |h| h.size) > MAX_CFI_FILE_BYTES {
        tracing::debug!(pid, path = %map.path, "CFI too large: not read");
        return None;
    }
    let opened = crate::safefile::open_mapped(root, pid, map).ok()?;
    let read = |s: crate::cfi::SectionRef| {
        let mut bytes = vec![0; s.size as usize];
        opened.file.read_exact_at(&mut bytes, s.offset).ok()?;
        Some((bytes, s.address))
    };
    let (eh_frame, hdr) = (read(eh_frame)?, hdr.and_then(read));
    if !opened.unchanged() {
        return None;
    }
    FileCfi::new(eh_frame, hdr, binary.text_address)
}
