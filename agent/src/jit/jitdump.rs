//! jitdump files (linux `tools/perf/Documentation/jitdump-specification.txt`):
//! a 40-byte header, then records — `JIT_CODE_LOAD` (a function's code:
//! address, size, name), `JIT_CODE_MOVE`, `JIT_CODE_DEBUG_INFO` (source
//! lines of the code about to be loaded), `JIT_CODE_CLOSE`, and others
//! skipped. The writer appends while it runs; records are read once
//! complete, from where the last read stopped. Only little-endian files
//! (the host's order on x86-64) are read.

use std::collections::VecDeque;
use std::sync::Arc;

const MAGIC: u32 = 0x4A69_5444;
const HEADER: usize = 40;
const RECORD_HEADER: usize = 16;
const LOAD_FIXED: usize = RECORD_HEADER + 40;
const MOVE_SIZE: usize = RECORD_HEADER + 48;
/// A record larger than this (its code included) marks the file corrupt.
pub const MAX_RECORD: u64 = 64 << 20;
/// Longest function or file name read.
const MAX_NAME: usize = 4096;
/// A debug-info record larger than this is skipped (counted bad).
const MAX_DEBUG_RECORD: u64 = 1 << 20;
/// Lines kept of one debug-info record (sorted by address: the code's
/// first ones).
const MAX_DEBUG_LINES: usize = 1024;
/// Debug-info records waiting for their code's load record, at most, and
/// the bytes their lines may hold together (beyond either the oldest go,
/// counted as bad): what a writer that never loads the code described
/// costs at most.
const MAX_PENDING_DEBUG: usize = 64;
pub const MAX_PENDING_BYTES: usize = 1 << 20;
/// What a debug line costs beyond its file name.
const LINE_COST: usize = std::mem::size_of::<DebugLine>() + 16;

/// One source line of generated code: from `address` on, until the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugLine {
    pub address: u64,
    pub line: u32,
    pub file: Arc<str>,
}

/// What a record says.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    Load {
        address: u64,
        size: u64,
        name: &'a str,
        /// From the debug-info record that preceded it, sorted by address.
        lines: Vec<DebugLine>,
    },
    Move {
        from: u64,
        to: u64,
        size: u64,
    },
}

/// What one read found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub records: u64,
    pub bad: u64,
}

/// Where reading a jitdump file stands.
#[derive(Debug, Default)]
pub struct Reader {
    offset: u64,
    /// The header was read and is one this reader understands.
    started: bool,
    /// The file is not (or no longer) readable: a bad header, a record of
    /// impossible size, or `JIT_CODE_CLOSE` read.
    pub done: bool,
    pending: VecDeque<(u64, Vec<DebugLine>, usize)>,
    /// Bytes the pending lines hold.
    pending_bytes: usize,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A NUL-terminated string at the start of `b` and the bytes after it.
fn c_str(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = b.iter().position(|&c| c == 0)?;
    Some((&b[..end], &b[end + 1..]))
}

fn read_exact(
    read_at: &mut impl FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
    offset: u64,
    buf: &mut [u8],
) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match read_at(offset + got as u64, &mut buf[got..])? {
            0 => return Ok(false),
            n => got += n,
        }
    }
    Ok(true)
}

impl Reader {
    /// Bytes the pending debug lines hold (what this reader costs beyond
    /// its few fixed bytes).
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Reads the records appended since the last call whose bytes are all
    /// in the file (`len` long now), up to about `budget` bytes.
    pub fn read(
        &mut self,
        len: u64,
        budget: u64,
        mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
        mut event: impl FnMut(Event<'_>),
    ) -> std::io::Result<Counts> {
        let mut counts = Counts::default();
        if self.done {
            return Ok(counts);
        }
        if !self.started {
            if len < HEADER as u64 {
                return Ok(counts);
            }
            let mut h = [0u8; HEADER];
            if !read_exact(&mut read_at, 0, &mut h)? {
                return Ok(counts);
            }
            let size = u32_at(&h, 8) as u64;
            if u32_at(&h, 0) != MAGIC || u32_at(&h, 4) != 1 || size < HEADER as u64 {
                self.done = true;
                counts.bad += 1;
                return Ok(counts);
            }
            self.started = true;
            self.offset = size;
        }
        let stop = self.offset.saturating_add(budget);
        let mut buf = Vec::new();
        while self.offset < stop && len - self.offset.min(len) >= RECORD_HEADER as u64 {
            let mut rh = [0u8; RECORD_HEADER];
            if !read_exact(&mut read_at, self.offset, &mut rh)? {
                break;
            }
            let (id, size) = (u32_at(&rh, 0), u32_at(&rh, 4) as u64);
            if size < RECORD_HEADER as u64 || size > MAX_RECORD {
                self.done = true;
                counts.bad += 1;
                break;
            }
            if self.offset.saturating_add(size) > len {
                break; // not all written yet
            }
            let at = self.offset;
            self.offset += size;
            counts.records += 1;
            let ok = match id {
                0 => {
                    let want = (size as usize).min(LOAD_FIXED + MAX_NAME + 1);
                    buf.resize(want, 0);
                    read_exact(&mut read_at, at, &mut buf)? && self.load(&buf, &mut event)
                }
                1 => {
                    buf.resize(MOVE_SIZE, 0);
                    size >= MOVE_SIZE as u64 && read_exact(&mut read_at, at, &mut buf)? && {
                        event(Event::Move {
                            from: u64_at(&buf, 32),
                            to: u64_at(&buf, 40),
                            size: u64_at(&buf, 48),
                        });
                        true
                    }
                }
                2 => {
                    size <= MAX_DEBUG_RECORD && {
                        buf.resize(size as usize, 0);
                        read_exact(&mut read_at, at, &mut buf)? && self.debug_info(&buf)
                    }
                }
                3 => {
                    self.done = true;
                    true
                }
                _ => true, // unwinding info and records of later versions
            };
            if !ok {
                counts.bad += 1;
            }
            if self.done {
                break;
            }
        }
        Ok(counts)
    }

    fn load(&mut self, b: &[u8], event: &mut impl FnMut(Event<'_>)) -> bool {
        if b.len() < LOAD_FIXED {
            return false;
        }
        let (address, size) = (u64_at(b, 32), u64_at(b, 40));
        let Some(name) = c_str(&b[LOAD_FIXED..]).and_then(|(n, _)| std::str::from_utf8(n).ok())
        else {
            return false;
        };
        let lines = match self.pending.iter().rposition(|(a, _, _)| *a == address) {
            Some(i) => match self.pending.remove(i) {
                Some((_, lines, cost)) => {
                    self.pending_bytes -= cost;
                    lines
                }
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        event(Event::Load {
            address,
            size,
            name,
            lines,
        });
        true
    }

    fn debug_info(&mut self, b: &[u8]) -> bool {
        if b.len() < RECORD_HEADER + 16 {
            return false;
        }
        let code = u64_at(b, RECORD_HEADER);
        let entries = u64_at(b, RECORD_HEADER + 8);
        let mut rest = &b[RECORD_HEADER + 16..];
        let mut lines: Vec<DebugLine> = Vec::new();
        let mut cost = 0usize;
        for _ in 0..entries {
            if rest.len() < 16 {
                return false;
            }
            let (address, line) = (u64_at(rest, 0), u32_at(rest, 8));
            let Some((name, after)) = c_str(&rest[16..]) else {
                return false;
            };
            rest = after;
            // The byte 0xff alone: the previous entry's file (and the same
            // name again is shared too).
            let file = match (name, lines.last()) {
                (b"\xff", Some(prev)) => prev.file.clone(),
                (_, Some(prev)) if prev.file.as_bytes() == name => prev.file.clone(),
                _ if name.len() > MAX_NAME => return false,
                _ => match std::str::from_utf8(name) {
                    Ok(name) => {
                        cost += name.len();
                        Arc::from(name)
                    }
                    Err(_) => return false,
                },
            };
            cost += LINE_COST;
            lines.push(DebugLine {
                address,
                line,
                file,
            });
        }
        lines.sort_by_key(|l| l.address);
        if lines.len() > MAX_DEBUG_LINES {
            lines.truncate(MAX_DEBUG_LINES);
            lines.shrink_to_fit();
        }
        // The kept lines' cost, at most what was counted for all of them.
        let cost = cost.min(lines.len() * (LINE_COST + MAX_NAME));
        // A newer record for the same code replaces an older one.
        let mut freed = 0;
        self.pending.retain(|(a, _, c)| {
            let keep = *a != code;
            if !keep {
                freed += c;
            }
            keep
        });
        self.pending_bytes -= freed;
        let mut ok = true;
        while self.pending.len() >= MAX_PENDING_DEBUG
            || (!self.pending.is_empty() && self.pending_bytes + cost > MAX_PENDING_BYTES)
        {
            if let Some((_, _, c)) = self.pending.pop_front() {
                self.pending_bytes -= c;
                ok = false; // a description lost before its code came
            }
        }
        if cost > MAX_PENDING_BYTES {
            return false;
        }
        self.pending_bytes += cost;
        self.pending.push_back((code, lines, cost));
        ok
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// jitdump bytes, as a writer appends them.
    #[derive(Default)]
    pub(crate) struct Writer(pub Vec<u8>);

    impl Writer {
        pub(crate) fn header(pid: u32) -> Self {
            let mut w = Writer::default();
            for v in [MAGIC, 1, HEADER as u32, 62, 0, pid] {
                w.0.extend_from_slice(&v.to_le_bytes());
            }
            w.0.extend_from_slice(&[0; 16]);
            w
        }

        fn record(&mut self, id: u32, body: &[u8]) {
            self.0.extend_from_slice(&id.to_le_bytes());
            self.0
                .extend_from_slice(&((RECORD_HEADER + body.len()) as u32).to_le_bytes());
            self.0.extend_from_slice(&0u64.to_le_bytes());
            self.0.extend_from_slice(body);
        }

        pub(crate) fn load(&mut self, address: u64, size: u64, name: &str) {
            let mut b = Vec::new();
            b.extend_from_slice(&[0; 8]);
            for v in [address, address, size, 0] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(name.as_bytes());
            b.push(0);
            b.extend(std::iter::repeat_n(0xcc, size as usize));
            self.record(0, &b);
        }

        pub(crate) fn moved(&mut self, from: u64, to: u64, size: u64) {
            let mut b = vec![0; 8];
            for v in [to, from, to, size, 0] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            self.record(1, &b);
        }

        pub(crate) fn debug(&mut self, code: u64, lines: &[(u64, u32, &str)]) {
            let mut b = Vec::new();
            b.extend_from_slice(&code.to_le_bytes());
            b.extend_from_slice(&(lines.len() as u64).to_le_bytes());
            for (a, l, f) in lines {
                b.extend_from_slice(&a.to_le_bytes());
                b.extend_from_slice(&l.to_le_bytes());
                b.extend_from_slice(&0u32.to_le_bytes());
                match *f {
                    "same" => b.push(0xff),
                    f => b.extend_from_slice(f.as_bytes()),
                }
                b.push(0);
            }
            self.record(2, &b);
        }
    }

    fn events(r: &mut Reader, file: &[u8]) -> (Counts, Vec<String>) {
        let mut out = Vec::new();
        let c = r
            .read(
                file.len() as u64,
                1 << 20,
                |off, buf| {
                    let src = file.get(off as usize..).unwrap_or(&[]);
                    let n = src.len().min(buf.len());
                    buf[..n].copy_from_slice(&src[..n]);
                    Ok(n)
                },
                |e| {
                    out.push(match e {
                        Event::Load {
                            address,
                            size,
                            name,
                            lines,
                        } => {
                            let lines: Vec<String> = lines
                                .iter()
                                .map(|l| format!("{:x}:{}:{}", l.address, l.file, l.line))
                                .collect();
                            format!("load {address:x} {size} {name} [{}]", lines.join(" "))
                        }
                        Event::Move { from, to, size } => format!("move {from:x} {to:x} {size}"),
                    })
                },
            )
            .unwrap();
        (c, out)
    }

    #[test]
    fn records_as_they_are_appended() {
        let mut w = Writer::header(7);
        w.debug(0x1000, &[(0x1000, 10, "gen.c"), (0x1010, 12, "same")]);
        let mut r = Reader::default();
        let file_before = w.0.clone();
        w.load(0x1000, 32, "hot_loop");
        w.moved(0x1000, 0x2000, 32);
        // A partial record: not read until complete.
        let cut = w.0.len() - 3;
        let (c, seen) = events(&mut r, &w.0[..cut]);
        assert_eq!((c.records, c.bad), (2, 0));
        assert_eq!(
            seen,
            vec!["load 1000 32 hot_loop [1000:gen.c:10 1010:gen.c:12]"]
        );
        let _ = file_before;
        let (c, seen) = events(&mut r, &w.0);
        assert_eq!(c.records, 1);
        assert_eq!(seen, vec!["move 1000 2000 32"]);
        w.record(3, &[]);
        w.load(0x3000, 8, "after_close");
        let (_, seen) = events(&mut r, &w.0);
        assert!(seen.is_empty() && r.done, "nothing after JIT_CODE_CLOSE");
    }

    #[test]
    fn hostile_files_are_refused_not_trusted() {
        // Wrong magic, big-endian, another version.
        for patch in [0usize, 4] {
            let mut w = Writer::header(1);
            w.0[patch] ^= 0xff;
            let mut r = Reader::default();
            let (c, _) = events(&mut r, &w.0);
            assert_eq!(c.bad, 1);
            assert!(r.done);
        }
        // A record claiming 4 GiB, one smaller than its header.
        for size in [u32::MAX, 3] {
            let mut w = Writer::header(1);
            w.load(0x1000, 4, "ok");
            w.0.extend_from_slice(&0u32.to_le_bytes());
            w.0.extend_from_slice(&size.to_le_bytes());
            w.0.extend_from_slice(&[0; 64]);
            let mut r = Reader::default();
            let (c, seen) = events(&mut r, &w.0);
            assert_eq!((seen.len(), c.bad, r.done), (1, 1, true));
        }
        // A load record whose name never ends, debug info with more
        // entries than bytes: counted bad, the next record still read.
        let mut w = Writer::header(1);
        w.record(0, &[1; 40]);
        let mut b = 0x1000u64.to_le_bytes().to_vec();
        b.extend_from_slice(&1000u64.to_le_bytes());
        w.record(2, &b);
        w.load(0x2000, 4, "fine");
        let mut r = Reader::default();
        let (c, seen) = events(&mut r, &w.0);
        assert_eq!((c.records, c.bad), (3, 2));
        assert_eq!(seen, vec!["load 2000 4 fine []"]);
    }

    #[test]
    fn debug_lines_never_loaded_are_bounded() {
        // A writer describing code it never loads, with long file names:
        // the pending lines stay within their bound, the oldest going.
        let mut w = Writer::header(1);
        let name = "f".repeat(MAX_NAME);
        for i in 0..200u64 {
            let lines: Vec<(u64, u32, &str)> = (0..16)
                .map(|k| {
                    (
                        0x1000 + i * 0x1000 + k,
                        k as u32,
                        if k % 2 == 0 { name.as_str() } else { "g.c" },
                    )
                })
                .collect();
            w.debug(0x1000 + i * 0x1000, &lines);
        }
        let mut r = Reader::default();
        let mut bad = 0;
        loop {
            let (c, _) = events(&mut r, &w.0);
            bad += c.bad;
            if c.records == 0 {
                break;
            }
        }
        assert!(bad > 0, "descriptions were given up");
        assert!(
            r.pending_bytes() <= MAX_PENDING_BYTES,
            "{}",
            r.pending_bytes()
        );
        assert!(r.pending.len() <= MAX_PENDING_DEBUG);
        // The newest one is still there for its load.
        let mut w2 = Writer::default();
        w2.load(0x1000 + 199 * 0x1000, 64, "late");
        let mut whole = w.0.clone();
        whole.extend_from_slice(&w2.0);
        let (_, seen) = events(&mut r, &whole);
        assert!(
            seen[0].starts_with("load c8000 64 late [c8000:"),
            "{seen:?}"
        );
        let before = r.pending_bytes();
        assert!(before < MAX_PENDING_BYTES);
    }
}
