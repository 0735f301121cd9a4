//! One user stack resolved against one process: each address to its
//! mapping (build-ID, ELF address, content hash), the leaf's caller
//! inserted by CFI, every return address checked (see `unwind`), the code
//! and CFI read through the process's view of its files — in jobs, within
//! the process's budget; what cannot be read in time is resolved from what
//! is known (and counted), never waited for without bound.

use std::sync::Arc;
use std::time::Instant;

use super::maps::{self, MapEntry};
use super::{
    Context, Process, ProcessInfo, Processes, MAPS_FIRST_MISS_INTERVAL, MAPS_MAX_AGE,
    MAPS_MISS_INTERVAL,
};
use crate::cfi::LeafRule;
use crate::jobs::{About, Ticket};
use crate::record::{
    self, call_site, USER_END_LEAF_CFI, USER_END_MASK, USER_END_NOT_INCREASING, USER_END_OUTERMOST,
    USER_END_ROOT, USER_END_UNREADABLE,
};
use crate::unwind::{self, Cut, LeafStep};

/// Cached answers of "is this return address just after a call" at most;
/// the cache starts over beyond.
pub(crate) const CODE_CHECKS_MAX: usize = 64 * 1024;

/// A mapping as the profile names it: a file's range in ELF virtual
/// addresses (the OpenTelemetry eBPF profiler's convention), or a range of
/// memory that is no file (`[anon]`, `[vdso]`) in runtime addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub path: String,
    /// The file's ID: its GNU build-ID, else its htlhash (`htlhash`).
    pub build_id: Option<String>,
    /// `build_id` is an htlhash (the file has no GNU build-ID).
    pub htlhash: bool,
    /// The SHA-256 of the file's content (what binds symbols an agent
    /// published from a file to the frames of exactly that content).
    pub content_sha256: Option<String>,
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
    /// The mapped file's (device, inode); (0, 0) for memory that is no
    /// file. Not exported: what ties a mapping to the file whose content
    /// hash is still being computed when it is first sampled.
    pub file: (u64, u64),
}

/// A user frame: its mapping and address (an ELF virtual address when the
/// mapping is a file or the vDSO, the runtime address in generated code),
/// and its name when the agent knows it (the vDSO's functions, JIT code).
#[derive(Debug, Clone)]
pub struct UserFrame {
    pub mapping: Arc<Mapping>,
    pub address: u64,
    pub name: Option<Arc<crate::jit::Symbol>>,
}

/// A user stack as the BPF program captured it.
#[derive(Debug, Clone, Copy)]
pub struct UserStack<'a> {
    /// `%rip`, then the frame-pointer chain's return addresses.
    pub chain: &'a [u64],
    /// `enum user_stack_end`.
    pub end: u32,
    /// `%rbp` at the sample (where the chain was walked from).
    pub bp: u64,
    /// The stack bytes from `%rsp` up.
    pub window: &'a [u8],
    /// A copy of the stack from `%rsp` (`sp`, bytes), longer than the
    /// window, when the BPF walk found no unwind ranges for the process:
    /// walked here by CFI (see `snapshot`).
    pub snapshot: Option<(u64, &'a [u8])>,
}

/// A leaf frame resolved, with what its CFI lookup needs.
pub(crate) struct Leaf {
    pub frame: UserFrame,
    /// The CFI's key: (device, inode), or `VDSO_KEY`.
    key: (u64, u64),
    map: usize,
}

/// Urgent jobs queued beyond which no code is read for a check.
const MAX_BACKLOG: usize = 32;

const VDSO_KEY: (u64, u64) = (u64::MAX, 0);
const ANON_KEY: u64 = u64::MAX - 1;

impl Processes {
    /// Resolves a user stack of process `pid` into `out` (leaf first; see
    /// `record::call_site`): the leaf's caller inserted when its CFI says the
    /// frame-pointer chain skips it, every return address checked, the stack
    /// cut where one fails (the `Cut` returned then). Also returns who the
    /// process is (read now if new; `comm` names it if it is gone).
    pub fn resolve(
        &mut self,
        pid: u32,
        comm: &str,
        stack: &UserStack<'_>,
        out: &mut Vec<UserFrame>,
    ) -> (Arc<ProcessInfo>, Option<Cut>) {
        let started = Instant::now();
        let Processes { by_pid, ctx } = self;
        let cpu = crate::jobs::thread_cpu();
        let process = ctx.entry(by_pid, pid, comm);
        ctx.settle_identity(process);
        ctx.settle_thread_ctx(pid, process);
        let resolved = ctx.resolve_in(pid, process, stack, out, started);
        process.work.charge_cpu_since(cpu);
        if ctx.jit.over_total() {
            // A process read JIT symbols beyond what the others leave.
            for p in by_pid.values_mut() {
                if let Some(j) = p.jit.as_mut() {
                    j.trim();
                }
            }
        }
        resolved
    }
}

impl Context {
    fn resolve_in(
        &mut self,
        pid: u32,
        process: &mut Process,
        stack: &UserStack<'_>,
        out: &mut Vec<UserFrame>,
        now: Instant,
    ) -> (Arc<ProcessInfo>, Option<Cut>) {
        process.last_sample = now;
        if now.duration_since(process.maps_read) > MAPS_MAX_AGE {
            self.reread(pid, process, now);
        }
        self.settle_unwind(pid, process, now);
        let info = process.info.clone();
        let Some((&ip, chain)) = stack.chain.split_first() else {
            return (info, None);
        };
        let mut r = Resolver {
            ctx: self,
            pid,
            process,
            now,
        };
        let Some(leaf) = r.frame(ip) else {
            out.push(r.unknown_frame(ip));
            return (info, None);
        };
        if let Some((sp, data)) = stack.snapshot {
            let snap = crate::snapshot::Snapshot {
                ip,
                sp,
                bp: stack.bp,
                data,
            };
            if let Some(cut) = r.walk_snapshot(&snap, leaf.frame.clone(), out) {
                return (info, cut);
            }
        }
        let end = stack.end & USER_END_MASK as u32;
        // Step out of the leaf with its CFI, unless the BPF walk did.
        let rule = if stack.end & USER_END_LEAF_CFI as u32 != 0 {
            r.ctx.unwind.leaf_in_bpf += 1;
            Some(LeafRule::Framed)
        } else {
            r.leaf_rule(&leaf)
        };
        out.push(leaf.frame);
        let mut cut = None;
        match rule.map(|rule| unwind::leaf_step(rule, stack.bp, stack.window)) {
            None => r.ctx.unwind.leaf_without_cfi += 1,
            Some(LeafStep::Chain) => {}
            Some(LeafStep::OutOfWindow) => r.ctx.unwind.out_of_window += 1,
            Some(LeafStep::Caller {
                mut ret,
                mut chain_ok,
            }) => {
                r.ctx.unwind.callers_recovered += 1;
                // The caller may be frameless too (a libc wrapper around a
                // syscall wrapper: where every blocked thread waits): step
                // on with each one's CFI, in the captured window, until a
                // function with its frame, from which the chain is right.
                let mut base = rule.and_then(unwind::caller_sp).unwrap_or(0);
                for _ in 0..unwind::MAX_FRAMELESS_CALLERS {
                    if !r.check_and_push(ret, false, out, &mut cut) {
                        break;
                    }
                    if !chain_ok {
                        cut = Some(Cut::CallerFrameUnknown);
                        break;
                    }
                    let Some(caller) = r.frame(record::call_site(1, ret)) else {
                        break;
                    };
                    let Some(rule) = r.leaf_rule(&caller) else {
                        break;
                    };
                    match unwind::step(rule, stack.bp, stack.window, base) {
                        LeafStep::Chain => break,
                        LeafStep::OutOfWindow => {
                            // Its caller is above the window: the chain from
                            // %rbp would skip it.
                            cut = Some(Cut::CallerFrameUnknown);
                            break;
                        }
                        LeafStep::Caller {
                            ret: next,
                            chain_ok: ok,
                        } => {
                            r.ctx.unwind.frameless_callers += 1;
                            base = base.saturating_add(unwind::caller_sp(rule).unwrap_or(0));
                            (ret, chain_ok) = (next, ok);
                        }
                    }
                }
            }
        }
        if cut.is_none() {
            r.prefetch_code(chain);
            let last = chain.len().saturating_sub(1);
            for (i, &ret) in chain.iter().enumerate() {
                // The root frame of a chain that ended normally may be a
                // runtime's entry point that nothing called (Go's goexit).
                let root_frame = i == last && (end == USER_END_ROOT || end == USER_END_OUTERMOST);
                if !r.check_and_push(ret, root_frame, out, &mut cut) {
                    break;
                }
            }
        }
        if cut.is_none() {
            cut = match end {
                USER_END_NOT_INCREASING => Some(Cut::NotIncreasing),
                USER_END_UNREADABLE => Some(Cut::Unreadable),
                _ => None,
            };
        }
        if let Some(c) = cut {
            self.unwind.cut[c.index()] += 1;
        }
        (info, cut)
    }

    /// The mapping a profile names for entry `map` of process `pid` (its
    /// file's facts read if they are not known and `allowed`).
    fn mapping_of(&mut self, pid: u32, map: &MapEntry, allowed: bool) -> (Mapping, bool) {
        if let Some(vdso) = self.vdso.as_ref().filter(|_| map.path == "[vdso]") {
            // In the image's own addresses, as for files.
            let mapping = Mapping {
                path: map.path.clone(),
                build_id: None,
                htlhash: false,
                content_sha256: None,
                start: vdso.base,
                limit: vdso.base.saturating_add(map.end - map.start),
                file_offset: 0,
                file: (0, 0),
            };
            return (mapping, true);
        }
        let mut binary = self.binaries.get(pid, map, &mut self.waiting, allowed);
        if binary.is_some() && self.binaries.hash_pending(map) {
            // Hashed from its first sample on (in the background: not
            // waited for), and looked up again in case it is there.
            self.binaries.start_hash(pid, map);
            binary = self.binaries.get(pid, map, &mut self.waiting, allowed);
        }
        let size = map.end - map.start;
        match binary {
            Some(b) => {
                // Kept once its content hash is there (a mapping without it
                // names nothing an agent published).
                let keep = !self.binaries.hash_pending(map);
                let start = b.vaddr_of_mapping(map.offset);
                let mapping = Mapping {
                    path: map.path.clone(),
                    build_id: b.build_id.clone().or_else(|| b.htlhash.clone()),
                    htlhash: b.build_id.is_none() && b.htlhash.is_some(),
                    content_sha256: b.content_sha256.clone(),
                    start,
                    limit: start.saturating_add(size),
                    file_offset: map.offset,
                    file: (map.dev, map.inode),
                };
                (mapping, keep)
            }
            // A file we could not read (yet) still has a name; its
            // addresses become file offsets, which equal virtual addresses
            // for most PIEs. Kept once its read is over (not while it is
            // under way: the next sample may have its facts).
            None if map.is_file() => {
                let mapping = Mapping {
                    path: map.path.clone(),
                    build_id: None,
                    htlhash: false,
                    content_sha256: None,
                    start: map.offset,
                    limit: map.offset.saturating_add(size),
                    file_offset: map.offset,
                    file: (map.dev, map.inode),
                };
                (mapping, self.binaries.settled(map))
            }
            None => {
                let mapping = Mapping {
                    path: if map.path.is_empty() {
                        "[anon]".to_owned()
                    } else {
                        map.path.clone()
                    },
                    build_id: None,
                    htlhash: false,
                    content_sha256: None,
                    start: map.start,
                    limit: map.end,
                    file_offset: 0,
                    file: (0, 0),
                };
                (mapping, true)
            }
        }
    }
}

/// One stack's resolution against one process.
pub(crate) struct Resolver<'a> {
    ctx: &'a mut Context,
    pid: u32,
    process: &'a mut Process,
    now: Instant,
}

impl Resolver<'_> {
    /// Whether the process may still cost the sampler thread new work.
    fn allowed(&mut self) -> bool {
        let ok = self.process.work.has(Instant::now());
        if !ok {
            self.ctx.contained.over_budget += 1;
        }
        ok
    }

    /// The frame of the instruction at `address`, `None` outside every
    /// executable mapping.
    pub(crate) fn frame(&mut self, address: u64) -> Option<Leaf> {
        let mut at = maps::find(&self.process.maps, address);
        let interval = if self.process.maps_reread {
            MAPS_MISS_INTERVAL
        } else {
            MAPS_FIRST_MISS_INTERVAL
        };
        if at.is_none() && self.now.duration_since(self.process.maps_read) > interval {
            self.ctx.reread(self.pid, self.process, self.now);
            at = maps::find(&self.process.maps, address);
        }
        let Some(i) = at else {
            // Outside every executable mapping: generated code the maps
            // did not show yet, maybe.
            let name = self.jit_symbol(address)?;
            return Some(Leaf {
                frame: UserFrame {
                    mapping: self.ctx.unknown.clone(),
                    address,
                    name: Some(name),
                },
                key: (0, 0),
                map: usize::MAX,
            });
        };
        let mapping = match &self.process.mappings[i] {
            Some(m) => m.clone(),
            None => {
                let allowed = self.allowed();
                let map = self.process.maps[i].clone();
                let (m, keep) = self.ctx.mapping_of(self.pid, &map, allowed);
                let m = Arc::new(m);
                self.ctx.binaries.offer_sampled(self.pid, &map);
                if keep {
                    self.process.mappings[i] = Some(m.clone());
                }
                m
            }
        };
        let map = &self.process.maps[i];
        let runtime_address = address;
        let (dev, inode) = (map.dev, map.inode);
        // Within the mapping: `address - map.start` fits its size.
        let address = (address - map.start).wrapping_add(mapping.start);
        let is_vdso = map.path == "[vdso]";
        let name = if is_vdso {
            self.ctx.vdso.as_ref().and_then(|v| v.name(address))
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
        let may_read = self.allowed();
        let p = &mut *self.process;
        let (shared, root, pid) = (&self.ctx.jit, &self.ctx.proc_root, self.pid);
        let jit = p.jit.get_or_insert_with(|| {
            let exe = p.info.executable_path.as_deref();
            Box::new(crate::jit::ProcessJit::new(shared, root, pid, exe, &p.maps))
        });
        jit.symbol(root, pid, &p.maps, address, self.now, may_read)
    }

    pub(crate) fn unknown_frame(&self, address: u64) -> UserFrame {
        UserFrame {
            mapping: self.ctx.unknown.clone(),
            address,
            name: None,
        }
    }

    /// The CFI rule at the leaf, `None` when its file has no usable CFI
    /// (or it is still being read).
    pub(crate) fn leaf_rule(&mut self, leaf: &Leaf) -> Option<LeafRule> {
        let address = leaf.frame.address;
        if leaf.key == VDSO_KEY {
            let Context {
                vdso, cfi, waiting, ..
            } = &mut *self.ctx;
            let vdso = vdso.as_ref()?;
            return cfi.rule(VDSO_KEY, address, waiting, || Ticket::ready(vdso.cfi()));
        }
        let map = self.process.maps.get(leaf.map)?.clone();
        if !map.is_file() {
            return None;
        }
        let allowed = self.allowed();
        let ctx = &mut *self.ctx;
        if !allowed {
            // Over its budget: the rules of a file read already only.
            return ctx.cfi.cached_rule(leaf.key, address);
        }
        let binary = ctx
            .binaries
            .get(self.pid, &map, &mut ctx.waiting, allowed)?;
        let (binaries, pid) = (&ctx.binaries, self.pid);
        ctx.cfi.rule(leaf.key, address, &mut ctx.waiting, || {
            binaries.load_cfi(pid, &map, &binary)
        })
    }

    /// The stack walked from its snapshot by each file's CFI (frame
    /// pointers where a file has none), into `out` after `leaf`, when the
    /// walk reaches the stack's end; `None` (nothing pushed) when it does
    /// not: the BPF walk's chain is used then. The cut, if a return address
    /// fails its check.
    fn walk_snapshot(
        &mut self,
        snap: &crate::snapshot::Snapshot<'_>,
        leaf: UserFrame,
        out: &mut Vec<UserFrame>,
    ) -> Option<Option<Cut>> {
        let (returns, end) =
            crate::snapshot::walk(snap, record::USER_STACK_DEPTH - 1, |depth, ip| {
                let frame = self.frame(record::call_site(depth, ip))?;
                self.leaf_rule(&frame)
            });
        if !end.whole() {
            self.ctx.unwind.snapshots_cut += 1;
            tracing::debug!(
                pid = self.pid,
                ?end,
                depth = returns.len(),
                bytes = snap.data.len(),
                "a stack copy's walk did not reach the stack's end: {:x?}",
                &returns[..returns.len().min(6)]
            );
            return None;
        }
        self.ctx.unwind.snapshots_whole += 1;
        out.push(leaf);
        self.prefetch_code(&returns);
        let mut cut = None;
        let last = returns.len().saturating_sub(1);
        for (i, &ret) in returns.iter().enumerate() {
            if !self.check_and_push(ret, i == last, out, &mut cut) {
                break;
            }
        }
        Some(cut)
    }

    /// The cache key of the check of return address `ret` in frame
    /// `caller`.
    fn check_key(&self, caller: &Leaf, ret: u64) -> (u64, u64, u64) {
        match caller.key {
            (0, 0) => (ANON_KEY, u64::from(self.pid), ret),
            (dev, inode) => (dev, inode, caller.frame.address.wrapping_add(1)),
        }
    }

    /// Reads, in one job, the code around the return addresses of `chain`
    /// whose checks are not cached (within the process's budget).
    fn prefetch_code(&mut self, chain: &[u64]) {
        let mut wanted: Vec<((u64, u64, u64), u64)> = Vec::new();
        for &ret in chain {
            let Some(caller) = self.frame(call_site(1, ret)) else {
                break;
            };
            let key = self.check_key(&caller, ret);
            if !self.ctx.code_checks.contains_key(&key) && !wanted.iter().any(|(k, _)| *k == key) {
                wanted.push((key, ret));
            }
        }
        // Not queued behind a backlog: the checks are then skipped (and
        // counted), the frames kept.
        if wanted.is_empty() || !self.allowed() || self.ctx.pool.urgent_queued() > MAX_BACKLOG {
            return;
        }
        let pid = self.pid;
        let addresses: Vec<u64> = wanted.iter().map(|&(_, r)| r).collect();
        let ticket = self.ctx.pool.submit(About { pid, dev: 0 }, move || {
            addresses
                .iter()
                .map(|&ret| read_code(pid, ret))
                .collect::<Vec<_>>()
        });
        let Some(Ok(codes)) = self.ctx.waiting.wait(&ticket) else {
            return;
        };
        for ((key, _), code) in wanted.into_iter().zip(codes) {
            let ok = match code {
                Some(code) => {
                    unwind::after_call(&code[..unwind::CODE_BEFORE])
                        || unwind::is_sigreturn(&code[unwind::CODE_BEFORE..])
                }
                // The process is gone (or the page is not readable): the
                // address is in its code, which is all that can be checked.
                None => continue,
            };
            if self.ctx.code_checks.len() >= CODE_CHECKS_MAX {
                self.ctx.code_checks.clear();
            }
            self.ctx.code_checks.insert(key, ok);
        }
    }

    /// Checks a return address and pushes its frame; on a failed check sets
    /// `cut` and returns false.
    pub(crate) fn check_and_push(
        &mut self,
        ret: u64,
        root_frame: bool,
        out: &mut Vec<UserFrame>,
        cut: &mut Option<Cut>,
    ) -> bool {
        let Some(caller) = self.frame(call_site(1, ret)) else {
            *cut = Some(Cut::OutsideCode);
            return false;
        };
        let key = self.check_key(&caller, ret);
        if !self.ctx.code_checks.contains_key(&key) {
            self.prefetch_code(&[ret]);
        }
        let ok = match self.ctx.code_checks.get(&key) {
            Some(&ok) => ok,
            // Not read (the process is gone, the page is not readable, the
            // read was refused or is late): the address is in its code,
            // which is all that can be checked — unless it is in no mapping
            // (a JIT symbol of code freed since: perf maps never forget).
            None => {
                self.ctx.contained.unchecked_returns += 1;
                caller.map != usize::MAX
            }
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
/// before it and `CODE_AFTER` from it (one `process_vm_readv`; in a job:
/// the page may be a file's that its filesystem must fetch).
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
