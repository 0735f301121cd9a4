//! Perf maps (`/tmp/perf-PID.map`, linux `tools/perf/Documentation/
//! jit-interface.txt`): one `START SIZE name` line per piece of generated
//! code, hex with or without `0x`. The file grows while the process runs;
//! it is read from where the last read stopped, a line at a time once it is
//! complete, and read from the start again when it shrank (a runtime that
//! rewrites it whole: `jcmd Compiler.perfmap`).

/// Longest line accepted; a longer one is counted bad and skipped.
pub const MAX_LINE: usize = 4096;

/// One line, parsed: start, size and name. `None` for a malformed line.
pub fn parse_line(line: &[u8]) -> Option<(u64, u64, &str)> {
    let line = std::str::from_utf8(line).ok()?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut parts = line.splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    if name.is_empty() || size == 0 || name.chars().any(char::is_control) {
        return None;
    }
    Some((start, size, name))
}

fn hex(s: &str) -> Option<u64> {
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// Where reading a growing file stands.
#[derive(Debug, Default)]
pub struct Cursor {
    /// Bytes consumed: every complete line before it was handled.
    pub offset: u64,
    /// Inside an over-long line: skip to its newline.
    skipping: bool,
}

/// What one read found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub lines: u64,
    pub bad: u64,
    /// The file was shorter than the offset: read again from its start.
    pub restarted: bool,
}

impl Cursor {
    /// Reads what was appended since the last call, at most `budget` bytes
    /// (what is left waits for the next call), through `read_at(offset,
    /// buf) -> bytes read`; `len` is the file's length now. Each complete
    /// line goes to `line` (a bad one is counted, never passed on).
    pub fn read(
        &mut self,
        len: u64,
        budget: usize,
        mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
        mut line: impl FnMut(u64, u64, &str),
    ) -> std::io::Result<Counts> {
        let mut counts = Counts::default();
        // Rewritten since (shorter, or another line ends where the last
        // read stopped): from the start again.
        let mut newline = [0u8; 1];
        if len < self.offset
            || (self.offset > 0
                && !self.skipping
                && (read_at(self.offset - 1, &mut newline)? != 1 || newline[0] != b'\n'))
        {
            *self = Cursor::default();
            counts.restarted = true;
        }
        // At least a whole line's worth, so that every line can complete.
        let want = (len - self.offset).min(budget.max(MAX_LINE + 1) as u64) as usize;
        if want == 0 {
            return Ok(counts);
        }
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match read_at(self.offset + got as u64, &mut buf[got..])? {
                0 => break,
                n => got += n,
            }
        }
        let buf = &buf[..got];
        let mut at = 0;
        while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
            let text = &buf[at..at + nl];
            at += nl + 1;
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            counts.lines += 1;
            match (text.len() <= MAX_LINE).then(|| parse_line(text)).flatten() {
                Some((start, size, name)) => line(start, size, name),
                None => counts.bad += 1,
            }
        }
        // A partial line waits for its end, unless it is already too long.
        if got - at > MAX_LINE {
            if !self.skipping {
                counts.lines += 1;
                counts.bad += 1;
            }
            self.skipping = true;
            at = got;
        }
        self.offset += at as u64;
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_runtimes_write_them() {
        assert_eq!(
            parse_line(b"7fe0c6fec640 378 JS:~computeRed /path/x.js:6:20"),
            Some((0x7fe0c6fec640, 0x378, "JS:~computeRed /path/x.js:6:20"))
        );
        assert_eq!(
            parse_line(b"0x00007fe3f0ec7620 0x0000000000000318 double Hot.heavy(int)"),
            Some((0x7fe3f0ec7620, 0x318, "double Hot.heavy(int)"))
        );
        assert_eq!(
            parse_line(b"1000 10 name with  spaces\r"),
            Some((0x1000, 0x10, "name with  spaces"))
        );
        for bad in [
            &b""[..],
            b"garbage",
            b"1000 10",
            b"1000 10 ",
            b"xyz 10 f",
            b"1000 0 empty",
            b"10000000000000000 10 too-wide",
            b"1000 10 bell\x07",
            b"1000 10 \xff\xfe",
            b"-1000 10 neg",
        ] {
            assert_eq!(parse_line(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// A growing file: partial lines wait, a shrink starts over, bad and
    /// over-long lines are counted and skipped.
    #[test]
    fn reads_a_growing_file_incrementally() {
        let mut file: Vec<u8> = Vec::new();
        let mut cursor = Cursor::default();
        let mut seen: Vec<(u64, String)> = Vec::new();
        let step = |file: &[u8], cursor: &mut Cursor, seen: &mut Vec<(u64, String)>, budget| {
            cursor
                .read(
                    file.len() as u64,
                    budget,
                    |off, buf| {
                        let src = &file[off as usize..];
                        let n = src.len().min(buf.len());
                        buf[..n].copy_from_slice(&src[..n]);
                        Ok(n)
                    },
                    |start, _, name| seen.push((start, name.to_owned())),
                )
                .unwrap()
        };
        file.extend_from_slice(b"1000 10 a\n2000 10 b\nnot a line\n3000 10 c");
        let c = step(&file, &mut cursor, &mut seen, 1 << 20);
        assert_eq!((c.lines, c.bad), (3, 1));
        assert_eq!(seen.len(), 2, "the partial line waits");
        file.extend_from_slice(b"d\n");
        step(&file, &mut cursor, &mut seen, 1 << 20);
        assert_eq!(seen[2], (0x3000, "cd".to_owned()));
        // An over-long line, split across reads, then a good one.
        file.extend_from_slice(b"4000 10 ");
        file.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        let c = step(&file, &mut cursor, &mut seen, 1 << 20);
        assert_eq!((c.lines, c.bad), (1, 1));
        file.extend_from_slice(b"xxxx\n5000 10 e\n");
        let c = step(&file, &mut cursor, &mut seen, 1 << 20);
        assert_eq!((c.lines, c.bad), (1, 0));
        assert_eq!(seen.last().unwrap(), &(0x5000, "e".to_owned()));
        // A small budget: several reads to catch up, nothing lost.
        let before = seen.len();
        for i in 0..100u64 {
            file.extend_from_slice(format!("{:x} 10 f{i}\n", 0x10000 + i * 16).as_bytes());
        }
        while step(&file, &mut cursor, &mut seen, 64).lines > 0 {}
        assert!(cursor.offset == file.len() as u64);
        assert_eq!(seen.len(), before + 100);
        // Rewritten shorter: read from the start.
        let file = b"0x9000 0x10 again\n".to_vec();
        let c = step(&file, &mut cursor, &mut seen, 1 << 20);
        assert!(c.restarted);
        assert_eq!(seen.last().unwrap(), &(0x9000, "again".to_owned()));
        // Rewritten longer (no newline where the last read stopped).
        let mut longer = b"0x9000 0x10 again and again, and longer".to_vec();
        longer.extend_from_slice(b"\n0xa000 0x10 new\n");
        let c = step(&longer, &mut cursor, &mut seen, 1 << 20);
        assert!(c.restarted);
        assert_eq!(seen.last().unwrap(), &(0xa000, "new".to_owned()));
    }
}
