//! The pprof format (github.com/google/pprof, `proto/profile.proto`),
//! gzipped, as `go tool pprof` and speedscope read it. The messages are
//! declared here with prost's derive rather than generated: the schema is
//! small and has been stable since 2016.

use std::io::Write;

use prost::Message;
use rustc_hash::FxHashMap;

use crate::aggregate::{Aggregate, TypeInfo};
use crate::resolved::Resolved;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// A gzipped pprof profile as text: its sample types and period, then one
/// `values  root;…;leaf` line per sample (inlined functions as their own
/// frames), sorted — what a test compares or snapshots. Reads what
/// [`encode`] writes; panics on anything else.
#[cfg(any(test, feature = "testing"))]
pub fn describe(gz: &[u8]) -> String {
    use std::io::Read;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("a gzipped pprof profile");
    let p = Profile::decode(raw.as_slice()).expect("a pprof profile");
    let s = |i: i64| p.string_table[i as usize].as_str();
    let vt = |t: &ValueType| format!("{}:{}", s(t.r#type), s(t.unit));
    let functions: FxHashMap<u64, &str> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
    let locations: FxHashMap<u64, &Location> = p.location.iter().map(|l| (l.id, l)).collect();
    let mut lines: Vec<String> = p
        .sample
        .iter()
        .map(|sample| {
            let mut frames: Vec<&str> = Vec::new();
            // Root first (pprof lists leaf first), and within a location
            // the caller before what it inlined.
            for id in sample.location_id.iter().rev() {
                let location = locations[id];
                frames.extend(
                    location
                        .line
                        .iter()
                        .rev()
                        .map(|l| functions[&l.function_id]),
                );
            }
            let values: Vec<String> = sample.value.iter().map(i64::to_string).collect();
            format!("{}  {}", values.join(","), frames.join(";"))
        })
        .collect();
    lines.sort();
    let types: Vec<String> = p.sample_type.iter().map(vt).collect();
    let period = p.period_type.as_ref().map(vt).unwrap_or_default();
    format!(
        "types {}\nperiod {} {}\n{}\n",
        types.join(" "),
        period,
        p.period,
        lines.join("\n")
    )
}

struct Strings {
    table: Vec<String>,
    ids: FxHashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.ids.insert(s.to_owned(), i);
        i
    }
}

/// The aggregate (one profile type) as a gzipped pprof profile. Counted
/// samples with a period also get the period's unit as a second value
/// (`samples/count` + `cpu/nanoseconds`, like Go's CPU profiles).
pub fn encode(
    agg: &Aggregate,
    resolved: &Resolved,
    ty: &TypeInfo,
    from_ns: i64,
    to_ns: i64,
) -> Vec<u8> {
    let mut s = Strings {
        table: vec![String::new()],
        ids: FxHashMap::default(),
    };
    s.ids.insert(String::new(), 0);
    let mut sample_type = vec![ValueType {
        r#type: s.id(&ty.sample_type),
        unit: s.id(&ty.sample_unit),
    }];
    let scaled = ty.sample_unit == "count" && ty.period > 0 && !ty.period_type.is_empty();
    let period_type = ValueType {
        r#type: s.id(&ty.period_type),
        unit: s.id(&ty.period_unit),
    };
    if scaled {
        sample_type.push(period_type.clone());
    }

    // Mappings by (build-ID, file); functions by (name, file).
    let mut mappings: Vec<Mapping> = Vec::new();
    let mut mapping_ids: FxHashMap<(u32, u32), u64> = FxHashMap::default();
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: FxHashMap<u32, u64> = FxHashMap::default();
    let mut locations = Vec::with_capacity(agg.frames.len());
    for (i, raw) in agg.frames.iter().enumerate() {
        let mapping_id = if raw.build_id != 0 || raw.module != 0 {
            *mapping_ids
                .entry((raw.build_id, raw.module))
                .or_insert_with(|| {
                    let id = mappings.len() as u64 + 1;
                    mappings.push(Mapping {
                        id,
                        filename: s.id(agg.str(raw.module)),
                        build_id: s.id(agg.str(raw.build_id)),
                        has_functions: true,
                    });
                    id
                })
        } else {
            0
        };
        let line = resolved
            .expansion(i as u32)
            .iter()
            .map(|&f| {
                let function_id = *function_ids.entry(f).or_insert_with(|| {
                    let shown = &resolved.shown[f as usize];
                    let name = s.id(agg.str(shown.name));
                    let id = functions.len() as u64 + 1;
                    functions.push(Function {
                        id,
                        name,
                        system_name: name,
                        filename: s.id(agg.str(shown.file)),
                    });
                    id
                });
                Line {
                    function_id,
                    line: i64::from(resolved.lines[f as usize]),
                }
            })
            .collect();
        locations.push(Location {
            id: i as u64 + 1,
            mapping_id,
            address: raw.address,
            line,
        });
    }
    let sample = agg
        .stacks
        .iter()
        .filter(|(_, v)| v[0] != 0)
        .map(|((_, frames), v)| {
            let mut value = vec![v[0]];
            if scaled {
                value.push(v[0].saturating_mul(ty.period));
            }
            Sample {
                location_id: frames.iter().map(|&f| u64::from(f) + 1).collect(),
                value,
            }
        })
        .collect();
    let default_sample_type = sample_type.last().map_or(0, |t| t.r#type);
    let profile = Profile {
        sample_type,
        sample,
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: s.table,
        time_nanos: from_ns,
        duration_nanos: to_ns.saturating_sub(from_ns),
        period_type: Some(period_type),
        period: ty.period,
        default_sample_type,
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&profile.encode_to_vec())
        .expect("writing to memory");
    gz.finish().expect("writing to memory")
}
