//! The varint range encoding of `range_data` (see `format.rs`), shared by
//! the writer and the reader. The decoder checks every step, so damaged
//! data ends a scan early instead of panicking.

use super::format::{BLOCK, NONE};

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
