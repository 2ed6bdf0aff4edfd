//! The client side: a namespace made fit for many short connections, and one request with
//! its deadline and retries, ending in an [`Outcome`].

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpSocket,
    time::Instant,
};

use super::{
    https::{Https, Reply, http_exchange},
    protocol::{BUSY, REQUEST, RESPONSE},
};
use crate::netns::Netns;

/// Make a client namespace fit for thousands of short connections per second: the whole
/// ephemeral port range (`net.ipv4.ip_local_port_range = 1024 65535`) and reuse of
/// TIME_WAIT ports for new outgoing connections (`net.ipv4.tcp_tw_reuse = 1`). Both are
/// per network namespace. Panics if they cannot be set.
pub fn prepare_client_namespace(ns: &Netns) {
    ns.sysctl("ipv4/ip_local_port_range", "1024 65535");
    ns.sysctl("ipv4/tcp_tw_reuse", "1");
}

/// Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// What a client speaks over its connection.
#[derive(Clone, Debug, Default)]
pub enum Protocol {
    /// The 16-byte request and 64-byte response of the [module documentation](super).
    #[default]
    Line,
    /// One full TLS handshake and one HTTP `GET` (see [`Https`]).
    Https(Https),
    /// One plain HTTP/1.1 `GET /` with `Connection: close`, as a new client of an HTTP
    /// proxy sends; a 200 with the lab's response body is served, a 503 busy.
    Http,
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The response arrived within the deadline.
    Ok,
    /// The connection was refused: RST in answer to the SYN (ECONNREFUSED), or reset while
    /// connecting.
    Refused,
    /// The connection was reset or closed by the server after it was established, before
    /// the response (ECONNRESET, EPIPE, or EOF).
    Reset,
    /// The server accepted the connection and answered [`BUSY`]: an explicit 503-style shed
    /// after accept.
    Busy,
    /// The deadline passed with the connect or the response still pending; the request was
    /// abandoned then (there is no "late" outcome: nothing is waited for past the deadline).
    Timeout,
    /// Anything else (e.g. EADDRNOTAVAIL when ephemeral ports run out, EMFILE, a wrong
    /// response); the messages are counted in
    /// [`LoadReport::errors`](super::LoadReport::errors).
    Error,
    /// Never started: the generator already had its maximum of outstanding requests.
    GeneratorDropped,
}

impl Outcome {
    /// Worth retrying immediately (when retries are enabled and the deadline allows).
    fn retryable(self) -> bool {
        matches!(self, Self::Refused | Self::Reset | Self::Busy)
    }
}

/// Set IP_BIND_ADDRESS_NO_PORT: bind() then fixes only the address and connect() picks the
/// port by the full 4-tuple, so ports are shared across destinations and TIME_WAIT ports
/// are reused (with `tcp_tw_reuse`). Without it, bind-before-connect takes a port per socket
/// exclusively and a few thousand connections per second exhaust the range.
fn bind_address_no_port(fd: &impl AsRawFd) {
    let one: libc::c_int = 1;
    // SAFETY: valid fd and option value of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// One attempt: connect from `source` (any port), send the request, read the response.
async fn attempt(
    target: SocketAddr,
    source: IpAddr,
    protocol: &Protocol,
) -> Result<(), (Outcome, io::Error)> {
    let error = |e: io::Error| (Outcome::Error, e);
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(error)?;
    if !source.is_unspecified() {
        bind_address_no_port(&socket);
        socket.bind(SocketAddr::new(source, 0)).map_err(error)?;
    }
    let mut stream = socket.connect(target).await.map_err(|e| {
        let outcome = match e.raw_os_error() {
            Some(libc::ECONNREFUSED) | Some(libc::ECONNRESET) => Outcome::Refused,
            Some(libc::ETIMEDOUT) => Outcome::Timeout,
            _ => Outcome::Error,
        };
        (outcome, e)
    })?;
    let after = |e: io::Error| {
        let outcome = match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof => Outcome::Reset,
            io::ErrorKind::TimedOut => Outcome::Timeout,
            _ => Outcome::Error,
        };
        (outcome, e)
    };
    match protocol {
        Protocol::Line => {
            stream.write_all(REQUEST).await.map_err(after)?;
            let mut buf = [0u8; RESPONSE.len()];
            stream.read_exact(&mut buf).await.map_err(after)?;
            if &buf == BUSY {
                return Err((Outcome::Busy, io::Error::other("the server is busy")));
            }
            if &buf != RESPONSE {
                return Err((
                    Outcome::Error,
                    io::Error::other("unexpected response bytes"),
                ));
            }
            Ok(())
        }
        Protocol::Https(https) => reply(https.exchange(stream).await.map_err(after)?),
        Protocol::Http => reply(http_exchange(stream).await.map_err(after)?),
    }
}

fn reply(r: Reply) -> Result<(), (Outcome, io::Error)> {
    match r {
        Reply::Served => Ok(()),
        Reply::Busy => Err((Outcome::Busy, io::Error::other("HTTP 503"))),
    }
}

/// One request with its deadline and retries: (outcome, attempts, error message).
pub(super) async fn request(
    target: SocketAddr,
    source: IpAddr,
    protocol: &Protocol,
    deadline: Instant,
    retries: u32,
) -> (Outcome, u32, Option<String>) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match tokio::time::timeout_at(deadline, attempt(target, source, protocol)).await {
            Err(_) => return (Outcome::Timeout, attempts, None),
            Ok(Ok(())) => return (Outcome::Ok, attempts, None),
            Ok(Err((outcome, e))) => {
                if outcome.retryable() && attempts <= retries && Instant::now() < deadline {
                    continue;
                }
                let msg = (outcome == Outcome::Error).then(|| e.to_string());
                return (outcome, attempts, msg);
            }
        }
    }
}
