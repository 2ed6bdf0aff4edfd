//! [`HttpBackend`]: an HTTP/1.1 keep-alive server of known capacity, for load that arrives
//! over persistent connections (a proxy's backend, `wrk`'s target). A thread per connection
//! reads its requests one after another; each request takes one of `workers` slots for the
//! service time, so the server answers at most `workers / service time` requests a second
//! however many connections it holds, and the rest wait for a slot.
//!
//! Every response carries back the request's `X-Sent` header, so a client that stamps its
//! requests can measure each one's latency from the response alone (see
//! [`crate::peers::Wrk`]).

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use super::protocol::RESPONSE;
use crate::netns::Netns;

/// How often a connection's thread wakes from a blocked read to see whether the server
/// stops.
const POLL: Duration = Duration::from_millis(200);
/// The longest request head read.
const MAX_HEAD: usize = 8192;

/// Worker slots: a counting semaphore.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn take(&self) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
    }

    fn give(&self) {
        *self.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.freed.notify_one();
    }
}

/// What the connections' threads share.
struct Shared {
    slots: Slots,
    workers: usize,
    service_time: Duration,
    served: AtomicU64,
    stop: AtomicBool,
}

/// The server; dropping it stops it (its connections close as their threads notice).
pub struct HttpBackend {
    shared: Arc<Shared>,
    accept: Option<thread::JoinHandle<()>>,
    port: u16,
}

impl HttpBackend {
    /// Listen on `[::]:port` (dual-stack) inside `ns` with `workers` slots of
    /// `service_time` each.
    pub fn start_in(ns: &Netns, port: u16, workers: usize, service_time: Duration) -> Self {
        let listener = ns.run(|| {
            let addr: SocketAddr = format!("[::]:{port}").parse().expect("address");
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding {addr}: {e}"))
        });
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().expect("local address").port();
        let shared = Arc::new(Shared {
            slots: Slots {
                free: Mutex::new(workers),
                freed: Condvar::new(),
            },
            workers,
            service_time,
            served: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let s = s.clone();
                        thread::spawn(move || serve(conn, &s));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            shared,
            accept: Some(accept),
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// Nominal capacity in requests per second.
    pub fn capacity(&self) -> f64 {
        self.shared.workers as f64 / self.shared.service_time.as_secs_f64()
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Serve one connection's requests until the client closes it, an error, or the stop.
fn serve(mut conn: TcpStream, s: &Shared) {
    let _ = conn.set_read_timeout(Some(POLL));
    let _ = conn.set_nodelay(true);
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let end = loop {
            if let Some(end) = head_end(&buf) {
                break end;
            }
            if buf.len() > MAX_HEAD || s.stop.load(Ordering::Relaxed) {
                return;
            }
            match conn.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let sent = header(&head, "x-sent");
        let close = header(&head, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        s.slots.take();
        thread::sleep(s.service_time);
        s.slots.give();
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n",
            RESPONSE.len()
        );
        if let Some(v) = sent {
            response.push_str(&format!("X-Sent: {v}\r\n"));
        }
        if close {
            response.push_str("Connection: close\r\n");
        }
        response.push_str("\r\n");
        let mut out = response.into_bytes();
        out.extend_from_slice(RESPONSE);
        if conn.write_all(&out).is_err() {
            return;
        }
        s.served.fetch_add(1, Ordering::Relaxed);
        if close {
            return;
        }
    }
}

/// Where the first request head in `buf` ends (after its blank line).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The value of header `name` (lower case) in a request head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_split_and_read() {
        let buf = b"GET / HTTP/1.1\r\nHost: a\r\nX-Sent: 12.5\r\n\r\nGET /";
        let end = head_end(buf).unwrap();
        assert_eq!(&buf[end..], b"GET /");
        let head = std::str::from_utf8(&buf[..end]).unwrap();
        assert_eq!(header(head, "x-sent"), Some("12.5"));
        assert_eq!(header(head, "connection"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
