//! HTTP/1.1 (hyper) for the control socket and the metrics endpoint, served on the side-I/O
//! runtime ([`crate::runtime`]). These never wait on the tick loop except through the
//! control API's request channel.
//!
//! Every connection is a task of its own, so a client that sends half a request holds one
//! task, not the endpoint: its head must arrive within [`HEAD_TIMEOUT`], its body within
//! [`BODY_TIMEOUT`], and the whole exchange ends within [`CONNECTION_TIMEOUT`]. Bodies are
//! bounded, and chunked bodies are read as such. Each endpoint serves a bounded number of
//! connections at once and pauses after failed accepts ([`crate::api::accept`]).

use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::Semaphore,
};

use crate::api::accept::{Backoff, Held};

/// The request head (line and headers) must arrive within this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The body must arrive within this once the head has.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection ends after this whatever it is doing (an answer is written well within it).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

pub type Answer = Response<Full<Bytes>>;

/// An answer with a body, `Content-Type` and `Connection: close` (one request per
/// connection, as the clients send).
pub fn answer(status: u16, content_type: &str, body: impl Into<Bytes>) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("connection", "close")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// A listening socket the runtime accepts connections on.
pub trait Listener: Send + 'static {
    type Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Conn> {
        tokio::net::TcpListener::accept(self).await.map(|(c, _)| c)
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Conn> {
        tokio::net::UnixListener::accept(self).await.map(|(c, _)| c)
    }
}

/// Accept connections on the runtime until the process exits, at most `cap` served at
/// once (see [`crate::api::accept`]), handing each to `each` (which serves it, usually
/// with [`serve_connection`]; the connection frees its place when dropped). `make` turns
/// the bound socket into the runtime's listener; if it cannot, `what` is logged as not
/// served.
pub fn accept_loop<L: Listener>(
    what: &'static str,
    cap: usize,
    make: impl FnOnce() -> std::io::Result<L> + Send + 'static,
    each: impl Fn(Held<L::Conn>) + Send + 'static,
) {
    crate::runtime::handle().spawn(async move {
        let listener = match make() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "{what} cannot be served");
                return;
            }
        };
        let places = Arc::new(Semaphore::new(cap));
        let mut backoff = Backoff::default();
        loop {
            // Taken before accepting, so that past the cap clients wait in the backlog.
            let Ok(place) = places.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok(conn) => {
                    backoff.succeeded();
                    each(Held::new(conn, place));
                }
                Err(e) => {
                    let failed = backoff.failed(e.raw_os_error(), std::time::Instant::now());
                    if let Some(unsaid) = failed.say {
                        tracing::warn!(
                            error = %e,
                            pause_ms = failed.pause.as_millis() as u64,
                            failures_unsaid = unsaid,
                            "{what}: accepting a connection failed"
                        );
                    }
                    drop(place);
                    tokio::time::sleep(failed.pause).await;
                }
            }
        }
    });
}

/// Serve one connection on the runtime: one request, within the timeouts above.
pub fn serve_connection<S, F, Fut>(io: S, handler: F)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    crate::runtime::handle().spawn(async move {
        let service = service_fn(move |req| {
            let f = handler(req);
            async move { Ok::<_, Infallible>(f.await) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .keep_alive(false)
            .serve_connection(TokioIo::new(io), service);
        let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
    });
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("body over {0} bytes")]
    TooLarge(usize),
    #[error("the body did not arrive within {} s", BODY_TIMEOUT.as_secs())]
    Timeout,
    #[error("reading the body: {0}")]
    Read(String),
}

/// The whole body of `req`, at most `max` bytes (with Content-Length or chunked).
pub async fn body(req: Request<Incoming>, max: usize) -> Result<Bytes, BodyError> {
    let collect = Limited::new(req.into_body(), max).collect();
    match tokio::time::timeout(BODY_TIMEOUT, collect).await {
        Err(_) => Err(BodyError::Timeout),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(max)),
        Ok(Err(e)) => Err(BodyError::Read(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{ErrorKind, Read as _, Write as _},
        net::{TcpListener, TcpStream},
    };

    use super::*;

    /// Past the cap a client waits in the backlog, is not refused, and is answered as soon
    /// as a connection before it ends; the idle ones do not starve it for longer.
    #[test]
    fn connections_past_the_cap_wait_and_are_served_when_a_place_frees() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let make = move || {
            listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(listener)
        };
        accept_loop("a test endpoint", 2, make, |conn| {
            serve_connection(conn, |_req| async { answer(200, "text/plain", "ok\n") });
        });
        let idle: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let mut third = TcpStream::connect(addr).expect("the third connects (backlog)");
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .expect("request");
        third
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        let mut buf = [0u8; 256];
        let waiting = third.read(&mut buf);
        assert!(
            matches!(&waiting, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
            "the third was served past the cap of 2: {waiting:?}"
        );
        drop(idle);
        third
            .set_read_timeout(Some(Duration::from_secs(4)))
            .expect("timeout");
        let mut answer = String::new();
        third.read_to_string(&mut answer).expect("answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
