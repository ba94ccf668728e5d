//! The connections of `aplc serve` (spec/serve.md, "Connections"): the accept loop, the cap
//! on open connections, and the timeouts that keep a silent or slow client from holding
//! one.
//!
//! `axum::serve` has neither a cap nor timeouts, so this is its loop over hyper's HTTP/1
//! connection, with three additions:
//!
//! * Every connection is in one of three phases: waiting for the first byte of a request
//!   after an answer (*idle*, at most `idle_timeout`), reading a request head (*header*,
//!   at most `header_timeout` from its first byte, or from the accept for a new
//!   connection), or *busy* (a request is being served, its answer written). A connection
//!   past its phase's deadline is closed. hyper's own `header_read_timeout` is not used:
//!   it starts when hyper waits for a head, so it would cut idle keep-alive connections at
//!   the header timeout too. The body has its own deadline where it is read
//!   ([`crate::api`]).
//! * At most `max_connections` are open. A new connection over the cap closes the oldest
//!   one that is not busy (one that has not sent a whole request head: a slowloris
//!   client's, or an idle keep-alive one, which its client reopens at need), so stalled
//!   connections can never lock out a client that sends a request; only when every
//!   connection is busy serving a request is the new one closed at once.
//! * On shutdown, connections get hyper's graceful shutdown, and those still open after
//!   the drain timeout are dropped, so a client that never reads cannot hold the process.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt as _;

/// The most a connection buffers: a request head's limit, and what bounds the server's
/// buffers at the largest cap (10,000 connections: under 700 MB even if every one sends a
/// head this large).
const MAX_CONNECTION_BUFFER: usize = 64 * 1024;

/// How long connections may stall, and how many may be open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) max_connections: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// How long open connections may go on after a shutdown starts.
    pub(crate) drain_timeout: Duration,
}

/// Accepts connections and serves `app` on them until `stop`; then lets open
/// connections finish (hyper's graceful shutdown) for up to the drain timeout.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let open = Arc::new(OpenConnections::default());
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Finished connection tasks are reaped as they end: the set stays small.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                accept_failed(e, &mut stop).await;
                continue;
            }
        };
        let Some(connection) = open.admit(limits.max_connections) else {
            tracing::debug!("every connection is busy: a new one is closed");
            continue;
        };
        // TCP_NODELAY on every connection: an SSE stream writes each event (a token
        // delta) as a small segment of its own, and with Nagle's algorithm each one after
        // the first would wait for the reader's delayed ACK (up to 40 ms on Linux).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let (open, app, stop) = (open.clone(), app.clone(), stop.clone());
        tasks.spawn(async move {
            serve_connection(stream, connection.clone(), app, limits, stop).await;
            open.remove(connection.id);
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            "connections still open after the drain timeout are closed"
        );
    }
    // Dropping the set aborts what is left.
}

/// Serves one connection until it ends, is evicted, or stalls past its phase's deadline.
async fn serve_connection(
    stream: TcpStream,
    connection: Arc<Connection>,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let io = TokioIo::new(Watched {
        stream,
        connection: connection.clone(),
    });
    let service = {
        let connection = connection.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let busy = connection.begin_request();
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _busy: busy })))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper buffers up to about 400 KiB per connection by default; a request head larger
    // than this gets 431, and a body streams through in pieces of at most this size.
    builder.max_buf_size(MAX_CONNECTION_BUFFER);
    let mut served = std::pin::pin!(builder.serve_connection(io, service));
    let mut stopping = false;
    loop {
        // Taken before the deadline is read, so a change in between is not missed.
        let changed = connection.changed.notified();
        let deadline = connection.deadline(&limits);
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = connection.evicted.notified() => {
                tracing::debug!("connection closed for a new one: the cap is reached");
                return;
            }
            () = sleep_until(deadline) => {
                if connection.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("connection closed: it stalled past its timeout");
                    return;
                }
            }
            () = changed => {}
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// An accept that failed. A failed handshake concerns that connection only; anything
/// else (out of file descriptors, memory) is logged and retried after a second, as
/// hyper and axum do, so the loop does not spin or flood the log.
async fn accept_failed(error: io::Error, stop: &mut watch::Receiver<bool>) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %error, "cannot accept a connection; retrying in a second");
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = stop.wait_for(|stop| *stop) => {}
    }
}

/// The open connections, oldest first (ids grow).
#[derive(Default)]
struct OpenConnections {
    by_id: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// Set while the cap is reached, so that reaching it is logged once, not per accept.
    at_cap: AtomicBool,
}

impl OpenConnections {
    /// Registers a new connection: under the cap, or in place of the oldest one that is
    /// not busy (told to close). `None` when every open connection is busy.
    fn admit(&self, max: usize) -> Option<Arc<Connection>> {
        let mut by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        if by_id.len() >= max.max(1) {
            if !self.at_cap.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max_connections = max,
                    "the connection cap is reached: stalled connections are closed for new ones"
                );
            }
            let oldest_waiting = by_id
                .iter()
                .find(|(_, c)| !c.is_busy())
                .map(|(id, _)| *id)?;
            if let Some(evicted) = by_id.remove(&oldest_waiting) {
                evicted.evicted.notify_one();
            }
        } else {
            self.at_cap.store(false, Ordering::Relaxed);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection::new(id));
        by_id.insert(id, connection.clone());
        Some(connection)
    }

    fn remove(&self, id: u64) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// One open connection's phase, shared by its task, its socket and its requests.
struct Connection {
    id: u64,
    phase: Mutex<Phase>,
    /// The phase changed: the connection's task reads the new deadline.
    changed: Notify,
    /// The cap needs this connection's place: its task closes it.
    evicted: Notify,
}

/// Where a connection is in its request cycle, and since when.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Answered; waiting for the first byte of the next request.
    Idle(Instant),
    /// Reading a request head, since the accept or since its first byte.
    Header(Instant),
    /// Serving this many requests (hyper's HTTP/1 serves one at a time).
    Busy(usize),
}

impl Connection {
    fn new(id: u64) -> Connection {
        Connection {
            id,
            phase: Mutex::new(Phase::Header(Instant::now())),
            changed: Notify::new(),
            evicted: Notify::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_busy(&self) -> bool {
        matches!(*self.phase(), Phase::Busy(_))
    }

    /// When the connection is closed unless its phase changes first.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        match *self.phase() {
            Phase::Idle(since) => Some(since + limits.idle_timeout),
            Phase::Header(since) => Some(since + limits.header_timeout),
            Phase::Busy(_) => None,
        }
    }

    /// Bytes came in: an idle connection starts reading a request head.
    fn bytes_read(&self) {
        let mut phase = self.phase();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Header(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A whole request head arrived: busy until the answer is written.
    fn begin_request(self: &Arc<Self>) -> Busy {
        {
            let mut phase = self.phase();
            *phase = match *phase {
                Phase::Busy(n) => Phase::Busy(n + 1),
                Phase::Idle(_) | Phase::Header(_) => Phase::Busy(1),
            };
        }
        self.changed.notify_one();
        Busy(self.clone())
    }
}

/// A request in progress; dropped once its answer is written (or abandoned).
struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        {
            let mut phase = self.0.phase();
            *phase = match *phase {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Idle(Instant::now()),
            };
        }
        self.0.changed.notify_one();
    }
}

/// An answer's body that keeps its connection busy until it is written to the end (an
/// SSE stream can take as long as its run).
struct Tracked {
    body: Body,
    /// Held for its `Drop`.
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, which tells the connection when bytes arrive.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.connection.bytes_read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The default of `--max-connections`: three quarters of the open-file limit (after
/// [`raise_fd_limit`]; `None`: unlimited), the rest kept for the store, agent files, tool
/// processes' pipes and outgoing provider connections; at least 16 and at most 10,000
/// (see [`MAX_CONNECTION_BUFFER`]).
pub(crate) fn default_max_connections(fd_limit: Option<u64>) -> usize {
    fd_limit
        .and_then(|limit| usize::try_from(limit / 4 * 3).ok())
        .unwrap_or(usize::MAX)
        .clamp(16, 10_000)
}

/// Raises the soft limit on open files to the hard limit (a server holds a descriptor
/// per connection; many systems start processes at 256 or 1,024 whatever the hard limit
/// allows). Returns the soft limit in force afterwards; `None` when it is unlimited or
/// cannot be read.
#[cfg(unix)]
pub(crate) fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::debug!(limit = ?limit.maximum, "open-file limit raised"),
            // macOS refuses an unlimited soft limit (OPEN_MAX); the old one stays.
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
    }
    getrlimit(Resource::Nofile).current
}

/// No open-file limit to raise off Unix.
#[cfg(not(unix))]
pub(crate) fn raise_fd_limit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_follows_the_fd_limit() {
        assert_eq!(default_max_connections(Some(256)), 192);
        assert_eq!(default_max_connections(Some(1 << 20)), 10_000);
        assert_eq!(default_max_connections(Some(8)), 16);
        assert_eq!(default_max_connections(None), 10_000);
    }

    #[tokio::test]
    async fn the_cap_closes_the_oldest_connection_that_is_not_busy() {
        let open = OpenConnections::default();
        let first = open.admit(2).unwrap();
        let _busy = first.begin_request();
        let second = open.admit(2).unwrap();
        let third = open.admit(2).unwrap();
        // The second (waiting for a head) made room; the first is busy and stays.
        assert!(
            tokio::time::timeout(Duration::from_secs(5), second.evicted.notified())
                .await
                .is_ok()
        );
        let _also_busy = third.begin_request();
        assert!(open.admit(2).is_none(), "every connection is busy");
    }
}
