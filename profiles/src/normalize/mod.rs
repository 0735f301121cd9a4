//! OTLP profiles → the stored model. Every profile is checked against the
//! proto's rules before anything of it is kept, so a bad profile is
//! rejected whole and the good ones of the same request are stored.

use std::cell::Cell;
use std::collections::HashSet;

use rustc_hash::FxHashMap;

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value::Value, AnyValue, KeyValue};
use symtrace_proto::profiles::{KeyValueAndUnit, Profile, ProfilesDictionary};

use crate::model::{
    BuildIdKind, Frame, Line, Link, Mapping, Sample, SegmentBuilder, SegmentData, Series,
};

/// What came of a request.
pub struct Normalized {
    /// The accepted profiles' samples.
    pub data: SegmentData,
    /// Profiles accepted.
    pub accepted: usize,
    /// Profiles rejected (see `errors`).
    pub rejected: usize,
    /// One line per rejected profile (the first few), naming what was wrong.
    pub errors: Vec<String>,
    /// Stacks deeper than [`Limits::max_stack_depth`], cut to their leaf-most
    /// frames.
    pub truncated_stacks: usize,
}

/// What one request may carry.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Frames kept of a stack, leaf-most first; the rest become one
    /// synthetic root frame that says how many were cut.
    pub max_stack_depth: usize,
    /// Elements (entries of repeated fields at every level) one request may
    /// hold; checked on the bytes before decoding.
    pub max_elements: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_stack_depth: DEFAULT_MAX_STACK_DEPTH,
            max_elements: DEFAULT_MAX_ELEMENTS,
        }
    }
}

/// Frames kept of a stack by default (`SYMTRACE_MAX_STACK_DEPTH`).
pub const DEFAULT_MAX_STACK_DEPTH: usize = 1024;
/// Elements one request may hold by default (`SYMTRACE_MAX_EXPORT_ELEMENTS`).
pub const DEFAULT_MAX_ELEMENTS: usize = 4_000_000;

/// `profile.frame.type` of the synthetic root frame of a truncated stack.
pub const TRUNCATED_FRAME_TYPE: &str = "truncated";

/// Nesting of array and key-value list attribute values accepted (the
/// protobuf decoder allows 100; no real attribute needs more than a few).
const MAX_VALUE_DEPTH: usize = 16;

/// Attribute lists up to this long are checked for repeated keys by a scan
/// (cheaper than a set); longer ones through a set.
const SHORT_LIST: usize = 16;

/// The request as a whole is unusable (its dictionary breaks the rules).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

/// Rejection messages kept per request; the count is always exact.
const MAX_MESSAGES: usize = 5;

/// Validates `request` and turns its accepted profiles into segment data;
/// `now_ns` bounds timestamps from the future. A profile that breaks a rule is
/// rejected alone (counted, its message kept); a dictionary that breaks one
/// refuses the request.
pub fn normalize(
    mut request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized, RequestError> {
    let dict = request.dictionary.take().unwrap_or_default();
    let dict = &dict;
    check_zero_values(dict)?;
    let mut n = Normalizer {
        dict,
        b: SegmentBuilder::default(),
        locations: vec![u32::MAX; dict.location_table.len()],
        stacks: vec![u32::MAX; dict.stack_table.len()],
        attributes: vec![None; dict.attribute_table.len()],
        valid_attributes: vec![Cell::new(false); dict.attribute_table.len()],
        valid_stacks: vec![Cell::new(false); dict.stack_table.len()],
        valid_locations: vec![Cell::new(false); dict.location_table.len()],
        label_sets: FxHashMap::default(),
        max_stack_depth: limits.max_stack_depth.max(1),
        truncated_stacks: 0,
    };
    let mut out = Normalized {
        data: SegmentData::default(),
        accepted: 0,
        rejected: 0,
        errors: Vec::new(),
        truncated_stacks: 0,
    };
    let reject = |out: &mut Normalized, count: usize, message: String| {
        out.rejected += count;
        if out.errors.len() < MAX_MESSAGES {
            out.errors.push(message);
        }
    };
    for (r, resource_profiles) in request.resource_profiles.iter_mut().enumerate() {
        let attributes = resource_profiles
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default();
        let resource = match n.resource_labels(attributes) {
            Ok(labels) => labels,
            Err(e) => {
                let count = resource_profiles
                    .scope_profiles
                    .iter()
                    .map(|s| s.profiles.len())
                    .sum();
                reject(&mut out, count, format!("resource {r}: {e}"));
                continue;
            }
        };
        for (s, scope) in resource_profiles.scope_profiles.iter_mut().enumerate() {
            for (p, profile) in scope.profiles.iter_mut().enumerate() {
                match n.check_profile(profile) {
                    Ok(()) => {
                        n.add_profile(profile, &resource, now_ns);
                        out.accepted += 1;
                    }
                    Err(e) => reject(
                        &mut out,
                        1,
                        format!("resource {r}, scope {s}, profile {p}: {e}"),
                    ),
                }
            }
        }
    }
    out.truncated_stacks = n.truncated_stacks;
    out.data = n.b.finish();
    Ok(out)
}

/// Index 0 of every table must hold the zero value (0 means "unset").
fn check_zero_values(d: &ProfilesDictionary) -> Result<(), RequestError> {
    /// Whether the first entry of a table, if any, is not the default.
    fn nonzero<T: Default + PartialEq>(table: &[T]) -> bool {
        table.first().is_some_and(|first| *first != T::default())
    }
    let link_nonzero = d
        .link_table
        .first()
        .is_some_and(|l| l.trace_id.iter().chain(&l.span_id).any(|&b| b != 0));
    let tables = [
        ("string_table", nonzero(&d.string_table)),
        ("mapping_table", nonzero(&d.mapping_table)),
        ("location_table", nonzero(&d.location_table)),
        ("function_table", nonzero(&d.function_table)),
        ("stack_table", nonzero(&d.stack_table)),
        ("attribute_table", nonzero(&d.attribute_table)),
        ("link_table", link_nonzero),
    ];
    match tables.iter().find(|(_, bad)| *bad) {
        Some((table, _)) => Err(RequestError(format!(
            "dictionary.{table}[0] must be the zero value (index 0 means unset); \
             this sender does not follow OTLP profiles v1.10+"
        ))),
        None => Ok(()),
    }
}

struct Normalizer<'a> {
    dict: &'a ProfilesDictionary,
    b: SegmentBuilder,
    /// Dictionary index → builder index (u32::MAX = not yet converted).
    locations: Vec<u32>,
    stacks: Vec<u32>,
    attributes: Vec<Option<(u32, u32)>>,
    /// Table entries already checked (a table entry is valid or not
    /// whichever profile uses it).
    valid_attributes: Vec<Cell<bool>>,
    valid_stacks: Vec<Cell<bool>>,
    valid_locations: Vec<Cell<bool>>,
    /// Sample attribute lists → label sets.
    label_sets: FxHashMap<Vec<i32>, u32>,
    max_stack_depth: usize,
    truncated_stacks: usize,
}

type Check = Result<(), String>;

fn index(i: i32, len: usize, what: impl std::fmt::Display) -> Result<usize, String> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| format!("{what} {i} is out of range (the table has {len} entries)"))
}

impl<'a> Normalizer<'a> {
    fn string(&self, i: i32, what: &str) -> Result<&'a str, String> {
        let strings = &self.dict.string_table;
        index(i, strings.len().max(1), what).map(|i| strings.get(i).map_or("", |s| s.as_str()))
    }

    fn render(&self, value: Option<&AnyValue>) -> Result<String, String> {
        self.render_at(value, 0)
    }

    /// Renders a value nested `depth` deep ([`Self::check_value`] bounded
    /// the depth before anything is rendered).
    fn render_at(&self, value: Option<&AnyValue>, depth: usize) -> Result<String, String> {
        if depth > MAX_VALUE_DEPTH {
            return Err(format!(
                "an attribute value nests arrays or lists more than {MAX_VALUE_DEPTH} deep"
            ));
        }
        Ok(match value.and_then(|v| v.value.as_ref()) {
            None => String::new(),
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::StringValueStrindex(i)) => {
                self.string(*i, "string_value_strindex")?.to_owned()
            }
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            Some(Value::BytesValue(b)) => hex::encode(b),
            Some(Value::ArrayValue(a)) => {
                let items = a
                    .values
                    .iter()
                    .map(|v| {
                        self.render_at(Some(v), depth + 1)
                            .map(serde_json::Value::String)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                serde_json::Value::Array(items).to_string()
            }
            Some(Value::KvlistValue(kv)) => {
                let mut map = serde_json::Map::new();
                for item in &kv.values {
                    let key = self.key_of(item)?;
                    let v = self.render_at(item.value.as_ref(), depth + 1)?;
                    map.insert(key.to_owned(), serde_json::Value::String(v));
                }
                serde_json::Value::Object(map).to_string()
            }
        })
    }

    /// A `KeyValue` (resource, scope): `key`, or `key_strindex` (v1.10).
    fn key_value<'k>(&self, kv: &'k KeyValue) -> Result<(&'k str, String), String>
    where
        'a: 'k,
    {
        Ok((self.key_of(kv)?, self.render(kv.value.as_ref())?))
    }

    fn key_of<'k>(&self, kv: &'k KeyValue) -> Result<&'k str, String>
    where
        'a: 'k,
    {
        if kv.key.is_empty() && kv.key_strindex != 0 {
            self.string(kv.key_strindex, "key_strindex")
        } else {
            Ok(kv.key.as_str())
        }
    }

    fn resource_labels(&mut self, attributes: &[KeyValue]) -> Result<Vec<(u32, u32)>, String> {
        let mut seen = HashSet::new();
        let mut labels = Vec::new();
        for kv in attributes {
            let (key, value) = self.key_value(kv)?;
            if key.is_empty() {
                return Err("an attribute has an empty key".into());
            }
            if seen.insert(key) && !value.is_empty() {
                labels.push((self.b.string(key), self.b.string(&value)));
            }
        }
        Ok(labels)
    }

    /// String references inside a value, and its nesting, without
    /// rendering it: iterative, at most [`MAX_VALUE_DEPTH`] deep.
    fn check_value(&self, value: Option<&AnyValue>) -> Check {
        let mut pending: Vec<(&AnyValue, usize)> = value.into_iter().map(|v| (v, 0)).collect();
        while let Some((value, depth)) = pending.pop() {
            match value.value.as_ref() {
                Some(Value::StringValueStrindex(i)) => {
                    self.string(*i, "string_value_strindex")?;
                }
                Some(Value::ArrayValue(a)) => {
                    if depth >= MAX_VALUE_DEPTH {
                        return Err(format!(
                            "an attribute value nests arrays or lists more than {MAX_VALUE_DEPTH} deep"
                        ));
                    }
                    pending.extend(a.values.iter().map(|v| (v, depth + 1)));
                }
                Some(Value::KvlistValue(kv)) => {
                    if depth >= MAX_VALUE_DEPTH {
                        return Err(format!(
                            "an attribute value nests arrays or lists more than {MAX_VALUE_DEPTH} deep"
                        ));
                    }
                    for kv in &kv.values {
                        if kv.key.is_empty() && kv.key_strindex != 0 {
                            self.string(kv.key_strindex, "key_strindex")?;
                        }
                        if let Some(v) = &kv.value {
                            pending.push((v, depth + 1));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check_attributes(&self, indices: &[i32], what: &'static str) -> Check {
        let table = &self.dict.attribute_table;
        for (n, &i) in indices.iter().enumerate() {
            // format_args!: the message is only built on failure.
            let slot = index(i, table.len(), format_args!("{what} attribute index"))?;
            let attribute = &table[slot];
            if !self.valid_attributes[slot].get() {
                self.string(attribute.key_strindex, "attribute key_strindex")?;
                self.string(attribute.unit_strindex, "attribute unit_strindex")?;
                self.check_value(attribute.value.as_ref())?;
                self.valid_attributes[slot].set(true);
            }
            // Most lists are short: there a scan beats a set.
            let key = attribute.key_strindex;
            if indices.len() <= SHORT_LIST
                && indices[..n]
                    .iter()
                    .any(|&j| table[j as usize].key_strindex == key)
            {
                let key = self.string(key, "")?;
                return Err(format!("{what} attributes repeat the key {key:?}"));
            }
        }
        if indices.len() > SHORT_LIST {
            let mut seen = HashSet::with_capacity(indices.len());
            for &i in indices {
                let key = table[i as usize].key_strindex;
                if !seen.insert(key) {
                    let key = self.string(key, "")?;
                    return Err(format!("{what} attributes repeat the key {key:?}"));
                }
            }
        }
        Ok(())
    }

    fn check_value_type(&self, vt: &symtrace_proto::profiles::ValueType, what: &str) -> Check {
        self.string(vt.type_strindex, &format!("{what}.type_strindex"))?;
        self.string(vt.unit_strindex, &format!("{what}.unit_strindex"))?;
        Ok(())
    }

    fn check_location(&self, i: usize) -> Check {
        let d = self.dict;
        let location = &d.location_table[i];
        let mapping = index(
            location.mapping_index,
            d.mapping_table.len().max(1),
            "mapping_index",
        )?;
        if let Some(m) = d.mapping_table.get(mapping) {
            self.string(m.filename_strindex, "mapping filename_strindex")?;
            self.check_attributes(&m.attribute_indices, "mapping")?;
        }
        for line in &location.lines {
            let f = index(
                line.function_index,
                d.function_table.len(),
                "function_index",
            )?;
            let f = &d.function_table[f];
            self.string(f.name_strindex, "function name_strindex")?;
            self.string(f.system_name_strindex, "function system_name_strindex")?;
            self.string(f.filename_strindex, "function filename_strindex")?;
        }
        self.check_attributes(&location.attribute_indices, "location")
    }

    fn check_profile(&self, profile: &Profile) -> Check {
        let d = self.dict;
        let sample_type = profile
            .sample_type
            .as_ref()
            .ok_or("sample_type is missing")?;
        self.check_value_type(sample_type, "sample_type")?;
        if let Some(period_type) = &profile.period_type {
            self.check_value_type(period_type, "period_type")?;
        }
        self.check_attributes(&profile.attribute_indices, "profile")?;
        if profile.time_unix_nano.saturating_add(profile.duration_nano) > i64::MAX as u64 {
            return Err("time_unix_nano + duration_nano is after the year 2262".into());
        }
        for (i, sample) in profile.samples.iter().enumerate() {
            let fail = |e: String| format!("sample {i}: {e}");
            let stack = index(
                sample.stack_index,
                d.stack_table.len().max(1),
                "stack_index",
            )
            .map_err(fail)?;
            if self.valid_stacks.get(stack).is_some_and(|v| !v.get()) {
                for &l in d
                    .stack_table
                    .get(stack)
                    .map_or(&[][..], |s| &s.location_indices)
                {
                    let l = index(l, d.location_table.len(), "location index").map_err(fail)?;
                    if !self.valid_locations[l].get() {
                        self.check_location(l).map_err(fail)?;
                        self.valid_locations[l].set(true);
                    }
                }
                self.valid_stacks[stack].set(true);
            }
            self.check_attributes(&sample.attribute_indices, "sample")
                .map_err(fail)?;
            let link =
                index(sample.link_index, d.link_table.len().max(1), "link_index").map_err(fail)?;
            if let Some(link) = d.link_table.get(link) {
                if !matches!(link.trace_id.len(), 0 | 16) || !matches!(link.span_id.len(), 0 | 8) {
                    return Err(fail(format!(
                        "link_table[{link_index}] has a {t}-byte trace_id and a {s}-byte span_id (want 16 and 8)",
                        link_index = sample.link_index,
                        t = link.trace_id.len(),
                        s = link.span_id.len()
                    )));
                }
            }
            let (nv, nt) = (sample.values.len(), sample.timestamps_unix_nano.len());
            if nv == 0 && nt == 0 {
                return Err(fail(
                    "has neither values nor timestamps (a v1.9 sender's values land here: \
                     OTLP v1.10 renumbered Sample; upgrade the sender to proto >= 1.10)"
                        .into(),
                ));
            }
            if let Some(t) = sample
                .timestamps_unix_nano
                .iter()
                .find(|&&t| t > i64::MAX as u64)
            {
                return Err(fail(format!(
                    "timestamp {t} is after the year 2262 (not a unix time in nanoseconds)"
                )));
            }
            if nv != 0 && nt != 0 && nv != nt {
                return Err(fail(format!(
                    "has {nv} values and {nt} timestamps (they must be equally many)"
                )));
            }
        }
        Ok(())
    }

    fn attribute(&mut self, i: i32) -> (u32, u32) {
        let i = i as usize;
        if let Some(pair) = self.attributes[i] {
            return pair;
        }
        let attribute: &KeyValueAndUnit = &self.dict.attribute_table[i];
        let key = self.string(attribute.key_strindex, "").unwrap_or_default();
        let value = self.render(attribute.value.as_ref()).unwrap_or_default();
        let pair = (self.b.string(key), self.b.string(&value));
        self.attributes[i] = Some(pair);
        pair
    }

    fn attribute_value(&self, indices: &[i32], key: &str) -> Option<String> {
        indices.iter().find_map(|&i| {
            let a = &self.dict.attribute_table[i as usize];
            (self.string(a.key_strindex, "").ok()? == key)
                .then(|| self.render(a.value.as_ref()).ok())
                .flatten()
        })
    }

    fn location(&mut self, i: usize) -> u32 {
        if self.locations[i] != u32::MAX {
            return self.locations[i];
        }
        let d = self.dict;
        let location = &d.location_table[i];
        let mapping = match d.mapping_table.get(location.mapping_index as usize) {
            Some(m) if location.mapping_index > 0 => {
                let mut build_id = (0, BuildIdKind::None);
                for (key, kind) in [
                    ("process.executable.build_id.gnu", BuildIdKind::Gnu),
                    ("process.executable.build_id.htlhash", BuildIdKind::Htlhash),
                    ("process.executable.build_id.go", BuildIdKind::Go),
                ] {
                    if let Some(v) = self.attribute_value(&m.attribute_indices, key) {
                        if !v.is_empty() {
                            let v = if kind == BuildIdKind::Gnu {
                                v.to_ascii_lowercase()
                            } else {
                                v
                            };
                            build_id = (self.b.string(&v), kind);
                            break;
                        }
                    }
                }
                let file = self.string(m.filename_strindex, "").unwrap_or_default();
                let file = self.b.string(file);
                self.b.mapping(Mapping {
                    build_id: build_id.0,
                    build_id_kind: build_id.1,
                    file,
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                })
            }
            _ => 0,
        };
        let frame_type = self
            .attribute_value(&location.attribute_indices, "profile.frame.type")
            .unwrap_or_default();
        let frame_type = self.b.string(&frame_type);
        let lines = location
            .lines
            .iter()
            .map(|line| {
                let f = &d.function_table[line.function_index as usize];
                let s = |i: i32| self.string(i, "").unwrap_or_default();
                let (name, system, file) = (
                    s(f.name_strindex),
                    s(f.system_name_strindex),
                    s(f.filename_strindex),
                );
                Line {
                    function: self.b.string(name),
                    system_name: self.b.string(system),
                    file: self.b.string(file),
                    line: line.line,
                    column: line.column,
                }
            })
            .collect();
        let frame = self.b.frame(Frame {
            frame_type,
            mapping,
            address: location.address,
            lines,
        });
        self.locations[i] = frame;
        frame
    }

    fn stack(&mut self, i: usize) -> u32 {
        if i == 0 {
            return 0;
        }
        if self.stacks[i] != u32::MAX {
            return self.stacks[i];
        }
        let locations = &self.dict.stack_table[i].location_indices;
        let keep = locations.len().min(self.max_stack_depth);
        let mut frames: Vec<u32> = Vec::with_capacity(keep + 1);
        for &l in &locations[..keep] {
            frames.push(self.location(l as usize));
        }
        if locations.len() > keep {
            // Leaf first: the cut frames were the root-most ones.
            self.truncated_stacks += 1;
            frames.push(self.truncated_frame(locations.len() - keep));
        }
        let stack = self.b.stack(frames);
        self.stacks[i] = stack;
        stack
    }

    /// The synthetic root frame standing for `cut` root-most frames.
    fn truncated_frame(&mut self, cut: usize) -> u32 {
        let frame_type = self.b.string(TRUNCATED_FRAME_TYPE);
        let name = self.b.string(&format!(
            "[truncated: {cut} root-most frames beyond the {} kept]",
            self.max_stack_depth
        ));
        self.b.frame(Frame {
            frame_type,
            mapping: 0,
            address: 0,
            lines: vec![Line {
                function: name,
                ..Line::default()
            }],
        })
    }

    /// Adds a checked profile; its samples' timestamps and values move.
    fn add_profile(&mut self, profile: &mut Profile, resource: &[(u32, u32)], now_ns: u64) {
        let d = self.dict;
        let s = |i: i32| self.string(i, "").unwrap_or_default();
        let sample_type = profile.sample_type.unwrap_or_default();
        let period_type = profile.period_type.unwrap_or_default();
        let (st, su) = (s(sample_type.type_strindex), s(sample_type.unit_strindex));
        let (pt, pu) = (s(period_type.type_strindex), s(period_type.unit_strindex));

        let mut labels = resource.to_vec();
        for &a in &profile.attribute_indices {
            let pair = self.attribute(a);
            if !labels.iter().any(|(k, _)| *k == pair.0) && pair.1 != 0 {
                labels.push(pair);
            }
        }
        let service = service_name(&self.b, &labels);
        let service = self.b.string(&service);
        let labels = self.b.label_set(labels);

        let (mut start, mut end) = if profile.time_unix_nano != 0 {
            let start = profile.time_unix_nano;
            (start, start.saturating_add(profile.duration_nano))
        } else {
            (u64::MAX, 0)
        };
        for sample in &profile.samples {
            for &t in &sample.timestamps_unix_nano {
                start = start.min(t);
                end = end.max(t.saturating_add(1));
            }
        }
        if start == u64::MAX {
            (start, end) = (now_ns, now_ns);
        }
        let info = Series {
            service,
            sample_type: self.b.string(st),
            sample_unit: self.b.string(su),
            period_type: self.b.string(pt),
            period_unit: self.b.string(pu),
            period: profile.period,
            labels,
            start_ns: start,
            end_ns: end,
        };
        // Timestamped samples say when each event happened; value-only ones
        // only that they fell in this profile's range, which their series
        // keeps exactly (see SegmentBuilder::series_exact).
        let (mut timed, mut untimed) = (None, None);
        if profile.samples.is_empty() {
            self.b.series(info.clone());
        }

        for sample in profile.samples.iter_mut() {
            let series = if sample.timestamps_unix_nano.is_empty() {
                *untimed.get_or_insert_with(|| self.b.series_exact(info.clone()))
            } else {
                *timed.get_or_insert_with(|| self.b.series(info.clone()))
            };
            let stack = self.stack(sample.stack_index as usize);
            let labels = match self.label_sets.get(&sample.attribute_indices[..]) {
                Some(&labels) => labels,
                None => {
                    let mut pairs = Vec::with_capacity(sample.attribute_indices.len());
                    for &a in &sample.attribute_indices {
                        let pair = self.attribute(a);
                        if pair.1 != 0 {
                            pairs.push(pair);
                        }
                    }
                    let labels = self.b.label_set(pairs);
                    self.label_sets
                        .insert(sample.attribute_indices.clone(), labels);
                    labels
                }
            };
            let link = match d.link_table.get(sample.link_index as usize) {
                Some(l)
                    if sample.link_index > 0
                        && !l.trace_id.iter().chain(&l.span_id).all(|&b| b == 0) =>
                {
                    let mut link: Link = [0; 24];
                    link[..l.trace_id.len()].copy_from_slice(&l.trace_id);
                    link[16..16 + l.span_id.len()].copy_from_slice(&l.span_id);
                    self.b.link(link)
                }
                _ => 0,
            };
            self.b.add_sample(Sample {
                series,
                stack,
                labels,
                link,
                timestamps: std::mem::take(&mut sample.timestamps_unix_nano),
                values: std::mem::take(&mut sample.values),
            });
        }
    }
}

/// `service.name`, else the executable's name, else `unknown_service`
/// (the OpenTelemetry default).
fn service_name(b: &SegmentBuilder, labels: &[(u32, u32)]) -> String {
    let get = |key: &str| {
        labels
            .iter()
            .find(|&&(k, _)| b.str(k) == key)
            .map(|&(_, v)| b.str(v))
            .filter(|v| !v.is_empty())
    };
    if let Some(name) = get("service.name") {
        return name.to_owned();
    }
    if let Some(name) = get("process.executable.name") {
        return name.to_owned();
    }
    if let Some(path) = get("process.executable.path") {
        if let Some(name) = path.rsplit('/').next().filter(|n| !n.is_empty()) {
            return name.to_owned();
        }
    }
    "unknown_service".to_owned()
}

#[cfg(test)]
#[path = "normalize_tests.rs"]
mod tests;
