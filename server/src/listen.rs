//! The HTTP listener: hyper with the bounds axum's `serve` leaves out.
//!
//! - **Connections**: at most `max_connections` open; beyond it the accept
//!   loop waits and new clients queue in the kernel's backlog.
//! - **Headers**: a client has `header_timeout` to send a request's headers
//!   (hyper's `header_read_timeout`, which needs a timer and so was off
//!   under `axum::serve`); the same bound closes a keep-alive connection
//!   idle that long. A slow-loris client holds a connection that long, no
//!   more.
//! - **Bodies**: a request body that goes `body_idle_timeout` without a
//!   byte ends in an error the handler reports ([`IdleTimeoutBody`]).
//! - **Responses**: a connection whose client takes no byte of a response
//!   for `write_timeout` (it stopped reading: its receive window is zero)
//!   is closed ([`SendfileStream`]'s write timeout).
//!
//! Connections are served as `axum::serve` serves them ([`SendfileStream`]
//! for zero-copy files, [`PeerAddr`] for handlers), HTTP/1.1 only, and
//! shut down gracefully: no new connections, requests in flight finished.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::zerocopy::{PeerAddr, SendfileStream};

/// The bounds of the HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub write_timeout: Duration,
}

/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let router = router.layer(axum::middleware::from_fn(
        move |request: Request, next: axum::middleware::Next| {
            let request =
                request.map(|body| Body::new(IdleTimeoutBody::new(body, limits.body_idle_timeout)));
            next.run(request)
        },
    ));
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // HTTP/1.1 only: debuginfod clients (libcurl), browsers on plain http
    // and OTLP/HTTP senders all speak it, and HTTP/2's idle connections
    // have no header timeout to end them (a client answering pings could
    // hold a connection slot forever). OTLP gRPC has its own listener.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let builder = Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = shutdown.as_mut() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before
                    // accept: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.as_mut() => break,
        };
        let _ = stream.set_nodelay(true);
        metrics::gauge!("symtrace_http_connections").increment(1.0);
        let service = router
            .clone()
            .map_request(move |request: Request<Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
                request
            });
        let service = TowerToHyperService::new(service);
        let io = TokioIo::new(SendfileStream::new(stream, limits.write_timeout));
        let builder = builder.clone();
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %e, %peer, "connection ended with an error");
            }
            metrics::gauge!("symtrace_http_connections").decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; closing them");
    }
    Ok(())
}

/// A request body that fails once it goes `timeout` without a frame (the
/// clock starts at the first read, so a handler's own work before reading
/// does not count).
pub struct IdleTimeoutBody {
    inner: Body,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl IdleTimeoutBody {
    pub fn new(inner: Body, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
        }
    }
}

/// The request body stopped arriving.
#[derive(Debug, thiserror::Error)]
#[error("no byte of the request body arrived for {0:?} ({BODY_IDLE_SETTING})")]
pub struct BodyIdle(Duration);

const BODY_IDLE_SETTING: &str = "SYMTRACE_BODY_IDLE_TIMEOUT";

/// Whether a body error's text is a [`BodyIdle`] (errors reach handlers
/// through body streams as text).
pub fn is_body_idle(message: &str) -> bool {
    message.contains(BODY_IDLE_SETTING)
}

impl http_body::Body for IdleTimeoutBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyIdle(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The gRPC listener's connections, at most `max` open at once (the accept
/// loop waits for one to close).
pub fn capped_incoming(
    listener: TcpListener,
    max: usize,
) -> impl futures::Stream<Item = std::io::Result<CappedStream>> {
    let slots = Arc::new(Semaphore::new(max.max(1)));
    futures::stream::unfold((listener, slots), |(listener, slots)| async move {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let accepted = listener.accept().await;
        if let Err(e) = &accepted {
            // Out of descriptors, say: tonic polls again at once, so back
            // off here rather than spin.
            tracing::warn!(error = %e, "gRPC accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let accepted = accepted.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            CappedStream {
                stream,
                _permit: permit,
            }
        });
        Some((accepted, (listener, slots)))
    })
}

/// A connection that holds one of the listener's slots while open.
pub struct CappedStream {
    stream: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for CappedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
