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
use symtrace_proto::profiles::ProfilesDictionary;

use crate::model::SegmentData;
use crate::parts::PartKey;
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
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized, RequestError> {
    let out = normalize_with(request, now_ns, limits, false)?;
    Ok(out.map(|mut parts| parts.pop().map(|(_, d)| d).unwrap_or_default()))
}

/// [`normalize`], laid out by series: one part per (service, profile type),
/// in key order, each holding only what its samples use (as
/// [`crate::parts::split`] makes of the whole).
pub fn normalize_by_series(
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized<Vec<(PartKey, SegmentData)>>, RequestError> {
    normalize_with(request, now_ns, limits, true)
}

fn normalize_with(
    mut request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
    by_series: bool,
) -> Result<Normalized<Vec<(PartKey, SegmentData)>>, RequestError> {
    let dict = request.dictionary.take().unwrap_or_default();
    check_zero_values(&dict)?;
    let mut d = Dict::new(&dict);
    let mut out = Normalized {
        data: Vec::new(),
        accepted: 0,
        rejected: 0,
        errors: Vec::new(),
        truncated_stacks: 0,
    };
    let reject = |out: &mut Normalized<_>, count: usize, message: String| {
        out.rejected += count;
        if out.errors.len() < MAX_MESSAGES {
            out.errors.push(message);
        }
    };
    // Pass 1: every profile checked, the accepted ones keyed by their part.
    let mut accepted: Vec<(PartKey, Accepted)> = Vec::new();
    for (r, resource_profiles) in request.resource_profiles.iter().enumerate() {
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
                let mut labels = resource.clone();
                for &a in &profile.attribute_indices {
                    let key = d.str(dict.attribute_table[a as usize].key_strindex);
                    let value = d.attribute_value(a as usize);
                    if !value.is_empty() && !labels.iter().any(|(k, _)| k == key) {
                        labels.push((key.to_owned(), value.to_owned()));
                    }
                }
                let service = service_name(&labels);
                let key = if by_series {
                    let (st, pt) = (
                        profile.sample_type.unwrap_or_default(),
                        profile.period_type.unwrap_or_default(),
                    );
                    let ty = [st.type_strindex, st.unit_strindex]
                        .into_iter()
                        .chain([pt.type_strindex, pt.unit_strindex])
                        .map(|i| d.str(i))
                        .collect::<Vec<_>>()
                        .join(":");
                    (service.clone(), ty)
                } else {
                    PartKey::default()
                };
                accepted.push((
                    key,
                    Accepted {
                        resource: r,
                        scope: s,
                        profile: p,
                        labels,
                        service,
                    },
                ));
            }
        }
    }
    out.accepted = accepted.len();
    // Pass 2: each part from its profiles, in key order (stable: a part's
    // profiles in request order).
    accepted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut part = Part::new(&dict, limits.max_stack_depth.max(1));
    let mut rest = accepted.into_iter().peekable();
    while let Some((key, first)) = rest.next() {
        let mut next = Some(first);
        while let Some(a) = next {
            let profile = &mut request.resource_profiles[a.resource].scope_profiles[a.scope]
                .profiles[a.profile];
            part.add_profile(&mut d, profile, &a, now_ns);
            next = rest.next_if(|(k, _)| *k == key).map(|(_, a)| a);
        }
        out.data.push((key, part.finish()));
    }
    out.truncated_stacks = part.truncated.len();
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

/// `service.name`, else the executable's name, else `unknown_service`
/// (the OpenTelemetry default).
fn service_name(labels: &[(String, String)]) -> String {
    let get = |key: &str| {
        labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
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
mod tests;
