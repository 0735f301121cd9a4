//! Opening the files a process maps or names, safely. The path
//! `/proc/PID/maps` shows is the process's view, inside its container:
//! resolved naively under `/proc/PID/root`, an absolute symlink there
//! resolves against the *agent's* root (a container could point the agent at
//! any host file), `..` climbs out, and opening a FIFO blocks, opening a
//! device runs its driver's `open` (as root), and a mapping of a file that
//! is truncated faults the agent (SIGBUS). So:
//!
//! - `/proc/PID/map_files/START-END` first: the kernel's link to exactly the
//!   mapped file, no path walk (needs CAP_SYS_ADMIN or
//!   CAP_CHECKPOINT_RESTORE, which the agent does not ask for);
//! - else `openat2` under `/proc/PID/root` with `RESOLVE_IN_ROOT` (every
//!   symlink and `..` stays inside the process's root) and
//!   `RESOLVE_NO_MAGICLINKS`;
//! - either way with `O_PATH` first: a handle that opens nothing (no FIFO
//!   wait, no driver, no FUSE `open`), whose `fstat` must show a regular
//!   file of at most `MAX_FILE_BYTES` with the inode the mapping has (not
//!   another file now at that path) — only then is the very same file opened
//!   for reading, through `/proc/self/fd/N` of that handle;
//! - it is read with `pread` (object's `ReadCache`), never mapped, and
//!   skipped when its size or modification time changed meanwhile.
//!
//! These calls can still wait on a filesystem a process controls (a FUSE
//! daemon that never answers): they run in jobs (`crate::jobs`), never on
//! the sampler thread.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::process::maps::MapEntry;

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
    /// Not an ELF file the agent can read (or it asked for more than its
    /// read budget).
    Unparsable,
    /// Reading it panicked (a parser met bytes it did not expect).
    Panicked,
    /// Reading it took longer than the jobs' bound, or its filesystem or
    /// process had a job hang before.
    Hung,
    /// Its process is over its budget of work (see `process::budget`).
    OverBudget,
}

impl Skip {
    pub const ALL: [Skip; 9] = [
        Skip::Unreachable,
        Skip::NotRegular,
        Skip::TooLarge,
        Skip::NotTheMappedFile,
        Skip::Changed,
        Skip::Unparsable,
        Skip::Panicked,
        Skip::Hung,
        Skip::OverBudget,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// An opened mapped file and what `fstat` said when it was opened.
pub struct Opened {
    pub file: File,
    pub size: u64,
    /// Its owner (budgets are kept per owner of the files they pay for).
    pub uid: u32,
    mtime: (i64, i64),
}

impl Opened {
    /// An already open file, as if opened through a mapping.
    #[cfg(test)]
    pub fn for_test(file: File) -> Self {
        let meta = file.metadata().unwrap();
        Opened {
            size: meta.size(),
            uid: meta.uid(),
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
    let handle = match path_handle(&via_map_files) {
        Ok(f) => f,
        Err(_) => path_in_root(&process.join("root"), &map.path).map_err(|_| Skip::Unreachable)?,
    };
    let meta = handle.metadata().map_err(|_| Skip::Unreachable)?;
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
    let file = reopen(&handle).map_err(|_| Skip::Unreachable)?;
    let meta = file.metadata().map_err(|_| Skip::Unreachable)?;
    Ok(Opened {
        file,
        size: meta.size(),
        uid: meta.uid(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    })
}

/// Opens a regular file at `path` (absolute, as the process whose root
/// `root` is sees it) for reading, if it is one of at most `max_bytes`
/// owned by one of `uids` — checked on an `O_PATH` handle before anything
/// is opened. What it is when it is not: `NotRegular`, `TooLarge`, or
/// `Unreachable` (also for another owner's file).
pub fn open_owned_in_root(
    root: &Path,
    path: &str,
    uids: &[u32],
    max_bytes: u64,
) -> Result<File, Skip> {
    let handle = path_in_root(root, path).map_err(|_| Skip::Unreachable)?;
    let meta = handle.metadata().map_err(|_| Skip::Unreachable)?;
    if !meta.file_type().is_file() {
        return Err(Skip::NotRegular);
    }
    if !uids.contains(&meta.uid()) {
        return Err(Skip::Unreachable);
    }
    if meta.size() > max_bytes {
        return Err(Skip::TooLarge);
    }
    reopen(&handle).map_err(|_| Skip::Unreachable)
}

/// An `O_PATH` handle of `path` (a magic link of /proc followed, as the
/// kernel allows it).
fn path_handle(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
}

/// The file of an `O_PATH` handle, opened for reading: the same file (the
/// handle's own magic link), never a FIFO wait (`O_NONBLOCK`) or a
/// controlling terminal.
fn reopen(handle: &File) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?;
    let (a, b) = (handle.metadata()?, file.metadata()?);
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(std::io::Error::other("another file"));
    }
    Ok(file)
}

/// An `O_PATH` handle of `path` (absolute, as the process sees it) with
/// `root` as `/` for every step of the walk: `openat2(RESOLVE_IN_ROOT |
/// RESOLVE_NO_MAGICLINKS)` (Linux ≥ 5.6; on an older kernel nothing is
/// opened this way).
pub fn path_in_root(root: &Path, path: &str) -> std::io::Result<File> {
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
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
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

/// Opens `path` inside `root` for reading if it is a regular file (tests).
#[cfg(test)]
pub fn open_in_root(root: &Path, path: &str) -> std::io::Result<File> {
    let handle = path_in_root(root, path)?;
    if !handle.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    reopen(&handle)
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

        // A FIFO and a device are never opened: their O_PATH handle
        // shows what they are, and that is where it ends.
        let fifo = root.path().join("app/fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let handle = path_in_root(root.path(), "/app/fifo").expect("O_PATH: no wait");
        assert!(!handle.metadata().unwrap().file_type().is_file());
        assert!(open_in_root(root.path(), "/app/fifo").is_err());
        std::os::unix::fs::symlink("/dev/null", root.path().join("app/dev")).unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::copy("/dev/null", root.path().join("dev/null")).ok();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(
            open_owned_in_root(Path::new("/"), "/dev/null", &[uid], 1 << 20).err(),
            Some(Skip::NotRegular),
            "a device is not opened"
        );
        std::fs::write(root.path().join("app/mine"), "x").unwrap();
        assert!(open_owned_in_root(root.path(), "/app/mine", &[uid], 1 << 20).is_ok());
        assert_eq!(
            open_owned_in_root(root.path(), "/app/mine", &[uid + 1], 1 << 20).err(),
            Some(Skip::Unreachable),
            "another user's file"
        );
        assert_eq!(
            open_owned_in_root(root.path(), "/app/mine", &[uid], 0).err(),
            Some(Skip::TooLarge)
        );
    }

    #[test]
    fn the_mapped_file_or_nothing() {
        // Our own executable, as mapped: found, regular, the same inode.
        let maps = crate::process::maps::read(Path::new("/proc"), std::process::id()).unwrap();
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
