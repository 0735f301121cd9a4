//! Command-line flags (each with a `SYMTRACE_AGENT_…` environment twin).

use std::time::Duration;

use clap::Parser;

/// symtrace-agent: samples the on-CPU stacks of every process on this host
/// with eBPF (a CPU-clock perf event per CPU; stacks walked by frame
/// pointer where code keeps them, by each file's CFI where it does not),
/// with the trace and span each thread published (OpenTelemetry thread
/// context), and ships them, unsymbolized with their build-IDs, to a
/// symtrace server (or any OTLP profiles receiver) over OTLP/gRPC.
///
/// Needs CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (root has them); never
/// privileged mode. The server symbolizes at query time from the debug info
/// your CI uploads.
#[derive(Parser, Debug)]
#[command(name = "symtrace-agent", version)]
pub struct Args {
    /// OTLP/gRPC endpoint of the server (`symtrace-server`'s --grpc-addr).
    #[arg(
        long,
        env = "SYMTRACE_AGENT_SERVER",
        default_value = "http://127.0.0.1:4317"
    )]
    pub server: String,

    /// Tenant, sent as `X-Scope-OrgID` (the server's default tenant when
    /// unset).
    #[arg(long, env = "SYMTRACE_AGENT_TENANT")]
    pub tenant: Option<String>,

    /// Bearer token with upload scope, when the server asks for one.
    #[arg(long, env = "SYMTRACE_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Samples per second per CPU. Must be prime (19, 47, 97, …): a
    /// frequency sharing a factor with periodic work (10/100/1000 Hz timers)
    /// samples it in lockstep and biases the profile.
    #[arg(long, env = "SYMTRACE_AGENT_FREQUENCY", default_value_t = 19, value_parser = parse_frequency)]
    pub frequency: u64,

    /// How often a batch is built and exported.
    #[arg(long, env = "SYMTRACE_AGENT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Bound of the batches waiting for the server (oldest dropped first,
    /// and counted, when the server stays away).
    #[arg(long, env = "SYMTRACE_AGENT_BUFFER_BYTES", default_value_t = 32 << 20)]
    pub buffer_bytes: usize,

    /// Size of the BPF ring buffer between the sampler and the agent (a
    /// power of two, at least 64 KiB); samples that find it full are lost and
    /// counted.
    #[arg(long, env = "SYMTRACE_AGENT_RING_BUFFER_BYTES", default_value_t = 8 << 20, value_parser = parse_ring_size)]
    pub ring_buffer_bytes: u32,

    /// Bytes of call-frame information (`.eh_frame` of the files samples'
    /// leaf functions are in) kept in memory, to recover the caller of a
    /// frameless leaf; beyond it the cache starts over.
    #[arg(long, env = "SYMTRACE_AGENT_CFI_CACHE_BYTES", default_value_t = 32 << 20)]
    pub cfi_cache_bytes: usize,

    /// Bytes of BPF memory for the unwind tables of code without frame
    /// pointers (each file's `.eh_frame` as sorted rows the BPF walk
    /// searches, 8 bytes a row, shared by every process mapping the file),
    /// the per-process mapping tables (6 MiB at most) included. Files no
    /// process maps any more are evicted when room is needed; a file that
    /// does not fit is walked by frame pointer.
    #[arg(long, env = "SYMTRACE_AGENT_UNWIND_TABLE_BYTES", default_value_t = 16 << 20)]
    pub unwind_table_bytes: u64,

    /// Do not copy the user stack (up to 16 KiB) of a sample taken before
    /// the agent has read its process (a new process's first moments, or
    /// one whose files are still being read). With the copy, the agent
    /// walks such a stack by each file's CFI once the files are read, so
    /// new and short-lived processes' stacks are whole through code
    /// without frame pointers; without it they are walked by frame pointer
    /// alone.
    #[arg(long, env = "SYMTRACE_AGENT_NO_STACK_SNAPSHOTS")]
    pub no_stack_snapshots: bool,

    /// Bytes of JIT symbols (from perf maps and jitdump files) kept per
    /// process; beyond it the oldest entries are dropped (counted in the
    /// stats as `jit: … evicted`). About 235 bytes an entry.
    #[arg(long, env = "SYMTRACE_AGENT_JIT_PROCESS_BYTES", default_value_t = 32 << 20)]
    pub jit_process_bytes: usize,

    /// Bytes of JIT symbols kept for all processes together. With the
    /// defaults of the other bounds the agent stays under 256 MiB however
    /// the processes of its host behave (docs/agent.md, "Memory").
    #[arg(long, env = "SYMTRACE_AGENT_JIT_TOTAL_BYTES", default_value_t = 64 << 20)]
    pub jit_total_bytes: usize,

    /// Also record kernel threads (kworker, ksoftirqd, …).
    #[arg(long, env = "SYMTRACE_AGENT_KERNEL_THREADS")]
    pub kernel_threads: bool,

    /// host.name of every profile (default: this host's name; in Kubernetes
    /// set it from spec.nodeName).
    #[arg(long, env = "SYMTRACE_AGENT_HOST_NAME")]
    pub host_name: Option<String>,

    /// Print, every interval, samples/s, lost samples, processes tracked,
    /// delivery, the agent's own CPU and the BPF programs' run time. Turns
    /// on the kernel's BPF run-time statistics (machine-wide: two clock
    /// reads around every BPF program run) for as long as the agent runs;
    /// without it the final `total:` line says the BPF time was not measured.
    #[arg(long, env = "SYMTRACE_AGENT_STATS")]
    pub stats: bool,

    /// Timeout of one export call.
    #[arg(long, env = "SYMTRACE_AGENT_EXPORT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub export_timeout: Duration,

    /// On SIGINT/SIGTERM, how long to keep trying to deliver what is
    /// buffered before exiting (what is left is reported as dropped).
    #[arg(long, env = "SYMTRACE_AGENT_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Off-CPU profile: the probability that a thread's switch-out while
    /// blocked (a lock, I/O, a sleep, a downstream call) is recorded, with
    /// its stacks and how long it waited until it ran again (profile type
    /// `off_cpu:nanoseconds`; each wait counts 1/p times, so totals stay
    /// unbiased). For threads outside any span; 0 records none of them.
    /// The default keeps the agent under 1% of a 2-CPU machine switching
    /// 70,000-90,000 times a second (docs/BENCHMARKS.md).
    #[arg(long, env = "SYMTRACE_AGENT_OFF_CPU_PROBABILITY", default_value_t = 0.001, value_parser = parse_probability)]
    pub off_cpu_probability: f64,

    /// The same for threads in a span (that publish an OpenTelemetry thread
    /// context): where a slow span waited. Each recorded switch-out costs
    /// tens of µs of CPU (BPF and agent): lower it for services that block thousands of
    /// times a second inside spans. 0 and an --off-cpu-probability of 0
    /// attach nothing to the scheduler.
    #[arg(long, env = "SYMTRACE_AGENT_OFF_CPU_SPAN_PROBABILITY", default_value_t = 1.0, value_parser = parse_probability)]
    pub off_cpu_span_probability: f64,

    /// Recorded waits kept open at once, until their thread runs again
    /// (each holds its resolved stacks); beyond it the oldest are given
    /// up (counted).
    #[arg(long, env = "SYMTRACE_AGENT_OFF_CPU_MAX_WAITING", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub off_cpu_max_waiting: u32,

    /// Off-CPU records one process may make per second (and twice that at
    /// once); beyond it its switch-outs are not recorded (counted as
    /// `off-CPU records over their process's rate`): one process blocking
    /// a hundred thousand times a second inside spans cannot fill the ring
    /// buffer that every process's samples share. 0: no bound.
    #[arg(
        long,
        env = "SYMTRACE_AGENT_OFF_CPU_MAX_PROCESS_RATE",
        default_value_t = 2000
    )]
    pub off_cpu_max_process_rate: u32,

    /// Turn memory allocation profiling off. When on (the default), the
    /// agent attaches to the `otel_memory:alloc` and `otel_memory:free`
    /// USDT probes of every file that has them (the symtrace-alloc
    /// `LD_PRELOAD` library, a Rust program with `SampledAllocator`, any
    /// other writer of the OpenTelemetry design) and sends `alloc_space`,
    /// `alloc_objects`, `inuse_space` and `inuse_objects` profiles.
    /// Processes without the probes cost nothing. Needs Linux ≥ 5.15.
    #[arg(long, env = "SYMTRACE_AGENT_NO_MEMORY")]
    pub no_memory: bool,

    /// Live sampled allocations tracked at once (for the in-use profiles;
    /// beyond it new ones count as allocated but not as in use, counted).
    #[arg(long, env = "SYMTRACE_AGENT_MEMORY_MAX_LIVE", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub memory_max_live: u32,

    /// Live sampled allocations one process may hold of those (beyond it
    /// its new ones count as allocated, not as in use, counted as `live
    /// allocations over their process's share`): one process cannot take
    /// the in-use profiles of the others. 0: no bound but the total.
    #[arg(
        long,
        env = "SYMTRACE_AGENT_MEMORY_MAX_LIVE_PER_PROCESS",
        default_value_t = 8192
    )]
    pub memory_max_live_per_process: u32,

    /// Sampled allocations recorded per second per CPU, aimed at (0: no
    /// bound). The probes fire as often as the profiled process samples
    /// (`OTEL_MEMORY_SAMPLING_INTERVAL=1` fires on every allocation); each
    /// record costs the agent a few microseconds. Beyond the rate (kept per
    /// tenth of a second) allocations are thinned: one in 2^k recorded,
    /// its weight 2^k times larger, so totals stay unbiased; those left
    /// out are counted as throttled. Records standing for 64 KiB or more
    /// are bounded apart from smaller ones (a burst of small allocations
    /// never thins the large ones), so the records can reach twice this.
    #[arg(long, env = "SYMTRACE_AGENT_MEMORY_MAX_RATE", default_value_t = 10000)]
    pub memory_max_rate: u32,

    /// Files with `otel_memory` probes, or directories of them, attached
    /// at start (comma-separated): the first process started with one is
    /// covered from its first allocation — the preload library where you
    /// install it, the executables of services built with symtrace-alloc.
    /// The preload library is also looked for in /usr/local/lib, /usr/lib,
    /// /usr/lib/x86_64-linux-gnu and /usr/lib64. (Other files are attached
    /// when the agent finds a process mapping them, a few milliseconds
    /// after its exec, and stay attached for the next process until they
    /// are deleted.) In a container, name host paths through
    /// /proc/1/root/…
    #[arg(long, env = "SYMTRACE_AGENT_MEMORY_PROBE_FILES", value_delimiter = ',')]
    pub memory_probe_files: Vec<std::path::PathBuf>,

    /// Do not publish binaries. By default every executable or library
    /// whose code is sampled, and that the server has no symbols as good
    /// for, is uploaded as found on this host (symbol table, DWARF if it
    /// has any), in the background: once per file for the whole fleet (the
    /// server grants one agent a claim), ranked below any CI upload of the
    /// same quality. Files without symbols are not sent.
    #[arg(long, env = "SYMTRACE_AGENT_NO_UPLOAD_BINARIES")]
    pub no_upload_binaries: bool,

    /// The server's HTTP API, where binaries are published (default: the
    /// --server host, port 8002).
    #[arg(long, env = "SYMTRACE_AGENT_UPLOAD_URL")]
    pub upload_url: Option<String>,

    /// Bytes per second a binary upload may send (one upload at a time).
    #[arg(long, env = "SYMTRACE_AGENT_UPLOAD_BYTES_PER_SECOND", default_value_t = 2 << 20, value_parser = clap::value_parser!(u64).range(1024..))]
    pub upload_bytes_per_second: u64,

    /// New binaries published per minute, at most, by this host (the
    /// others wait their turn; each file's owner waits behind its own
    /// files: one user making files with fresh build-IDs by the thousand
    /// does not delay the rest). 0: no bound.
    #[arg(
        long,
        env = "SYMTRACE_AGENT_UPLOAD_MAX_FILES_PER_MINUTE",
        default_value_t = 30
    )]
    pub upload_max_files_per_minute: u32,

    /// Bytes published per hour, at most, by this host. 0: no bound.
    #[arg(long, env = "SYMTRACE_AGENT_UPLOAD_MAX_BYTES_PER_HOUR", default_value_t = 2 << 30)]
    pub upload_max_bytes_per_hour: u64,

    /// Largest binary published whole; a larger one with a GNU build-ID
    /// and a symbol table is published as its symbol tables and DWARF
    /// (like objcopy --only-keep-debug) if those fit, else counted as
    /// unpublishable (publish it from CI with symtrace-upload).
    #[arg(long, env = "SYMTRACE_AGENT_UPLOAD_MAX_FILE_BYTES", default_value_t = 512 << 20)]
    pub upload_max_file_bytes: u64,

    /// Serve `GET /healthz` (200 while the agent samples and delivers,
    /// 503 with why not) and `GET /metrics` (Prometheus) here, e.g.
    /// `0.0.0.0:8003` (the DaemonSet's liveness probe). Off by default.
    #[arg(long, env = "SYMTRACE_AGENT_HEALTH_ADDR")]
    pub health_addr: Option<std::net::SocketAddr>,

    /// `/healthz` answers 503 when the sampler thread has not gone round
    /// its loop, or the BPF sampler has not run, for this long.
    #[arg(long, env = "SYMTRACE_AGENT_HEALTH_MAX_SILENCE", default_value = "60s", value_parser = parse_duration)]
    pub health_max_silence: Duration,

    /// `/healthz` answers 503 when batches wait for the server and none was
    /// delivered for this long (`off`: never for that reason — a restart
    /// does not bring a server back, and drops what is buffered).
    #[arg(long, env = "SYMTRACE_AGENT_HEALTH_MAX_UNDELIVERED", default_value = "15m", value_parser = parse_optional_duration)]
    pub health_max_undelivered: OptionalDuration,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Tools that inspect without sampling (no privileges needed).
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Prints each ELF file's whole unwind table, built from its
    /// `.eh_frame` with the agent's reading of CFI rules — address ranges,
    /// distinct rules, how much of its code keeps a frame pointer, the
    /// table's size and build time — and exits.
    UnwindTable {
        /// ELF files (executables, shared libraries).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Also prints the rule at these ELF virtual addresses (hex, as
        /// `0x3f9c0` or `3f9c0`) of each file.
        #[arg(long = "at", value_parser = parse_hex)]
        at: Vec<u64>,
    },
}

fn parse_hex(s: &str) -> Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| format!("{s:?} is not a hex address"))
}

/// A duration, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalDuration(pub Option<Duration>);

fn parse_optional_duration(s: &str) -> Result<OptionalDuration, String> {
    if s == "off" {
        return Ok(OptionalDuration(None));
    }
    parse_duration(s).map(|d| OptionalDuration(Some(d)))
}

fn parse_probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{p} is not a probability (0 to 1)"));
    }
    Ok(p)
}

pub fn parse_frequency(s: &str) -> Result<u64, String> {
    let hz: u64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of Hz"))?;
    if !(2..=1000).contains(&hz) {
        return Err(format!("{hz} Hz is outside 2..=1000"));
    }
    if !(2..hz)
        .take_while(|d| d * d <= hz)
        .all(|d| !hz.is_multiple_of(d))
    {
        return Err(format!(
            "{hz} Hz is not prime: a sampling frequency that shares a factor with periodic \
             work (10, 100 or 1000 Hz timers, once-a-second jobs) samples it in lockstep and \
             over- or under-counts it; use a prime such as 19 (the default), 47 or 97"
        ));
    }
    Ok(hz)
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 10s, 500ms)"))?;
    if d.is_zero() {
        return Err("must be more than zero".to_owned());
    }
    Ok(d)
}

fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    if n < 64 << 10 || !n.is_power_of_two() {
        return Err(format!("{n} is not a power of two of at least 65536"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_prime_frequencies() {
        for hz in [19, 47, 97, 2, 997] {
            assert_eq!(parse_frequency(&hz.to_string()), Ok(hz));
        }
        for hz in ["100", "99", "20", "1", "1009", "0", "x"] {
            assert!(parse_frequency(hz).is_err(), "{hz}");
        }
        assert!(parse_frequency("100").unwrap_err().contains("not prime"));
    }

    #[test]
    fn durations_and_ring_sizes() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_ring_size("65536"), Ok(65536));
        assert!(parse_ring_size("100000").is_err());
        assert!(parse_ring_size("4096").is_err());
    }

    #[test]
    fn probabilities_are_between_zero_and_one() {
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert_eq!(parse_probability("0"), Ok(0.0));
        assert_eq!(parse_probability("1"), Ok(1.0));
        assert!(parse_probability("1.5").is_err());
        assert!(parse_probability("-0.1").is_err());
        assert!(parse_probability("NaN").is_err());
        assert!(parse_probability("often").is_err());
        assert_eq!(parse_hex("0x3f9c0"), Ok(0x3f9c0));
        assert_eq!(parse_hex("3F9C0"), Ok(0x3f9c0));
        assert_eq!(parse_hex("0X10"), Ok(0x10));
        assert!(parse_hex("0x0x10").is_err());
        assert!(parse_hex("main").is_err());
    }

    #[test]
    fn help_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
