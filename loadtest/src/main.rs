//! symtrace-loadtest: load and benchmarks for symtrace-server. Every loop is
//! bounded in count and time and aimed only at the URL it is given.

mod generate;
mod query;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use prost::Message;
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue, KeyValue};
use symtrace_proto::profiles::{Profile, ResourceProfiles, Sample, ScopeProfiles, ValueType};

use crate::generate::Shape;

/// Load generator and benchmarks for symtrace-server.
#[derive(Parser)]
#[command(name = "symtrace-loadtest", version, about)]
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
    fn shape(self, periodic: bool) -> Shape {
        let base = match self {
            Size::Medium => Shape::MEDIUM,
            Size::Large => Shape::LARGE,
        };
        Shape { periodic, ..base }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Exports realistic OTLP profiles over OTLP/HTTP (protobuf, gzip) as
    /// fast as the server takes them; prints throughput and latency, exits
    /// non-zero if any export failed.
    Otlp {
        /// The server's HTTP base URL.
        #[arg(long, default_value = "http://127.0.0.1:8002")]
        url: String,
        /// How long to send.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        duration: Duration,
        /// Concurrent exports in flight.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        #[arg(long, value_enum, default_value = "medium")]
        size: Size,
        /// Distinct base payloads generated up front (each export is made
        /// unique with a small extra resource, so none is a retry).
        #[arg(long, default_value_t = 8)]
        payloads: usize,
        /// Regular 19 Hz timestamps instead of random nanoseconds.
        #[arg(long)]
        periodic: bool,
        /// X-Scope-OrgID.
        #[arg(long, default_value = "loadtest")]
        tenant: String,
        /// Most exports sent (0 = until the duration ends).
        #[arg(long, default_value_t = 0)]
        max_exports: u64,
        /// Seconds to shift the profiles' time into the past (backfill).
        #[arg(long, default_value_t = 0)]
        ago: u64,
    },
    /// Stores one service's profiles for the query benchmark: native frames
    /// at real function addresses of the given ELF files (uploaded first as
    /// their own debug info with --upload), Zipf-distributed stacks, one
    /// export per 10 s window.
    QuerySeed(query::SeedArgs),
    /// Times flamegraph queries: one first request (cold after a restart),
    /// then N more; prints latency percentiles, exits non-zero on errors.
    Query(query::QueryArgs),
    /// The physical limit on this core: gunzip + prost decoding of the same
    /// payloads, in a loop on the calling thread (pin it with taskset).
    DecodeBaseline {
        #[arg(long, value_enum, default_value = "medium")]
        size: Size,
        #[arg(long, default_value_t = 8)]
        payloads: usize,
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        #[arg(long)]
        periodic: bool,
    },
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

struct Payload {
    raw: Vec<u8>,
    gzipped: Vec<u8>,
    events: usize,
}

fn payloads(size: Size, count: usize, periodic: bool, ago: u64) -> Vec<Payload> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        - ago * 1_000_000_000;
    (0..count)
        .map(|i| {
            let request = generate::export(size.shape(periodic), i as u64 + 1, now);
            let raw = request.encode_to_vec();
            Payload {
                gzipped: gzip(&raw),
                events: generate::events(&request),
                raw,
            }
        })
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A small gzip member with one more resource (sequence number `seq`):
/// appended to a gzipped payload it makes the export unique. Protobuf
/// concatenation appends to repeated fields, and gzip members concatenate.
fn unique_suffix(seq: u64) -> Vec<u8> {
    let extra = ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(symtrace_proto::resource::Resource {
                attributes: vec![KeyValue {
                    key: "loadtest.seq".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::IntValue(seq as i64)),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(ValueType::default()),
                    samples: vec![Sample {
                        stack_index: 1,
                        timestamps_unix_nano: vec![seq],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: None,
    };
    gzip(&extra.encode_to_vec())
}

#[derive(Default)]
struct Totals {
    ok: AtomicU64,
    events: AtomicU64,
    raw_bytes: AtomicU64,
    wire_bytes: AtomicU64,
    errors: Mutex<std::collections::BTreeMap<String, u64>>,
}

async fn otlp(
    url: String,
    duration: Duration,
    connections: usize,
    payloads: Vec<Payload>,
    tenant: String,
    max_exports: u64,
) -> anyhow::Result<bool> {
    let payloads = Arc::new(payloads);
    let totals = Arc::new(Totals::default());
    let histogram = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let endpoint = format!("{}/v1development/profiles", url.trim_end_matches('/'));
    let started = Instant::now();
    let seq = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections.max(1) {
        let (payloads, totals, histogram, http, endpoint, tenant, seq) = (
            payloads.clone(),
            totals.clone(),
            histogram.clone(),
            http.clone(),
            endpoint.clone(),
            tenant.clone(),
            seq.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < duration {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                if max_exports > 0 && n >= max_exports {
                    break;
                }
                let p = &payloads[n as usize % payloads.len()];
                let mut body = p.gzipped.clone();
                body.extend_from_slice(&unique_suffix(n));
                let wire = body.len() as u64;
                let t = Instant::now();
                let result = http
                    .post(&endpoint)
                    .header("Content-Type", "application/x-protobuf")
                    .header("Content-Encoding", "gzip")
                    .header("X-Scope-OrgID", &tenant)
                    .body(body)
                    .send()
                    .await;
                let kind = match result {
                    Ok(r) if r.status().is_success() => None,
                    Ok(r) => Some(format!("HTTP {}", r.status().as_u16())),
                    Err(e) if e.is_connect() => Some("connection refused".to_owned()),
                    Err(e) if e.is_timeout() => Some("timeout".to_owned()),
                    Err(_) => Some("connection error".to_owned()),
                };
                match kind {
                    None => {
                        histogram
                            .lock()
                            .unwrap()
                            .record(t.elapsed().as_micros() as u64)
                            .ok();
                        totals.ok.fetch_add(1, Ordering::Relaxed);
                        totals
                            .events
                            .fetch_add(p.events as u64 + 1, Ordering::Relaxed);
                        totals
                            .raw_bytes
                            .fetch_add(p.raw.len() as u64, Ordering::Relaxed);
                        totals.wire_bytes.fetch_add(wire, Ordering::Relaxed);
                    }
                    Some(kind) => {
                        *totals.errors.lock().unwrap().entry(kind).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let h = histogram.lock().unwrap();
    let errors = totals.errors.lock().unwrap().clone();
    let ok = totals.ok.load(Ordering::Relaxed);
    let events = totals.events.load(Ordering::Relaxed) as f64;
    let raw = totals.raw_bytes.load(Ordering::Relaxed) as f64;
    let wire = totals.wire_bytes.load(Ordering::Relaxed) as f64;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("exports ok        {ok}");
    println!(
        "errors            {}",
        if errors.is_empty() {
            "none".to_owned()
        } else {
            format!("{errors:?}")
        }
    );
    println!("duration          {secs:.1} s");
    println!("events/s          {:.0}", events / secs);
    println!("MB/s (protobuf)   {:.1}", raw / secs / 1e6);
    println!("MB/s (gzip wire)  {:.1}", wire / secs / 1e6);
    println!(
        "latency ms        p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        h.max() as f64 / 1000.0
    );
    println!(
        "raw B/event       {:.1} (gzip {:.1})",
        raw / events.max(1.0),
        wire / events.max(1.0)
    );
    let json = serde_json::json!({
        "scenario": "otlp", "exports_ok": ok, "errors": errors, "seconds": secs,
        "events_per_second": events / secs, "protobuf_mb_per_second": raw / secs / 1e6,
        "wire_mb_per_second": wire / secs / 1e6,
        "latency_ms": {"p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": h.max() as f64 / 1000.0},
        "raw_bytes_per_event": raw / events.max(1.0), "gzip_bytes_per_event": wire / events.max(1.0),
    });
    println!("{json}");
    Ok(errors.is_empty() && ok > 0)
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

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Otlp {
            url,
            duration,
            connections,
            size,
            payloads: count,
            periodic,
            tenant,
            max_exports,
            ago,
        } => {
            let payloads = payloads(size, count, periodic, ago);
            let avg = payloads.iter().map(|p| p.raw.len()).sum::<usize>() / payloads.len();
            println!(
                "payloads          {count} × ~{:.2} MB protobuf",
                avg as f64 / 1e6
            );
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let ok = rt
                .block_on(otlp(
                    url,
                    duration,
                    connections,
                    payloads,
                    tenant,
                    max_exports,
                ))
                .context("running the otlp scenario")?;
            if !ok {
                std::process::exit(1);
            }
        }
        Cmd::QuerySeed(args) => {
            tokio::runtime::Runtime::new()?.block_on(query::seed(args))?;
        }
        Cmd::Query(args) => {
            if !tokio::runtime::Runtime::new()?.block_on(query::query(args))? {
                std::process::exit(1);
            }
        }
        Cmd::DecodeBaseline {
            size,
            payloads: count,
            duration,
            periodic,
        } => {
            let payloads = payloads(size, count, periodic, 0);
            decode_baseline(&payloads, duration);
        }
    }
    Ok(())
}
