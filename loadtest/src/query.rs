//! The query benchmark: `query-seed` stores one service's hour of profiles
//! whose native frames are real functions of real ELF files (uploaded as
//! their own debug info, so every query symbolizes for real); `query` then
//! times flamegraph requests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue};
use symtrace_proto::profiles::{
    KeyValueAndUnit, Location, Mapping, Profile, ProfilesDictionary, ResourceProfiles, Sample,
    ScopeProfiles, Stack, ValueType,
};

use crate::generate::{kv, Zipf};
use any_value::Value::StringValue;

#[derive(clap::Args)]
pub struct SeedArgs {
    #[arg(long, default_value = "http://127.0.0.1:8002")]
    pub url: String,
    #[arg(long, default_value = "loadtest")]
    pub tenant: String,
    #[arg(long, default_value = "bench-svc")]
    pub service: String,
    /// ELF files with GNU build-IDs and symbols (each a distinct build-ID).
    #[arg(long, required = true, num_args = 1..)]
    pub elf: Vec<PathBuf>,
    /// Distinct stacks.
    #[arg(long, default_value_t = 50_000)]
    pub stacks: usize,
    /// Samples (timestamps) in all.
    #[arg(long, default_value_t = 1_000_000)]
    pub samples: usize,
    /// Seconds of profile time covered.
    #[arg(long, default_value_t = 3600)]
    pub seconds: u64,
    /// How many seconds ago the covered time starts.
    #[arg(long, default_value_t = 3600)]
    pub ago: u64,
    /// Upload each ELF file as the debuginfo of its build-ID first.
    #[arg(long)]
    pub upload: bool,
}

/// A binary's functions: (start, size) in ELF virtual addresses.
struct Binary {
    path: String,
    build_id: String,
    functions: Vec<(u64, u64)>,
}

fn read_binary(path: &PathBuf) -> anyhow::Result<Binary> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file =
        object::File::parse(&*data).with_context(|| format!("parsing {}", path.display()))?;
    let build_id = file
        .build_id()?
        .map(hex_of)
        .with_context(|| format!("{} has no GNU build-ID", path.display()))?;
    let text: Vec<_> = file
        .sections()
        .filter(|s| s.kind() == object::SectionKind::Text)
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16)
        .map(|s| (s.address(), s.size()))
        .filter(|(a, _)| text.iter().any(|(lo, hi)| (lo..hi).contains(&a)))
        .collect();
    functions.sort_unstable();
    functions.dedup();
    if functions.len() < 10 {
        bail!("{} has too few function symbols", path.display());
    }
    Ok(Binary {
        path: path.display().to_string(),
        build_id,
        functions,
    })
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Stacks (leaf first) of (binary, address): 80% extend a prefix of an
/// earlier stack, as call trees do; binaries and functions Zipf-weighted,
/// four distinct addresses per function.
fn make_stacks(rng: &mut StdRng, binaries: &[Binary], count: usize) -> Vec<Vec<(usize, u64)>> {
    let by_binary = Zipf::new(binaries.len());
    let per_binary: Vec<Zipf> = binaries
        .iter()
        .map(|b| Zipf::new(b.functions.len()))
        .collect();
    let frame = |rng: &mut StdRng| {
        let b = by_binary.sample(rng);
        let (start, size) = binaries[b].functions[per_binary[b].sample(rng)];
        // A function is left from a few places (its call sites and hot
        // loops), not from every byte: 4 return addresses per function.
        let site = (start ^ (rng.random_range(0..4u64) + 1)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (b, start + 1 + (site >> 11) % (size - 1))
    };
    let mut roots_first: Vec<Vec<(usize, u64)>> = Vec::with_capacity(count);
    let mut seen = std::collections::HashSet::new();
    while roots_first.len() < count {
        let mut st = if !roots_first.is_empty() && rng.random_bool(0.8) {
            let base = &roots_first[rng.random_range(0..roots_first.len())];
            let keep = rng.random_range(1..=base.len());
            base[..keep].to_vec()
        } else {
            Vec::new()
        };
        let depth = rng.random_range(10..=40).max(st.len() + 1);
        while st.len() < depth {
            st.push(frame(rng));
        }
        if seen.insert(st.clone()) {
            roots_first.push(st);
        }
    }
    roots_first
        .into_iter()
        .map(|mut s| {
            s.reverse();
            s
        })
        .collect()
}

pub async fn seed(args: SeedArgs) -> anyhow::Result<()> {
    let binaries: Vec<Binary> = args.elf.iter().map(read_binary).collect::<Result<_, _>>()?;
    let mut ids: Vec<&str> = binaries.iter().map(|b| b.build_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != binaries.len() {
        bail!("the ELF files must have distinct build-IDs");
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let base = args.url.trim_end_matches('/').to_owned();
    if args.upload {
        for b in &binaries {
            let body = tokio::fs::read(&b.path).await?;
            let r = http
                .put(format!("{base}/api/v1/debuginfo/{}/debuginfo", b.build_id))
                .body(body)
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("uploading {}: {} {}", b.path, r.status(), r.text().await?);
            }
        }
        println!(
            "uploaded          {} ELF files as debuginfo",
            binaries.len()
        );
    }
    let mut rng = StdRng::seed_from_u64(0x9e3779b9);
    let stacks = make_stacks(&mut rng, &binaries, args.stacks);
    let zipf = Zipf::new(stacks.len());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let start = now - args.ago * 1_000_000_000;
    let span = args.seconds * 1_000_000_000;
    // Per 10 s export window: stack → timestamps.
    let windows = args.seconds.div_ceil(10) as usize;
    let mut per_window: Vec<HashMap<usize, Vec<u64>>> = vec![HashMap::new(); windows];
    for _ in 0..args.samples {
        let t = rng.random_range(0..span);
        per_window[(t / 10_000_000_000) as usize]
            .entry(zipf.sample(&mut rng))
            .or_default()
            .push(start + t);
    }
    let endpoint = format!("{base}/v1development/profiles");
    let started = Instant::now();
    let (mut sent, mut bytes) = (0usize, 0usize);
    for (w, window) in per_window.into_iter().enumerate() {
        let request = export(
            &binaries,
            &stacks,
            window,
            start + w as u64 * 10_000_000_000,
            &args.service,
        );
        let raw = request.encode_to_vec();
        bytes += raw.len();
        let body = crate::otlp::gzip(&raw);
        let r = http
            .post(&endpoint)
            .header("Content-Type", "application/x-protobuf")
            .header("Content-Encoding", "gzip")
            .header("X-Scope-OrgID", &args.tenant)
            .body(body)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("export {w}: {} {}", r.status(), r.text().await?);
        }
        sent += 1;
    }
    println!(
        "seeded            {} samples, {} distinct stacks, {} build-IDs, {} exports ({:.1} MB protobuf) in {:.1} s",
        args.samples,
        stacks.len(),
        binaries.len(),
        sent,
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn export(
    binaries: &[Binary],
    stacks: &[Vec<(usize, u64)>],
    window: HashMap<usize, Vec<u64>>,
    window_start: u64,
    service: &str,
) -> ExportProfilesServiceRequest {
    let mut d = ProfilesDictionary::with_zero_values();
    let mut strings: HashMap<String, i32> = HashMap::new();
    let mut string = |d: &mut ProfilesDictionary, s: &str| -> i32 {
        *strings.entry(s.to_owned()).or_insert_with(|| {
            d.string_table.push(s.to_owned());
            d.string_table.len() as i32 - 1
        })
    };
    let k_gnu = string(&mut d, "process.executable.build_id.gnu");
    let k_type = string(&mut d, "profile.frame.type");
    d.attribute_table.push(KeyValueAndUnit {
        key_strindex: k_type,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue("native".into())),
        }),
        unit_strindex: 0,
    });
    let native = 1;
    let mut mappings = HashMap::new();
    let mut locations: HashMap<(usize, u64), i32> = HashMap::new();
    let mut samples = Vec::with_capacity(window.len());
    let mut window: Vec<_> = window.into_iter().collect();
    window.sort_unstable_by_key(|(s, _)| *s);
    for (stack, mut timestamps) in window {
        let mut location_indices = Vec::with_capacity(stacks[stack].len());
        for &(b, address) in &stacks[stack] {
            let mapping = *mappings.entry(b).or_insert_with(|| {
                d.attribute_table.push(KeyValueAndUnit {
                    key_strindex: k_gnu,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(binaries[b].build_id.clone())),
                    }),
                    unit_strindex: 0,
                });
                let file = string(&mut d, &binaries[b].path);
                d.mapping_table.push(Mapping {
                    memory_start: 0,
                    memory_limit: u64::MAX >> 1,
                    filename_strindex: file,
                    attribute_indices: vec![d.attribute_table.len() as i32 - 1],
                    ..Default::default()
                });
                d.mapping_table.len() as i32 - 1
            });
            let loc = *locations.entry((b, address)).or_insert_with(|| {
                d.location_table.push(Location {
                    mapping_index: mapping,
                    address,
                    attribute_indices: vec![native],
                    ..Default::default()
                });
                d.location_table.len() as i32 - 1
            });
            location_indices.push(loc);
        }
        d.stack_table.push(Stack { location_indices });
        timestamps.sort_unstable();
        samples.push(Sample {
            stack_index: d.stack_table.len() as i32 - 1,
            timestamps_unix_nano: timestamps,
            ..Default::default()
        });
    }
    let samples_type = string(&mut d, "samples");
    let count = string(&mut d, "count");
    let cpu = string(&mut d, "cpu");
    let ns = string(&mut d, "nanoseconds");
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(symtrace_proto::resource::Resource {
                attributes: vec![
                    kv("service.name", StringValue(service.into())),
                    kv("host.name", StringValue("bench-host".into())),
                ],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(ValueType {
                        type_strindex: samples_type,
                        unit_strindex: count,
                    }),
                    period_type: Some(ValueType {
                        type_strindex: cpu,
                        unit_strindex: ns,
                    }),
                    period: 52_631_578,
                    time_unix_nano: window_start,
                    duration_nano: 10_000_000_000,
                    samples,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(d),
    }
}

#[derive(clap::Args)]
pub struct QueryArgs {
    #[arg(long, default_value = "http://127.0.0.1:8002")]
    pub url: String,
    #[arg(long, default_value = "loadtest")]
    pub tenant: String,
    /// The query string of /api/v1/flamegraph.
    #[arg(long, default_value = "service=bench-svc&from=now-2h&to=now")]
    pub query: String,
    #[arg(long, default_value_t = 30)]
    pub iterations: usize,
    /// Time `GET /api/v1/traces/ID` (the trace view: a trace's spans with
    /// their CPU time) instead of the flamegraph query.
    #[arg(long)]
    pub trace_id: Option<String>,
}

/// Times `iterations` flamegraph (or trace) requests after a first one (reported on
/// its own: it is the cold one when the server just started).
pub async fn query(args: QueryArgs) -> anyhow::Result<bool> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let base = args.url.trim_end_matches('/');
    let url = match &args.trace_id {
        Some(id) => format!("{base}/api/v1/traces/{id}"),
        None => format!("{base}/api/v1/flamegraph?{}", args.query),
    };
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut first = None;
    let mut errors = 0;
    let mut summary = serde_json::Value::Null;
    for i in 0..=args.iterations {
        let t = Instant::now();
        let r = http
            .get(&url)
            .header("X-Scope-OrgID", &args.tenant)
            .send()
            .await?;
        let ok = r.status().is_success();
        let body = r.bytes().await?;
        let ms = t.elapsed().as_micros() as u64;
        if !ok {
            errors += 1;
            eprintln!("error: {}", String::from_utf8_lossy(&body));
            continue;
        }
        if i == 0 {
            first = Some(ms);
            if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&body) {
                for k in ["tree", "functions", "build_ids"] {
                    if let Some(o) = v.as_object_mut() {
                        o.remove(k);
                    }
                }
                summary = v;
            }
        } else {
            histogram.record(ms)?;
        }
    }
    let ms = |v: u64| v as f64 / 1000.0;
    println!("first (cold)      {:.1} ms", ms(first.unwrap_or(0)));
    println!(
        "warm ms           p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  ({} requests)",
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.9)),
        ms(histogram.value_at_quantile(0.99)),
        ms(histogram.max()),
        histogram.len()
    );
    println!("errors            {errors}");
    println!(
        "{}",
        serde_json::json!({
            "scenario": "query", "first_ms": first.map(ms), "errors": errors,
            "warm_ms": {"p50": ms(histogram.value_at_quantile(0.5)), "p90": ms(histogram.value_at_quantile(0.9)),
                        "p99": ms(histogram.value_at_quantile(0.99)), "max": ms(histogram.max())},
            "answer": summary,
        })
    );
    Ok(errors == 0)
}
