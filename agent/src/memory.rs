//! Memory allocation profiles from the `otel_memory` probes' records: the
//! sampled allocations of an interval, added up per site (stack, thread,
//! span) for the `alloc_space`/`alloc_objects` profiles, and the ones not
//! yet freed — their site and weight — for the `inuse_space`/
//! `inuse_objects` snapshot taken at every export. The BPF side keeps the
//! same live set (it reports a free only for an allocation it tracks), so
//! this one is bounded by its map.
//!
//! A record costs a hash lookup or two here: its stack is resolved once per
//! interval (by the raw addresses the BPF program took), and nothing is
//! built per record for the export — sites are made once per interval.

use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::process::{ProcessInfo, UserFrame};
use crate::record::{CpuSample, TraceCtx};
use crate::unwind::Cut;

/// A resolved allocation stack of a process; shared by the sites (threads,
/// spans) that allocate from it.
pub struct Stack {
    pub process: Arc<ProcessInfo>,
    pub user: Vec<UserFrame>,
    pub cut: Option<Cut>,
}

/// Where allocations were made: their stack, thread and span.
pub struct Site {
    pub stack: Arc<Stack>,
    pub thread_name: String,
    pub trace: TraceCtx,
}

/// Stacks by their raw record (pid and stack as the BPF program took it)
/// held at most; beyond, the cache starts over.
const MAX_RAW_STACKS: usize = 65_536;

/// A site's identity: the stack (by address: the `Arc` is held with it),
/// the thread name and the thread context's bytes as the BPF program
/// copied them (zeroed first, so equal contexts are equal bytes).
type SiteKey = (usize, [u8; 16], [u8; std::mem::size_of::<TraceCtx>()]);

fn trace_bytes(trace: &TraceCtx) -> [u8; std::mem::size_of::<TraceCtx>()] {
    // SAFETY: TraceCtx is plain old data (integers and byte arrays, no
    // padding: its layout is checked against bpf/sample.h).
    unsafe { std::mem::transmute_copy(trace) }
}

fn site_key(stack: &Arc<Stack>, comm: &[u8; 16], trace: &TraceCtx) -> SiteKey {
    (Arc::as_ptr(stack) as usize, *comm, trace_bytes(trace))
}

/// What a site adds up to.
struct Sum {
    stack: Arc<Stack>,
    comm: [u8; 16],
    trace: TraceCtx,
    /// The latest allocation's time (allocated sums only).
    latest_ns: u64,
    bytes: u64,
    objects: f64,
}

impl Sum {
    fn site(self) -> (Site, u64, i64, i64) {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(16);
        let site = Site {
            stack: self.stack,
            thread_name: String::from_utf8_lossy(&self.comm[..end]).into_owned(),
            trace: self.trace,
        };
        let bytes = self.bytes.min(i64::MAX as u64) as i64;
        (site, self.latest_ns, bytes, self.objects.round() as i64)
    }
}

fn add(
    sums: &mut HashMap<SiteKey, Sum>,
    stack: &Arc<Stack>,
    comm: &[u8; 16],
    trace: &TraceCtx,
    unix_ns: u64,
    weight: u64,
    objects: f64,
) {
    let e = sums
        .entry(site_key(stack, comm, trace))
        .or_insert_with(|| Sum {
            stack: stack.clone(),
            comm: *comm,
            trace: *trace,
            latest_ns: unix_ns,
            bytes: 0,
            objects: 0.0,
        });
    e.latest_ns = e.latest_ns.max(unix_ns);
    e.bytes = e.bytes.saturating_add(weight);
    e.objects += objects;
}

struct LiveAlloc {
    stack: Arc<Stack>,
    comm: [u8; 16],
    trace: TraceCtx,
    /// Bytes it stands for.
    weight: u64,
    /// Allocations it stands for (`weight / size`).
    objects: f64,
}

/// A sampled allocation as the collector hands it over.
pub struct Sampled<'a> {
    pub stack: &'a Arc<Stack>,
    pub comm: &'a [u8; 16],
    pub trace: &'a TraceCtx,
    pub unix_ns: u64,
    pub ptr: u64,
    pub size: u64,
    pub weight: u64,
    /// The BPF side tracks it as live (it will report its free).
    pub tracked: bool,
}

/// The interval's sampled allocations and the live ones.
#[derive(Default)]
pub struct Memory {
    live: HashMap<(u32, u64), LiveAlloc>,
    allocated: HashMap<SiteKey, Sum>,
    /// Resolved stacks by raw record, for this interval: an allocation
    /// from a stack seen before is not resolved again (mappings that change
    /// within an interval are rare; an exec or exit drops its process's
    /// entries).
    raw: HashMap<Vec<u8>, Arc<Stack>>,
    /// The processes `raw` holds entries of.
    raw_pids: HashSet<u32>,
    /// Frees of allocations not known here (recorded before the agent
    /// started reading, or whose allocation record was lost).
    pub unknown_frees: u64,
}

/// The allocations a sampled one of `size` bytes with weight `weight`
/// stands for: weight / size (at least one; an empty block counts one).
fn objects(size: u64, weight: u64) -> f64 {
    if size == 0 {
        return 1.0;
    }
    (weight as f64 / size as f64).max(1.0)
}

impl Memory {
    /// The resolved stack of a raw record seen before in this interval.
    pub fn cached(&self, raw: &[u8]) -> Option<Arc<Stack>> {
        self.raw.get(raw).cloned()
    }

    /// Remembers the resolved stack of a raw record of process `pid`.
    pub fn cache(&mut self, pid: u32, raw: Vec<u8>, stack: &Arc<Stack>) {
        if self.raw.len() >= MAX_RAW_STACKS {
            self.raw.clear();
            self.raw_pids.clear();
        }
        self.raw_pids.insert(pid);
        self.raw.insert(raw, stack.clone());
    }

    /// A sampled allocation of process `pid`.
    pub fn alloc(&mut self, pid: u32, a: &Sampled<'_>) {
        let objects = objects(a.size, a.weight);
        add(
            &mut self.allocated,
            a.stack,
            a.comm,
            a.trace,
            a.unix_ns,
            a.weight,
            objects,
        );
        if a.tracked {
            self.live.insert(
                (pid, a.ptr),
                LiveAlloc {
                    stack: a.stack.clone(),
                    comm: *a.comm,
                    trace: *a.trace,
                    weight: a.weight,
                    objects,
                },
            );
        }
    }

    pub fn free(&mut self, pid: u32, ptr: u64) {
        if self.live.remove(&(pid, ptr)).is_none() {
            self.unknown_frees += 1;
        }
    }

    /// A process exited or exec'd: its allocations are gone. Returns their
    /// pointers (for the BPF side's map).
    pub fn forget_process(&mut self, pid: u32) -> Vec<u64> {
        if self.raw_pids.remove(&pid) {
            self.raw.retain(|k, _| k[..4] != pid.to_ne_bytes());
        }
        let ptrs: Vec<u64> = self
            .live
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|&(_, ptr)| ptr)
            .collect();
        for ptr in &ptrs {
            self.live.remove(&(pid, *ptr));
        }
        ptrs
    }

    /// Live allocations held.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether (pid, pointer) is live.
    pub fn has(&self, pid: u32, ptr: u64) -> bool {
        self.live.contains_key(&(pid, ptr))
    }

    /// Ends the interval: what was allocated per site, as (site, latest
    /// allocation's time, bytes, objects), and what is live per site, as
    /// (site, bytes, objects). The cache of raw records starts over.
    #[allow(clippy::type_complexity)]
    pub fn take(&mut self) -> (Vec<(Site, u64, i64, i64)>, Vec<(Site, i64, i64)>) {
        self.raw.clear();
        self.raw_pids.clear();
        let allocated = std::mem::take(&mut self.allocated)
            .into_values()
            .map(Sum::site)
            .collect();
        let mut live: HashMap<SiteKey, Sum> = HashMap::default();
        for a in self.live.values() {
            add(
                &mut live, &a.stack, &a.comm, &a.trace, 0, a.weight, a.objects,
            );
        }
        let live = live
            .into_values()
            .map(|s| {
                let (site, _, bytes, objects) = s.site();
                (site, bytes, objects)
            })
            .collect();
        (allocated, live)
    }
}

/// The raw key of an allocation record's stack, as the BPF program wrote
/// it (pid first).
pub fn raw_key(s: &CpuSample) -> Vec<u8> {
    let chain = s.user_stack();
    let mut key = Vec::with_capacity(8 + 8 * chain.len());
    key.extend_from_slice(&s.pid.to_ne_bytes());
    key.extend_from_slice(&s.user_end.to_ne_bytes());
    for a in chain {
        key.extend_from_slice(&a.to_ne_bytes());
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Mapping;

    fn stack(process: &Arc<ProcessInfo>, addresses: &[u64]) -> Arc<Stack> {
        let mapping = Arc::new(Mapping {
            path: "/bin/x".into(),
            build_id: None,
            htlhash: false,
            content_sha256: None,
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
            file: (0, 0),
        });
        Arc::new(Stack {
            process: process.clone(),
            user: addresses
                .iter()
                .map(|&address| UserFrame {
                    mapping: mapping.clone(),
                    address,
                    name: None,
                })
                .collect(),
            cut: None,
        })
    }

    fn span(id: u8) -> TraceCtx {
        let mut trace = TraceCtx::default();
        if id != 0 {
            trace.valid = 1;
            trace.trace_id = [1; 16];
            trace.span_id = [id; 8];
        }
        trace
    }

    const MAIN: [u8; 16] = *b"main\0\0\0\0\0\0\0\0\0\0\0\0";

    fn sampled<'a>(
        stack: &'a Arc<Stack>,
        trace: &'a TraceCtx,
        ptr: u64,
        size: u64,
        weight: u64,
    ) -> Sampled<'a> {
        Sampled {
            stack,
            comm: &MAIN,
            trace,
            unix_ns: ptr,
            ptr,
            size,
            weight,
            tracked: true,
        }
    }

    #[test]
    fn allocations_add_up_per_site_and_the_live_ones_are_kept() {
        let p = Arc::new(ProcessInfo {
            pid: 7,
            ..Default::default()
        });
        let (s12, s3) = (stack(&p, &[1, 2]), stack(&p, &[3]));
        let (none, five) = (span(0), span(5));
        let mut m = Memory::default();
        m.alloc(7, &sampled(&s12, &none, 0x10, 64, 512 << 10));
        m.alloc(7, &sampled(&s12, &none, 0x20, 64, 512 << 10));
        m.alloc(7, &sampled(&s12, &five, 0x30, 64, 512 << 10));
        m.alloc(7, &sampled(&s3, &none, 0x40, 1 << 20, 1 << 20));
        m.free(7, 0x20);
        m.free(7, 0x99);
        assert_eq!(m.unknown_frees, 1);
        assert_eq!(m.len(), 3);
        let (allocated, live) = m.take();
        // Allocated: three sites (the span's is its own), each added up,
        // at its latest allocation's time.
        assert_eq!(allocated.len(), 3);
        let plain = allocated
            .iter()
            .find(|(s, ..)| Arc::ptr_eq(&s.stack, &s12) && s.trace.ids().is_none())
            .unwrap();
        assert_eq!((plain.1, plain.2, plain.3), (0x20, 1 << 20, 16_384));
        assert_eq!(plain.0.thread_name, "main");
        // Live: what was not freed.
        let mut bytes: Vec<(i64, i64)> = live.iter().map(|(_, b, o)| (*b, *o)).collect();
        bytes.sort();
        assert_eq!(
            bytes,
            vec![(512 << 10, 8192), (512 << 10, 8192), (1 << 20, 1)]
        );
        // The next interval starts empty but keeps what is live.
        let (allocated, live) = m.take();
        assert!(allocated.is_empty());
        assert_eq!(live.len(), 3);
        assert_eq!(m.forget_process(7).len(), 3);
        assert_eq!(m.len(), 0);
        assert!(m.take().1.is_empty());
    }

    #[test]
    fn raw_records_seen_before_find_their_stack_within_an_interval() {
        let p = Arc::new(ProcessInfo {
            pid: 7,
            ..Default::default()
        });
        let mut m = Memory::default();
        // SAFETY: CpuSample is plain old data; all zeroes is a valid one.
        let mut record: CpuSample = unsafe { std::mem::zeroed() };
        record.pid = 7;
        record.user[..2].copy_from_slice(&[0x1000, 0x2000]);
        record.user_frames = 2;
        let raw = raw_key(&record);
        assert!(m.cached(&raw).is_none());
        let a = stack(&p, &[0x1000, 0x1fff]);
        m.cache(7, raw.clone(), &a);
        assert!(Arc::ptr_eq(&m.cached(&raw).unwrap(), &a));
        // Another stack or process is another key; another span is not
        // (the stack is the same).
        record.user[1] = 0x3000;
        assert!(m.cached(&raw_key(&record)).is_none());
        record.user[1] = 0x2000;
        record.trace.span_id = [1; 8];
        assert_eq!(raw_key(&record), raw);
        record.pid = 8;
        assert_ne!(raw_key(&record), raw);
        // The process exec'd or exited: its entries go; an interval ends:
        // all go.
        m.forget_process(7);
        assert!(m.cached(&raw).is_none());
        m.cache(7, raw.clone(), &a);
        m.take();
        assert!(m.cached(&raw).is_none());
    }

    #[test]
    fn objects_a_sample_stands_for() {
        assert_eq!(objects(64, 512 << 10), 8192.0);
        assert_eq!(objects(0, 512 << 10), 1.0);
        assert_eq!(objects(3 << 20, 2 << 20), 1.0, "at least the one seen");
    }
}
