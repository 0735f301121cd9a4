//! Opening the files a process maps, safely. The path `/proc/PID/maps`
//! shows is the process's view, inside its container: resolved naively
//! under `/proc/PID/root`, an absolute symlink there resolves against the
//! *agent's* root (a container could point the agent at any host file),
//! `..` climbs out, a FIFO blocks `open` forever, and a mapping of a file
//! that is truncated faults the agent (SIGBUS). So:
//!
//! - `/proc/PID/map_files/START-END` first: the kernel's link to exactly the
//!   mapped file, no path walk (needs CAP_SYS_ADMIN or
//!   CAP_CHECKPOINT_RESTORE, which the agent does not ask for);
//! - else `openat2` under `/proc/PID/root` with `RESOLVE_IN_ROOT` (every
//!   symlink and `..` stays inside the process's root) and
//!   `RESOLVE_NO_MAGICLINKS`, `O_NONBLOCK` (a FIFO does not block);
//! - then the opened file must be a regular file, of at most
//!   `MAX_FILE_BYTES`, with the inode the mapping has (not another file now
//!   at that path);
//! - it is read with `pread` (object's `ReadCache`), never mapped, and
//!   skipped when its size or modification time changed meanwhile.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::maps::MapEntry;

/// Largest file the agent reads headers and symbols from.
pub const MAX_FILE_BYTES: u64 = 16 << 30;

/// Why a mapped file was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Gone, or the path does not resolve inside the process's root.
    Unreachable,
    /// A FIFO, device, directory, …
    NotRegular,
    /// Larger than `MAX_FILE_BYTES`.
    TooLarge,
    /// The file at the path is not the one mapped (another inode).
    NotTheMappedFile,
    /// Its size or modification time changed while it was read.
    Changed,
    /// Not an ELF file the agent can read.
    Unparsable,
}

impl Skip {
    pub const ALL: [Skip; 6] = [
        Skip::Unreachable,
        Skip::NotRegular,
        Skip::TooLarge,
        Skip::NotTheMappedFile,
        Skip::Changed,
        Skip::Unparsable,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// An opened mapped file and what `fstat` said when it was opened.
pub struct Opened {
    pub file: File,
    pub size: u64,
    mtime: (i64, i64),
}

impl Opened {
    /// An already open file, as if opened through a mapping.
    #[cfg(test)]
    pub fn for_test(file: File) -> Self {
        let meta = file.metadata().unwrap();
        Opened {
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            file,
        }
    }

    /// Whether the file is as it was when opened (size, modification time).
    pub fn unchanged(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|m| m.size() == self.size && (m.mtime(), m.mtime_nsec()) == self.mtime)
    }
}

/// Opens the file of mapping `map` of process `pid` (see the module docs).
pub fn open_mapped(proc_root: &Path, pid: u32, map: &MapEntry) -> Result<Opened, Skip> {
    let process = proc_root.join(pid.to_string());
    let via_map_files = process
        .join("map_files")
        .join(format!("{:x}-{:x}", map.start, map.end));
    let file = match nonblocking(&via_map_files) {
        Ok(f) => f,
        Err(_) => open_in_root(&process.join("root"), &map.path).map_err(|_| Skip::Unreachable)?,
    };
    let meta = file.metadata().map_err(|_| Skip::Unreachable)?;
    if !meta.file_type().is_file() {
        return Err(Skip::NotRegular);
    }
    if meta.size() > MAX_FILE_BYTES {
        return Err(Skip::TooLarge);
    }
    // Only the inode: a file of an overlay filesystem (containers) shows
    // the overlay's device to fstat and the underlying one in the maps.
    if map.inode != 0 && meta.ino() != map.inode {
        return Err(Skip::NotTheMappedFile);
    }
    Ok(Opened {
        file,
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    })
}

fn nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Opens `path` (absolute, as the process sees it) with `root` as `/` for
/// every step of the walk: `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
/// (Linux ≥ 5.6; on an older kernel nothing is opened this way).
pub fn open_in_root(root: &Path, path: &str) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)?;
    let relative = path.trim_start_matches('/');
    let name = std::ffi::CString::new(Path::new(relative).as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain integers; all-zero is its documented
    // default (libc marks it non-exhaustive: fields may be added).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `name` (NUL-terminated) and `how` (of the size
    // given) and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor openat2 just returned, owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_stay_inside_the_root_and_fifos_do_not_block() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        std::fs::create_dir_all(root.path().join("app")).unwrap();
        std::fs::write(root.path().join("app/real"), "inside").unwrap();
        // An absolute symlink to the host file, and a climb out with `..`.
        std::os::unix::fs::symlink(&secret, root.path().join("app/abs")).unwrap();
        let climb = format!("../../../../../../..{}", secret.display());
        std::os::unix::fs::symlink(&climb, root.path().join("app/climb")).unwrap();
        std::os::unix::fs::symlink("/app/real", root.path().join("app/ok")).unwrap();
        let read =
            |p: &str| open_in_root(root.path(), p).map(|f| std::io::read_to_string(f).unwrap());
        assert_eq!(read("/app/real").unwrap(), "inside");
        assert_eq!(
            read("/app/ok").unwrap(),
            "inside",
            "a symlink inside the root"
        );
        assert!(
            read("/app/abs").is_err(),
            "resolved inside the root: no such file"
        );
        assert!(read("/app/climb").is_err());
        assert!(read(&format!("/../../../../..{}", secret.display())).is_err());

        // A FIFO opens without blocking and is refused as not regular.
        let fifo = root.path().join("app/fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let f = open_in_root(root.path(), "/app/fifo").expect("O_NONBLOCK: no wait");
        assert!(!f.metadata().unwrap().file_type().is_file());
    }

    #[test]
    fn the_mapped_file_or_nothing() {
        // Our own executable, as mapped: found, regular, the same inode.
        let maps = crate::maps::read(Path::new("/proc"), std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let map = maps
            .iter()
            .find(|m| Path::new(&m.path) == exe)
            .expect("our executable is mapped");
        let opened = open_mapped(Path::new("/proc"), std::process::id(), map).unwrap();
        assert!(opened.unchanged());
        // Another inode at the path: refused.
        let mut other = map.clone();
        other.inode += 1;
        other.start = 0; // no map_files entry: by path
        assert_eq!(
            open_mapped(Path::new("/proc"), std::process::id(), &other).err(),
            Some(Skip::NotTheMappedFile)
        );
        let mut gone = other;
        gone.path = "/no/such/file".into();
        assert_eq!(
            open_mapped(Path::new("/proc"), std::process::id(), &gone).err(),
            Some(Skip::Unreachable)
        );
    }
}
