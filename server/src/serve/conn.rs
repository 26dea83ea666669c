//! Serving connections: the accept loop used instead of `axum::serve`, so that every connection gets the HTTP front's
//! limits (`ConnLimits`). `axum::serve` sets no timer on hyper, so hyper's header read timeout never ran: a client
//! that sent its headers a byte a second held its connection (and a file descriptor) for as long as it liked. Here:
//! - hyper's header read timeout, with tokio's timer: the headers of each request must be in within
//!   `header_timeout` of the connection opening or of the previous response ending (which also closes idle keep-alive
//!   connections);
//! - the size of a request head (`--h11-max-header-count`, `--h11-max-incomplete-event-size`: 431 beyond them);
//! - the body deadline, handed to `ApiJson` as a request extension (`BodyTimeout`);
//! - the connection limit: one connection more is answered 503 with `Retry-After` and closed (at most as many such
//!   answers at a time as the limit; beyond that a connection is closed unanswered, so a flood never holds more than
//!   twice the limit in sockets).
//!
//! Graceful shutdown is `axum::serve`'s: stop accepting, let each connection finish the request it serves (idle ones
//! close at once), and return when all have.

use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use crate::app::Peer;
use crate::cli::limits::ConnLimits;
use crate::error::ApiError;
use crate::json::BodyTimeout;

/// hyper's default read buffer limit (8 kB + 100 x 4 kB).
const DEFAULT_MAX_BUF: usize = 8192 + 4096 * 100;

/// Serves `router` on the connections `listener` accepts, with `limits`, until `shutdown` resolves; then finishes
/// the open connections' requests and returns.
pub async fn serve<L>(mut listener: L, router: Router, limits: ConnLimits, shutdown: impl Future<Output = ()>)
where
    L: Listener<Addr = SocketAddr>,
{
    let slots = limits.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    let refusals = limits.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    // Each connection's task holds a receiver: `closed()` on the sender resolves once every one has ended.
    let (stop_tx, stop_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut shutdown => break,
        };
        let slot = match &slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    refuse(io, peer, &limits, refusals.as_ref(), stop_rx.clone());
                    continue;
                }
            },
        };
        let body_timeout = BodyTimeout(limits.body_timeout);
        let service = router.clone().map_request(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(Peer(peer)));
            req.extensions_mut().insert(body_timeout);
            req.map(Body::new)
        });
        spawn(io, TowerToHyperService::new(service), &limits, stop_rx.clone(), slot);
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(());
    stop_tx.closed().await;
}

/// Answers a connection over `--max-connections` with 503 (after reading its request, so that the client reads the
/// answer instead of a reset), or closes it at once when as many answers are already under way.
fn refuse<Io>(
    io: Io,
    peer: SocketAddr,
    limits: &ConnLimits,
    refusals: Option<&Arc<Semaphore>>,
    stop: watch::Receiver<()>,
) where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let limit = limits.max_connections.unwrap_or_default();
    tracing::warn!("refusing a connection from {peer}: {limit} connections are open (--max-connections)");
    let Some(permit) = refusals.and_then(|r| r.clone().try_acquire_owned().ok()) else { return };
    let service = hyper::service::service_fn(move |_req: hyper::Request<Incoming>| async move {
        let mut response = ApiError::TooManyConnections { limit }.into_response();
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        Ok::<Response, std::convert::Infallible>(response)
    });
    spawn(io, service, limits, stop, Some(permit));
}

/// Serves one connection in its own task: HTTP/1.1 with the header read timeout and head limits, shut down gracefully
/// when `stop` changes or closes; `slot` (its place under the connection limit) is released when it ends.
fn spawn<Io, S, B>(
    io: Io,
    service: S,
    limits: &ConnLimits,
    mut stop: watch::Receiver<()>,
    slot: Option<OwnedSemaphorePermit>,
) where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<hyper::Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_headers(limits.max_header_count)
        .max_header_size(limits.max_head_bytes)
        // The read buffer must hold the largest head allowed (hyper's default holds about 400 kB).
        .max_buf_size(limits.max_head_bytes.max(DEFAULT_MAX_BUF));
    tokio::spawn(async move {
        let _slot = slot;
        let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = stop.changed() => {}
        }
        conn.as_mut().graceful_shutdown();
        if let Err(e) = conn.await {
            tracing::debug!("connection ended: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    /// Serves a router answering "ok" with these limits; returns its address and the shutdown trigger.
    async fn start(limits: ConnLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(listener, router, limits, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    fn limits(header_ms: u64, max_connections: Option<usize>) -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_millis(header_ms),
            body_timeout: Duration::from_secs(5),
            max_connections,
            max_header_count: 256,
            max_head_bytes: 1 << 20,
        }
    }

    /// Everything the server sends until it closes the connection.
    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.expect("closed in time");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_slow_head_is_cut_off_at_the_header_timeout_while_others_are_served() {
        let (addr, _stop) = start(limits(300, None)).await;
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET / HT").await.expect("write");
        let t0 = Instant::now();
        let mut fast = TcpStream::connect(addr).await.expect("connect");
        fast.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        assert!(read_to_close(&mut fast).await.starts_with("HTTP/1.1 200"));
        assert_eq!(read_to_close(&mut slow).await, "", "closed without an answer");
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(3), "{waited:?}");
    }

    #[tokio::test]
    async fn one_connection_over_the_limit_gets_503_until_a_slot_frees() {
        let (addr, _stop) = start(limits(5_000, Some(1))).await;
        let held = TcpStream::connect(addr).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut over = TcpStream::connect(addr).await.expect("connect");
        over.write_all(GET).await.expect("write");
        let answer = read_to_close(&mut over).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("retry-after: 1"), "{answer}");
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut next = TcpStream::connect(addr).await.expect("connect");
        next.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        assert!(read_to_close(&mut next).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_returns_once_connections_end() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = Router::new().route("/", get(|| async { "ok" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, limits(5_000, None), async move {
            let _ = rx.await;
        }));
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 256];
        assert!(idle.read(&mut buf).await.expect("answer") > 0);
        let _ = tx.send(());
        // The idle keep-alive connection is closed, and the server returns.
        tokio::time::timeout(Duration::from_secs(5), server).await.expect("returns").expect("no panic");
        assert!(TcpStream::connect(addr).await.is_err(), "no longer accepting");
    }
}
