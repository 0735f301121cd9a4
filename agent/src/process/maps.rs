//! `/proc/PID/maps`: the executable mappings of a process, sorted by
//! address. A process controls its maps (up to 65,530 mappings with paths
//! of up to 4 KiB: hundreds of MB of text), so they are read as a stream,
//! keeping only executable lines (and the `OTEL_CTX` mapping's start), and
//! bounded: at most [`MAX_BYTES`] read, [`MAX_EXECUTABLE`] entries and
//! [`MAX_PATH_BYTES`] of their paths kept — past a bound the rest is
//! dropped and the read says so ([`Maps::truncated`]).

use std::io::BufRead;
use std::path::Path;

/// Bytes of `/proc/PID/maps` read at most (a JVM's 10,000 mappings take
/// about 1 MB; the kernel spends about 30 ms a MB of long paths making it).
pub const MAX_BYTES: u64 = 8 << 20;
/// Executable mappings kept at most.
pub const MAX_EXECUTABLE: usize = 16_384;
/// Bytes of their paths kept at most.
pub const MAX_PATH_BYTES: usize = 4 << 20;
/// The longest line read whole (a 4 KiB path and the fields before it);
/// a longer one is skipped.
const MAX_LINE: usize = 4096 + 128;

/// One executable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    pub dev: u64,
    pub inode: u64,
    /// The path as the process sees it (`[vdso]`, empty for anonymous
    /// memory); without the ` (deleted)` suffix, see `deleted`.
    pub path: String,
    pub deleted: bool,
}

impl MapEntry {
    /// Backed by a file (not anonymous memory, `[vdso]`, `[stack]`, …).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// What a read of a process's maps kept.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maps {
    /// Its executable mappings, sorted by start.
    pub executable: Vec<MapEntry>,
    /// The start of its OpenTelemetry process context mapping
    /// (`OTEL_CTX`), if it has one.
    pub process_context: Option<u64>,
    /// A bound was reached: some mappings were left out.
    pub truncated: bool,
    /// Bytes read.
    pub bytes: u64,
}

/// The names of the OpenTelemetry process context mapping (OTEP 4719).
const PROCESS_CONTEXT: [&str; 3] = [
    "[anon:OTEL_CTX]",
    "[anon_shmem:OTEL_CTX]",
    "/memfd:OTEL_CTX",
];

/// Reads `/proc/PID/maps`-formatted lines from `input` within the bounds.
pub fn read_from(input: impl std::io::Read) -> std::io::Result<Maps> {
    let mut reader = std::io::BufReader::with_capacity(64 << 10, input.take(MAX_BYTES));
    let mut maps = Maps::default();
    let mut line = Vec::with_capacity(256);
    let mut path_bytes = 0usize;
    loop {
        line.clear();
        let n =
            std::io::Read::take(&mut reader, MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        maps.bytes += n as u64;
        if line.last() != Some(&b'\n') {
            if n > MAX_LINE {
                // Skip the rest of a line too long to be a real one.
                maps.truncated = true;
                maps.bytes += skip_line(&mut reader)?;
                continue;
            }
            if maps.bytes >= MAX_BYTES {
                maps.truncated = true;
                break;
            }
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            continue; // a path that is not UTF-8: no name to give it anyway
        };
        let text = text.trim_end_matches('\n');
        let Some(f) = fields(text) else { continue };
        if maps.process_context.is_none() && PROCESS_CONTEXT.contains(&f.path) {
            maps.process_context = f
                .range
                .split_once('-')
                .and_then(|(s, _)| u64::from_str_radix(s, 16).ok());
        }
        let Some(entry) = entry_of(f) else { continue };
        if maps.executable.len() >= MAX_EXECUTABLE
            || path_bytes.saturating_add(entry.path.len()) > MAX_PATH_BYTES
        {
            maps.truncated = true;
            continue;
        }
        path_bytes += entry.path.len();
        maps.executable.push(entry);
    }
    maps.executable.sort_unstable_by_key(|e| e.start);
    Ok(maps)
}

/// Consumes input up to and including the next newline; the bytes skipped.
fn skip_line(reader: &mut impl BufRead) -> std::io::Result<u64> {
    let mut skipped = 0u64;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(skipped);
        }
        let (n, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        reader.consume(n);
        skipped += n as u64;
        if done {
            return Ok(skipped);
        }
    }
}

/// The executable mappings of `/proc/PID/maps` text, sorted by start.
#[cfg(test)]
pub fn parse(text: &str) -> Vec<MapEntry> {
    read_from(text.as_bytes())
        .map(|m| m.executable)
        .unwrap_or_default()
}

/// The fields of one line: `start-end perms offset major:minor inode
/// path`, the path without its ` (deleted)` suffix.
struct Fields<'a> {
    range: &'a str,
    perms: &'a str,
    offset: &'a str,
    dev: &'a str,
    inode: &'a str,
    path: &'a str,
    deleted: bool,
}

fn fields(line: &str) -> Option<Fields<'_>> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or("").trim_start();
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(Fields {
        range,
        perms,
        offset,
        dev,
        inode,
        path,
        deleted,
    })
}

fn entry_of(fields: Fields<'_>) -> Option<MapEntry> {
    let Fields {
        range,
        perms,
        offset,
        dev,
        inode,
        path,
        deleted,
    } = fields;
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(MapEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (u64::from_str_radix(major, 16).ok()? << 32) | u64::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        path: path.to_owned(),
        deleted,
    })
}

/// The index of the mapping holding `address`, if any.
pub fn find(entries: &[MapEntry], address: u64) -> Option<usize> {
    let i = entries
        .partition_point(|e| e.start <= address)
        .checked_sub(1)?;
    (address < entries[i].end).then_some(i)
}

/// Reads a process's maps (within the bounds).
pub fn read_maps(proc_root: &Path, pid: u32) -> std::io::Result<Maps> {
    read_from(std::fs::File::open(
        proc_root.join(pid.to_string()).join("maps"),
    )?)
}

/// Reads a process's executable mappings.
#[cfg(test)]
pub fn read(proc_root: &Path, pid: u32) -> std::io::Result<Vec<MapEntry>> {
    Ok(read_maps(proc_root, pid)?.executable)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1234   /usr/bin/busy
55d0c0001000-55d0c0002000 r-xp 00001000 fd:01 1234   /usr/bin/busy
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99     /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 
7f0000300000-7f0000301000 r-xp 00002000 00:05 77     /memfd:jit (deleted)
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0      [vdso]
";

    #[test]
    fn keeps_executable_mappings_and_finds_addresses() {
        let entries = parse(MAPS);
        assert_eq!(entries.len(), 5);
        let busy = &entries[find(&entries, 0x55d0c0001234).unwrap()];
        assert_eq!(
            (busy.offset, busy.inode, busy.dev),
            (0x1000, 1234, (0xfd << 32) | 1)
        );
        assert_eq!(busy.path, "/usr/bin/busy");
        assert!(busy.is_file());
        assert!(find(&entries, 0x55d0c0000010).is_none(), "not executable");
        assert!(find(&entries, 0x55d0c0002000).is_none(), "end is exclusive");
        let anon = &entries[find(&entries, 0x7f0000200010).unwrap()];
        assert!(!anon.is_file());
        let jit = &entries[find(&entries, 0x7f0000300010).unwrap()];
        assert!(jit.deleted);
        assert_eq!(jit.path, "/memfd:jit");
        assert_eq!(
            entries[find(&entries, 0x7ffd00000100).unwrap()].path,
            "[vdso]"
        );
        assert!(find(&entries, 1).is_none());
        let read = read_from(MAPS.as_bytes()).unwrap();
        assert!(!read.truncated);
        assert_eq!(read.process_context, None);
        let with_context =
            format!("{MAPS}7f1000000000-7f1000001000 r--p 00000000 00:00 0    [anon:OTEL_CTX]\n");
        assert_eq!(
            read_from(with_context.as_bytes()).unwrap().process_context,
            Some(0x7f10_0000_0000)
        );
    }

    #[test]
    fn a_huge_map_is_read_within_bounds() {
        // As many executable mappings as a process may have, each with a
        // 4 KiB path: the lines past the bounds are left out, and said so.
        let path = format!("/{}", "p".repeat(4000));
        let mut text = String::new();
        for i in 0..65_530u64 {
            text.push_str(&format!(
                "{:x}-{:x} r-xp 00000000 fd:01 {i} {path}\n",
                0x1000_0000 + i * 0x2000,
                0x1000_1000 + i * 0x2000
            ));
        }
        let read = read_from(text.as_bytes()).unwrap();
        assert!(read.truncated);
        assert!(read.bytes <= MAX_BYTES);
        let kept: usize = read.executable.iter().map(|e| e.path.len()).sum();
        assert!(kept <= MAX_PATH_BYTES, "{kept}");
        assert!(read.executable.len() <= MAX_EXECUTABLE);
        assert!(!read.executable.is_empty());
        // A line longer than any real one is skipped, not kept whole.
        let long = format!(
            "1000-2000 r-xp 00000000 fd:01 1 /{}\n2000-3000 r-xp 00000000 fd:01 2 /ok\n",
            "x".repeat(1 << 20)
        );
        let read = read_from(long.as_bytes()).unwrap();
        assert!(read.truncated);
        assert_eq!(read.executable.len(), 1);
        assert_eq!(read.executable[0].path, "/ok");
    }
}
