//! `/proc/PID/maps`: the executable mappings of a process, sorted by address.

use std::path::Path;

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

/// The executable mappings of `/proc/PID/maps` text, sorted by start.
pub fn parse(text: &str) -> Vec<MapEntry> {
    let mut entries: Vec<MapEntry> = text.lines().filter_map(parse_line).collect();
    entries.sort_unstable_by_key(|e| e.start);
    entries
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

fn parse_line(line: &str) -> Option<MapEntry> {
    let Fields {
        range,
        perms,
        offset,
        dev,
        inode,
        path,
        deleted,
    } = fields(line)?;
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

/// The start of the first mapping (of any permissions) whose path is one of
/// `names`, in `/proc/PID/maps` text.
pub fn start_of(text: &str, names: &[&str]) -> Option<u64> {
    text.lines().find_map(|line| {
        let f = fields(line)?;
        if !names.contains(&f.path) {
            return None;
        }
        u64::from_str_radix(f.range.split_once('-')?.0, 16).ok()
    })
}

/// A process's `/proc/PID/maps` text.
pub fn read_text(proc_root: &Path, pid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps"))
}

/// Reads a process's executable mappings.
pub fn read(proc_root: &Path, pid: u32) -> std::io::Result<Vec<MapEntry>> {
    Ok(parse(&read_text(proc_root, pid)?))
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
    }
}
