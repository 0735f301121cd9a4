//! symtrace-loadtest: load and benchmarks for symtrace-server. Every loop is
//! bounded in count and time and aimed only at the URLs it is given.

mod debuginfod;
mod generate;
mod mixed;
mod otlp;
mod pipeline;
mod query;
mod report;
mod target;

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use prost::Message;
use symtrace_proto::collector::ExportProfilesServiceRequest;

use crate::generate::Shape;
use crate::otlp::{Exporter, Payload, Protocol};
use crate::report::Report;
use crate::target::Targets;

/// The server's allocator, so that the decode baseline (`decode-baseline`)
/// measures what the server's own decoding can reach.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator and benchmarks for symtrace-server.
///
/// Every scenario prints a table (requests, errors by kind, latency
/// percentiles from an HDR histogram, the servers' CPU and resident memory —
/// from /proc for a server on this machine, from its /metrics otherwise),
/// then the same as one JSON line; it exits 1 when a request failed.
#[derive(Parser)]
#[command(name = "symtrace-loadtest", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Size {
    /// 40 processes, 30–300 stacks each (about 1 MB of protobuf).
    Medium,
    /// 140 processes, 200–1200 stacks each (about 10 MB).
    Large,
}

impl Size {
    fn shape(self, periodic: bool, services: Option<usize>) -> Shape {
        let base = match self {
            Size::Medium => Shape::MEDIUM,
            Size::Large => Shape::LARGE,
        };
        Shape {
            periodic,
            services: services.unwrap_or(base.processes).max(base.processes),
            ..base
        }
    }
}

/// Where a run is aimed and how long it lasts.
#[derive(clap::Args)]
struct Common {
    /// A server's base URL (for `otlp --protocol grpc`, its gRPC address).
    /// Repeat for several replicas: requests go round-robin over them.
    #[arg(long = "url", default_value = "http://127.0.0.1:8002")]
    urls: Vec<String>,
    /// How long to send.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// X-Scope-OrgID.
    #[arg(long, default_value = "loadtest")]
    tenant: String,
    /// Send a request whose connection fails (or that a draining replica
    /// answers 503) to the next server, as a load balancer would, instead
    /// of counting an error.
    #[arg(long)]
    failover: bool,
    /// HTTP base URLs of the servers whose CPU and memory to report
    /// (default: the --url values).
    #[arg(long = "watch")]
    watch: Vec<String>,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Common {
    fn targets(&self) -> Arc<Targets> {
        Arc::new(Targets::new(&self.urls, self.failover))
    }

    fn report(&self) -> Report {
        Report::new(if self.watch.is_empty() {
            &self.urls
        } else {
            &self.watch
        })
    }

    /// Prints the report; writes the JSON file; Ok(false) on errors.
    async fn finish(&self, report: Report) -> anyhow::Result<bool> {
        let errors = report.errors();
        let json = report.print().await;
        if let Some(path) = &self.json {
            std::fs::write(path, serde_json::to_vec_pretty(&json)?)?;
        }
        Ok(errors == 0)
    }
}

/// The generated exports.
#[derive(clap::Args)]
struct Exports {
    #[arg(long, value_enum, default_value = "medium")]
    size: Size,
    /// Distinct base payloads generated up front (each export is made
    /// unique with one more small resource, so none is a retry).
    #[arg(long, default_value_t = 8)]
    payloads: usize,
    /// Regular 19 Hz timestamps instead of random nanoseconds.
    #[arg(long)]
    periodic: bool,
    /// Services in the fleet (default: one per process of an export, the
    /// same in every export); more spreads them over the exports, each
    /// export holding as many as it has processes.
    #[arg(long)]
    services: Option<usize>,
    /// Seconds to shift the profiles' time into the past (backfill).
    #[arg(long, default_value_t = 0)]
    ago: u64,
    /// Target rate in events (sampled stacks' timestamps) per second, in
    /// whole exports; 0 = as fast as the server takes them.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    #[arg(long, value_enum, default_value = "http")]
    protocol: Protocol,
}

impl Exports {
    /// The payloads' shape, as the flags say.
    fn shape(&self) -> Shape {
        self.size.shape(self.periodic, self.services)
    }

    fn exporter(&self, common: &Common, run: u64) -> anyhow::Result<Arc<Exporter>> {
        let shape = self.shape();
        let slots = shape.processes * self.payloads.max(1);
        anyhow::ensure!(
            shape.services <= slots,
            "--services {} needs more payloads: {} payloads of {} processes hold {slots} \
             services (use --payloads {})",
            shape.services,
            self.payloads.max(1),
            shape.processes,
            shape.services.div_ceil(shape.processes)
        );
        let payloads = otlp::payloads(
            shape,
            self.payloads.max(1),
            self.ago,
            matches!(self.protocol, Protocol::Grpc),
        );
        let exporter = Exporter::new(payloads, self.protocol, &common.urls, &common.tenant, run)?;
        println!(
            "payloads          {} × ~{:.2} MB protobuf, ~{:.0} events each",
            self.payloads,
            exporter.average_bytes() as f64 / 1e6,
            exporter.average_events()
        );
        Ok(Arc::new(exporter))
    }

    /// The pause between exports that makes the target rate.
    fn interval(&self, exporter: &Exporter) -> Option<Duration> {
        (self.rate > 0.0).then(|| Duration::from_secs_f64(exporter.average_events() / self.rate))
    }
}

/// The files the debuginfod scenario serves.
#[derive(clap::Args)]
struct Symbols {
    /// An ELF file with a GNU build-ID: the set is copies of it, each with
    /// its own build-ID.
    #[arg(long, default_value = "/usr/bin/ls")]
    elf: PathBuf,
    /// Files in the set (uploaded before the run).
    #[arg(long, default_value_t = 100)]
    files: u64,
    /// Share of requests for build-IDs never uploaded (404 expected).
    #[arg(long, default_value_t = 0.2)]
    miss_ratio: f64,
    /// Names the set: runs with the same seed share their build-IDs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not upload the set first (a run with the same seed did).
    #[arg(long)]
    skip_upload: bool,
}

impl Symbols {
    async fn prepare(
        &self,
        common: &Common,
        targets: &Targets,
        run: u64,
    ) -> anyhow::Result<Arc<debuginfod::Debuginfod>> {
        let set = debuginfod::ElfSet::load(&self.elf, run)?;
        let d = debuginfod::Debuginfod::new(set, self.files, &common.tenant)?;
        if !self.skip_upload {
            let t = Instant::now();
            let op = report::Op::new("debuginfod", "upload");
            d.upload_set(targets, &op).await?;
            println!(
                "uploaded          {} files of {:.2} MB in {:.1} s",
                self.files,
                d.set.len() as f64 / 1e6,
                t.elapsed().as_secs_f64()
            );
        }
        Ok(Arc::new(d))
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Exports realistic OTLP profiles (Zipf-distributed stacks over many
    /// build-IDs, depths 10–60, timestamps, trace links, gzip) over
    /// OTLP/HTTP or gRPC, at a target rate or as fast as the server takes
    /// them with N connections.
    Otlp {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        exports: Exports,
        /// Concurrent exports in flight.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// Most exports sent (0 = until the duration ends).
        #[arg(long, default_value_t = 0)]
        max_exports: u64,
    },
    /// debuginfod clients: a hit/miss mix of /buildid/ID/executable
    /// requests over a set of files it uploads first.
    Debuginfod {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        symbols: Symbols,
        /// Concurrent requests in flight.
        #[arg(long, default_value_t = 4)]
        connections: usize,
    },
    /// Exports, debuginfod traffic with uploads, and flamegraph and trace
    /// queries at once. With --verify, every export and upload a server
    /// acknowledged is then looked up through each server still up (exit
    /// 1 if one is missing).
    Mixed {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        exports: Exports,
        #[command(flatten)]
        symbols: Symbols,
        /// Concurrent exports in flight.
        #[arg(long, default_value_t = 2)]
        otlp_connections: usize,
        /// Concurrent debuginfod requests in flight.
        #[arg(long, default_value_t = 1)]
        debuginfod_connections: usize,
        /// debuginfod requests per second (0 = as fast as answered).
        #[arg(long, default_value_t = 0.0)]
        debuginfod_rate: f64,
        /// Share of debuginfod requests that upload a new file.
        #[arg(long, default_value_t = 0.02)]
        upload_ratio: f64,
        /// Concurrent queries in flight.
        #[arg(long, default_value_t = 1)]
        query_connections: usize,
        /// Pause between queries (flamegraphs of the last minute and trace
        /// lookups, alternately).
        #[arg(long, default_value = "500ms", value_parser = parse_duration)]
        query_interval: Duration,
        #[arg(long)]
        verify: bool,
    },
    /// Stores one service's profiles for the query benchmark: native frames
    /// at real function addresses of the given ELF files (uploaded first as
    /// their own debug info with --upload), Zipf-distributed stacks, one
    /// export per 10 s window.
    QuerySeed(query::SeedArgs),
    /// Times flamegraph queries (or, with --trace-id, trace lookups): one
    /// first request (cold after a restart), then N more; prints latency
    /// percentiles, exits non-zero on errors.
    Query(query::QueryArgs),
    /// The ingest pipeline in this process, stage by stage (gunzip + decode,
    /// normalize, encode) on the calling thread (pin it with taskset).
    Pipeline {
        #[command(flatten)]
        run: InProcess,
        /// How requests become parts.
        #[arg(long, value_enum, default_value = "series")]
        layout: pipeline::Layout,
        /// zstd level of the encoded parts (the server's ingest level: 1).
        #[arg(long, default_value_t = 1)]
        zstd_level: i32,
    },
    /// Where a stored segment's bytes go: each group of its columns
    /// (strings, stacks, links, timestamps, …) compressed alone, in bytes
    /// per event, summed over its parts.
    SegmentColumns {
        /// Segment objects (from the server's blob store).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// zstd level (the compactor's: 12).
        #[arg(long, default_value_t = 12)]
        zstd_level: i32,
    },
    /// The physical limit on this core: gunzip + prost decoding of the same
    /// payloads, in a loop on the calling thread (pin it with taskset).
    DecodeBaseline {
        #[command(flatten)]
        run: InProcess,
        #[arg(long)]
        periodic: bool,
    },
}

/// The payloads and duration of an in-process measurement.
#[derive(clap::Args)]
struct InProcess {
    #[arg(long, value_enum, default_value = "medium")]
    size: Size,
    #[arg(long, default_value_t = 8)]
    payloads: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(60 * n)),
        _ => Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    }
}

fn decode_baseline(payloads: &[Payload], duration: Duration) {
    let started = Instant::now();
    let (mut bytes, mut events, mut n) = (0usize, 0usize, 0usize);
    while started.elapsed() < duration {
        let p = &payloads[n % payloads.len()];
        let mut raw = Vec::with_capacity(p.raw.len());
        flate2::read::MultiGzDecoder::new(&p.gzipped[..])
            .read_to_end(&mut raw)
            .unwrap();
        let request = ExportProfilesServiceRequest::decode(&raw[..]).unwrap();
        std::hint::black_box(&request);
        bytes += raw.len();
        events += p.events;
        n += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "gunzip+decode     {:.1} MB/s  {:.0} events/s  ({n} payloads)",
        bytes as f64 / secs / 1e6,
        events as f64 / secs
    );
    println!(
        "{}",
        serde_json::json!({"scenario": "decode-baseline", "mb_per_second": bytes as f64 / secs / 1e6, "events_per_second": events as f64 / secs})
    );
}

/// A number for this run: names its exports (and, in `mixed`, its uploads).
fn run_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Events and bytes of the acknowledged exports, under the table.
fn export_figures(report: &mut Report, exporter: &Exporter, seconds: f64, events: u64) {
    let bytes = exporter
        .protobuf_bytes
        .load(std::sync::atomic::Ordering::Relaxed) as f64;
    let acknowledged = exporter.acknowledged.lock().unwrap().len();
    report.figures.extend([
        ("exports ok".to_owned(), acknowledged.into()),
        (
            "events/s".to_owned(),
            ((events as f64 / seconds) as u64).into(),
        ),
        ("MB/s (protobuf)".to_owned(), (bytes / seconds / 1e6).into()),
        (
            "raw B/event".to_owned(),
            (bytes / (events.max(1) as f64)).into(),
        ),
    ]);
}

async fn otlp_scenario(
    common: Common,
    exports: Exports,
    connections: usize,
    max_exports: u64,
) -> anyhow::Result<bool> {
    let exporter = exports.exporter(&common, run_id())?;
    let targets = common.targets();
    let mut report = common.report();
    let op = report.op("otlp", "export");
    let started = Instant::now();
    {
        let (t, e, op) = (targets.clone(), exporter.clone(), op.clone());
        target::run(
            connections,
            common.duration,
            max_exports,
            exports.interval(&exporter),
            move |n| {
                let (t, e, op) = (t.clone(), e.clone(), op.clone());
                async move { e.export(&t, &op, n).await }
            },
        )
        .await;
    }
    let seconds = started.elapsed().as_secs_f64();
    export_figures(&mut report, &exporter, seconds, op.units());
    let ok = op.succeeded() > 0;
    Ok(common.finish(report).await? && ok)
}

async fn debuginfod_scenario(
    common: Common,
    symbols: Symbols,
    connections: usize,
) -> anyhow::Result<bool> {
    let targets = common.targets();
    let d = symbols.prepare(&common, &targets, symbols.seed).await?;
    let mut report = common.report();
    let ops = debuginfod::Ops::new(&mut report);
    let miss = symbols.miss_ratio;
    {
        let (t, d, ops) = (targets.clone(), d.clone(), ops.clone());
        target::run(connections, common.duration, 0, None, move |_| {
            let (t, d, ops) = (t.clone(), d.clone(), ops.clone());
            async move { d.request(&t, &ops, miss, 0.0).await }
        })
        .await;
    }
    let seconds = report.started.elapsed().as_secs_f64();
    report.figures.push((
        "MB/s (hits)".to_owned(),
        (ops.hit.units() as f64 / seconds / 1e6).into(),
    ));
    common.finish(report).await
}

async fn mixed_scenario(
    common: Common,
    exports: Exports,
    symbols: Symbols,
    settings: mixed::Settings,
    verify: bool,
) -> anyhow::Result<bool> {
    let run = run_id();
    let from_ns = now_ns() - (exports.ago + 60) * 1_000_000_000;
    let targets = common.targets();
    let exporter = exports.exporter(&common, run)?;
    let debuginfod = symbols.prepare(&common, &targets, run).await?;
    let services = exports.shape().services;
    let queries = Arc::new(mixed::Queries::new(
        &common.tenant,
        exporter.clone(),
        services,
    )?);
    let settings = mixed::Settings {
        export_interval: exports.interval(&exporter),
        ..settings
    };
    let mut report = common.report();
    let started = Instant::now();
    let export = mixed::run_mixed(
        &settings,
        targets.clone(),
        exporter.clone(),
        debuginfod.clone(),
        queries,
        &mut report,
    )
    .await;
    let seconds = started.elapsed().as_secs_f64();
    export_figures(&mut report, &exporter, seconds, export.units());
    let verified_ok = !verify
        || mixed::verify_all(
            &targets.urls,
            &common.tenant,
            &exporter,
            &debuginfod,
            from_ns,
            &mut report,
        )
        .await?;
    Ok(common.finish(report).await? && verified_ok)
}

fn main() -> anyhow::Result<()> {
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    let ok = match Cli::parse().command {
        Cmd::Otlp {
            common,
            exports,
            connections,
            max_exports,
        } => rt()?.block_on(otlp_scenario(common, exports, connections, max_exports))?,
        Cmd::Debuginfod {
            common,
            symbols,
            connections,
        } => rt()?.block_on(debuginfod_scenario(common, symbols, connections))?,
        Cmd::Mixed {
            common,
            exports,
            symbols,
            otlp_connections,
            debuginfod_connections,
            debuginfod_rate,
            upload_ratio,
            query_connections,
            query_interval,
            verify,
        } => {
            let settings = mixed::Settings {
                duration: common.duration,
                otlp_connections,
                export_interval: None,
                debuginfod_connections,
                debuginfod_interval: (debuginfod_rate > 0.0)
                    .then(|| Duration::from_secs_f64(1.0 / debuginfod_rate)),
                miss_ratio: symbols.miss_ratio,
                upload_ratio,
                query_connections,
                query_interval,
            };
            rt()?.block_on(mixed_scenario(common, exports, symbols, settings, verify))?
        }
        Cmd::QuerySeed(args) => {
            rt()?.block_on(query::seed(args))?;
            true
        }
        Cmd::Query(args) => rt()?.block_on(query::query(args))?,
        Cmd::Pipeline {
            run,
            layout,
            zstd_level,
        } => {
            let payloads =
                otlp::payloads(run.size.shape(false, None), run.payloads.max(1), 0, false);
            pipeline::run(&payloads, run.duration, layout, zstd_level);
            true
        }
        Cmd::SegmentColumns { files, zstd_level } => {
            segment_columns(&files, zstd_level)?;
            true
        }
        Cmd::DecodeBaseline { run, periodic } => {
            let shape = run.size.shape(periodic, None);
            let payloads = otlp::payloads(shape, run.payloads.max(1), 0, false);
            decode_baseline(&payloads, run.duration);
            true
        }
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

fn segment_columns(files: &[std::path::PathBuf], level: i32) -> anyhow::Result<()> {
    use symtrace_profiles::segment;
    let mut groups: Vec<(&'static str, usize, usize)> = Vec::new();
    let (mut events, mut stored) = (0u64, 0usize);
    for file in files {
        let bytes = std::fs::read(file)?;
        stored += bytes.len();
        for part in segment::decode_parts(&bytes)? {
            events += part.points();
            for (i, c) in segment::column_sizes(&part, level).into_iter().enumerate() {
                if groups.len() <= i {
                    groups.push((c.name, 0, 0));
                }
                groups[i].1 += c.raw;
                groups[i].2 += c.compressed;
            }
        }
    }
    let per = |b: usize| b as f64 / events.max(1) as f64;
    println!(
        "{events} events, {stored} bytes stored ({:.2} B/event)",
        per(stored)
    );
    println!(
        "{:<40} {:>12} {:>12} {:>9}",
        "columns", "raw B", "zstd B", "B/event"
    );
    for (name, raw, compressed) in &groups {
        println!(
            "{name:<40} {raw:>12} {compressed:>12} {:>9.3}",
            per(*compressed)
        );
    }
    let total: usize = groups.iter().map(|g| g.2).sum();
    println!("{:<40} {:>12} {total:>12} {:>9.3}", "sum", "", per(total));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit_and_refuse_others() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        let err = parse_duration("5h").unwrap_err();
        assert!(
            err.contains("bad duration unit") && err.contains("(ms, s, m)"),
            "{err}"
        );
        assert!(parse_duration("fast").unwrap_err().contains("bad duration"));
    }
}
