//! Command-line flags, each with a `SYMTRACE_*` environment twin. With no
//! flags at all the server runs on SQLite and a local directory under
//! `./symtrace-data`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// symtrace-server: a debuginfod-compatible symbol store and an OpenTelemetry
/// profile store.
///
/// Serves /buildid/ID/{debuginfo,executable,source/PATH,section/NAME} to
/// debuginfod clients (gdb, perf, debuginfod-find), accepts uploads on
/// /api/v1/debuginfo, federates misses to upstream debuginfod servers,
/// turns addresses into functions, files and lines on /api/v1/symbolize,
/// stores OpenTelemetry profiles sent over OTLP (gRPC on GRPC_ADDR, HTTP
/// on /v1development/profiles), and serves them as flamegraphs symbolized
/// at query time (/api/v1/flamegraph, /api/v1/diff, /api/v1/traces/ID; the
/// web UI at /).
#[derive(Parser, Clone)]
#[command(name = "symtrace-server", version, about, long_about)]
pub struct Config {
    /// Address of the HTTP listener (debuginfod protocol, upload API, metrics).
    #[arg(long, env = "SYMTRACE_HTTP_ADDR", default_value = "127.0.0.1:8002")]
    pub http_addr: SocketAddr,

    /// Directory for the embedded defaults (SQLite file, blob directory) and
    /// for spooling uploads.
    #[arg(long, env = "SYMTRACE_DATA_DIR", default_value = "./symtrace-data")]
    pub data_dir: PathBuf,

    /// Metadata database: postgres://user:pass@host/db, or sqlite://PATH.
    /// Default: SQLite at DATA_DIR/symtrace.db.
    #[arg(long, env = "SYMTRACE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Blob storage: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix,
    /// or a directory. Default: DATA_DIR/objects. S3 settings come from the
    /// AWS_* variables (AWS_ENDPOINT_URL and AWS_ALLOW_HTTP=true for
    /// S3-compatible servers).
    #[arg(long, env = "SYMTRACE_STORAGE_URL")]
    pub storage_url: Option<String>,

    /// Upstream debuginfod servers asked on a miss, space-separated like
    /// DEBUGINFOD_URLS. Fetched files are validated and stored.
    #[arg(long, env = "SYMTRACE_UPSTREAM_URLS", value_delimiter = ' ', num_args = 0.., hide_env_values = true)]
    pub upstream_urls: Vec<String>,

    /// Seconds to wait for an upstream server's response headers.
    #[arg(
        long = "upstream-timeout",
        env = "SYMTRACE_UPSTREAM_TIMEOUT",
        default_value_t = 30
    )]
    pub upstream_timeout_secs: u64,

    /// Seconds an upstream miss is remembered before it is asked again.
    #[arg(
        long = "upstream-negative-ttl",
        env = "SYMTRACE_UPSTREAM_NEGATIVE_TTL",
        default_value_t = 60
    )]
    pub upstream_negative_ttl_secs: u64,

    /// Requests that already crossed this many federating servers (entries in
    /// X-Forwarded-For) are not forwarded again, which breaks loops.
    #[arg(long, env = "SYMTRACE_HOP_LIMIT", default_value_t = 8)]
    pub hop_limit: usize,

    /// Comma-separated bearer tokens allowed to upload (and export
    /// profiles). Each is `TOKEN` (every tenant) or `TOKEN=TENANT[+TENANT…]`
    /// (only those). With neither these nor admin tokens, uploads are
    /// accepted from direct loopback clients only.
    #[arg(
        long,
        env = "SYMTRACE_UPLOAD_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub upload_tokens: Vec<String>,

    /// Comma-separated bearer tokens allowed to upload and delete
    /// (`TOKEN` or `TOKEN=TENANT[+TENANT…]`). Without them, deletes are
    /// accepted from direct loopback clients only.
    #[arg(
        long,
        env = "SYMTRACE_ADMIN_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub admin_tokens: Vec<String>,

    /// Comma-separated bearer tokens of agents (`TOKEN` or
    /// `TOKEN=TENANT[+TENANT…]`): they export profiles and publish the
    /// files agents find on their hosts — always as an agent's files,
    /// ranked below CI's and upstream's and bound to their content, never
    /// as CI uploads — and read nothing.
    #[arg(
        long,
        env = "SYMTRACE_AGENT_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub agent_tokens: Vec<String>,

    /// Comma-separated bearer tokens required for reads (`TOKEN` or
    /// `TOKEN=TENANT[+TENANT…]`). Without them reads are public, which a
    /// non-loopback --http-addr allows only with --public-reads (debuginfod
    /// clients send tokens via DEBUGINFOD_HEADERS_FILE).
    #[arg(
        long,
        env = "SYMTRACE_READ_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub read_tokens: Vec<String>,

    /// A file of tokens, one per line: `SCOPE SECRET [TENANT[+TENANT…]]`
    /// with SCOPE read, upload or admin and SECRET the token or
    /// `sha256:<hex>` of it; `#` starts a comment. Read at start and again
    /// on SIGHUP (a broken file keeps the tokens in force).
    #[arg(long, env = "SYMTRACE_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,

    /// Serve reads without tokens on a non-loopback address (a public
    /// symbol server); without it such a server refuses to start.
    #[arg(long, env = "SYMTRACE_PUBLIC_READS")]
    pub public_reads: bool,

    /// Accept writes without a token from direct loopback clients when no
    /// write token is configured (no proxy headers, a loopback Host).
    #[arg(long, env = "SYMTRACE_LOOPBACK_TRUST", default_value_t = true, action = clap::ArgAction::Set)]
    pub loopback_trust: bool,

    /// Claims (`missing` items an agent asks to publish) one token may make
    /// per minute (on each replica); beyond it 429. 0: no bound.
    #[arg(long, env = "SYMTRACE_CLAIMS_PER_MINUTE", default_value_t = 6000)]
    pub claims_per_minute: u64,

    /// Bytes of agents' uploads one token may send per hour (on each
    /// replica); beyond it 429. 0: no bound.
    #[arg(long, env = "SYMTRACE_AGENT_UPLOAD_BYTES_PER_HOUR", default_value_t = 64 << 30)]
    pub agent_upload_bytes_per_hour: u64,

    /// Largest accepted upload, in bytes, after Content-Encoding is undone.
    #[arg(long, env = "SYMTRACE_MAX_UPLOAD_BYTES", default_value_t = 8 << 30)]
    pub max_upload_bytes: u64,

    /// Most bytes the compressed debug sections (SHF_COMPRESSED zlib/zstd,
    /// `.zdebug_*`) of one file may decompress to, together: checked at
    /// upload (a file over it, or whose sections do not inflate to what
    /// their headers claim, is refused with 422) and when symbolizing.
    #[arg(
        long,
        env = "SYMTRACE_MAX_DECOMPRESSED_BYTES",
        default_value_t = symtrace_elf::DEFAULT_MAX_DECOMPRESSED_BYTES
    )]
    pub max_decompressed_bytes: u64,

    /// Uploads processed at once; more get 503 with Retry-After.
    #[arg(long, env = "SYMTRACE_MAX_CONCURRENT_UPLOADS", default_value_t = 16)]
    pub max_concurrent_uploads: usize,

    /// Queries (flamegraphs, diffs, trace views, raw samples) run at once;
    /// more get 503 with Retry-After.
    #[arg(long, env = "SYMTRACE_MAX_CONCURRENT_QUERIES", default_value_t = 32)]
    pub max_concurrent_queries: usize,

    /// /api/v1/symbolize requests run at once; more get 503 with Retry-After.
    #[arg(long, env = "SYMTRACE_MAX_CONCURRENT_SYMBOLIZE", default_value_t = 64)]
    pub max_concurrent_symbolize: usize,

    /// OTLP exports received, decoded and stored at once; more get 503
    /// (HTTP) or UNAVAILABLE (gRPC), which OTLP senders retry.
    #[arg(long, env = "SYMTRACE_MAX_CONCURRENT_EXPORTS", default_value_t = 64)]
    pub max_concurrent_exports: usize,

    /// Fetches from upstream debuginfod servers at once (requests for a
    /// file already being fetched share that fetch); more get 503.
    #[arg(long, env = "SYMTRACE_MAX_CONCURRENT_FETCHES", default_value_t = 64)]
    pub max_concurrent_fetches: usize,

    /// Symbol index builds under way at once (they take turns on the CPU);
    /// a symbolization that would start one more is answered from DWARF,
    /// and a later one starts the build.
    #[arg(
        long,
        env = "SYMTRACE_MAX_CONCURRENT_INDEX_BUILDS",
        default_value_t = 64
    )]
    pub max_concurrent_index_builds: usize,

    /// HTTP connections open at once; beyond it new ones wait in the
    /// kernel's accept queue.
    #[arg(long, env = "SYMTRACE_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Seconds a client may take to send a request's headers (and an idle
    /// keep-alive connection may wait for its next request) before the
    /// connection is closed.
    #[arg(
        long = "header-timeout",
        env = "SYMTRACE_HEADER_TIMEOUT",
        default_value_t = 30
    )]
    pub header_timeout_secs: u64,

    /// Seconds a request body may go without a byte before the request is
    /// abandoned (408).
    #[arg(
        long = "body-idle-timeout",
        env = "SYMTRACE_BODY_IDLE_TIMEOUT",
        default_value_t = 60
    )]
    pub body_idle_timeout_secs: u64,

    /// Seconds a response may go without the client taking a byte (a
    /// client that stops reading — its receive window closed — holds its
    /// connection no longer); the connection is closed then.
    #[arg(
        long = "response-write-timeout",
        env = "SYMTRACE_RESPONSE_WRITE_TIMEOUT",
        default_value_t = 60
    )]
    pub response_write_timeout_secs: u64,

    /// Seconds an OTLP/HTTP export's whole body may take to arrive (408
    /// beyond; the export slot it holds is freed).
    #[arg(
        long = "export-body-timeout",
        env = "SYMTRACE_EXPORT_BODY_TIMEOUT",
        default_value_t = 60
    )]
    pub export_body_timeout_secs: u64,

    /// Concurrent HTTP/2 streams per gRPC connection.
    #[arg(long, env = "SYMTRACE_GRPC_MAX_STREAMS", default_value_t = 64)]
    pub grpc_max_streams: u32,

    /// Seconds between orphan-collection passes.
    #[arg(
        long = "gc-interval",
        env = "SYMTRACE_GC_INTERVAL",
        default_value_t = 3600
    )]
    pub gc_interval_secs: u64,

    /// Seconds an unreferenced blob is kept before it is collected.
    #[arg(long = "gc-grace", env = "SYMTRACE_GC_GRACE", default_value_t = 3600)]
    pub gc_grace_secs: u64,

    /// Milliseconds a "which file is served" lookup is cached in-process.
    /// Other replicas see a replacement or delete after at most this long;
    /// new uploads are seen at once. 0 disables the cache.
    #[arg(
        long = "lookup-cache-ms",
        env = "SYMTRACE_LOOKUP_CACHE_MS",
        default_value_t = 1000
    )]
    pub lookup_cache_ms: u64,

    /// Memory budget, in bytes, for symbol indexes kept open (least
    /// recently used ones are dropped first).
    #[arg(long, env = "SYMTRACE_SYMBOL_CACHE_BYTES", default_value_t = 1 << 30)]
    pub symbol_cache_bytes: u64,

    /// Most addresses accepted by one /api/v1/symbolize request.
    #[arg(
        long,
        env = "SYMTRACE_MAX_SYMBOLIZE_ADDRESSES",
        default_value_t = 100_000
    )]
    pub max_symbolize_addresses: usize,

    /// Memory budget, in bytes, for decoded profile segments kept for
    /// queries (least recently used ones are dropped first).
    #[arg(long, env = "SYMTRACE_SEGMENT_CACHE_BYTES", default_value_t = 512 << 20)]
    pub segment_cache_bytes: u64,

    /// Most bytes of stored (compressed) profile segments one flamegraph,
    /// diff or trace query reads; larger selections are refused with 400.
    #[arg(long, env = "SYMTRACE_QUERY_MAX_BYTES", default_value_t = 1 << 30)]
    pub query_max_bytes: u64,

    /// Seconds a query may run before it is abandoned (503).
    #[arg(
        long = "query-timeout",
        env = "SYMTRACE_QUERY_TIMEOUT",
        default_value_t = 60
    )]
    pub query_timeout_secs: u64,

    /// Address of the OTLP gRPC listener (ProfilesService/Export).
    #[arg(long, env = "SYMTRACE_GRPC_ADDR", default_value = "127.0.0.1:4317")]
    pub grpc_addr: SocketAddr,

    /// Once both listeners are bound, write their addresses here as JSON
    /// (`{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:4317", "pid": N}`,
    /// replaced atomically): how a supervisor or a test learns the ports
    /// of `--http-addr 127.0.0.1:0` without reading the log. Removed at a
    /// graceful shutdown; after a crash, `pid` says whether the writer runs.
    #[arg(long, env = "SYMTRACE_READY_FILE")]
    pub ready_file: Option<std::path::PathBuf>,

    /// Largest OTLP export accepted, in bytes, after gzip is undone (413 /
    /// RESOURCE_EXHAUSTED beyond it).
    #[arg(long, env = "SYMTRACE_MAX_EXPORT_BYTES", default_value_t = 64 << 20)]
    pub max_export_bytes: usize,

    /// Most frames kept of one stack at ingest: deeper stacks keep their
    /// leaf-most frames and get one synthetic root frame
    /// `[truncated: N root-most frames …]` (counted in
    /// symtrace_ingest_truncated_stacks_total).
    #[arg(long, env = "SYMTRACE_MAX_STACK_DEPTH", default_value_t = 1024)]
    pub max_stack_depth: usize,

    /// Most elements one OTLP export may hold (entries of every repeated
    /// field: table entries, samples, stack frames, values, timestamps),
    /// counted on the bytes before decoding, and most frames and stack
    /// entries its series may copy (413 / RESOURCE_EXHAUSTED beyond):
    /// bounds the memory an export decodes and normalizes into.
    #[arg(
        long,
        env = "SYMTRACE_MAX_EXPORT_ELEMENTS",
        default_value_t = 4_000_000
    )]
    pub max_export_elements: usize,

    /// Longest label value kept, in bytes (resource, profile and sample
    /// attributes as text); a longer one is cut at a character boundary
    /// and ends in `…[truncated]` (counted in
    /// symtrace_ingest_truncated_labels_total).
    #[arg(
        long,
        env = "SYMTRACE_MAX_LABEL_VALUE_BYTES",
        default_value_t = 16 << 10
    )]
    pub max_label_value_bytes: usize,

    /// Most series (service × profile type) one OTLP export may hold: each
    /// is a part of its segment and a row of the index (413 /
    /// RESOURCE_EXHAUSTED beyond).
    #[arg(long, env = "SYMTRACE_MAX_EXPORT_SERIES", default_value_t = 10_000)]
    pub max_export_series: usize,

    /// Most bytes of label and type text one OTLP export may render, and
    /// that its series may hold together, each series counting the text it
    /// uses (a label shared by many series is stored with each; 413 /
    /// RESOURCE_EXHAUSTED beyond).
    #[arg(
        long,
        env = "SYMTRACE_MAX_EXPORT_TEXT_BYTES",
        default_value_t = 256 << 20
    )]
    pub max_export_text_bytes: usize,

    /// Most distinct values of one label name per segment and service that
    /// the label index records; beyond it the name is indexed as having
    /// many values (the samples keep every value).
    #[arg(long, env = "SYMTRACE_MAX_LABEL_VALUES", default_value_t = 100)]
    pub max_label_values: usize,

    /// How ingested segments are laid out: `series` (one part per service
    /// and profile type, as compacted segments always are: a one-service
    /// query of recent data reads only its service's parts) or `whole`
    /// (one part: measured ~15% more events per core and about half the
    /// bytes per uncompacted event, but every query of recent data reads
    /// whole exports; docs/BENCHMARKS.md).
    #[arg(
        long,
        env = "SYMTRACE_INGEST_LAYOUT",
        value_enum,
        default_value = "series"
    )]
    pub ingest_layout: IngestLayout,

    /// Seconds of profile data one compacted segment covers; ingested
    /// segments are merged per tenant and window once the window has ended.
    #[arg(
        long = "compaction-window",
        env = "SYMTRACE_COMPACTION_WINDOW",
        default_value_t = 3600
    )]
    pub compaction_window_secs: u64,

    /// Compressed segment bytes one compaction job merges at most; a window
    /// holding more is merged into several segments. The compactor's memory
    /// grows with this (decoded tables of the inputs and the output), not
    /// with a window's data.
    #[arg(
        long = "compaction-job-bytes",
        env = "SYMTRACE_COMPACTION_JOB_BYTES",
        default_value_t = crate::profiles::compact::DEFAULT_JOB_BYTES as u64
    )]
    pub compaction_job_bytes: u64,

    /// Seconds between compaction passes (0 disables compaction).
    #[arg(
        long = "compaction-interval",
        env = "SYMTRACE_COMPACTION_INTERVAL",
        default_value_t = 60
    )]
    pub compaction_interval_secs: u64,

    /// Seconds after a window's end before it is compacted (late exports).
    #[arg(
        long = "compaction-delay",
        env = "SYMTRACE_COMPACTION_DELAY",
        default_value_t = 300
    )]
    pub compaction_delay_secs: u64,

    /// Seconds between retention passes (which run whether or not
    /// compaction is on).
    #[arg(
        long = "retention-interval",
        env = "SYMTRACE_RETENTION_INTERVAL",
        default_value_t = 60
    )]
    pub retention_interval_secs: u64,

    /// Hours profiles are kept (0 keeps them forever).
    #[arg(
        long = "profile-retention",
        env = "SYMTRACE_PROFILE_RETENTION",
        default_value_t = 720
    )]
    pub profile_retention_hours: u64,

    /// Log format: text or json. Verbosity comes from RUST_LOG (default info).
    #[arg(long, env = "SYMTRACE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Operator commands; without one, the server runs.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum Command {
    /// Symbolizes addresses of one build-ID through a running server and
    /// prints frames innermost first, like `llvm-symbolizer --inlines`.
    Symbolize {
        /// GNU build-ID (hex).
        build_id: String,
        /// ELF virtual addresses (hex, with or without 0x).
        #[arg(required = true)]
        addresses: Vec<String>,
        /// The server to ask.
        #[arg(long, env = "SYMTRACE_URL", default_value = "http://127.0.0.1:8002")]
        server: String,
        /// Bearer token for a server that requires read tokens.
        #[arg(long, env = "SYMTRACE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the JSON answer as it came.
        #[arg(long)]
        json: bool,
    },
}

/// How ingested (level-0) segments are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IngestLayout {
    /// One part per (service, profile type).
    Series,
    /// One part holding the whole export.
    Whole,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Config {
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("symtrace.db").display()))
    }

    pub fn storage_url(&self) -> String {
        self.storage_url
            .clone()
            .unwrap_or_else(|| self.data_dir.join("objects").display().to_string())
    }

    pub fn upstreams(&self) -> Vec<String> {
        self.upstream_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .map(|u| {
                let u = u.trim_end_matches('/');
                let u = u.strip_suffix("/buildid").unwrap_or(u);
                if u.contains("://") {
                    u.to_owned()
                } else {
                    format!("http://{u}")
                }
            })
            .collect()
    }

    pub fn gc_interval(&self) -> Duration {
        Duration::from_secs(self.gc_interval_secs.max(1))
    }

    pub fn gc_grace(&self) -> Duration {
        Duration::from_secs(self.gc_grace_secs)
    }
}
