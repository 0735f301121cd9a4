//! A request's dictionary: the rules its entries must follow, checked once
//! per entry whichever profile uses it, and what of it is rendered as text
//! (attribute values, build-IDs, frame types), rendered once per request
//! however many parts use it.

use std::cell::Cell;
use std::collections::HashSet;

use crate::request::{Dictionary, Profile, Request};
use symtrace_proto::common::{any_value::Value, AnyValue, KeyValue};

use crate::model::BuildIdKind;

/// Nesting of array and key-value list attribute values accepted (the
/// protobuf decoder allows 100; no real attribute needs more than a few).
const MAX_VALUE_DEPTH: usize = 16;

/// Attribute lists up to this long are checked for repeated keys by a scan
/// (cheaper than a set); longer ones through a set.
pub(super) const SHORT_LIST: usize = 16;

pub(super) type Check = Result<(), String>;

pub(super) fn index(i: i32, len: usize, what: impl std::fmt::Display) -> Result<usize, String> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| format!("{what} {i} is out of range (the table has {len} entries)"))
}

/// The build-ID attributes of a mapping, in the order they are preferred.
const BUILD_ID_KEYS: [(&str, BuildIdKind); 3] = [
    ("process.executable.build_id.gnu", BuildIdKind::Gnu),
    ("process.executable.build_id.htlhash", BuildIdKind::Htlhash),
    ("process.executable.build_id.go", BuildIdKind::Go),
];

pub(super) struct Dict<'a> {
    pub(super) request: &'a Request,
    pub(super) dict: &'a Dictionary,
    /// Table entries already checked (a table entry is valid or not
    /// whichever profile uses it).
    valid_attributes: Vec<Cell<bool>>,
    valid_stacks: Vec<Cell<bool>>,
    /// Checked locations, as parts use them.
    locations: Vec<Cell<Option<LocationInfo>>>,
    /// Rendered attribute values.
    attribute_values: Vec<Option<Box<str>>>,
    /// Mappings' build-IDs as stored (gnu ones lower-cased).
    build_ids: Vec<Option<(Box<str>, BuildIdKind)>>,
    /// Bytes of a rendered value kept.
    max_value_bytes: usize,
    /// Values cut to `max_value_bytes`.
    truncated: Cell<usize>,
    /// Bytes of label text still allowed for the whole request, and
    /// whether it ran out.
    text_left: Cell<usize>,
    over_budget: Cell<bool>,
}

/// The smallest char boundary of `s` at or above `at` (its length past it).
fn ceil_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// The largest char boundary of `s` at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// What a part needs of a location, in 24 bytes, taken when the location
/// is checked (while its entry is in cache: each part maps the locations
/// it uses, and reading the dictionary's entries again costs a cache miss
/// each).
#[derive(Debug, Clone, Copy)]
pub(super) struct LocationInfo {
    pub(super) address: u64,
    /// The mapping (a dictionary index, 0 = none).
    pub(super) mapping: u32,
    /// The `profile.frame.type` attribute (a dictionary index, `u32::MAX`
    /// = none).
    pub(super) frame_type: u32,
    pub(super) has_lines: bool,
}

impl<'a> Dict<'a> {
    pub(super) fn new(request: &'a Request, max_value_bytes: usize, max_text: usize) -> Self {
        let dict = &request.dictionary;
        Self {
            request,
            dict,
            max_value_bytes,
            truncated: Cell::new(0),
            text_left: Cell::new(max_text),
            over_budget: Cell::new(false),
            valid_attributes: vec![Cell::new(false); dict.attribute_table.len()],
            valid_stacks: vec![Cell::new(false); dict.stack_table.len()],
            locations: vec![Cell::new(None); dict.location_table.len()],
            attribute_values: vec![None; dict.attribute_table.len()],
            build_ids: vec![None; dict.mapping_table.len()],
        }
    }

    pub(super) fn string(&self, i: i32, what: &str) -> Result<&'a str, String> {
        let strings = &self.dict.string_table;
        index(i, strings.len().max(1), what).map(|i| strings.get(i).map_or("", |s| s.as_str()))
    }

    /// A checked string index's text.
    pub(super) fn str(&self, i: i32) -> &'a str {
        self.string(i, "").unwrap_or_default()
    }

    /// A value as label text, cut to the longest value kept, and charged
    /// to the request's text budget.
    pub(super) fn render(&self, value: Option<&AnyValue>) -> Result<String, String> {
        // Rendered within one byte past the longest value kept: nested
        // values, whose JSON escaping can double their text at each level,
        // never grow past it, and "longer than kept" is still seen.
        let mut text = self.render_at(value, 0, self.max_value_bytes + 1)?;
        if text.len() > self.max_value_bytes {
            let suffix = super::TRUNCATED_LABEL_SUFFIX;
            text.truncate(floor_char_boundary(
                &text,
                self.max_value_bytes.saturating_sub(suffix.len()),
            ));
            text.push_str(suffix);
            self.truncated.set(self.truncated.get() + 1);
        }
        self.charge(text.len())?;
        Ok(text)
    }

    /// Counts `n` bytes of text against the request's budget; past it the
    /// request is refused (see [`Self::over_text_budget`]).
    pub(super) fn charge(&self, n: usize) -> Result<(), String> {
        match self.text_left.get().checked_sub(n) {
            Some(left) => {
                self.text_left.set(left);
                Ok(())
            }
            None => {
                self.text_left.set(0);
                self.over_budget.set(true);
                Err("the request's labels are more text than allowed".into())
            }
        }
    }

    /// Values cut so far.
    pub(super) fn truncated_labels(&self) -> usize {
        self.truncated.get()
    }

    /// Whether the request's labels and names went past its text budget.
    pub(super) fn over_text_budget(&self) -> bool {
        self.over_budget.get()
    }

    /// Renders a value nested `depth` deep ([`Self::check_value`] bounded
    /// the depth before anything is rendered), stopping once its text is
    /// longer than `budget` bytes (the caller cuts it).
    fn render_at(
        &self,
        value: Option<&AnyValue>,
        depth: usize,
        budget: usize,
    ) -> Result<String, String> {
        if depth > MAX_VALUE_DEPTH {
            return Err(format!(
                "an attribute value nests arrays or lists more than {MAX_VALUE_DEPTH} deep"
            ));
        }
        // At a char boundary at or past the budget: what was longer than
        // the budget stays so.
        let cut = |s: &str| s[..ceil_char_boundary(s, budget)].to_owned();
        let json = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        Ok(match value.and_then(|v| v.value.as_ref()) {
            None => String::new(),
            Some(Value::StringValue(s)) => cut(s),
            Some(Value::StringValueStrindex(i)) => cut(self.string(*i, "string_value_strindex")?),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            Some(Value::BytesValue(b)) => hex::encode(&b[..b.len().min(budget / 2 + 1)]),
            Some(Value::ArrayValue(a)) => {
                // A JSON array of the items as strings.
                let mut out = String::from("[");
                for (n, v) in a.values.iter().enumerate() {
                    if out.len() > budget {
                        break;
                    }
                    if n > 0 {
                        out.push(',');
                    }
                    out.push_str(&json(&self.render_at(Some(v), depth + 1, budget)?));
                }
                out.push(']');
                out
            }
            Some(Value::KvlistValue(kv)) => {
                // A JSON object of the values as strings, keys sorted, the
                // last of a repeated key kept.
                let mut map = std::collections::BTreeMap::new();
                let mut size = 0usize;
                for item in &kv.values {
                    if size > budget {
                        break;
                    }
                    let key = cut(self.key_of(item)?);
                    let v = self.render_at(item.value.as_ref(), depth + 1, budget)?;
                    size += key.len() + v.len();
                    map.insert(key, v);
                }
                let mut out = String::from("{");
                for (n, (k, v)) in map.iter().enumerate() {
                    if out.len() > budget {
                        break;
                    }
                    if n > 0 {
                        out.push(',');
                    }
                    out.push_str(&json(k));
                    out.push(':');
                    out.push_str(&json(v));
                }
                out.push('}');
                out
            }
        })
    }

    /// A `KeyValue` (resource, scope): `key`, or `key_strindex` (v1.10).
    pub(super) fn key_of<'k>(&self, kv: &'k KeyValue) -> Result<&'k str, String>
    where
        'a: 'k,
    {
        if kv.key.is_empty() && kv.key_strindex != 0 {
            self.string(kv.key_strindex, "key_strindex")
        } else {
            Ok(kv.key.as_str())
        }
    }

    /// Resource attributes as (key, value) text: the first of a repeated
    /// key wins, empty values are dropped.
    pub(super) fn resource_labels(
        &self,
        attributes: &[KeyValue],
    ) -> Result<Vec<(String, String)>, String> {
        let mut seen = HashSet::new();
        let mut labels = Vec::new();
        for kv in attributes {
            let key = self.key_of(kv)?;
            let value = self.render(kv.value.as_ref())?;
            if key.is_empty() {
                return Err("an attribute has an empty key".into());
            }
            if seen.insert(key) && !value.is_empty() {
                labels.push((key.to_owned(), value));
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
        self.check_attributes(&location.attribute_indices, "location")?;
        let frame_type = location.attribute_indices.iter().find(|&&a| {
            self.str(d.attribute_table[a as usize].key_strindex) == "profile.frame.type"
        });
        self.locations[i].set(Some(LocationInfo {
            address: location.address,
            mapping: location.mapping_index.max(0) as u32,
            frame_type: frame_type.map_or(u32::MAX, |&a| a as u32),
            has_lines: !location.lines.is_empty(),
        }));
        Ok(())
    }

    pub(super) fn check_profile(&self, profile: &Profile) -> Check {
        let d = self.dict;
        let sample_type = profile
            .sample_type
            .as_ref()
            .ok_or("sample_type is missing")?;
        self.check_value_type(sample_type, "sample_type")?;
        if let Some(period_type) = &profile.period_type {
            self.check_value_type(period_type, "period_type")?;
        }
        let r = self.request;
        self.check_attributes(r.ints(profile.attribute_indices), "profile")?;
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
                for &l in r.stack(stack) {
                    let l = index(l, d.location_table.len(), "location index").map_err(fail)?;
                    if self.locations[l].get().is_none() {
                        self.check_location(l).map_err(fail)?;
                    }
                }
                self.valid_stacks[stack].set(true);
            }
            self.check_attributes(r.ints(sample.attribute_indices), "sample")
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
            let (nv, nt) = (sample.values.len(), sample.timestamps.len());
            if nv == 0 && nt == 0 {
                return Err(fail(
                    "has neither values nor timestamps (a v1.9 sender's values land here: \
                     OTLP v1.10 renumbered Sample; upgrade the sender to proto >= 1.10)"
                        .into(),
                ));
            }
            if let Some(t) = r
                .timestamps(sample.timestamps)
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

    /// The rendered value of attribute `i` (a checked index).
    pub(super) fn attribute_value(&mut self, i: usize) -> &str {
        if self.attribute_values[i].is_none() {
            let a = &self.dict.attribute_table[i];
            let value = self.render(a.value.as_ref()).unwrap_or_default();
            self.attribute_values[i] = Some(value.into_boxed_str());
        }
        self.attribute_values[i].as_deref().unwrap_or_default()
    }

    /// The value of attribute `i` as [`Self::attribute_value`] rendered it
    /// (empty before).
    pub(super) fn rendered(&self, i: usize) -> &str {
        self.attribute_values[i].as_deref().unwrap_or_default()
    }

    /// The value of the first attribute of `indices` (checked) keyed `key`.
    fn value_of(&mut self, indices: &[i32], key: &str) -> Option<&str> {
        let i = indices
            .iter()
            .map(|&i| i as usize)
            .find(|&i| self.str(self.dict.attribute_table[i].key_strindex) == key)?;
        Some(self.attribute_value(i))
    }

    /// A mapping's build-ID and its kind (empty and none without one).
    pub(super) fn build_id(&mut self, mapping: usize) -> (&str, BuildIdKind) {
        if self.build_ids[mapping].is_none() {
            let indices = &self.dict.mapping_table[mapping].attribute_indices;
            let mut found = (Box::<str>::default(), BuildIdKind::None);
            for (key, kind) in BUILD_ID_KEYS {
                match self.value_of(indices, key) {
                    Some(v) if !v.is_empty() => {
                        let v = if kind == BuildIdKind::Gnu {
                            v.to_ascii_lowercase()
                        } else {
                            v.to_owned()
                        };
                        found = (v.into_boxed_str(), kind);
                        break;
                    }
                    _ => {}
                }
            }
            self.build_ids[mapping] = Some(found);
        }
        let (id, kind) = self.build_ids[mapping].as_ref().expect("just set");
        (id, *kind)
    }

    /// A mapping's content hash (`symtrace.file.sha256`), when it is one
    /// (64 hex digits, as lowercase); empty otherwise.
    pub(super) fn content(&mut self, mapping: usize) -> String {
        let indices = self.dict.mapping_table[mapping].attribute_indices.clone();
        match self.value_of(&indices, symtrace_proto::FILE_SHA256) {
            Some(v) if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
                v.to_ascii_lowercase()
            }
            _ => String::new(),
        }
    }

    /// What a part needs of a checked location.
    pub(super) fn location(&self, i: usize) -> LocationInfo {
        self.locations[i].get().expect("a checked location")
    }
}
