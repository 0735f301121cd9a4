//! OTLP profiles → the stored model. Every profile is checked against the
//! proto's rules before anything of it is kept, so a bad profile is
//! rejected whole and the good ones of the same request are stored.
//!
//! A request is normalized in two passes: the first checks every profile
//! ([`check`]) and finds the part it belongs to; the second builds each
//! part ([`build`]) from its profiles alone, so ingest lays a request out by
//! series (one part per service and profile type, see [`crate::parts`])
//! without building it whole first.

mod build;
mod check;

use symtrace_proto::collector::ExportProfilesServiceRequest;

use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::SegmentData;
use crate::parts::PartKey;
use crate::request::{Dictionary, Request};
use build::{Accepted, Part};
use check::Dict;

/// What came of a request: its accepted profiles' samples as `D` (one
/// segment's data, or its parts).
pub struct Normalized<D = SegmentData> {
    /// The accepted profiles' samples.
    pub data: D,
    /// Profiles accepted.
    pub accepted: usize,
    /// Profiles rejected (see `errors`).
    pub rejected: usize,
    /// One line per rejected profile (the first few), naming what was wrong.
    pub errors: Vec<String>,
    /// Stacks deeper than [`Limits::max_stack_depth`], cut to their leaf-most
    /// frames.
    pub truncated_stacks: usize,
    /// Label values longer than [`Limits::max_label_value_bytes`], cut.
    pub truncated_labels: usize,
}

impl<D> Normalized<D> {
    /// The same outcome with its data turned into `E`.
    pub fn map<E>(self, f: impl FnOnce(D) -> E) -> Normalized<E> {
        Normalized {
            data: f(self.data),
            accepted: self.accepted,
            rejected: self.rejected,
            errors: self.errors,
            truncated_stacks: self.truncated_stacks,
            truncated_labels: self.truncated_labels,
        }
    }
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
    /// Bytes of one label value (a resource, profile or sample attribute as
    /// text) kept; a longer value is cut at a character boundary and ends
    /// in [`TRUNCATED_LABEL_SUFFIX`].
    pub max_label_value_bytes: usize,
    /// Series (service × profile type) one request may hold: each is a part
    /// of the segment and a row of the index.
    pub max_series: usize,
    /// Bytes of text (labels, names, paths) the request's parts may hold
    /// together: each part keeps its own copy of the text it uses, so a
    /// label shared by many series is stored once per series.
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_stack_depth: DEFAULT_MAX_STACK_DEPTH,
            max_elements: DEFAULT_MAX_ELEMENTS,
            max_label_value_bytes: DEFAULT_MAX_LABEL_VALUE_BYTES,
            max_series: DEFAULT_MAX_SERIES,
            max_text_bytes: DEFAULT_MAX_TEXT_BYTES,
        }
    }
}

/// Frames kept of a stack by default (`SYMTRACE_MAX_STACK_DEPTH`).
pub const DEFAULT_MAX_STACK_DEPTH: usize = 1024;
/// Elements one request may hold by default (`SYMTRACE_MAX_EXPORT_ELEMENTS`).
pub const DEFAULT_MAX_ELEMENTS: usize = 4_000_000;
/// Bytes of a label value kept by default (`SYMTRACE_MAX_LABEL_VALUE_BYTES`).
pub const DEFAULT_MAX_LABEL_VALUE_BYTES: usize = 16 << 10;
/// Series one request may hold by default (`SYMTRACE_MAX_EXPORT_SERIES`).
pub const DEFAULT_MAX_SERIES: usize = 10_000;
/// Bytes of text a request's parts may hold by default
/// (`SYMTRACE_MAX_EXPORT_TEXT_BYTES`).
pub const DEFAULT_MAX_TEXT_BYTES: usize = 256 << 20;
/// What a label value cut to [`Limits::max_label_value_bytes`] ends in.
pub const TRUNCATED_LABEL_SUFFIX: &str = "…[truncated]";

/// `profile.frame.type` of the synthetic root frame of a truncated stack.
pub const TRUNCATED_FRAME_TYPE: &str = "truncated";

/// The request as a whole is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// It is unusable (its dictionary breaks the rules).
    #[error("{0}")]
    Invalid(String),
    /// It would be stored as more than a limit allows (series, text).
    #[error("{0}")]
    TooLarge(String),
}

/// Rejection messages kept per request; the count is always exact.
const MAX_MESSAGES: usize = 5;

/// Validates `request` and turns its accepted profiles into segment data;
/// `now_ns` bounds timestamps from the future. A profile that breaks a rule is
/// rejected alone (counted, its message kept); a dictionary that breaks one
/// refuses the request.
pub fn normalize_request(
    request: &Request,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized, RequestError> {
    let out = normalize_with(request, now_ns, limits, false)?;
    Ok(out.map(|mut parts| parts.pop().map(|(_, d)| d).unwrap_or_default()))
}

/// [`normalize_request`], laid out by series: one part per (service,
/// profile type), in key order, each holding only what its samples use (as
/// [`crate::parts::split`] makes of the whole).
pub fn normalize_request_by_series(
    request: &Request,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized<Vec<(PartKey, SegmentData)>>, RequestError> {
    normalize_with(request, now_ns, limits, true)
}

/// [`normalize_request`] of a generated message (tests, tools).
pub fn normalize(
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized, RequestError> {
    normalize_request(&from_message(&request)?, now_ns, limits)
}

/// [`normalize_request_by_series`] of a generated message.
pub fn normalize_by_series(
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized<Vec<(PartKey, SegmentData)>>, RequestError> {
    normalize_request_by_series(&from_message(&request)?, now_ns, limits)
}

fn from_message(request: &ExportProfilesServiceRequest) -> Result<Request, RequestError> {
    Request::from_message(request).map_err(|e| RequestError::Invalid(format!("{e}")))
}

fn normalize_with(
    request: &Request,
    now_ns: u64,
    limits: &Limits,
    by_series: bool,
) -> Result<Normalized<Vec<(PartKey, SegmentData)>>, RequestError> {
    let dict = &request.dictionary;
    check_zero_values(dict)?;
    let mut d = Dict::new(request, limits.max_label_value_bytes, limits.max_text_bytes);
    let mut out = Normalized {
        data: Vec::new(),
        accepted: 0,
        rejected: 0,
        errors: Vec::new(),
        truncated_stacks: 0,
        truncated_labels: 0,
    };
    let reject = |out: &mut Normalized<_>, count: usize, message: String| {
        out.rejected += count;
        if out.errors.len() < MAX_MESSAGES {
            out.errors.push(message);
        }
    };
    // Pass 1: every profile checked, the accepted ones keyed by their part.
    // Label text is kept once per resource and profile attributes by index,
    // so what a profile costs here is bounded by its elements, not by its
    // labels' bytes; service names and profile types are shared.
    let mut resources: Vec<Vec<(String, String)>> = Vec::new();
    // Service names and profile types, each with the number of its text
    // (the same text under several resources or string indexes is one
    // series): each text is hashed once, where it is made.
    let mut services: FxHashMap<(Source, u8), (Rc<str>, u32)> = FxHashMap::default();
    let mut types: FxHashMap<[i32; 4], (Rc<str>, u32)> = FxHashMap::default();
    let (mut service_texts, mut type_texts) = (Texts::default(), Texts::default());
    let mut accepted: Vec<(SharedKey, Accepted)> = Vec::new();
    let mut series: FxHashSet<(u32, u32)> = FxHashSet::default();
    let empty: Rc<str> = Rc::from("");
    for (r, resource_profiles) in request.resource_profiles.iter().enumerate() {
        if d.over_text_budget() {
            return Err(too_much_text(limits));
        }
        let attributes = resource_profiles
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default();
        let resource = match d.resource_labels(attributes) {
            Ok(labels) => labels,
            Err(e) => {
                let count = resource_profiles
                    .scope_profiles
                    .iter()
                    .map(|s| s.profiles.len())
                    .sum();
                reject(&mut out, count, format!("resource {r}: {e}"));
                resources.push(Vec::new());
                continue;
            }
        };
        for (s, scope) in resource_profiles.scope_profiles.iter().enumerate() {
            for (p, profile) in scope.profiles.iter().enumerate() {
                if let Err(e) = d.check_profile(profile) {
                    reject(
                        &mut out,
                        1,
                        format!("resource {r}, scope {s}, profile {p}: {e}"),
                    );
                    continue;
                }
                // Profile attributes not already given by the resource.
                let mut extras: Vec<u32> = Vec::new();
                for &a in request.ints(profile.attribute_indices) {
                    let key = d.str(dict.attribute_table[a as usize].key_strindex);
                    let taken = resource.iter().any(|(k, _)| k == key)
                        || extras
                            .iter()
                            .any(|&e| d.str(dict.attribute_table[e as usize].key_strindex) == key);
                    if !taken && !d.attribute_value(a as usize).is_empty() {
                        extras.push(a as u32);
                    }
                }
                let (source, rule) = service_source(&d, r, &resource, &extras);
                let (service, service_id) = services
                    .entry((source, rule))
                    .or_insert_with(|| {
                        service_texts.number(service_text(&d, &resource, source, rule).into())
                    })
                    .clone();
                let (st, pt) = (
                    profile.sample_type.unwrap_or_default(),
                    profile.period_type.unwrap_or_default(),
                );
                let indices = [
                    st.type_strindex,
                    st.unit_strindex,
                    pt.type_strindex,
                    pt.unit_strindex,
                ];
                let (ty, type_id) = types
                    .entry(indices)
                    .or_insert_with(|| {
                        let text = indices.map(|i| d.str(i)).join(":");
                        // Type strings are the request's own, of any length.
                        let _ = d.charge(text.len());
                        type_texts.number(text.into())
                    })
                    .clone();
                if d.over_text_budget() {
                    return Err(too_much_text(limits));
                }
                // Series are counted in either layout: each is a row of the
                // index.
                if series.len() <= limits.max_series {
                    series.insert((service_id, type_id));
                }
                let key = if by_series {
                    (service.clone(), ty)
                } else {
                    (empty.clone(), empty.clone())
                };
                accepted.push((
                    key,
                    Accepted {
                        resource: r,
                        scope: s,
                        profile: p,
                        extras,
                        service,
                    },
                ));
            }
        }
        resources.push(resource);
    }
    if series.len() > limits.max_series {
        return Err(RequestError::TooLarge(format!(
            "the request holds more than {} series (service × profile type; \
             SYMTRACE_MAX_EXPORT_SERIES): send smaller exports",
            limits.max_series
        )));
    }
    out.accepted = accepted.len();
    // Pass 2: each part from its profiles, in key order (stable: a part's
    // profiles in request order).
    accepted.sort_by(|a, b| cmp_shared(&a.0, &b.0));
    let mut part = Part::new(dict, limits.max_stack_depth.max(1));
    // What the parts hold, each its own copy: text, and frames and stack
    // entries (a stack shared by many series is copied into each).
    let (mut text, mut entries) = (0usize, 0usize);
    let mut rest = accepted.into_iter().peekable();
    while let Some((key, first)) = rest.next() {
        let mut next = Some(first);
        while let Some(a) = next {
            let profile =
                &request.resource_profiles[a.resource].scope_profiles[a.scope].profiles[a.profile];
            part.add_profile(&mut d, profile, &resources[a.resource], &a, now_ns);
            next = rest
                .next_if(|(k, _)| cmp_shared(k, &key).is_eq())
                .map(|(_, a)| a);
        }
        let data = part.finish();
        text += data.strings.iter().map(String::len).sum::<usize>();
        if text > limits.max_text_bytes || d.over_text_budget() {
            return Err(too_much_text(limits));
        }
        entries += data.frames.len() + data.stacks.iter().map(Vec::len).sum::<usize>();
        if entries > limits.max_elements {
            return Err(RequestError::TooLarge(format!(
                "the request's series would hold more than {} frames and stack entries \
                 (each series keeps its own copy of the stacks its samples use; \
                 SYMTRACE_MAX_EXPORT_ELEMENTS): send smaller exports",
                limits.max_elements
            )));
        }
        out.data
            .push(((key.0.to_string(), key.1.to_string()), data));
    }
    out.truncated_stacks = part.truncated.len();
    out.truncated_labels = d.truncated_labels();
    Ok(out)
}

fn too_much_text(limits: &Limits) -> RequestError {
    RequestError::TooLarge(format!(
        "the request's labels and names come to more than {} bytes of text \
         (each series keeps its own copy of the text it uses; \
         SYMTRACE_MAX_EXPORT_TEXT_BYTES): send smaller exports or shorter labels",
        limits.max_text_bytes
    ))
}

/// Texts numbered by content.
#[derive(Default)]
struct Texts(FxHashMap<Rc<str>, u32>);

impl Texts {
    /// `text` shared with its number: the first text of this content.
    fn number(&mut self, text: Rc<str>) -> (Rc<str>, u32) {
        let next = self.0.len() as u32;
        let (shared, n) = self
            .0
            .get_key_value(&text)
            .map_or((text.clone(), next), |(k, &n)| (k.clone(), n));
        if n == next {
            self.0.insert(text, n);
        }
        (shared, n)
    }
}

/// Index 0 of every table must hold the zero value (0 means "unset").
fn check_zero_values(d: &Dictionary) -> Result<(), RequestError> {
    /// Whether the first entry of a table, if any, is not the default.
    fn nonzero<T: Default + PartialEq>(table: &[T]) -> bool {
        table.first().is_some_and(|first| *first != T::default())
    }
    // The OpenTelemetry Collector's pdata writes the zero attribute with
    // its value present but empty (an `AnyValue` holding nothing): that is
    // the zero value too.
    let attribute_nonzero = d.attribute_table.first().is_some_and(|a| {
        a.key_strindex != 0
            || a.unit_strindex != 0
            || a.value.as_ref().is_some_and(|v| v.value.is_some())
    });
    let link_nonzero = d
        .link_table
        .first()
        .is_some_and(|l| l.trace_id.iter().chain(&l.span_id).any(|&b| b != 0));
    let tables = [
        ("string_table", nonzero(&d.string_table)),
        ("mapping_table", nonzero(&d.mapping_table)),
        ("location_table", nonzero(&d.location_table)),
        ("function_table", nonzero(&d.function_table)),
        (
            "stack_table",
            d.stack_table.first().is_some_and(|s| !s.is_empty()),
        ),
        ("attribute_table", attribute_nonzero),
        ("link_table", link_nonzero),
    ];
    match tables.iter().find(|(_, bad)| *bad) {
        Some((table, _)) => Err(RequestError::Invalid(format!(
            "dictionary.{table}[0] must be the zero value (index 0 means unset); \
             this sender does not follow OTLP profiles v1.10+"
        ))),
        None => Ok(()),
    }
}

/// A part key whose texts are shared by the profiles of the part.
type SharedKey = (Rc<str>, Rc<str>);

/// Orders part keys by text; the same shared text is equal without
/// comparing its bytes (a long service name under many profiles would
/// otherwise be compared once per profile).
fn cmp_shared(a: &SharedKey, b: &SharedKey) -> std::cmp::Ordering {
    let text = |x: &Rc<str>, y: &Rc<str>| {
        if Rc::ptr_eq(x, y) {
            std::cmp::Ordering::Equal
        } else {
            x.cmp(y)
        }
    };
    text(&a.0, &b.0).then_with(|| text(&a.1, &b.1))
}

/// Where a profile's service name comes from: a resource label (resource,
/// label), a profile attribute, or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Resource(usize, usize),
    Attribute(u32),
    None,
}

/// The keys a service name is taken from, in order (the OpenTelemetry
/// rule): `service.name`, else the executable's name, else the last
/// component of its path, else `unknown_service`.
const SERVICE_KEYS: [&str; 3] = [
    "service.name",
    "process.executable.name",
    "process.executable.path",
];

/// The label a profile's service name comes from, and which rule
/// ([`SERVICE_KEYS`]' index; 3 = `unknown_service`) made it.
fn service_source(
    d: &Dict,
    r: usize,
    resource: &[(String, String)],
    extras: &[u32],
) -> (Source, u8) {
    for (rule, key) in SERVICE_KEYS.iter().enumerate() {
        let found = match resource.iter().position(|(k, _)| k == key) {
            Some(i) => Some(Source::Resource(r, i)),
            None => extras
                .iter()
                .find(|&&a| d.str(d.dict.attribute_table[a as usize].key_strindex) == *key)
                .map(|&a| Source::Attribute(a)),
        };
        let Some(found) = found else { continue };
        // Labels have non-empty values; a path may end in `/`.
        if rule < 2 || !service_text(d, resource, found, rule as u8).is_empty() {
            return (found, rule as u8);
        }
    }
    (Source::None, 3)
}

/// The service name `source` and `rule` give.
fn service_text<'d>(
    d: &'d Dict,
    resource: &'d [(String, String)],
    source: Source,
    rule: u8,
) -> &'d str {
    let text = match source {
        Source::Resource(_, i) => resource[i].1.as_str(),
        Source::Attribute(a) => d.rendered(a as usize),
        Source::None => return "unknown_service",
    };
    match rule {
        2 => text.rsplit('/').next().unwrap_or_default(),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
