//! Zero-copy sending of local blobs with `sendfile(2)`.
//!
//! Local blobs are served as `Bytes` over a memory mapping ([`FileMapping`]),
//! which hyper hands to the socket without copying it into its own buffers.
//! Every mapping is registered here with the file it maps. The connection
//! type [`SendfileStream`] looks at each buffer hyper writes: when the buffer
//! lies inside a registered mapping, it asks the kernel to send those bytes
//! straight from the page cache (`sendfile`), so they are never copied
//! through user space (and the mapped pages are never even touched). Bytes
//! on the wire are the same either way: a buffer that is not file-backed, or
//! any error in the lookup, takes the ordinary `writev` path.
//!
//! This is what elfutils' server gets from libmicrohttpd's
//! `MHD_create_response_from_fd`, without giving up hyper.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::RwLock;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Registered mappings: start address → (length, file descriptor).
static MAPPINGS: RwLock<BTreeMap<usize, (usize, RawFd)>> = RwLock::new(BTreeMap::new());

/// A read-only mapping of a whole file, registered for `sendfile` while it
/// lives. Use as the owner of a `Bytes`.
pub struct FileMapping {
    map: memmap2::Mmap,
    _file: std::fs::File,
}

impl FileMapping {
    /// Maps `file` (which must not be empty and must not change while mapped).
    pub fn new(file: std::fs::File) -> io::Result<Self> {
        // SAFETY: callers map immutable, content-addressed blobs.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        MAPPINGS
            .write()
            .expect("mapping registry")
            .insert(map.as_ptr() as usize, (map.len(), file.as_raw_fd()));
        Ok(Self { map, _file: file })
    }
}

impl AsRef<[u8]> for FileMapping {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // Unregister before the mapping and the descriptor go away.
        MAPPINGS
            .write()
            .expect("mapping registry")
            .remove(&(self.map.as_ptr() as usize));
    }
}

/// Buffers smaller than this go out with the headers in one `writev`: for
/// them a second syscall costs more than the copy it saves.
const SENDFILE_MIN: usize = 64 << 10;

/// The file and offset behind a buffer, if it is large enough to be worth a
/// `sendfile` and lies wholly inside a mapping.
fn file_behind(buf: &[u8]) -> Option<(RawFd, u64)> {
    if buf.len() < SENDFILE_MIN {
        return None;
    }
    let start = buf.as_ptr() as usize;
    let registry = MAPPINGS.read().ok()?;
    let (&base, &(len, fd)) = registry.range(..=start).next_back()?;
    (start + buf.len() <= base + len).then_some((fd, (start - base) as u64))
}

/// The client's address, for handlers (`ConnectInfo<PeerAddr>`), set by
/// [`crate::listen::serve`] on every request.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// A TCP connection that sends file-backed buffers with `sendfile`, and
/// fails a write that makes no progress for `write_timeout` (a client that
/// stopped reading).
pub struct SendfileStream {
    stream: TcpStream,
    write_timeout: std::time::Duration,
    /// Running while a write waits for the client.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SendfileStream {
    pub fn new(stream: TcpStream, write_timeout: std::time::Duration) -> Self {
        Self {
            stream,
            write_timeout,
            stalled: None,
        }
    }

    /// `poll` (a write or a flush) with the write timeout: progress resets
    /// it, waiting past it is an error.
    fn guarded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client took no byte of the response for the write timeout \
                         (SYMTRACE_RESPONSE_WRITE_TIMEOUT)",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn poll_sendfile(
        &self,
        cx: &mut Context<'_>,
        fd: RawFd,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            let socket = self.stream.as_raw_fd();
            let sent = self.stream.try_io(Interest::WRITABLE, || {
                let mut off = offset as libc::off_t;
                // SAFETY: both descriptors are open (the socket is ours; the
                // file is kept open by the FileMapping that owns the buffer
                // hyper is writing), and `off` is a valid pointer.
                let n = unsafe { libc::sendfile(socket, fd, &mut off, len) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

impl AsyncRead for SendfileStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendfileStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = match file_behind(buf) {
            Some((fd, offset)) => self.poll_sendfile(cx, fd, offset, buf.len()),
            None => Pin::new(&mut self.stream).poll_write(cx, buf),
        };
        self.guarded(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some(first) = bufs.iter().position(|b| !b.is_empty()) else {
            return Poll::Ready(Ok(0));
        };
        let poll = if let Some((fd, offset)) = file_behind(&bufs[first]) {
            self.poll_sendfile(cx, fd, offset, bufs[first].len())
        } else {
            // Plain buffers up to the next file-backed one go out with writev.
            let end = bufs[first..]
                .iter()
                .position(|b| file_behind(b).is_some())
                .map_or(bufs.len(), |i| first + i);
            Pin::new(&mut self.stream).poll_write_vectored(cx, &bufs[first..end])
        };
        self.guarded(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.guarded(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.guarded(cx, poll)
    }
}

/// Raises the soft limit on open files to the hard limit: mapped blobs keep
/// their descriptors open.
pub fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a stack value.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_file_behind_a_mapped_slice_only() {
        let mut tmp = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut tmp, &vec![7u8; 4 * SENDFILE_MIN]).unwrap();
        let bytes = bytes::Bytes::from_owner(FileMapping::new(tmp).unwrap());
        let (_, offset) = file_behind(&bytes[100..100 + SENDFILE_MIN]).unwrap();
        assert_eq!(offset, 100);
        assert!(
            file_behind(&bytes[..SENDFILE_MIN - 1]).is_none(),
            "small buffers are written"
        );
        assert!(file_behind(&vec![1u8; 2 * SENDFILE_MIN]).is_none());
        let base = bytes.as_ptr() as usize;
        drop(bytes);
        assert!(
            MAPPINGS.read().unwrap().get(&base).is_none(),
            "unregistered on drop"
        );
    }
}
