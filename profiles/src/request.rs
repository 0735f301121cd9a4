//! An OTLP profiles export request decoded from protobuf without a
//! message per sample or stack: samples and stacks are fixed-size records
//! whose repeated fields (attribute indexes, values, timestamps, a stack's
//! locations) are ranges of a few arrays shared by the whole request.
//!
//! prost builds each `Sample` with three vectors and each `Stack` with one;
//! an export of 10,000 samples and 7,000 stacks is 37,000 allocations,
//! freed again once normalized, and as many scattered reads while it is
//! checked and built (by `perf`, prost's decoding of the stack table alone
//! was a tenth of ingest's CPU). The rest of the request (resources,
//! scopes, the dictionary's other tables) is few messages, decoded by the
//! generated code.
//!
//! Decoding follows prost's exactly: the same wire-format rules, recursion
//! limit and error messages (each message level implements
//! [`prost::Message`], so prost's own `merge` drives it), which the `otlp_protobuf` fuzz target
//! checks against the generated decoder.

use std::ops::Range;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::InstrumentationScope;
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Link, Location, Mapping, ProfilesDictionary, ValueType,
};
use symtrace_proto::resource::Resource;

/// A range of one of a request's shared arrays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }

    /// Elements in it.
    pub fn len(self) -> usize {
        self.len as usize
    }

    /// Whether it has none.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }
}

/// A decoded request: its resources and its dictionary, and the arrays their
/// samples and stacks index.
#[derive(Debug, Default)]
pub struct Request {
    /// The request's resources, in order.
    pub resource_profiles: Vec<ResourceProfiles>,
    /// The dictionary every profile's indexes point into.
    pub dictionary: Dictionary,
    ints: Vec<i32>,
    values: Vec<i64>,
    timestamps: Vec<u64>,
}

/// One resource and its profiles.
#[derive(Debug, Default)]
pub struct ResourceProfiles {
    /// The resource (None when the request did not send one).
    pub resource: Option<Resource>,
    /// Its scopes, in order.
    pub scope_profiles: Vec<ScopeProfiles>,
}

/// One instrumentation scope's profiles.
#[derive(Debug, Default)]
pub struct ScopeProfiles {
    /// The profiles, in order.
    pub profiles: Vec<Profile>,
}

/// A profile: its type, time and attributes, and its samples.
#[derive(Debug, Default)]
pub struct Profile {
    /// What the values count.
    pub sample_type: Option<ValueType>,
    /// What the period measures.
    pub period_type: Option<ValueType>,
    /// Start, Unix nanoseconds.
    pub time_unix_nano: u64,
    /// Length in nanoseconds.
    pub duration_nano: u64,
    /// The sampling period.
    pub period: i64,
    /// Attribute indexes (into [`Request::ints`]).
    pub attribute_indices: Span,
    /// The samples, in order.
    pub samples: Vec<Sample>,
}

/// A sample: indexes into the dictionary and ranges of the request's arrays.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// The stack (a dictionary index).
    pub stack_index: i32,
    /// Attribute indexes (into [`Request::ints`]).
    pub attribute_indices: Span,
    /// The link (a dictionary index).
    pub link_index: i32,
    /// Values (into [`Request::values`]).
    pub values: Span,
    /// Timestamps (into [`Request::timestamps`]).
    pub timestamps: Span,
}

/// The request's dictionary: the generated messages for every table but
/// stacks, which are ranges of location indexes.
#[derive(Debug, Default)]
pub struct Dictionary {
    /// Mappings.
    pub mapping_table: Vec<Mapping>,
    /// Locations.
    pub location_table: Vec<Location>,
    /// Functions.
    pub function_table: Vec<Function>,
    /// Trace/span links.
    pub link_table: Vec<Link>,
    /// Strings.
    pub string_table: Vec<String>,
    /// Attributes.
    pub attribute_table: Vec<KeyValueAndUnit>,
    /// Stacks: location indexes (into [`Request::ints`]).
    pub stack_table: Vec<Span>,
}

impl Request {
    /// Decodes protobuf bytes as prost would decode an
    /// `ExportProfilesServiceRequest`, with the same errors.
    pub fn decode(mut body: &[u8]) -> Result<Self, DecodeError> {
        let mut request = Request::default();
        // Room for what a typical export holds (each index takes a byte or
        // two, each timestamp eight): few arrays grow, none is copied often.
        request.ints.reserve(body.len() / 4);
        request.timestamps.reserve(body.len() / 16);
        request.values.reserve(body.len() / 64);
        let ctx = DecodeContext::default();
        while body.has_remaining() {
            let (tag, wire_type) = encoding::decode_key(&mut body)?;
            request.merge_top(tag, wire_type, &mut body, ctx.clone())?;
        }
        Ok(request)
    }

    /// The request a generated message encodes to (OTLP/JSON, tests): an
    /// error when prost could not decode it either (values nested past its
    /// recursion limit, which a message built in memory or parsed from
    /// JSON may be).
    pub fn from_message(message: &ExportProfilesServiceRequest) -> Result<Self, DecodeError> {
        Self::decode(&prost::Message::encode_to_vec(message))
    }

    /// Integers of a span: attribute and location indexes.
    pub fn ints(&self, span: Span) -> &[i32] {
        &self.ints[span.range()]
    }

    /// Values of a span.
    pub fn values(&self, span: Span) -> &[i64] {
        &self.values[span.range()]
    }

    /// Timestamps of a span.
    pub fn timestamps(&self, span: Span) -> &[u64] {
        &self.timestamps[span.range()]
    }

    /// The location indexes of dictionary stack `i` (none past the table).
    pub fn stack(&self, i: usize) -> &[i32] {
        self.dictionary
            .stack_table
            .get(i)
            .map_or(&[][..], |&s| self.ints(s))
    }

    fn merge_top(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "ExportProfilesServiceRequest";
        match tag {
            1 => {
                let mut out = ResourceProfiles::default();
                let mut m = ResourceM {
                    request: self,
                    out: &mut out,
                };
                encoding::message::merge(wire_type, &mut m, buf, ctx)
                    .map_err(|e| at(e, NAME, "resource_profiles"))?;
                self.resource_profiles.push(out);
                Ok(())
            }
            2 => encoding::message::merge(wire_type, &mut DictionaryM { request: self }, buf, ctx)
                .map_err(|e| at(e, NAME, "dictionary")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

fn at(mut e: DecodeError, message: &'static str, field: &'static str) -> DecodeError {
    e.push(message, field);
    e
}

/// Appends a repeated field's items to `arena` (packed or not, as prost
/// accepts them) and extends `span` over them: a field repeated in the
/// bytes, or sent unpacked, continues the same span. Only samples and
/// stacks use it, and nothing else appends to their arrays while one of
/// them is decoded; were a span not at the end, its items would be moved
/// there first (a profile's attribute indexes, interleaved with its
/// samples', are gathered apart instead: moving them at each occurrence
/// could cost their length times the occurrences).
fn merge_span<T: Copy>(
    arena: &mut Vec<T>,
    span: &mut Span,
    merge: impl FnOnce(&mut Vec<T>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let before = arena.len();
    if span.len > 0 && span.start as usize + span.len as usize != before {
        // Not at the end: move what the span has to the end first.
        let items = arena[span.range()].to_vec();
        span.start = index(before)?;
        arena.extend_from_slice(&items);
    } else if span.len == 0 {
        span.start = index(before)?;
    }
    merge(arena)?;
    span.len = index(arena.len() - span.start as usize)?;
    Ok(())
}

/// A varint at the start of `bytes` as prost accepts one (at most 10
/// bytes, the tenth at most 1); None when it is not, or does not end
/// within `bytes`.
#[inline(always)]
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    // Indexes, small values: one or two bytes.
    match *bytes {
        [b0, ..] if b0 < 0x80 => Some((u64::from(b0), 1)),
        [b0, b1, ..] if b1 < 0x80 => Some((u64::from(b0 & 0x7f) | u64::from(b1) << 7, 2)),
        _ => long_varint(bytes),
    }
}

fn long_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        if i == 9 && b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The fast path of a packed repeated field: when `wire_type` says packed
/// and its bytes (in the buffer's current chunk) are well-formed items,
/// appends them (`item` reads one) and consumes the field. Otherwise
/// consumes and appends nothing: prost's `merge_repeated` then decodes it
/// (and names what is wrong) — so the result is prost's either way, with a
/// tight loop over a slice instead of a call per item.
fn packed<T>(
    wire_type: WireType,
    out: &mut Vec<T>,
    buf: &mut impl Buf,
    item: impl Fn(&[u8]) -> Option<(T, usize)>,
) -> bool {
    if wire_type != WireType::LengthDelimited {
        return false;
    }
    let chunk = buf.chunk();
    let Some((len, header)) = varint(chunk) else {
        return false;
    };
    let Some(body) = usize::try_from(len)
        .ok()
        .and_then(|len| chunk.get(header..)?.get(..len))
    else {
        return false;
    };
    let start = out.len();
    let mut at = 0;
    while at < body.len() {
        match item(&body[at..]) {
            Some((v, n)) => {
                out.push(v);
                at += n;
            }
            None => {
                out.truncate(start);
                return false;
            }
        }
    }
    buf.advance(header + body.len());
    true
}

fn int32s(
    wire_type: WireType,
    out: &mut Vec<i32>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    // prost's int32: the varint's low 32 bits.
    if packed(wire_type, out, buf, |b| {
        varint(b).map(|(v, n)| (v as i32, n))
    }) {
        return Ok(());
    }
    encoding::int32::merge_repeated(wire_type, out, buf, ctx)
}

fn int64s(
    wire_type: WireType,
    out: &mut Vec<i64>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    if packed(wire_type, out, buf, |b| {
        varint(b).map(|(v, n)| (v as i64, n))
    }) {
        return Ok(());
    }
    encoding::int64::merge_repeated(wire_type, out, buf, ctx)
}

fn fixed64s(
    wire_type: WireType,
    out: &mut Vec<u64>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let item = |b: &[u8]| Some((u64::from_le_bytes(b.get(..8)?.try_into().ok()?), 8));
    if packed(wire_type, out, buf, item) {
        return Ok(());
    }
    encoding::fixed64::merge_repeated(wire_type, out, buf, ctx)
}

/// An arena position; spans are 32-bit (a request that large would be
/// gigabytes past every limit, but it is refused rather than wrapped).
fn index(n: usize) -> Result<u32, DecodeError> {
    // prost's only way to make an error of one's own (kept through 0.14).
    #[allow(deprecated)]
    u32::try_from(n).map_err(|_| DecodeError::new("more than 2^32 elements in one field's arena"))
}

// Each message level being decoded implements `prost::Message` (only
// `merge_field` is used): prost's `merge` reads its length and applies the
// recursion limit, exactly as for the generated messages; the level
// appends its repeated fields to the request's arrays.

macro_rules! decode_only {
    () => {
        fn encode_raw(&self, _: &mut impl BufMut) {
            unreachable!("a request being decoded is never encoded")
        }

        fn encoded_len(&self) -> usize {
            unreachable!("a request being decoded is never encoded")
        }

        fn clear(&mut self) {}
    };
}

struct ResourceM<'r> {
    request: &'r mut Request,
    out: &'r mut ResourceProfiles,
}

impl prost::Message for ResourceM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "ResourceProfiles";
        match tag {
            1 => encoding::message::merge(
                wire_type,
                self.out.resource.get_or_insert_with(Default::default),
                buf,
                ctx,
            )
            .map_err(|e| at(e, NAME, "resource")),
            2 => {
                let mut out = ScopeProfiles::default();
                let mut m = ScopeM {
                    request: self.request,
                    out: &mut out,
                };
                encoding::message::merge(wire_type, &mut m, buf, ctx)
                    .map_err(|e| at(e, NAME, "scope_profiles"))?;
                self.out.scope_profiles.push(out);
                Ok(())
            }
            3 => encoding::string::merge(wire_type, &mut String::new(), buf, ctx)
                .map_err(|e| at(e, NAME, "schema_url")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct ScopeM<'r> {
    request: &'r mut Request,
    out: &'r mut ScopeProfiles,
}

impl prost::Message for ScopeM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "ScopeProfiles";
        match tag {
            // Checked as prost checks it; nothing of it is stored.
            1 => {
                encoding::message::merge(wire_type, &mut InstrumentationScope::default(), buf, ctx)
                    .map_err(|e| at(e, NAME, "scope"))
            }
            2 => {
                let mut out = Profile::default();
                let mut m = ProfileM {
                    request: self.request,
                    out: &mut out,
                    attributes: Vec::new(),
                };
                encoding::message::merge(wire_type, &mut m, buf, ctx)
                    .map_err(|e| at(e, NAME, "profiles"))?;
                // Its attribute indexes, gathered apart (its samples append
                // to the same array between the field's occurrences).
                let ProfileM {
                    request,
                    attributes,
                    ..
                } = m;
                let start = index(request.ints.len())?;
                request.ints.extend_from_slice(&attributes);
                out.attribute_indices = Span {
                    start,
                    len: index(attributes.len())?,
                };
                self.out.profiles.push(out);
                Ok(())
            }
            3 => encoding::string::merge(wire_type, &mut String::new(), buf, ctx)
                .map_err(|e| at(e, NAME, "schema_url")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct ProfileM<'r> {
    request: &'r mut Request,
    out: &'r mut Profile,
    /// `attribute_indices`, every occurrence, until the profile ends.
    attributes: Vec<i32>,
}

/// Merges an optional `ValueType` field as prost does (created when first
/// seen, each later occurrence merged into it).
fn value_type(
    value: &mut Option<ValueType>,
    wire_type: WireType,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let value = value.get_or_insert_with(Default::default);
    encoding::message::merge(wire_type, &mut ValueTypeM { out: value }, buf, ctx)
}

impl prost::Message for ProfileM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "Profile";
        let p = &mut *self.out;
        match tag {
            1 => value_type(&mut p.sample_type, wire_type, buf, ctx)
                .map_err(|e| at(e, NAME, "sample_type")),
            2 => {
                let mut out = Sample::default();
                let mut m = SampleM {
                    request: self.request,
                    out: &mut out,
                };
                encoding::message::merge(wire_type, &mut m, buf, ctx)
                    .map_err(|e| at(e, NAME, "samples"))?;
                p.samples.push(out);
                Ok(())
            }
            3 => encoding::fixed64::merge(wire_type, &mut p.time_unix_nano, buf, ctx)
                .map_err(|e| at(e, NAME, "time_unix_nano")),
            4 => encoding::uint64::merge(wire_type, &mut p.duration_nano, buf, ctx)
                .map_err(|e| at(e, NAME, "duration_nano")),
            5 => value_type(&mut p.period_type, wire_type, buf, ctx)
                .map_err(|e| at(e, NAME, "period_type")),
            6 => encoding::int64::merge(wire_type, &mut p.period, buf, ctx)
                .map_err(|e| at(e, NAME, "period")),
            7 => encoding::bytes::merge(wire_type, &mut Vec::<u8>::new(), buf, ctx)
                .map_err(|e| at(e, NAME, "profile_id")),
            8 => encoding::uint32::merge(wire_type, &mut 0, buf, ctx)
                .map_err(|e| at(e, NAME, "dropped_attributes_count")),
            9 => encoding::string::merge(wire_type, &mut String::new(), buf, ctx)
                .map_err(|e| at(e, NAME, "original_payload_format")),
            10 => encoding::bytes::merge(wire_type, &mut Vec::<u8>::new(), buf, ctx)
                .map_err(|e| at(e, NAME, "original_payload")),
            11 => int32s(wire_type, &mut self.attributes, buf, ctx)
                .map_err(|e| at(e, NAME, "attribute_indices")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct SampleM<'r> {
    request: &'r mut Request,
    out: &'r mut Sample,
}

impl prost::Message for SampleM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "Sample";
        let (r, s) = (&mut *self.request, &mut *self.out);
        match tag {
            1 => encoding::int32::merge(wire_type, &mut s.stack_index, buf, ctx)
                .map_err(|e| at(e, NAME, "stack_index")),
            2 => merge_span(&mut r.ints, &mut s.attribute_indices, |a| {
                int32s(wire_type, a, buf, ctx)
            })
            .map_err(|e| at(e, NAME, "attribute_indices")),
            3 => encoding::int32::merge(wire_type, &mut s.link_index, buf, ctx)
                .map_err(|e| at(e, NAME, "link_index")),
            4 => merge_span(&mut r.values, &mut s.values, |a| {
                int64s(wire_type, a, buf, ctx)
            })
            .map_err(|e| at(e, NAME, "values")),
            5 => merge_span(&mut r.timestamps, &mut s.timestamps, |a| {
                fixed64s(wire_type, a, buf, ctx)
            })
            .map_err(|e| at(e, NAME, "timestamps_unix_nano")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct DictionaryM<'r> {
    request: &'r mut Request,
}

impl prost::Message for DictionaryM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        const NAME: &str = "ProfilesDictionary";
        let r = &mut *self.request;
        let d = &mut r.dictionary;
        match tag {
            1 => encoding::message::merge_repeated(wire_type, &mut d.mapping_table, buf, ctx)
                .map_err(|e| at(e, NAME, "mapping_table")),
            2 => encoding::message::merge_repeated(wire_type, &mut d.location_table, buf, ctx)
                .map_err(|e| at(e, NAME, "location_table")),
            3 => encoding::message::merge_repeated(wire_type, &mut d.function_table, buf, ctx)
                .map_err(|e| at(e, NAME, "function_table")),
            4 => encoding::message::merge_repeated(wire_type, &mut d.link_table, buf, ctx)
                .map_err(|e| at(e, NAME, "link_table")),
            5 => encoding::string::merge_repeated(wire_type, &mut d.string_table, buf, ctx)
                .map_err(|e| at(e, NAME, "string_table")),
            6 => encoding::message::merge_repeated(wire_type, &mut d.attribute_table, buf, ctx)
                .map_err(|e| at(e, NAME, "attribute_table")),
            7 => {
                let mut span = Span::default();
                let mut m = StackM {
                    ints: &mut r.ints,
                    span: &mut span,
                };
                encoding::message::merge(wire_type, &mut m, buf, ctx)
                    .map_err(|e| at(e, NAME, "stack_table"))?;
                r.dictionary.stack_table.push(span);
                Ok(())
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct StackM<'r> {
    ints: &'r mut Vec<i32>,
    span: &'r mut Span,
}

impl prost::Message for StackM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_span(self.ints, self.span, |a| int32s(wire_type, a, buf, ctx))
                .map_err(|e| at(e, "Stack", "location_indices")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

struct ValueTypeM<'r> {
    out: &'r mut ValueType,
}

impl prost::Message for ValueTypeM<'_> {
    decode_only!();

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let v = &mut *self.out;
        match tag {
            1 => encoding::int32::merge(wire_type, &mut v.type_strindex, buf, ctx)
                .map_err(|e| at(e, "ValueType", "type_strindex")),
            2 => encoding::int32::merge(wire_type, &mut v.unit_strindex, buf, ctx)
                .map_err(|e| at(e, "ValueType", "unit_strindex")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

impl Request {
    /// The generated message holding what this request kept (scopes,
    /// schema URLs and a profile's ID, dropped count and original payload
    /// are checked, not kept).
    pub fn to_message(&self) -> ExportProfilesServiceRequest {
        use symtrace_proto::profiles as pb;
        let d = &self.dictionary;
        let sample = |s: &Sample| pb::Sample {
            stack_index: s.stack_index,
            attribute_indices: self.ints(s.attribute_indices).to_vec(),
            link_index: s.link_index,
            values: self.values(s.values).to_vec(),
            timestamps_unix_nano: self.timestamps(s.timestamps).to_vec(),
        };
        let profile = |p: &Profile| pb::Profile {
            sample_type: p.sample_type,
            samples: p.samples.iter().map(sample).collect(),
            time_unix_nano: p.time_unix_nano,
            duration_nano: p.duration_nano,
            period_type: p.period_type,
            period: p.period,
            attribute_indices: self.ints(p.attribute_indices).to_vec(),
            ..Default::default()
        };
        ExportProfilesServiceRequest {
            resource_profiles: self
                .resource_profiles
                .iter()
                .map(|r| pb::ResourceProfiles {
                    resource: r.resource.clone(),
                    scope_profiles: r
                        .scope_profiles
                        .iter()
                        .map(|s| pb::ScopeProfiles {
                            profiles: s.profiles.iter().map(profile).collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            dictionary: Some(ProfilesDictionary {
                mapping_table: d.mapping_table.clone(),
                location_table: d.location_table.clone(),
                function_table: d.function_table.clone(),
                link_table: d.link_table.clone(),
                string_table: d.string_table.clone(),
                attribute_table: d.attribute_table.clone(),
                stack_table: d
                    .stack_table
                    .iter()
                    .map(|&s| pb::Stack {
                        location_indices: self.ints(s).to_vec(),
                    })
                    .collect(),
            }),
        }
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
