//! Frames of generated code (JIT compilers: V8, HotSpot, .NET, …), named
//! by the agent from what the runtime writes — perf maps
//! (`/tmp/perf-PID.map`) and jitdump files (`jit-PID.dump`) — because the
//! code is gone by the time anyone queries. A process's JIT symbols are
//! read on the first sample that lands in code without a build-ID, and
//! read on from where the last read stopped when an address misses (at
//! most every 20 ms); memory is bounded per process and in total, the
//! oldest entries evicted first but those sampled since the read before
//! spared, and a miss in a process that lost entries rescans its map
//! (`process`). Evictions, rescues and malformed input are counted.

mod jitdump;
mod names;
mod perfmap;
mod process;
mod table;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

pub use names::Runtime;
pub use process::ProcessJit;

/// `profile.frame.type` of a frame (OpenTelemetry semantic conventions;
/// `jit` for a runtime they name no value for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Native,
    V8js,
    Jvm,
    Dotnet,
    Jit,
}

impl FrameKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::V8js => "v8js",
            FrameKind::Jvm => "jvm",
            FrameKind::Dotnet => "dotnet",
            FrameKind::Jit => "jit",
        }
    }
}

/// A frame the agent names: a function, and where its source is when the
/// runtime says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Symbol {
    pub function: Arc<str>,
    /// The name as the runtime wrote it, when `function` is a part of it.
    pub system_name: Option<Arc<str>>,
    pub file: Option<Arc<str>>,
    /// 0: unknown.
    pub line: u32,
    pub column: u32,
    pub kind: FrameKind,
    /// V8's tier (`ignition`, `sparkplug`, `maglev`, `turbofan`).
    pub tier: Option<&'static str>,
}

impl Symbol {
    /// A native frame named `name` (the vDSO's functions).
    pub fn named(name: &str) -> Self {
        Symbol {
            function: name.into(),
            system_name: None,
            file: None,
            line: 0,
            column: 0,
            kind: FrameKind::Native,
            tier: None,
        }
    }

    /// Heap bytes it holds (a shared file name counted in full).
    fn heap_bytes(&self) -> usize {
        self.function.len()
            + self.system_name.as_ref().map_or(0, |s| s.len())
            + self.file.as_ref().map_or(0, |f| f.len() + 16)
    }
}

/// A table entry's name: as the runtime wrote it, parsed on its first
/// lookup (most entries of a perf map are never sampled), or parsed
/// already (jitdump pieces with their lines).
pub struct Named {
    raw: Box<str>,
    runtime: Runtime,
    symbol: std::sync::OnceLock<Arc<Symbol>>,
}

impl Named {
    fn raw(name: &str, runtime: Runtime) -> Self {
        Named {
            raw: name.into(),
            runtime,
            symbol: std::sync::OnceLock::new(),
        }
    }

    fn parsed(symbol: Symbol) -> Self {
        Named {
            raw: "".into(),
            runtime: Runtime::Unknown,
            symbol: std::sync::OnceLock::from(Arc::new(symbol)),
        }
    }

    pub fn symbol(&self) -> &Arc<Symbol> {
        self.symbol
            .get_or_init(|| Arc::new(names::parse(&self.raw, self.runtime)))
    }

    /// Heap bytes, the parsed form counted ahead (about twice the name:
    /// function, system name and file).
    fn heap_bytes(&self) -> usize {
        match self.symbol.get() {
            Some(s) if self.raw.is_empty() => s.heap_bytes(),
            _ => 3 * self.raw.len(),
        }
    }
}

/// Bounds and counters shared by every process's symbols.
#[derive(Debug)]
pub struct Shared {
    max_total: usize,
    max_process: usize,
    bytes: AtomicUsize,
    symbols: AtomicUsize,
    dropped: AtomicU64,
    bad: AtomicU64,
    files: AtomicU64,
    /// Entries found again by a rescan after their eviction.
    rescued: AtomicU64,
    /// Processes holding JIT symbols (not those whose state is empty: a
    /// Go binary without a GNU build-ID gets one too): each may hold
    /// `max_total / live` when that is less than `max_process` (no process
    /// starves the others).
    live: AtomicUsize,
    /// The byte rate of every process's rescans together.
    rescans: std::sync::Mutex<crate::process::budget::Bucket>,
}

/// What the JIT symbols hold and what they lost, for the stats line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JitStats {
    pub symbols: usize,
    pub bytes: usize,
    /// Entries evicted (or never kept) to stay within the bounds.
    pub dropped: u64,
    /// Malformed perf-map lines and jitdump records.
    pub bad: u64,
    /// Perf maps and jitdump files opened.
    pub files: u64,
    /// Evicted entries found again by a rescan of the map (a sample in
    /// code whose entry went before anything sampled it).
    pub rescued: u64,
}

/// Bytes of perf maps all processes' rescans may read per second, and at
/// once.
const RESCAN_RATE: f64 = (16 << 20) as f64;
const RESCAN_BURST: f64 = (64 << 20) as f64;

impl Shared {
    pub fn new(max_total: usize, max_process: usize) -> Arc<Self> {
        Arc::new(Shared {
            rescans: std::sync::Mutex::new(crate::process::budget::Bucket::new(
                RESCAN_RATE,
                RESCAN_BURST,
                std::time::Instant::now(),
            )),
            max_total,
            max_process,
            bytes: AtomicUsize::new(0),
            symbols: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            files: AtomicU64::new(0),
            rescued: AtomicU64::new(0),
            live: AtomicUsize::new(0),
        })
    }

    /// How far into its map a rescan wanting `bytes` may read now (the
    /// bytes are taken from the rate every rescan shares).
    pub fn take_rescan_bytes(&self, bytes: u64) -> u64 {
        let mut bucket = self.rescans.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if !bucket.has(now) {
            return 0;
        }
        bucket.charge(bytes as f64);
        bytes
    }

    /// Whether all processes together hold more than the total bound (the
    /// caller then trims each to its share).
    pub fn over_total(&self) -> bool {
        self.bytes.load(Relaxed) > self.max_total
    }

    /// What one process may hold now: `holding` says whether it is
    /// counted among `live` already (it holds entries).
    fn process_share(&self, holding: bool) -> usize {
        let live = self.live.load(Relaxed) + usize::from(!holding);
        self.max_process.min(self.max_total / live.max(1))
    }

    pub fn stats(&self) -> JitStats {
        JitStats {
            symbols: self.symbols.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            bad: self.bad.load(Relaxed),
            files: self.files.load(Relaxed),
            rescued: self.rescued.load(Relaxed),
        }
    }
}
