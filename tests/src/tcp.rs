//! Real TCP for the namespace tests: an echo server and a client that connects from a
//! chosen source address with a deadline.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// An echo server on `[::]:port` (dual-stack). Every connection is echoed until EOF on its
/// own thread. Dropping it stops the accept loop and shuts every connection down, so no
/// socket keeps a test namespace alive.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Call from a thread inside the server's namespace.
    pub fn start(port: u16) -> Self {
        let listener =
            TcpListener::bind(("::", port)).unwrap_or_else(|e| panic!("bind [::]:{port}: {e}"));
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (stop, conns) = (stop.clone(), conns.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            conn.set_nonblocking(false).expect("blocking connection");
                            if let Ok(clone) = conn.try_clone() {
                                conns.lock().expect("conns").push(clone);
                            }
                            thread::spawn(move || echo(conn));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => break,
                    }
                }
            })
        };
        Self {
            stop,
            conns,
            accept: Some(accept),
        }
    }
}

fn echo(mut conn: TcpStream) {
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

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().expect("conns").drain(..) {
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
