//! Realistic OTLP profiles, shaped like the OpenTelemetry eBPF profiler's
//! exports (see ../shared/reference/otlp-ingest-anchor.md): per process one
//! ResourceProfiles with one `samples/count` profile over a 10 s window;
//! stacks of depth 10–60 over a Zipf-distributed pool of unsymbolized
//! native frames (mappings with build-IDs), 80% extending a prefix of an
//! earlier stack, 25% ending in 2–8 named kernel frames; timestamps-only
//! samples with thread attributes, k timestamps with P(k) ∝ k⁻², 20% with
//! a trace link. The stacks of a process are the same in every export
//! (drawn Zipf-distributed, 1.3 samples per stack); the anchor's generator
//! drew new ones each time, which no fleet does.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue, KeyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};

#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub processes: usize,
    /// Stacks per process, drawn uniformly from this range.
    pub stacks: (usize, usize),
    /// Timestamps are regular 19 Hz ticks (with µs jitter) instead of
    /// uniformly random nanoseconds.
    pub periodic: bool,
    /// Services of the fleet (at least `processes`): export `seed`'s
    /// process `p` is `service-{(seed × processes + p) mod services}`, so
    /// each export holds `processes` of them, as a host holds a few of a
    /// fleet's services.
    pub services: usize,
}

impl Shape {
    /// About 1 MB of protobuf.
    pub const MEDIUM: Shape = Shape {
        processes: 40,
        stacks: (30, 300),
        periodic: false,
        services: 40,
    };
    /// About 10 MB.
    pub const LARGE: Shape = Shape {
        processes: 140,
        stacks: (200, 1200),
        periodic: false,
        services: 140,
    };
}

/// Sample from a Zipf(s = 1) distribution over `0..n`.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize) -> Self {
        let mut total = 0.0;
        let cdf = (1..=n)
            .map(|k| {
                total += 1.0 / k as f64;
                total
            })
            .collect::<Vec<_>>();
        Self {
            cdf: cdf.into_iter().map(|c| c / total).collect(),
        }
    }
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

pub fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// One export; `seed` picks the content, `now_ns` the window's end.
pub fn export(shape: Shape, seed: u64, now_ns: u64) -> ExportProfilesServiceRequest {
    // The fleet (files, frames, each process's stacks) is the same in every
    // export, as it is in production; which stacks are sampled, when, on
    // which thread and in which trace differs per export (`seed`).
    let mut pool = StdRng::seed_from_u64(0x5eed_f1ee7);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut d = ProfilesDictionary::with_zero_values();
    let mut strings = std::collections::HashMap::new();
    let mut string = |d: &mut ProfilesDictionary, s: &str| -> i32 {
        *strings.entry(s.to_owned()).or_insert_with(|| {
            d.string_table.push(s.to_owned());
            d.string_table.len() as i32 - 1
        })
    };
    let attribute = |d: &mut ProfilesDictionary, key: i32, value: any_value::Value| -> i32 {
        d.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        d.attribute_table.len() as i32 - 1
    };
    let k_frame_type = string(&mut d, "profile.frame.type");
    let k_gnu = string(&mut d, "process.executable.build_id.gnu");
    let k_thread_name = string(&mut d, "thread.name");
    let k_thread_id = string(&mut d, "thread.id");
    let native = attribute(
        &mut d,
        k_frame_type,
        any_value::Value::StringValue("native".into()),
    );
    let kernel = attribute(
        &mut d,
        k_frame_type,
        any_value::Value::StringValue("kernel".into()),
    );

    // The pool: 120 mappings, 5,000 native locations, 30 kernel frames.
    for m in 0..120 {
        let file = string(&mut d, &format!("/usr/lib/lib{m}.so"));
        let build_id = format!("{:040x}", pool.random::<u128>() ^ (m as u128) << 100);
        let a = attribute(&mut d, k_gnu, any_value::Value::StringValue(build_id));
        d.mapping_table.push(Mapping {
            memory_start: 0x1000,
            memory_limit: 0x100_0000,
            filename_strindex: file,
            attribute_indices: vec![a],
            ..Default::default()
        });
    }
    let natives: Vec<i32> = (0..5000)
        .map(|_| {
            d.location_table.push(Location {
                mapping_index: pool.random_range(1..=120),
                address: pool.random_range(0x1000..0x100_0000),
                attribute_indices: vec![native],
                ..Default::default()
            });
            d.location_table.len() as i32 - 1
        })
        .collect();
    let kernels: Vec<i32> = (0..30)
        .map(|i| {
            let name = string(&mut d, &format!("kernel_function_{i}"));
            d.function_table.push(Function {
                name_strindex: name,
                system_name_strindex: name,
                ..Default::default()
            });
            d.location_table.push(Location {
                lines: vec![Line {
                    function_index: d.function_table.len() as i32 - 1,
                    ..Default::default()
                }],
                attribute_indices: vec![kernel],
                ..Default::default()
            });
            d.location_table.len() as i32 - 1
        })
        .collect();
    let zipf = Zipf::new(natives.len());
    let k_weights: Vec<f64> = (1..=50).map(|k| 1.0 / (k * k) as f64).collect();
    let k_total: f64 = k_weights.iter().sum();

    let window = 10_000_000_000u64;
    let start = now_ns - window;
    let mut resource_profiles = Vec::with_capacity(shape.processes);
    let sample_type = ValueType {
        type_strindex: string(&mut d, "samples"),
        unit_strindex: string(&mut d, "count"),
    };
    let period_type = ValueType {
        type_strindex: string(&mut d, "cpu"),
        unit_strindex: string(&mut d, "nanoseconds"),
    };
    for p in 0..shape.processes {
        let n_stacks = pool.random_range(shape.stacks.0..=shape.stacks.1);
        let threads: Vec<(i32, i32)> = (0..pool.random_range(1..=16))
            .map(|t| {
                let name = attribute(
                    &mut d,
                    k_thread_name,
                    any_value::Value::StringValue(format!("worker-{t}")),
                );
                let id = attribute(
                    &mut d,
                    k_thread_id,
                    any_value::Value::IntValue(10_000 * p as i64 + t),
                );
                (name, id)
            })
            .collect();
        let mut stacks: Vec<Vec<i32>> = Vec::new();
        let mut pool_stacks = Vec::with_capacity(n_stacks);
        for _ in 0..n_stacks {
            let depth = pool.random_range(10..=60);
            let mut frames: Vec<i32> = if !stacks.is_empty() && pool.random_bool(0.8) {
                // Extend a prefix (from the root) of an earlier stack.
                let earlier = &stacks[pool.random_range(0..stacks.len())];
                let keep = pool.random_range(1..=earlier.len());
                earlier[earlier.len() - keep..].to_vec()
            } else {
                Vec::new()
            };
            while frames.len() < depth {
                frames.insert(0, natives[zipf.sample(&mut pool)]);
            }
            if pool.random_bool(0.25) {
                for _ in 0..pool.random_range(2..=8) {
                    frames.insert(0, kernels[pool.random_range(0..kernels.len())]);
                }
            }
            d.stack_table.push(Stack {
                location_indices: frames.clone(),
            });
            pool_stacks.push(d.stack_table.len() as i32 - 1);
            stacks.push(frames);
        }
        // Samples: 1.3 per stack of the pool, hot stacks more often (Zipf).
        let hot = Zipf::new(n_stacks);
        let mut samples = Vec::new();
        let mut tick = start + rng.random_range(0..52_631_578);
        for _ in 0..n_stacks * 13 / 10 {
            let stack_index = pool_stacks[hot.sample(&mut rng)];
            let (name, id) = threads[rng.random_range(0..threads.len())];
            let mut u = rng.random::<f64>() * k_total;
            let k = k_weights
                .iter()
                .position(|w| {
                    u -= w;
                    u <= 0.0
                })
                .unwrap_or(0)
                + 1;
            let mut timestamps: Vec<u64> = (0..k)
                .map(|_| {
                    if shape.periodic {
                        tick += 52_631_578 + rng.random_range(0..2_000);
                        start + (tick - start) % window
                    } else {
                        start + rng.random_range(0..window)
                    }
                })
                .collect();
            timestamps.sort_unstable();
            let link_index = if rng.random_bool(0.2) {
                d.link_table.push(Link {
                    trace_id: rng.random::<[u8; 16]>().to_vec(),
                    span_id: rng.random::<[u8; 8]>().to_vec(),
                });
                d.link_table.len() as i32 - 1
            } else {
                0
            };
            samples.push(Sample {
                stack_index,
                attribute_indices: vec![name, id],
                link_index,
                values: vec![],
                timestamps_unix_nano: timestamps,
            });
        }
        resource_profiles.push(ResourceProfiles {
            resource: Some(symtrace_proto::resource::Resource {
                attributes: vec![
                    kv(
                        "service.name",
                        any_value::Value::StringValue(format!(
                            "service-{}",
                            (seed as usize * shape.processes + p) % shape.services.max(1)
                        )),
                    ),
                    kv("process.pid", any_value::Value::IntValue(1000 + p as i64)),
                ],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(sample_type),
                    period_type: Some(period_type),
                    period: 52_631_578,
                    time_unix_nano: start,
                    duration_nano: window,
                    samples,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d),
    }
}

/// Timestamps (events) in a request.
pub fn events(request: &ExportProfilesServiceRequest) -> usize {
    request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
        .flat_map(|p| &p.samples)
        .map(|s| s.timestamps_unix_nano.len().max(s.values.len()))
        .sum()
}
