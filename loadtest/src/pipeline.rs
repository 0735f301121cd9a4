//! The ingest pipeline without the server around it: gunzip + decode (into
//! `symtrace_profiles::request::Request`, as ingest does),
//! normalization (whole then split by series, or by series directly) and
//! segment encoding of the same payloads, timed stage by stage on the
//! calling thread (pin it with taskset). What HTTP, the database and fsync
//! add is the difference to `otlp` against a server.

use std::io::Read;
use std::time::{Duration, Instant};

use symtrace_profiles::normalize::{normalize_request, normalize_request_by_series, Limits};
use symtrace_profiles::request::Request;
use symtrace_profiles::{parts, segment};

use crate::otlp::Payload;

/// How a request becomes parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// Normalized whole, then split by series (what compaction does).
    Split,
    /// Normalized by series directly (what ingest does).
    Series,
}

pub fn run(payloads: &[Payload], duration: Duration, layout: Layout, zstd_level: i32) {
    let limits = Limits::default();
    let (mut decode, mut build, mut encode) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut events, mut bytes, mut n) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    while started.elapsed() < duration {
        let p = &payloads[n % payloads.len()];
        let t = Instant::now();
        let mut raw = Vec::with_capacity(p.raw.len());
        flate2::read::MultiGzDecoder::new(&p.gzipped[..])
            .read_to_end(&mut raw)
            .expect("gunzip");
        let request = Request::decode(&raw[..]).expect("decode");
        let t1 = Instant::now();
        let now = u64::MAX / 2;
        let parts = match layout {
            Layout::Split => parts::split(
                normalize_request(&request, now, &limits)
                    .expect("usable")
                    .data,
            ),
            Layout::Series => {
                normalize_request_by_series(&request, now, &limits)
                    .expect("usable")
                    .data
            }
        };
        let t2 = Instant::now();
        let datas: Vec<_> = parts.into_iter().map(|(_, d)| d).collect();
        let (segment, _) = segment::encode_parts(&datas, zstd_level);
        std::hint::black_box(&segment);
        let t3 = Instant::now();
        (decode, build, encode) = (decode + (t1 - t), build + (t2 - t1), encode + (t3 - t2));
        events += p.events;
        bytes += segment.len();
        n += 1;
    }
    let total = decode + build + encode;
    let rate = |d: Duration| events as f64 / d.as_secs_f64();
    println!(
        "pipeline ({layout:?}, zstd {zstd_level}): {:.0} events/s over {n} payloads, {:.2} B/event as encoded",
        rate(total),
        bytes as f64 / events as f64
    );
    for (stage, d) in [
        ("gunzip+decode", decode),
        ("normalize", build),
        ("encode", encode),
    ] {
        println!(
            "  {stage:<14} {:>5.1}%  ({:.0} events/s alone)",
            100.0 * d.as_secs_f64() / total.as_secs_f64(),
            rate(d)
        );
    }
    println!(
        "{}",
        serde_json::json!({"scenario": "pipeline", "layout": format!("{layout:?}"), "events_per_second": rate(total),
            "decode_events_per_second": rate(decode), "normalize_events_per_second": rate(build), "encode_events_per_second": rate(encode)})
    );
}
