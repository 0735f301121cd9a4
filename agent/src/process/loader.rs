//! How a process's threads publish their trace contexts: the OTEP 4947
//! slot of its executable or of a library it maps, and the dynamic loaders
//! whose `dlopen` hook tells the agent of libraries loaded later.

use std::collections::HashSet;
use std::time::Instant;

use super::maps::MapEntry;
use super::{Context, Process};
use crate::record::{self, ThreadCtxLoc};
use crate::threadctx;

/// The dynamic loaders met, by (device, inode); and the processes read
/// since the last hand-over, whose link-map changes are to wake the agent
/// (every process start calls the hook: only those of processes the agent
/// knows do).
#[derive(Default)]
pub struct Loaders {
    pub seen: HashSet<(u64, u64)>,
    pub new: Vec<(u32, MapEntry, u64)>,
    pub watch: Vec<u32>,
}

impl Context {
    /// How the process's threads reach their OTEP 4947 slot: the
    /// executable's own symbol first (the one symbol lookup finds first),
    /// else a shared library's, through the GOT entry of its TLS
    /// relocation. Also whether every mapped file was read (else it is
    /// looked for again at a later sample).
    pub(super) fn thread_ctx_location(
        &mut self,
        pid: u32,
        process: &Process,
    ) -> (Option<ThreadCtxLoc>, bool) {
        let exe = process.info.executable_path.clone();
        let allowed = process.work.clone().has(Instant::now());
        if let Some(map) = exe
            .as_deref()
            .and_then(|exe| process.maps.iter().find(|m| m.path == exe))
        {
            let binary = self.binaries.get(pid, map, &mut self.waiting, allowed);
            if binary.is_none() && !self.binaries.settled(map) {
                // The executable's slot would come first: not known yet.
                let _ = self.library_location(pid, exe.as_deref(), &process.maps, allowed);
                return (None, false);
            }
            if let Some(offset) = binary.and_then(|b| b.thread_ctx_offset) {
                // The loaders are still looked for: a library loaded later
                // changes nothing here, but the hook serves every process.
                let (_, complete) =
                    self.library_location(pid, exe.as_deref(), &process.maps, allowed);
                return (Some(threadctx::executable_location(offset)), complete);
            }
        }
        self.library_location(pid, exe.as_deref(), &process.maps, allowed)
    }

    /// After a link-map change: the library location and whether every
    /// mapped file was read, unless the executable's own slot is what its
    /// threads use (`None`: nothing to change).
    pub(super) fn library_location_of(
        &mut self,
        pid: u32,
        process: &Process,
    ) -> Option<(Option<ThreadCtxLoc>, bool)> {
        if process
            .thread_ctx
            .is_some_and(|l| l.kind == record::CTX_TP_OFFSET)
        {
            return None; // the executable's slot, whatever the libraries do
        }
        let allowed = process.work.clone().has(Instant::now());
        let exe = process.info.executable_path.clone();
        Some(self.library_location(pid, exe.as_deref(), &process.maps, allowed))
    }

    /// The first mapped library that defines the slot (every mapped file
    /// is looked at once, cached by file; dynamic loaders are noted on the
    /// way), and whether every mapped file was read.
    fn library_location(
        &mut self,
        pid: u32,
        exe: Option<&str>,
        maps: &[MapEntry],
        allowed: bool,
    ) -> (Option<ThreadCtxLoc>, bool) {
        let mut found = None;
        let mut complete = true;
        for map in maps
            .iter()
            .filter(|m| m.is_file() && Some(m.path.as_str()) != exe)
        {
            let Some(binary) = self.binaries.get(pid, map, &mut self.waiting, allowed) else {
                complete &= self.binaries.settled(map);
                continue;
            };
            if let Some(offset) = binary.dl_debug_state {
                if self.loaders.seen.insert((map.dev, map.inode)) {
                    self.loaders.new.push((pid, map.clone(), offset));
                }
            }
            if found.is_none() {
                if let Some(slot) = binary.thread_ctx_library {
                    let bias = map.start.wrapping_sub(binary.vaddr_of_mapping(map.offset));
                    found = Some(threadctx::library_location(slot, bias));
                }
            }
        }
        (found, complete)
    }
}
