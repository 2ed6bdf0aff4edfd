//! Real TCP for the namespace tests: an echo server and a client that connects from a
//! chosen source address with a deadline.

use std::{
    collections::HashMap,
    io::{self, Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// A server for the tests: listens on `[::]:port` (dual-stack) and runs `handler` on each
/// connection in its own thread. Before each accept it waits `accept_delay` once a
/// connection is pending, so every connection sits in the accept queue for at least that
/// long. Dropping it stops accepting and shuts down the connections still open, so no socket
/// keeps a test namespace alive; a handler that returns closes its connection.
pub struct TestServer {
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
    pub port: u16,
}

/// Echo everything until EOF.
pub fn echo(mut conn: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
}

/// Requests of one byte: `h` is held (read, and not answered) until `release` is set or the
/// client closes, any other byte is answered at once; each answer is 64 bytes (longer than
/// a request, as in any real protocol). Ground truth for work in service: the held requests.
pub fn hold_until(release: Arc<AtomicBool>) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        let mut b = [0u8; 1];
        loop {
            match conn.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if b[0] == b'h' && !held_until(&conn, &release) {
                        break;
                    }
                    if conn.write_all(&[b[0]; 64]).is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// Wait until `release` is set (true) or the client closes (false).
fn held_until(conn: &TcpStream, release: &AtomicBool) -> bool {
    let mut peek = [0u8; 1];
    while !release.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: conn.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 5) };
        if n > 0 && matches!(conn.peek(&mut peek), Ok(0) | Err(_)) {
            return false;
        }
    }
    true
}

/// Echo everything until EOF, except a request of the one byte `h`, which is held
/// unanswered until the client closes: a connection with work in service, as shedder
/// counts it (see [`TestServer::holding`]).
pub fn echo_or_hold(mut conn: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(1) if buf[0] == b'h' => {
                held_until(&conn, &AtomicBool::new(false));
                break;
            }
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
}

/// Answer each read with the same bytes after `service_time` (a request/response server
/// with a known service time), until EOF.
pub fn respond_after(service_time: Duration) -> impl Fn(TcpStream) + Send + Sync + Clone + 'static {
    move |mut conn: TcpStream| {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    thread::sleep(service_time);
                    if conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    }
}

impl TestServer {
    /// An echo server without accept delay. Call from a thread inside the server's namespace.
    pub fn echo(port: u16) -> Self {
        Self::start(port, Duration::ZERO, echo)
    }

    /// An echo server whose connections that begin with `h` hold that request until the
    /// client closes ([`echo_or_hold`]). Call from a thread inside the server's namespace.
    pub fn holding(port: u16) -> Self {
        Self::start(port, Duration::ZERO, echo_or_hold)
    }

    /// Call from a thread inside the server's namespace.
    pub fn start<F>(port: u16, accept_delay: Duration, handler: F) -> Self
    where
        F: Fn(TcpStream) + Send + Sync + Clone + 'static,
    {
        let listener =
            TcpListener::bind(("::", port)).unwrap_or_else(|e| panic!("bind [::]:{port}: {e}"));
        let port = listener.local_addr().expect("local addr").port();
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
        let accept = {
            let (stop, conns) = (stop.clone(), conns.clone());
            thread::spawn(move || {
                let mut next_id = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if !readable(&listener, Duration::from_millis(5)) {
                        continue;
                    }
                    thread::sleep(accept_delay);
                    let Ok((conn, _)) = listener.accept() else {
                        continue;
                    };
                    conn.set_nonblocking(false).expect("blocking connection");
                    let id = next_id;
                    next_id += 1;
                    if let Ok(clone) = conn.try_clone() {
                        conns.lock().expect("conns").insert(id, clone);
                    }
                    let (handler, conns) = (handler.clone(), conns.clone());
                    thread::spawn(move || {
                        handler(conn);
                        // The handler's copy is closed when it returns; drop ours too.
                        conns.lock().expect("conns").remove(&id);
                    });
                }
            })
        };
        Self {
            stop,
            conns,
            accept: Some(accept),
            port,
        }
    }
}

/// Wait up to `timeout` for `listener` to have a connection to accept.
fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (_, c) in self.conns.lock().expect("conns").drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// The outcome of a connection attempt and how long it took.
#[derive(Debug)]
pub struct Attempt {
    pub result: io::Result<TcpStream>,
    pub elapsed: Duration,
}

/// Connect from `source` (port chosen by the kernel) to `dest:port`, giving up after
/// `timeout`. Call from a thread inside the client's namespace.
pub fn connect_from(source: IpAddr, dest: IpAddr, port: u16, timeout: Duration) -> Attempt {
    let domain = if dest.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    socket
        .bind(&SockAddr::from(SocketAddr::new(source, 0)))
        .unwrap_or_else(|e| panic!("bind {source}: {e}"));
    let start = Instant::now();
    let result = socket
        .connect_timeout(&SockAddr::from(SocketAddr::new(dest, port)), timeout)
        .map(|()| TcpStream::from(socket));
    Attempt {
        result,
        elapsed: start.elapsed(),
    }
}

/// Send `payload` and read the same bytes back.
pub fn echo_roundtrip(stream: &mut TcpStream, payload: &[u8]) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(payload)?;
    let mut back = vec![0u8; payload.len()];
    stream.read_exact(&mut back)?;
    if back != payload {
        return Err(io::Error::other("echo returned different bytes"));
    }
    Ok(())
}
