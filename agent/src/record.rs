//! The ring-buffer records of `bpf/sample.h`, byte for byte.

use std::mem::{offset_of, size_of};

// USER_STACK_DEPTH, KERNEL_STACK_DEPTH, USER_STACK_WINDOW, TRACE_CTX_ATTRS,
// the record kinds, `enum user_stack_end` and `enum counter`: one source,
// bpf/sample.h (build.rs).
#[allow(dead_code)] // every constant of the header, used or not
mod layout {
    include!(concat!(env!("OUT_DIR"), "/sample_h.rs"));
}
pub use layout::*;

/// `struct trace_ctx`: the OTEP 4947 record header and the first attribute
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceCtx {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub valid: u8,
    pub trace_flags: u8,
    pub attrs_size: u16,
    pub attrs: [u8; TRACE_CTX_ATTRS],
}

impl Default for TraceCtx {
    fn default() -> Self {
        Self {
            trace_id: [0; 16],
            span_id: [0; 8],
            valid: 0,
            trace_flags: 0,
            attrs_size: 0,
            attrs: [0; TRACE_CTX_ATTRS],
        }
    }
}

impl TraceCtx {
    /// The IDs when a span was active (valid record, non-zero IDs).
    pub fn ids(&self) -> Option<([u8; 16], [u8; 8])> {
        (self.valid == 1 && self.trace_id != [0; 16] && self.span_id != [0; 8])
            .then_some((self.trace_id, self.span_id))
    }

    /// The attributes copied: `(key index, value)`, complete ones only.
    pub fn attributes(&self) -> Vec<(u8, String)> {
        let data = &self.attrs[..(self.attrs_size as usize).min(TRACE_CTX_ATTRS)];
        let mut out = Vec::new();
        let mut at = 0;
        while at + 2 <= data.len() {
            let (key, len) = (data[at], data[at + 1] as usize);
            let Some(value) = data.get(at + 2..at + 2 + len) else {
                break; // cut by the copy limit
            };
            out.push((key, String::from_utf8_lossy(value).into_owned()));
            at += 2 + len;
        }
        out
    }
}

/// `struct cpu_sample`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuSample {
    pub kind: u32,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub boot_ns: u64,
    pub user_frames: u32,
    pub user_end: u32,
    pub kernel_bytes: i32,
    pub window_bytes: u32,
    pub comm: [u8; 16],
    pub user_sp: u64,
    pub user_bp: u64,
    pub trace: TraceCtx,
    pub window: [u8; USER_STACK_WINDOW],
    pub user: [u64; USER_STACK_DEPTH],
    pub kernel: [u64; KERNEL_STACK_DEPTH],
}

/// The checks of bpf/sample.h's `LAYOUT_` numbers, on this side: a change
/// to the C structs or to these alone fails one of the two builds.
macro_rules! layout_check {
    ($value:expr, $expected:expr) => {
        const _: () = assert!(
            $value == $expected,
            concat!(
                "src/record.rs: ",
                stringify!($value),
                " does not match bpf/sample.h's ",
                stringify!($expected)
            )
        );
    };
}
layout_check!(size_of::<TraceCtx>(), LAYOUT_TRACE_CTX_SIZE);
layout_check!(offset_of!(TraceCtx, trace_id), LAYOUT_TRACE_CTX_TRACE_ID);
layout_check!(offset_of!(TraceCtx, span_id), LAYOUT_TRACE_CTX_SPAN_ID);
layout_check!(offset_of!(TraceCtx, valid), LAYOUT_TRACE_CTX_VALID);
layout_check!(
    offset_of!(TraceCtx, trace_flags),
    LAYOUT_TRACE_CTX_TRACE_FLAGS
);
layout_check!(
    offset_of!(TraceCtx, attrs_size),
    LAYOUT_TRACE_CTX_ATTRS_SIZE
);
layout_check!(offset_of!(TraceCtx, attrs), LAYOUT_TRACE_CTX_ATTRS);
layout_check!(size_of::<CpuSample>(), LAYOUT_CPU_SAMPLE_SIZE);
layout_check!(offset_of!(CpuSample, kind), LAYOUT_CPU_SAMPLE_KIND);
layout_check!(offset_of!(CpuSample, cpu), LAYOUT_CPU_SAMPLE_CPU);
layout_check!(offset_of!(CpuSample, pid), LAYOUT_CPU_SAMPLE_PID);
layout_check!(offset_of!(CpuSample, tid), LAYOUT_CPU_SAMPLE_TID);
layout_check!(offset_of!(CpuSample, boot_ns), LAYOUT_CPU_SAMPLE_BOOT_NS);
layout_check!(
    offset_of!(CpuSample, user_frames),
    LAYOUT_CPU_SAMPLE_USER_FRAMES
);
layout_check!(offset_of!(CpuSample, user_end), LAYOUT_CPU_SAMPLE_USER_END);
layout_check!(
    offset_of!(CpuSample, kernel_bytes),
    LAYOUT_CPU_SAMPLE_KERNEL_BYTES
);
layout_check!(
    offset_of!(CpuSample, window_bytes),
    LAYOUT_CPU_SAMPLE_WINDOW_BYTES
);
layout_check!(offset_of!(CpuSample, comm), LAYOUT_CPU_SAMPLE_COMM);
layout_check!(offset_of!(CpuSample, user_sp), LAYOUT_CPU_SAMPLE_USER_SP);
layout_check!(offset_of!(CpuSample, user_bp), LAYOUT_CPU_SAMPLE_USER_BP);
layout_check!(offset_of!(CpuSample, trace), LAYOUT_CPU_SAMPLE_TRACE);
layout_check!(offset_of!(CpuSample, window), LAYOUT_CPU_SAMPLE_WINDOW);
layout_check!(offset_of!(CpuSample, user), LAYOUT_CPU_SAMPLE_USER);
layout_check!(offset_of!(CpuSample, kernel), LAYOUT_CPU_SAMPLE_KERNEL);
layout_check!(size_of::<StackSnapshotHeader>(), LAYOUT_STACK_SNAPSHOT_DATA);
layout_check!(
    offset_of!(StackSnapshotHeader, boot_ns),
    LAYOUT_STACK_SNAPSHOT_BOOT_NS
);
layout_check!(
    offset_of!(StackSnapshotHeader, sp),
    LAYOUT_STACK_SNAPSHOT_SP
);
layout_check!(
    offset_of!(StackSnapshotHeader, bytes),
    LAYOUT_STACK_SNAPSHOT_BYTES
);
layout_check!(
    LAYOUT_STACK_SNAPSHOT_DATA + STACK_SNAPSHOT_BYTES,
    LAYOUT_STACK_SNAPSHOT_SIZE
);
layout_check!(size_of::<ProcessEvent>(), LAYOUT_PROCESS_EVENT_SIZE);
layout_check!(offset_of!(ProcessEvent, kind), LAYOUT_PROCESS_EVENT_KIND);
layout_check!(offset_of!(ProcessEvent, pid), LAYOUT_PROCESS_EVENT_PID);
layout_check!(size_of::<OffCpuEnd>(), LAYOUT_OFF_CPU_END_SIZE);
layout_check!(offset_of!(OffCpuEnd, kind), LAYOUT_OFF_CPU_END_KIND);
layout_check!(offset_of!(OffCpuEnd, tid), LAYOUT_OFF_CPU_END_TID);
layout_check!(offset_of!(OffCpuEnd, start_ns), LAYOUT_OFF_CPU_END_START_NS);
layout_check!(offset_of!(OffCpuEnd, end_ns), LAYOUT_OFF_CPU_END_END_NS);
layout_check!(size_of::<UsdtArgSpec>(), LAYOUT_USDT_ARG_SIZE);
layout_check!(offset_of!(UsdtArgSpec, value), LAYOUT_USDT_ARG_VALUE);
layout_check!(offset_of!(UsdtArgSpec, kind), LAYOUT_USDT_ARG_KIND);
layout_check!(offset_of!(UsdtArgSpec, reg_off), LAYOUT_USDT_ARG_REG_OFF);
layout_check!(offset_of!(UsdtArgSpec, size), LAYOUT_USDT_ARG_SIZE_FIELD);
layout_check!(size_of::<ThreadCtxLoc>(), LAYOUT_THREAD_CTX_LOC_SIZE);
layout_check!(offset_of!(ThreadCtxLoc, got), LAYOUT_THREAD_CTX_LOC_GOT);
layout_check!(
    offset_of!(ThreadCtxLoc, tls_offset),
    LAYOUT_THREAD_CTX_LOC_TLS_OFFSET
);
layout_check!(offset_of!(ThreadCtxLoc, kind), LAYOUT_THREAD_CTX_LOC_KIND);
layout_check!(size_of::<UsdtSpec>(), LAYOUT_USDT_SPEC_SIZE);
layout_check!(offset_of!(UsdtSpec, probe), LAYOUT_USDT_SPEC_PROBE);
layout_check!(size_of::<AllocSample>(), LAYOUT_ALLOC_SAMPLE_SIZE);
layout_check!(offset_of!(AllocSample, ptr), LAYOUT_ALLOC_SAMPLE_PTR);
layout_check!(
    offset_of!(AllocSample, size),
    LAYOUT_ALLOC_SAMPLE_SIZE_FIELD
);
layout_check!(offset_of!(AllocSample, weight), LAYOUT_ALLOC_SAMPLE_WEIGHT);
layout_check!(
    offset_of!(AllocSample, tracked),
    LAYOUT_ALLOC_SAMPLE_TRACKED
);
layout_check!(size_of::<AllocFree>(), LAYOUT_ALLOC_FREE_SIZE);
layout_check!(offset_of!(AllocFree, kind), LAYOUT_ALLOC_FREE_KIND);
layout_check!(offset_of!(AllocFree, pid), LAYOUT_ALLOC_FREE_PID);
layout_check!(offset_of!(AllocFree, ptr), LAYOUT_ALLOC_FREE_PTR);
layout_check!(size_of::<LiveKey>(), LAYOUT_LIVE_KEY_SIZE);
layout_check!(size_of::<UnwindRule>(), LAYOUT_UNWIND_RULE_SIZE);
layout_check!(offset_of!(UnwindRule, kind), LAYOUT_UNWIND_RULE_KIND);
layout_check!(size_of::<UnwindRow>(), LAYOUT_UNWIND_ROW_SIZE);
layout_check!(size_of::<UnwindFile>(), LAYOUT_UNWIND_FILE_SIZE);
layout_check!(size_of::<UnwindRange>(), LAYOUT_UNWIND_RANGE_SIZE);
layout_check!(offset_of!(UnwindRange, file), LAYOUT_UNWIND_RANGE_FILE);
layout_check!(size_of::<UnwindProc>(), LAYOUT_UNWIND_PROC_SIZE);
layout_check!(offset_of!(UnwindProc, gen), LAYOUT_UNWIND_PROC_GEN);
layout_check!(offset_of!(UnwindProc, ranges), LAYOUT_UNWIND_PROC_RANGES);

/// `struct unwind_rule`: how to leave a function (issue #40).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRule {
    pub cfa: i32,
    pub ra: i32,
    pub rbp: i32,
    pub kind: u8,
    pub rbp_saved: u8,
    pub pad: u16,
}

/// `struct unwind_row`: a range of a file's table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub start: u32,
    pub rule: u32,
}

/// `struct unwind_file`: where a file's rows are in the pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindFile {
    pub first: u32,
    pub count: u32,
    pub flags: u32,
    pub pages: u32,
}

/// `struct unwind_range`: a process's mapping of a file with a table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRange {
    pub start: u64,
    pub adjust: u64,
    pub len: u32,
    pub file: u32,
}

/// `struct unwind_proc`: a process's mappings with tables, sorted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindProc {
    pub count: u32,
    /// Changed at each write of a process's ranges: the BPF walk's rule
    /// memo holds an entry only while it stays (`struct rule_memo`).
    pub gen: u32,
    pub ranges: [UnwindRange; UNWIND_PROC_RANGES],
}

/// `struct stack_snapshot` up to its data: the user stack of the on-CPU
/// sample that follows it (same CPU and time), from `sp` up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackSnapshotHeader {
    pub kind: u32,
    pub cpu: u32,
    pub boot_ns: u64,
    pub sp: u64,
    pub bytes: u32,
    pub pad: u32,
}

/// A stack snapshot as read: its header and the bytes read (at most
/// `STACK_SNAPSHOT_BYTES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSnapshot {
    pub cpu: u32,
    pub boot_ns: u64,
    pub sp: u64,
    pub data: Vec<u8>,
}

/// `struct process_event_record`: an exec or exit.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessEvent {
    pub kind: u32,
    pub pid: u32,
}

/// `struct off_cpu_end`: a thread whose switch-out was recorded ran again.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuEnd {
    pub kind: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// `struct usdt_arg`: where a USDT argument is at the probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArgSpec {
    pub value: i64,
    pub kind: u32,
    pub reg_off: u16,
    pub size: i8,
    pub pad: u8,
}

/// `struct usdt_spec`: a probe site's probe and arguments.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    pub args: [UsdtArgSpec; USDT_ARGS],
    pub probe: u32,
    pub pad: u32,
}

/// `struct thread_ctx_loc`: how a process's threads reach their OTEP 4947
/// slot (the value of the BPF map `thread_ctx_offsets`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCtxLoc {
    pub tp_offset: i64,
    pub got: u64,
    pub tls_offset: u64,
    pub kind: u32,
    pub pad: u32,
}

/// `struct alloc_sample`: a sampled allocation's stacks, context and
/// arguments.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocSample {
    pub sample: CpuSample,
    pub ptr: u64,
    pub size: u64,
    pub weight: u64,
    pub tracked: u32,
    pub pad: u32,
}

/// `struct alloc_free`: a tracked allocation was freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocFree {
    pub kind: u32,
    pub pid: u32,
    pub ptr: u64,
}

/// `struct live_key`: the live-allocation map's key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveKey {
    pub pid: u32,
    pub pad: u32,
    pub ptr: u64,
}

/// A record as read from the ring buffer.
pub enum Record {
    Sample(Box<CpuSample>),
    Exec(u32),
    Exit(u32),
    /// A blocked thread's switch-out: its stacks and context, `boot_ns`
    /// the time it left the CPU.
    OffCpuStart(Box<CpuSample>),
    OffCpuEnd(OffCpuEnd),
    /// A sampled allocation.
    Alloc(Box<AllocSample>),
    /// A tracked allocation was freed.
    Free(AllocFree),
    /// The user stack of the on-CPU sample that follows it (same CPU and
    /// time).
    Snapshot(StackSnapshot),
}

impl Record {
    /// The process the record is about (0 for an off-CPU end, which names
    /// only its thread).
    pub fn pid(&self) -> u32 {
        match self {
            Record::Sample(s) | Record::OffCpuStart(s) => s.pid,
            Record::Exec(pid) | Record::Exit(pid) => *pid,
            Record::OffCpuEnd(_) => 0,
            Record::Alloc(a) => a.sample.pid,
            Record::Free(f) => f.pid,
            Record::Snapshot(_) => 0,
        }
    }

    /// Reads a record; `None` for a record of an unknown kind or size (a
    /// BPF object of another layout: a bug, counted by the caller). A sample
    /// is exactly `sizeof(struct cpu_sample)` bytes: the ring buffer hands
    /// out what the program reserved.
    pub fn parse(bytes: &[u8]) -> Option<Record> {
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let sample = || {
            // SAFETY: CpuSample is plain old data (integers and byte
            // arrays, every bit pattern valid) and `bytes` holds exactly
            // one; read_unaligned makes no alignment assumption.
            Box::new(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<CpuSample>()) })
        };
        let is_sample = bytes.len() == size_of::<CpuSample>();
        match word(0)? {
            RECORD_SAMPLE if is_sample => Some(Record::Sample(sample())),
            RECORD_OFF_CPU_START if is_sample => Some(Record::OffCpuStart(sample())),
            RECORD_OFF_CPU_END if bytes.len() == size_of::<OffCpuEnd>() => {
                // SAFETY: as above, OffCpuEnd is integers only.
                let end = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<OffCpuEnd>()) };
                Some(Record::OffCpuEnd(end))
            }
            RECORD_ALLOC if bytes.len() == size_of::<AllocSample>() => {
                // SAFETY: as a sample: integers and byte arrays only.
                Some(Record::Alloc(Box::new(unsafe {
                    std::ptr::read_unaligned(bytes.as_ptr().cast::<AllocSample>())
                })))
            }
            RECORD_FREE if bytes.len() == size_of::<AllocFree>() => {
                // SAFETY: integers only.
                let f = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<AllocFree>()) };
                Some(Record::Free(f))
            }
            RECORD_STACK_SNAPSHOT if bytes.len() == LAYOUT_STACK_SNAPSHOT_SIZE => {
                // SAFETY: the header is integers only, and `bytes` is longer.
                let h = unsafe {
                    std::ptr::read_unaligned(bytes.as_ptr().cast::<StackSnapshotHeader>())
                };
                let n = (h.bytes as usize).min(STACK_SNAPSHOT_BYTES);
                let data = bytes.get(LAYOUT_STACK_SNAPSHOT_DATA..)?.get(..n)?.to_vec();
                Some(Record::Snapshot(StackSnapshot {
                    cpu: h.cpu,
                    boot_ns: h.boot_ns,
                    sp: h.sp,
                    data,
                }))
            }
            RECORD_EXEC => Some(Record::Exec(word(offset_of!(ProcessEvent, pid))?)),
            RECORD_EXIT => Some(Record::Exit(word(offset_of!(ProcessEvent, pid))?)),
            _ => None,
        }
    }
}

impl CpuSample {
    /// The user stack: the user `%rip`, then the frame-pointer chain's
    /// return addresses, leaf first (empty for a kernel thread).
    pub fn user_stack(&self) -> &[u64] {
        let n = (self.user_frames as usize).min(USER_STACK_DEPTH);
        let frames = &self.user[..n];
        let end = frames.iter().position(|&a| a == 0).unwrap_or(n);
        &frames[..end]
    }

    /// The bytes of the user stack from `user_sp` up.
    pub fn window(&self) -> &[u8] {
        &self.window[..(self.window_bytes as usize).min(USER_STACK_WINDOW)]
    }

    pub fn kernel_stack(&self) -> &[u64] {
        frames(&self.kernel, self.kernel_bytes)
    }

    /// The thread name (`comm`), up to its NUL.
    pub fn thread_name(&self) -> String {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }
}

/// The address to name for frame `depth` (0 = leaf) of a stack of return
/// addresses: a caller's return address is moved back one byte, into its
/// call instruction, so that line and inline lookups name the call site.
pub fn call_site(depth: usize, address: u64) -> u64 {
    if depth == 0 {
        address
    } else {
        address.saturating_sub(1)
    }
}

fn frames(all: &[u64], bytes: i32) -> &[u64] {
    let n = (bytes.max(0) as usize / 8).min(all.len());
    let frames = &all[..n];
    // bpf_get_stack pads nothing, but a walk can end on a zero frame.
    let end = frames.iter().position(|&a| a == 0).unwrap_or(n);
    &frames[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sample_and_its_stacks() {
        let mut s: CpuSample = unsafe { std::mem::zeroed() };
        s.kind = RECORD_SAMPLE;
        s.pid = 42;
        s.tid = 43;
        s.comm[..4].copy_from_slice(b"work");
        s.user[..4].copy_from_slice(&[0x1000, 0x2000, 0x3000, 0]);
        s.user_frames = 4;
        s.window_bytes = 8;
        s.window[..8].copy_from_slice(&7u64.to_ne_bytes());
        s.kernel_bytes = -14; // -EFAULT: sampled in user mode
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&s as *const CpuSample).cast::<u8>(),
                std::mem::size_of::<CpuSample>(),
            )
        };
        let Some(Record::Sample(parsed)) = Record::parse(bytes) else {
            panic!("not parsed as a sample")
        };
        assert_eq!((parsed.pid, parsed.tid), (42, 43));
        assert_eq!(parsed.user_stack(), &[0x1000, 0x2000, 0x3000]);
        assert_eq!(parsed.window(), 7u64.to_ne_bytes());
        assert!(parsed.kernel_stack().is_empty());
        assert_eq!(parsed.thread_name(), "work");
        // A sample of another size (another layout) is refused.
        assert!(Record::parse(&bytes[..100]).is_none());
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(&[0; 8]);
        assert!(Record::parse(&longer).is_none());
    }

    #[test]
    fn trace_context_ids_and_attributes() {
        let mut t = TraceCtx::default();
        assert_eq!(t.ids(), None);
        t.trace_id = [1; 16];
        t.span_id = [2; 8];
        assert_eq!(t.ids(), None, "not valid");
        t.valid = 1;
        assert_eq!(t.ids(), Some(([1; 16], [2; 8])));
        let attrs = b"\x00\x03GET\x02\x02eu";
        t.attrs[..attrs.len()].copy_from_slice(attrs);
        t.attrs_size = attrs.len() as u16;
        assert_eq!(t.attributes(), vec![(0, "GET".into()), (2, "eu".into())]);
        // A pair cut by the copy limit is left out.
        t.attrs_size = 300;
        t.attrs[9] = 1;
        t.attrs[10] = 200;
        assert_eq!(t.attributes().len(), 2);
        t.span_id = [0; 8];
        assert_eq!(t.ids(), None, "zero span ID: no span");
    }

    #[test]
    fn parses_off_cpu_records() {
        let end = OffCpuEnd {
            kind: RECORD_OFF_CPU_END,
            tid: 9,
            start_ns: 100,
            end_ns: 350,
        };
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&end as *const OffCpuEnd).cast::<u8>(),
                size_of::<OffCpuEnd>(),
            )
        };
        assert!(matches!(Record::parse(bytes), Some(Record::OffCpuEnd(e)) if e == end));
        assert!(
            Record::parse(&bytes[..20]).is_none(),
            "another size: refused"
        );
        let mut s: CpuSample = unsafe { std::mem::zeroed() };
        s.kind = RECORD_OFF_CPU_START;
        s.tid = 9;
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&s as *const CpuSample).cast::<u8>(),
                size_of::<CpuSample>(),
            )
        };
        assert!(matches!(Record::parse(bytes), Some(Record::OffCpuStart(s)) if s.tid == 9));
    }

    #[test]
    fn parses_memory_records() {
        let mut a: AllocSample = unsafe { std::mem::zeroed() };
        a.sample.kind = RECORD_ALLOC;
        a.sample.pid = 5;
        a.ptr = 0x1000;
        a.size = 64;
        a.weight = 524288;
        a.tracked = 1;
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&a as *const AllocSample).cast::<u8>(),
                size_of::<AllocSample>(),
            )
        };
        assert!(matches!(Record::parse(bytes),
            Some(Record::Alloc(r)) if r.ptr == 0x1000 && r.weight == 524288 && r.sample.pid == 5));
        assert!(
            Record::parse(&bytes[..size_of::<CpuSample>()]).is_none(),
            "an allocation cut to a sample's size is refused"
        );
        let f = AllocFree {
            kind: RECORD_FREE,
            pid: 5,
            ptr: 0x1000,
        };
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&f as *const AllocFree).cast::<u8>(),
                size_of::<AllocFree>(),
            )
        };
        assert!(matches!(Record::parse(bytes), Some(Record::Free(g)) if g == f));
        assert!(Record::parse(&bytes[..12]).is_none());
    }

    #[test]
    fn parses_stack_snapshots_up_to_the_bytes_read() {
        let mut bytes = vec![0u8; LAYOUT_STACK_SNAPSHOT_SIZE];
        let header = StackSnapshotHeader {
            kind: RECORD_STACK_SNAPSHOT,
            cpu: 1,
            boot_ns: 42,
            sp: 0x7fff_0000,
            bytes: 16,
            pad: 0,
        };
        // SAFETY: the header is integers only; `bytes` is longer.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
        bytes[LAYOUT_STACK_SNAPSHOT_DATA..][..16].copy_from_slice(&[9; 16]);
        let Some(Record::Snapshot(snap)) = Record::parse(&bytes) else {
            panic!("not a snapshot");
        };
        assert_eq!((snap.cpu, snap.boot_ns, snap.sp), (1, 42, 0x7fff_0000));
        assert_eq!(snap.data, [9; 16]);
        // A count beyond the array is the array; a short record is none.
        bytes[LAYOUT_STACK_SNAPSHOT_BYTES..][..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let Some(Record::Snapshot(snap)) = Record::parse(&bytes) else {
            panic!("not a snapshot");
        };
        assert_eq!(snap.data.len(), STACK_SNAPSHOT_BYTES);
        assert!(Record::parse(&bytes[..100]).is_none());
    }

    #[test]
    fn parses_process_events() {
        let mut bytes = RECORD_EXEC.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&7u32.to_ne_bytes());
        assert!(matches!(Record::parse(&bytes), Some(Record::Exec(7))));
        bytes[..4].copy_from_slice(&RECORD_EXIT.to_ne_bytes());
        assert!(matches!(Record::parse(&bytes), Some(Record::Exit(7))));
        bytes[..4].copy_from_slice(&99u32.to_ne_bytes());
        assert!(Record::parse(&bytes).is_none());
    }
}
