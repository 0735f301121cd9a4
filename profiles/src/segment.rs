//! The segment format: one immutable object per export (or per compacted
//! window), columnar and zstd-compressed. See docs/storage.md.
//!
//! ```text
//! part    = "SYMTSEG1"  u32 LE body length  zstd(body)
//! body    = strings mappings frames stacks label_sets links series samples
//! segment = part                                  (version 1: one part)
//!         | "SYMTSEG2"  u32 LE n  n × u64 LE part length  part…   (version 2)
//! ```
//! A version-2 segment holds one part per (service, profile type)
//! ([`crate::parts`]), each an independent version-1 segment at a byte
//! range the index records, so a query of one service fetches (a ranged
//! read) and decodes only its parts.
//! Every table is written column by column with LEB128 varints (zigzag for
//! signed values), so each column's values sit together for zstd. Stacks
//! are sorted root-first and front-coded (a stack shares its callers with
//! its neighbours); samples are sorted by identity (their stack column
//! delta-coded) and their timestamps ascending, delta-coded from the series
//! start. Decoding checks every
//! index, so a damaged object is an error, never a panic or a wrong answer.

use crate::model::{BuildIdKind, Frame, Line, Link, Mapping, Sample, SegmentData, Series};

const MAGIC: &[u8; 8] = b"SYMTSEG1";
const MAGIC_PARTS: &[u8; 8] = b"SYMTSEG2";
/// Most parts one segment may list (a guard against a damaged count).
const MAX_PARTS: usize = 1 << 20;
/// Largest body accepted when decoding (a guard against a damaged length).
const MAX_BODY: usize = 4 << 30;

/// Why bytes are not a segment.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// Not a segment of this format (magic or version).
    #[error("not a symtrace segment (bad magic)")]
    Magic,
    /// Damaged or inconsistent content (what was wrong).
    #[error("segment is damaged: {0}")]
    Corrupt(&'static str),
    /// Decompression failed.
    #[error("segment decompression: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes a segment at a zstd level (3 at ingest, higher when compacting).
pub fn encode(data: &SegmentData, level: i32) -> Vec<u8> {
    let mut zstd = zstd::bulk::Compressor::new(level).expect("a zstd context");
    encode_with(data, &mut zstd)
}

/// Encodes with a zstd context (reused across a segment's parts: setting
/// one up costs more than compressing a small part).
fn encode_with(data: &SegmentData, zstd: &mut zstd::bulk::Compressor<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::default().append(data, zstd, &mut out);
    out
}

/// Buffers reused across a segment's parts.
#[derive(Default)]
struct Encoder {
    body: Vec<u8>,
    compressed: Vec<u8>,
}

impl Encoder {
    /// Appends a version-1 segment of `data` to `out`.
    fn append(
        &mut self,
        data: &SegmentData,
        zstd: &mut zstd::bulk::Compressor<'_>,
        out: &mut Vec<u8>,
    ) {
        self.body.clear();
        encode_body(data, &mut self.body, &mut Vec::new());
        self.compressed.clear();
        self.compressed
            .reserve(zstd::zstd_safe::compress_bound(self.body.len()));
        zstd.compress_to_buffer(&self.body, &mut self.compressed)
            .expect("zstd compression into a buffer of its bound");
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.compressed);
    }
}

/// Encodes parts (each a segment of its own) into one version-2 segment;
/// returns it and each part's byte range in it.
pub fn encode_parts(parts: &[SegmentData], level: i32) -> (Vec<u8>, Vec<std::ops::Range<u64>>) {
    let mut zstd = zstd::bulk::Compressor::new(level).expect("a zstd context");
    let mut encoder = Encoder::default();
    let header = 12 + 8 * parts.len();
    let mut out = Vec::with_capacity(header);
    out.extend_from_slice(MAGIC_PARTS);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    out.resize(header, 0);
    let mut ranges = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let start = out.len();
        encoder.append(part, &mut zstd, &mut out);
        let len = (out.len() - start) as u64;
        out[12 + 8 * i..20 + 8 * i].copy_from_slice(&len.to_le_bytes());
        ranges.push(start as u64..out.len() as u64);
    }
    (out, ranges)
}

/// What one group of a segment's columns costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSize {
    /// The group (`strings`, `stacks`, `timestamps`, …).
    pub name: &'static str,
    /// Its encoded bytes, before compression.
    pub raw: usize,
    /// Its bytes compressed alone at the segment's zstd level (the groups
    /// together compress a little better than the sum of their parts).
    pub compressed: usize,
}

/// Where a segment's bytes go: each group of columns of `data` encoded as
/// [`encode`] does and compressed alone at `level`.
pub fn column_sizes(data: &SegmentData, level: i32) -> Vec<ColumnSize> {
    let mut body = Vec::new();
    let mut marks = Vec::new();
    encode_body(data, &mut body, &mut marks);
    let ends = marks.iter().skip(1).map(|&(_, at)| at).chain([body.len()]);
    marks
        .iter()
        .zip(ends)
        .map(|(&(name, start), end)| {
            let section = &body[start..end];
            ColumnSize {
                name,
                raw: section.len(),
                compressed: zstd::bulk::compress(section, level).map_or(section.len(), |c| c.len()),
            }
        })
        .collect()
}

/// The byte ranges of a segment's parts (one covering it all for a
/// version-1 segment).
pub fn part_ranges(bytes: &[u8]) -> Result<Vec<std::ops::Range<u64>>, SegmentError> {
    if bytes.len() >= 8 && &bytes[..8] == MAGIC {
        return Ok(std::iter::once(0..bytes.len() as u64).collect());
    }
    if bytes.len() < 12 || &bytes[..8] != MAGIC_PARTS {
        return Err(SegmentError::Magic);
    }
    let n = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    if n > MAX_PARTS || 12 + 8 * n > bytes.len() {
        return Err(SegmentError::Corrupt("part count"));
    }
    let mut at = (12 + 8 * n) as u64;
    let mut ranges = Vec::with_capacity(n);
    for i in 0..n {
        let len = u64::from_le_bytes(bytes[12 + 8 * i..20 + 8 * i].try_into().unwrap());
        let end = at
            .checked_add(len)
            .filter(|&e| e <= bytes.len() as u64)
            .ok_or(SegmentError::Corrupt("part length"))?;
        ranges.push(at..end);
        at = end;
    }
    if at != bytes.len() as u64 {
        return Err(SegmentError::Corrupt("bytes after the last part"));
    }
    Ok(ranges)
}

/// Decodes every part of a segment (version 1: the one).
pub fn decode_parts(bytes: &[u8]) -> Result<Vec<SegmentData>, SegmentError> {
    part_ranges(bytes)?
        .into_iter()
        .map(|r| decode_part(&bytes[r.start as usize..r.end as usize]))
        .collect()
}

/// Decodes a segment, its parts merged into one.
pub fn decode(bytes: &[u8]) -> Result<SegmentData, SegmentError> {
    if bytes.len() >= 8 && &bytes[..8] == MAGIC {
        return decode_part(bytes);
    }
    let mut parts = decode_parts(bytes)?;
    if parts.len() == 1 {
        return Ok(parts.pop().expect("one part"));
    }
    let mut b = crate::model::SegmentBuilder::default();
    for p in &parts {
        b.merge(p);
    }
    Ok(b.finish())
}

/// Decodes one part (a version-1 segment).
pub fn decode_part(bytes: &[u8]) -> Result<SegmentData, SegmentError> {
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(SegmentError::Magic);
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    if len > MAX_BODY {
        return Err(SegmentError::Corrupt("body length"));
    }
    // The header's length is the file's claim: memory grows with what the
    // stream really inflates to (reserved up front only up to 32× the
    // compressed bytes), and a stream longer than the claim is corrupt.
    let compressed = &bytes[12..];
    let mut body = Vec::with_capacity(len.min(compressed.len().saturating_mul(32)));
    let decoder = zstd::stream::read::Decoder::with_buffer(compressed)?;
    std::io::Read::read_to_end(&mut std::io::Read::take(decoder, len as u64 + 1), &mut body)?;
    if body.len() != len {
        return Err(SegmentError::Corrupt("body length"));
    }
    decode_body(&body)
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn i(&mut self, v: i64) {
        self.u(((v << 1) ^ (v >> 63)) as u64);
    }
}

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

type R<T> = Result<T, SegmentError>;

impl<'a> Dec<'a> {
    fn u(&mut self) -> R<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or(SegmentError::Corrupt("truncated"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(SegmentError::Corrupt("varint too long"))
    }
    fn i(&mut self) -> R<i64> {
        let v = self.u()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    fn u32(&mut self) -> R<u32> {
        u32::try_from(self.u()?).map_err(|_| SegmentError::Corrupt("index too large"))
    }
    /// An index below `len`.
    fn index(&mut self, len: usize) -> R<u32> {
        let v = self.u32()?;
        if (v as usize) < len {
            Ok(v)
        } else {
            Err(SegmentError::Corrupt("index out of range"))
        }
    }
    /// A count, bounded by the bytes left (every item takes at least one).
    fn count(&mut self) -> R<usize> {
        let n = self.u()? as usize;
        if n > self.buf.len() - self.pos {
            return Err(SegmentError::Corrupt("count larger than the segment"));
        }
        Ok(n)
    }
    fn bytes(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(SegmentError::Corrupt("truncated"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
}

/// Appends the body of `d` to `out` (the caller's buffer, reused), and
/// where each group of columns starts in it to `marks`.
fn encode_body(d: &SegmentData, out: &mut Vec<u8>, marks: &mut Vec<(&'static str, usize)>) {
    let mut e = Enc(std::mem::take(out));
    let mut mark = |name: &'static str, e: &Enc| marks.push((name, e.0.len()));
    mark("strings", &e);
    e.u(d.strings.len() as u64);
    for s in &d.strings {
        e.u(s.len() as u64);
    }
    for s in &d.strings {
        e.0.extend_from_slice(s.as_bytes());
    }

    mark("mappings", &e);
    e.u(d.mappings.len() as u64);
    for m in &d.mappings {
        e.u(m.build_id.into());
    }
    for m in &d.mappings {
        e.u(m.build_id_kind as u64);
    }
    for m in &d.mappings {
        e.u(m.file.into());
    }
    for m in &d.mappings {
        e.u(m.memory_start);
        e.u(m.memory_limit.wrapping_sub(m.memory_start));
        e.u(m.file_offset);
    }

    mark("frames", &e);
    e.u(d.frames.len() as u64);
    for f in &d.frames {
        e.u(f.frame_type.into());
    }
    for f in &d.frames {
        e.u(f.mapping.into());
    }
    let mut previous = 0u64;
    for f in &d.frames {
        e.i(f.address.wrapping_sub(previous) as i64);
        previous = f.address;
    }
    for f in &d.frames {
        e.u(f.lines.len() as u64);
    }
    for l in d.frames.iter().flat_map(|f| &f.lines) {
        e.u(l.function.into());
        e.u(l.system_name.into());
        e.u(l.file.into());
        e.i(l.line);
        e.i(l.column);
    }

    // Stacks root-first in sorted order, each sharing a prefix with the one
    // before; samples refer to the sorted position.
    let mut order: Vec<u32> = (0..d.stacks.len() as u32).collect();
    order.sort_by(|&a, &b| {
        d.stacks[a as usize]
            .iter()
            .rev()
            .cmp(d.stacks[b as usize].iter().rev())
    });
    let mut position = vec![0u32; d.stacks.len()];
    for (pos, &old) in order.iter().enumerate() {
        position[old as usize] = pos as u32;
    }
    mark("stacks", &e);
    e.u(d.stacks.len() as u64);
    let mut previous: &[u32] = &[];
    for &old in &order {
        let stack = &d.stacks[old as usize];
        let shared = previous
            .iter()
            .rev()
            .zip(stack.iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        e.u(shared as u64);
        e.u((stack.len() - shared) as u64);
        for &f in stack[..stack.len() - shared].iter().rev() {
            e.u(f.into());
        }
        previous = stack;
    }

    mark("label sets", &e);
    e.u(d.label_sets.len() as u64);
    for set in &d.label_sets {
        e.u(set.len() as u64);
        for &(k, v) in set {
            e.u(k.into());
            e.u(v.into());
        }
    }

    mark("links", &e);
    e.u(d.links.len() as u64);
    for l in &d.links {
        e.0.extend_from_slice(l);
    }

    mark("series", &e);
    e.u(d.series.len() as u64);
    for s in &d.series {
        for v in [
            s.service,
            s.sample_type,
            s.sample_unit,
            s.period_type,
            s.period_unit,
            s.labels,
        ] {
            e.u(v.into());
        }
        e.i(s.period);
        e.u(s.start_ns);
        e.u(s.end_ns.wrapping_sub(s.start_ns));
    }

    let mut samples: Vec<(&Sample, u32)> = d
        .samples
        .iter()
        .map(|s| (s, position[s.stack as usize]))
        .collect();
    samples.sort_by_key(|(s, stack)| (s.series, *stack, s.labels, s.link));
    mark("samples: series, stack, labels, link", &e);
    e.u(samples.len() as u64);
    for (s, _) in &samples {
        e.u(s.series.into());
    }
    // Non-decreasing within a series: delta-coded.
    let mut previous = 0i64;
    for (_, stack) in &samples {
        e.i(i64::from(*stack) - previous);
        previous = i64::from(*stack);
    }
    for (s, _) in &samples {
        e.u(s.labels.into());
    }
    for (s, _) in &samples {
        e.u(s.link.into());
    }
    mark("samples: event counts", &e);
    for (s, _) in &samples {
        e.u(s.timestamps.len() as u64);
        e.u(s.values.len() as u64);
    }
    mark("timestamps", &e);
    // Each sample's events sorted once; timestamps go to `e`, values to a
    // column of their own that follows.
    let mut values = Enc::default();
    let mut pairs: Vec<(u64, i64)> = Vec::new();
    let mut sorted: Vec<u64> = Vec::new();
    for (s, _) in &samples {
        let mut previous = d.series[s.series as usize].start_ns;
        if s.timestamps.len() == s.values.len() {
            pairs.clear();
            pairs.extend(s.timestamps.iter().copied().zip(s.values.iter().copied()));
            pairs.sort_unstable();
            for &(t, v) in &pairs {
                e.i(t.wrapping_sub(previous) as i64);
                previous = t;
                values.i(v);
            }
        } else {
            // One side is empty: timestamps without values, or the reverse.
            sorted.clear();
            sorted.extend_from_slice(&s.timestamps);
            sorted.sort_unstable();
            for &t in &sorted {
                e.i(t.wrapping_sub(previous) as i64);
                previous = t;
            }
            for &v in &s.values {
                values.i(v);
            }
        }
    }
    mark("values", &e);
    e.0.extend_from_slice(&values.0);
    // Extensions, after everything a segment always had: written only when
    // there is something in them, so a segment without reads the same in
    // every version. 1: the mappings' content hashes.
    if d.mappings.iter().any(|m| m.content != 0) {
        mark("mapping contents", &e);
        e.u(EXTENSION_MAPPING_CONTENT);
        for m in &d.mappings {
            e.u(m.content.into());
        }
    }
    *out = e.0;
}

/// The extension holding each mapping's content hash (a string index).
const EXTENSION_MAPPING_CONTENT: u64 = 1;

fn decode_body(body: &[u8]) -> R<SegmentData> {
    let mut d = Dec { buf: body, pos: 0 };
    let n = d.count()?;
    let lens: Vec<usize> = (0..n)
        .map(|_| d.u().map(|v| v as usize))
        .collect::<R<_>>()?;
    let mut strings = Vec::with_capacity(n);
    for len in lens {
        let bytes = d.bytes(len)?;
        let s =
            std::str::from_utf8(bytes).map_err(|_| SegmentError::Corrupt("string not UTF-8"))?;
        strings.push(s.to_owned());
    }
    let ns = strings.len();

    let n = d.count()?;
    let mut mappings = vec![Mapping::default(); n];
    for m in &mut mappings {
        m.build_id = d.index(ns)?;
    }
    for m in &mut mappings {
        m.build_id_kind =
            BuildIdKind::from_u8(d.u()? as u8).ok_or(SegmentError::Corrupt("build-ID kind"))?;
    }
    for m in &mut mappings {
        m.file = d.index(ns)?;
    }
    for m in &mut mappings {
        m.memory_start = d.u()?;
        m.memory_limit = m.memory_start.wrapping_add(d.u()?);
        m.file_offset = d.u()?;
    }

    let n = d.count()?;
    let mut frames = vec![Frame::default(); n];
    for f in &mut frames {
        f.frame_type = d.index(ns)?;
    }
    for f in &mut frames {
        f.mapping = d.index(mappings.len())?;
    }
    let mut previous = 0u64;
    for f in &mut frames {
        f.address = previous.wrapping_add(d.i()? as u64);
        previous = f.address;
    }
    let line_counts: Vec<usize> = (0..n).map(|_| d.count()).collect::<R<_>>()?;
    for (f, count) in frames.iter_mut().zip(line_counts) {
        f.lines = (0..count)
            .map(|_| {
                Ok(Line {
                    function: d.index(ns)?,
                    system_name: d.index(ns)?,
                    file: d.index(ns)?,
                    line: d.i()?,
                    column: d.i()?,
                })
            })
            .collect::<R<_>>()?;
    }

    let n = d.count()?;
    let mut stacks: Vec<Vec<u32>> = Vec::with_capacity(n);
    let mut previous: Vec<u32> = Vec::new(); // root first
    for _ in 0..n {
        let shared = d.u()? as usize;
        if shared > previous.len() {
            return Err(SegmentError::Corrupt("stack prefix"));
        }
        let rest = d.count()?;
        previous.truncate(shared);
        for _ in 0..rest {
            previous.push(d.index(frames.len())?);
        }
        stacks.push(previous.iter().rev().copied().collect());
    }

    let n = d.count()?;
    let mut label_sets = Vec::with_capacity(n);
    for _ in 0..n {
        let len = d.count()?;
        let set = (0..len)
            .map(|_| Ok((d.index(ns)?, d.index(ns)?)))
            .collect::<R<Vec<_>>>()?;
        label_sets.push(set);
    }

    let n = d.count()?;
    let mut links = Vec::with_capacity(n);
    for _ in 0..n {
        let link: Link = d.bytes(24)?.try_into().unwrap();
        links.push(link);
    }

    let n = d.count()?;
    let mut series = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = Series {
            service: d.index(ns)?,
            sample_type: d.index(ns)?,
            sample_unit: d.index(ns)?,
            period_type: d.index(ns)?,
            period_unit: d.index(ns)?,
            labels: d.index(label_sets.len())?,
            period: d.i()?,
            start_ns: d.u()?,
            ..Default::default()
        };
        s.end_ns = s.start_ns.wrapping_add(d.u()?);
        series.push(s);
    }

    let n = d.count()?;
    let mut samples = vec![Sample::default(); n];
    for s in &mut samples {
        s.series = d.index(series.len())?;
    }
    let mut previous = 0i64;
    for s in &mut samples {
        previous = previous.wrapping_add(d.i()?);
        s.stack = u32::try_from(previous)
            .ok()
            .filter(|&i| (i as usize) < stacks.len())
            .ok_or(SegmentError::Corrupt("index out of range"))?;
    }
    for s in &mut samples {
        s.labels = d.index(label_sets.len())?;
    }
    for s in &mut samples {
        s.link = d.index(links.len())?;
    }
    let mut shapes = Vec::with_capacity(n);
    for _ in 0..n {
        shapes.push((d.count()?, d.count()?));
    }
    for (s, &(nt, _)) in samples.iter_mut().zip(&shapes) {
        let mut previous = series[s.series as usize].start_ns;
        s.timestamps = (0..nt)
            .map(|_| {
                previous = previous.wrapping_add(d.i()? as u64);
                Ok(previous)
            })
            .collect::<R<_>>()?;
    }
    for (s, &(_, nv)) in samples.iter_mut().zip(&shapes) {
        s.values = (0..nv).map(|_| d.i()).collect::<R<_>>()?;
    }
    while d.pos < body.len() {
        match d.u()? {
            EXTENSION_MAPPING_CONTENT => {
                for m in &mut mappings {
                    m.content = d.index(ns)?;
                }
            }
            _ => return Err(SegmentError::Corrupt("unknown extension")),
        }
    }
    Ok(SegmentData {
        strings,
        mappings,
        frames,
        stacks,
        label_sets,
        links,
        series,
        samples,
    })
}

#[cfg(test)]
#[path = "segment_tests.rs"]
pub(crate) mod tests;
