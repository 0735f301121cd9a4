//! The varint range encoding of `range_data` (see `format.rs`), shared by
//! the writer and the reader. The decoder checks every step, so damaged
//! data ends a scan early instead of panicking.

use super::format::{BLOCK, NAME_BUCKET, NONE};

/// The innermost frame of one range (`scope == NONE`: nothing known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub scope: u32,
    pub file: u32,
    pub line: u32,
    pub column: u32,
}

impl Entry {
    pub const EMPTY: Self = Self {
        scope: NONE,
        file: NONE,
        line: 0,
        column: 0,
    };
}

/// Encoded ranges: `(starts, ends, data)` per `format.rs`.
pub fn encode(ranges: &[(u32, Entry)]) -> (Vec<u32>, Vec<u32>, Vec<u8>) {
    let mut starts = Vec::with_capacity(ranges.len() / BLOCK + 1);
    let mut ends = Vec::with_capacity(ranges.len() / BLOCK + 1);
    let mut data = Vec::with_capacity(ranges.len() * 6);
    for block in ranges.chunks(BLOCK) {
        starts.push(block[0].0);
        let mut prev_start = block[0].0;
        let mut prev = Entry::default();
        for (i, &(start, entry)) in block.iter().enumerate() {
            if i > 0 {
                put(&mut data, u64::from(start - prev_start));
            }
            prev_start = start;
            if entry.scope == NONE {
                put(&mut data, 0);
                continue;
            }
            put(&mut data, u64::from(entry.scope) + 1);
            put(&mut data, zigzag(entry.file, prev.file));
            put(&mut data, zigzag(entry.line, prev.line));
            put(&mut data, u64::from(entry.column));
            prev = entry;
        }
        ends.push(u32::try_from(data.len()).unwrap_or(u32::MAX));
    }
    (starts, ends, data)
}

fn zigzag(value: u32, prev: u32) -> u64 {
    let delta = i64::from(value) - i64::from(prev);
    ((delta << 1) ^ (delta >> 63)) as u64
}

fn unzigzag(encoded: u64, prev: u32) -> Option<u32> {
    let delta = (encoded >> 1) as i64 ^ -((encoded & 1) as i64);
    u32::try_from(i64::from(prev).checked_add(delta)?).ok()
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one block's ranges in order.
pub struct BlockReader<'a> {
    data: &'a [u8],
    at: usize,
    first: bool,
    start: u32,
    prev: Entry,
}

impl<'a> BlockReader<'a> {
    pub fn new(data: &'a [u8], start: u32) -> Self {
        Self {
            data,
            at: 0,
            first: true,
            start,
            prev: Entry::default(),
        }
    }

    fn get(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.data.get(self.at)?;
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
}

impl Iterator for BlockReader<'_> {
    type Item = (u32, Entry);

    fn next(&mut self) -> Option<(u32, Entry)> {
        if self.first {
            self.first = false;
        } else {
            let delta = u32::try_from(self.get()?).ok()?;
            self.start = self.start.checked_add(delta)?;
        }
        let scope = self.get()?;
        if scope == 0 {
            return Some((self.start, Entry::EMPTY));
        }
        let entry = Entry {
            scope: u32::try_from(scope - 1).ok()?,
            file: unzigzag(self.get()?, self.prev.file)?,
            line: unzigzag(self.get()?, self.prev.line)?,
            column: u32::try_from(self.get()?).ok()?,
        };
        self.prev = entry;
        Some((self.start, entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip() {
        let ranges: Vec<(u32, Entry)> = (0..100u32)
            .map(|i| {
                let entry = if i % 7 == 3 {
                    Entry::EMPTY
                } else {
                    Entry {
                        scope: i * 1000 % 77,
                        file: if i % 5 == 0 { NONE } else { i % 3 },
                        line: (i * 37) % 500,
                        column: i % 90,
                    }
                };
                (i * 3 + (i % 4), entry)
            })
            .collect();
        let (starts, ends, data) = encode(&ranges);
        let mut decoded = Vec::new();
        let mut from = 0;
        for (b, &end) in ends.iter().enumerate() {
            decoded.extend(BlockReader::new(&data[from..end as usize], starts[b]));
            from = end as usize;
        }
        assert_eq!(decoded, ranges);
    }
}

/// Front-codes names sorted ascending, [`NAME_BUCKET`] to a bucket: the
/// first in full (length, bytes), each next as (shared prefix length, suffix
/// length, suffix). Returns each bucket's end offset and the data.
pub fn encode_names(sorted: &[&str]) -> (Vec<u32>, Vec<u8>) {
    let mut ends = Vec::with_capacity(sorted.len() / NAME_BUCKET + 1);
    let mut data = Vec::new();
    for bucket in sorted.chunks(NAME_BUCKET) {
        let mut prev: &[u8] = &[];
        for name in bucket {
            let name = name.as_bytes();
            let shared = prev.iter().zip(name).take_while(|(a, b)| a == b).count();
            put(&mut data, shared as u64);
            put(&mut data, (name.len() - shared) as u64);
            data.extend_from_slice(&name[shared..]);
            prev = name;
        }
        ends.push(u32::try_from(data.len()).unwrap_or(u32::MAX));
    }
    (ends, data)
}

/// Decodes the name at `position` of a front-coded bucket into `out`;
/// `false` when the bucket is damaged.
pub fn decode_name(bucket: &[u8], position: usize, out: &mut Vec<u8>) -> bool {
    let mut reader = BlockReader::new(bucket, 0);
    out.clear();
    for _ in 0..=position {
        let (Some(shared), Some(len)) = (reader.get(), reader.get()) else {
            return false;
        };
        let (Ok(shared), Ok(len)) = (usize::try_from(shared), usize::try_from(len)) else {
            return false;
        };
        let Some(suffix) = reader
            .at
            .checked_add(len)
            .and_then(|end| bucket.get(reader.at..end))
        else {
            return false;
        };
        if shared > out.len() {
            return false;
        }
        out.truncate(shared);
        out.extend_from_slice(suffix);
        reader.at += len;
    }
    true
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let mut names: Vec<String> = (0..100)
            .map(|i| format!("_ZN4core3fmt{}E{}", i * 7, i % 3))
            .collect();
        names.push(String::new());
        names.push("é_unicode_ü".into());
        names.sort();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (ends, data) = encode_names(&refs);
        let mut out = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let bucket = i / NAME_BUCKET;
            let from = bucket.checked_sub(1).map_or(0, |b| ends[b] as usize);
            assert!(decode_name(
                &data[from..ends[bucket] as usize],
                i % NAME_BUCKET,
                &mut out
            ));
            assert_eq!(out, name.as_bytes());
        }
        assert!(!decode_name(&data[..3], 5, &mut out));
    }
}
