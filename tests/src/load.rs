//! Traffic for shedder's closed-loop tests, the demo and the overload benchmark: a
//! [`Backend`] of known capacity and an open-loop [`LoadGen`] whose requests carry a
//! deadline, reporting goodput, latency and outcomes per class per second.
//!
//! # Protocol
//!
//! One connection carries one request. The client connects, sends the 16-byte [`REQUEST`]
//! and waits for the 16-byte [`RESPONSE`]; a backend worker accepts the connection, reads the
//! request, holds it for the current service time, answers and closes. A backend with `w`
//! workers and service time `s` therefore serves at most `w / s` requests per second, and
//! connections beyond the workers wait in the kernel's accept queue — the queue shedder
//! measures and protects.
//!
//! With [`BackendConfig::in_app`] the backend sheds by itself instead, as an application
//! would without shedder: one thread accepts every connection and reads its request, then
//! either queues it for the workers or answers [`BUSY`] at once, under an AIMD limit on the
//! requests in flight (see [`InAppAimd`]).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use shedder_tests::{load::*, netns::Pair};
//!
//! let pair = Pair::new("ex");
//! prepare_client_namespace(&pair.client);
//! let backend = Backend::start_in(
//!     &pair.server,
//!     BackendConfig::new(8080, 4, Duration::from_millis(20)),
//! );
//! let report = LoadGen::new("198.18.0.2:8080".parse().unwrap())
//!     .phase(Duration::from_secs(5), 100.0)
//!     .class("critical", "198.18.10.1".parse().unwrap(), 0.2)
//!     .class("sheddable", "198.18.99.1".parse().unwrap(), 0.8)
//!     .run_in(&pair.client, |second| eprintln!("{second}"));
//! eprintln!("goodput {:.0}/s", report.total().goodput());
//! drop(backend);
//! ```

use std::{
    collections::BTreeMap,
    fmt,
    io::{self, Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    ops::Range,
    os::fd::AsRawFd,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::Duration,
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpSocket,
    time::Instant,
};

use crate::netns::Netns;

/// What a client sends: exactly these 16 bytes.
pub const REQUEST: &[u8; 16] = b"shedder request\n";
/// What a backend answers: exactly these 16 bytes.
pub const RESPONSE: &[u8; 16] = b"shedder respond\n";
/// What a backend shedding in the application ([`BackendConfig::in_app`]) answers instead
/// of [`RESPONSE`] to a request it will not serve, like an HTTP 503: exactly these 16 bytes.
pub const BUSY: &[u8; 16] = b"shedder busy 503";

/// How long a worker waits for the request bytes of a connection it accepted before it
/// gives up on it.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// Backend
// ---------------------------------------------------------------------------------------

/// How to run a [`Backend`].
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// Port to listen on, `[::]:port` dual-stack; 0 lets the kernel choose
    /// (see [`Backend::port`]).
    pub port: u16,
    /// Worker threads, each serving one request at a time.
    pub workers: usize,
    /// How long each request is held before the response (changeable while running with
    /// [`Backend::set_service_time`]).
    pub service_time: Duration,
    /// `listen(2)` backlog: the accept queue's capacity (capped by the namespace's
    /// `net.core.somaxconn`, 4096 by default).
    pub backlog: i32,
    /// Shed in the application under an AIMD limit (None: every accepted request is
    /// served, as by a plain server).
    pub in_app: Option<InAppAimd>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            port: 0,
            workers: 4,
            service_time: Duration::from_millis(20),
            backlog: 1024,
            in_app: None,
        }
    }
}

impl BackendConfig {
    /// `workers` workers holding each request for `service_time`, backlog 1024.
    pub fn new(port: u16, workers: usize, service_time: Duration) -> Self {
        Self {
            port,
            workers,
            service_time,
            ..Self::default()
        }
    }

    /// Set the listen backlog.
    pub fn backlog(mut self, backlog: i32) -> Self {
        self.backlog = backlog;
        self
    }

    /// Shed in the application under `aimd`.
    pub fn in_app(mut self, aimd: InAppAimd) -> Self {
        self.in_app = Some(aimd);
        self
    }

    /// Nominal capacity in requests per second: workers / service time.
    pub fn capacity(&self) -> f64 {
        nominal_capacity(self.workers, self.service_time)
    }
}

fn nominal_capacity(workers: usize, service_time: Duration) -> f64 {
    workers as f64 / service_time.as_secs_f64().max(1e-9)
}

/// Shedding inside the application, as its developer would add it: a limit on the requests
/// in flight (admitted and queued for a worker or being served), adjusted by AIMD from the
/// latencies the application measures itself.
///
/// One acceptor thread accepts each connection and reads its request. If fewer requests
/// than the limit are in flight, the connection is queued for the workers; otherwise it is
/// answered [`BUSY`] and closed. Each `window` the worst latency (accept to response
/// written) among the requests completed in it decides: above `target_latency` the limit
/// becomes `max(min_limit, ⌊limit × 0.9⌋)`; otherwise, if the limit was binding (a request
/// was shed or the in-flight count reached the limit), it becomes `min(max_limit, limit + 1)`.
/// The worst latency rather than a percentile, as Netflix concurrency-limits' `AIMDLimit`
/// backs off on any request slower than its timeout. A window closes at the first
/// completion after it has lasted `window`; without completions the limit stays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InAppAimd {
    /// Latency the limit is steered to stay under (default 50 ms).
    pub target_latency: Duration,
    /// Limit at start (default 10).
    pub initial_limit: u32,
    /// Floor of the limit (default 1).
    pub min_limit: u32,
    /// Ceiling of the limit (default 1000); also the capacity of the workers' queue.
    pub max_limit: u32,
    /// Length of an adjustment window (default 100 ms).
    pub window: Duration,
}

impl Default for InAppAimd {
    fn default() -> Self {
        Self {
            target_latency: Duration::from_millis(50),
            initial_limit: 10,
            min_limit: 1,
            max_limit: 1000,
            window: Duration::from_millis(100),
        }
    }
}

/// The limit after a window whose worst completed latency was `window_worst_latency` (None:
/// nothing completed) and in which the limit was `binding` or not.
fn aimd_next(
    limit: u32,
    window_worst_latency: Option<Duration>,
    binding: bool,
    cfg: &InAppAimd,
) -> u32 {
    match window_worst_latency {
        Some(worst) if worst > cfg.target_latency => {
            ((u64::from(limit) * 9 / 10) as u32).max(cfg.min_limit)
        }
        Some(_) if binding => limit.saturating_add(1).min(cfg.max_limit),
        _ => limit,
    }
}

/// Counters of a [`Backend`] since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Connections taken from the accept queue.
    pub accepted: u64,
    /// Requests answered (the response was written).
    pub served: u64,
    /// Accepted connections that got no response and were not shed: the client closed or
    /// reset it, sent a wrong request, never sent one, or the backend was stopping.
    pub failed: u64,
    /// Workers holding a connection right now.
    pub busy: usize,
    /// Requests shed in the application: answered [`BUSY`] (or the write of it failed).
    pub rejected: u64,
    /// CPU time the acceptor thread spent on the shed requests (`CLOCK_THREAD_CPUTIME_ID`,
    /// from before `accept()` to after the close: accept, read, write [`BUSY`], close). The
    /// kernel's work for them in softirq context (handshake, ACKs, FIN) is not included.
    pub reject_cpu: Duration,
    /// The in-application limit now; None without [`BackendConfig::in_app`].
    pub limit: Option<u32>,
}

/// A TCP request/response server of known capacity: `workers` threads, each accepting one
/// connection at a time from a shared listener, holding its request for the service time,
/// answering and closing. With [`BackendConfig::in_app`], one acceptor thread accepts and
/// sheds or queues for the workers instead (see [`InAppAimd`]). Dropping it stops it within
/// milliseconds and closes every socket (connections still in the accept queue are reset,
/// queued ones closed), so nothing keeps a namespace alive.
pub struct Backend {
    port: u16,
    shared: Arc<BackendShared>,
    listener: Arc<TcpListener>,
    threads: Vec<thread::JoinHandle<()>>,
}

struct BackendShared {
    workers: usize,
    service_us: AtomicU64,
    stopping: AtomicBool,
    stop_lock: Mutex<bool>,
    stop_cv: Condvar,
    accepted: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
    busy: AtomicUsize,
    rejected: AtomicU64,
    reject_cpu_ns: AtomicU64,
    aimd: Option<Aimd>,
}

/// The state of in-application shedding.
struct Aimd {
    cfg: InAppAimd,
    limit: AtomicU32,
    /// Admitted requests queued for a worker or being served.
    in_flight: AtomicU32,
    /// The limit was binding in the current window.
    binding: AtomicBool,
    window: Mutex<AimdWindow>,
}

struct AimdWindow {
    start: std::time::Instant,
    worst: Option<Duration>,
}

impl Aimd {
    fn new(cfg: InAppAimd) -> Self {
        assert!(
            1 <= cfg.min_limit && cfg.min_limit <= cfg.initial_limit,
            "in-app limits: need 1 <= min_limit <= initial_limit: {cfg:?}"
        );
        assert!(
            cfg.initial_limit <= cfg.max_limit,
            "in-app limits: need initial_limit <= max_limit: {cfg:?}"
        );
        assert!(!cfg.window.is_zero(), "in-app window is zero");
        Self {
            cfg,
            limit: AtomicU32::new(cfg.initial_limit),
            in_flight: AtomicU32::new(0),
            binding: AtomicBool::new(false),
            window: Mutex::new(AimdWindow {
                start: std::time::Instant::now(),
                worst: None,
            }),
        }
    }

    /// Admit a request if fewer than the limit are in flight. Only the acceptor admits, so
    /// the count cannot pass the limit between the check and the increment.
    fn try_admit(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        if in_flight + 1 >= limit {
            self.binding.store(true, Ordering::Relaxed);
        }
        if in_flight >= limit {
            return false;
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A request admitted `latency` ago was answered; closes the window if it has lasted
    /// long enough.
    fn completed(&self, latency: Duration) {
        let mut w = self.window.lock().expect("aimd window");
        w.worst = Some(w.worst.map_or(latency, |worst| worst.max(latency)));
        let now = std::time::Instant::now();
        if now.duration_since(w.start) >= self.cfg.window {
            let binding = self.binding.swap(false, Ordering::Relaxed);
            let limit = self.limit.load(Ordering::Relaxed);
            let next = aimd_next(limit, w.worst.take(), binding, &self.cfg);
            self.limit.store(next, Ordering::Relaxed);
            w.start = now;
        }
    }
}

/// A request admitted by the acceptor, waiting for a worker.
struct Admitted {
    conn: TcpStream,
    accepted_at: std::time::Instant,
}

impl BackendShared {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        *self.stop_lock.lock().expect("stop lock") = true;
        self.stop_cv.notify_all();
    }

    /// Sleep for `d` unless stopped first; true when the whole time passed.
    fn sleep(&self, d: Duration) -> bool {
        let guard = self.stop_lock.lock().expect("stop lock");
        let (guard, _) = self
            .stop_cv
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .expect("stop lock");
        !*guard
    }
}

impl Backend {
    /// Start listening and serving. The listener belongs to the network namespace of the
    /// calling thread: call it inside the server's namespace, or use [`Backend::start_in`].
    pub fn start(config: BackendConfig) -> Self {
        assert!(config.workers > 0, "a backend needs at least one worker");
        let socket =
            Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)).expect("socket(AF_INET6)");
        socket.set_only_v6(false).expect("IPV6_V6ONLY off");
        socket.set_reuse_address(true).expect("SO_REUSEADDR");
        let addr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, config.port));
        socket
            .bind(&SockAddr::from(addr))
            .unwrap_or_else(|e| panic!("bind [::]:{}: {e}", config.port));
        socket
            .listen(config.backlog)
            .unwrap_or_else(|e| panic!("listen({}): {e}", config.backlog));
        let listener: TcpListener = socket.into();
        let port = listener.local_addr().expect("local addr").port();
        let listener = Arc::new(listener);
        let shared = Arc::new(BackendShared {
            workers: config.workers,
            service_us: AtomicU64::new(config.service_time.as_micros() as u64),
            stopping: AtomicBool::new(false),
            stop_lock: Mutex::new(false),
            stop_cv: Condvar::new(),
            accepted: AtomicU64::new(0),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            rejected: AtomicU64::new(0),
            reject_cpu_ns: AtomicU64::new(0),
            aimd: config.in_app.map(Aimd::new),
        });
        fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
            thread::Builder::new()
                .name(name)
                .spawn(f)
                .expect("spawning a backend thread")
        }
        let mut threads = Vec::with_capacity(config.workers + 1);
        match &config.in_app {
            None => {
                for i in 0..config.workers {
                    let (listener, shared) = (listener.clone(), shared.clone());
                    threads.push(spawn(format!("backend-{port}-{i}"), move || {
                        worker(&listener, &shared)
                    }));
                }
            }
            Some(aimd) => {
                // In flight never exceeds the limit, so the queue never fills.
                let (tx, rx) = mpsc::sync_channel(aimd.max_limit as usize);
                let rx = Arc::new(Mutex::new(rx));
                for i in 0..config.workers {
                    let (rx, shared) = (rx.clone(), shared.clone());
                    threads.push(spawn(format!("backend-{port}-{i}"), move || {
                        pool_worker(&rx, &shared)
                    }));
                }
                let (listener, shared) = (listener.clone(), shared.clone());
                threads.push(spawn(format!("backend-{port}-a"), move || {
                    acceptor(&listener, &shared, tx)
                }));
            }
        }
        Self {
            port,
            shared,
            listener,
            threads,
        }
    }

    /// [`Backend::start`] with the listener created inside `ns`.
    pub fn start_in(ns: &Netns, config: BackendConfig) -> Self {
        ns.run(|| Self::start(config))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The current service time.
    pub fn service_time(&self) -> Duration {
        Duration::from_micros(self.shared.service_us.load(Ordering::Relaxed))
    }

    /// Change the service time; requests whose service has already started keep theirs.
    pub fn set_service_time(&self, service_time: Duration) {
        self.shared
            .service_us
            .store(service_time.as_micros() as u64, Ordering::Relaxed);
    }

    /// Nominal capacity now, in requests per second: workers / service time.
    pub fn capacity(&self) -> f64 {
        nominal_capacity(self.shared.workers, self.service_time())
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// All counters.
    pub fn stats(&self) -> BackendStats {
        BackendStats {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            served: self.shared.served.load(Ordering::Relaxed),
            failed: self.shared.failed.load(Ordering::Relaxed),
            busy: self.shared.busy.load(Ordering::Relaxed),
            rejected: self.shared.rejected.load(Ordering::Relaxed),
            reject_cpu: Duration::from_nanos(self.shared.reject_cpu_ns.load(Ordering::Relaxed)),
            limit: self.in_app_limit(),
        }
    }

    /// The in-application limit now; None without [`BackendConfig::in_app`].
    pub fn in_app_limit(&self) -> Option<u32> {
        let aimd = self.shared.aimd.as_ref()?;
        Some(aimd.limit.load(Ordering::Relaxed))
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shared.stop();
        // shutdown(2) on a listening socket moves it to CLOSE (resetting what waits in its
        // accept queue) and wakes every accept(); they fail with EINVAL. The acceptor of the
        // in-app mode then ends, which disconnects the workers' queue once they have taken
        // (and, stopping, closed) what it held.
        // SAFETY: the listener's fd is open until `self.listener` is dropped.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The next connection from the accept queue; None once stopping.
fn accept_next(listener: &TcpListener, shared: &BackendShared) -> Option<TcpStream> {
    while !shared.stopping() {
        match listener.accept() {
            Ok((conn, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                return Some(conn);
            }
            Err(_) if shared.stopping() => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
            Err(_) => {
                // EMFILE and the like: back off a little instead of spinning.
                shared.sleep(Duration::from_millis(10));
            }
        }
    }
    None
}

fn worker(listener: &TcpListener, shared: &BackendShared) {
    while let Some(conn) = accept_next(listener, shared) {
        shared.busy.fetch_add(1, Ordering::Relaxed);
        let answered = serve(conn, shared);
        shared.busy.fetch_sub(1, Ordering::Relaxed);
        if answered {
            shared.served.fetch_add(1, Ordering::Relaxed);
        } else {
            shared.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// This thread's CPU time so far.
fn thread_cpu_time() -> Duration {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

/// The time on a clock (`clock_gettime(2)`), e.g. a CPU-time clock.
pub fn read_clock(clock: libc::clockid_t) -> io::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; an invalid clock id is an error, not undefined.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The in-app mode's only accepting thread: reads each request, then queues it for the
/// workers or sheds it with [`BUSY`]. Ends when stopping, dropping `queue`.
fn acceptor(listener: &TcpListener, shared: &BackendShared, queue: mpsc::SyncSender<Admitted>) {
    let aimd = shared.aimd.as_ref().expect("in-app mode");
    loop {
        let cpu_before = thread_cpu_time();
        let Some(mut conn) = accept_next(listener, shared) else {
            break;
        };
        let accepted_at = std::time::Instant::now();
        if !read_request(&mut conn, shared) {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if aimd.try_admit() {
            if queue.send(Admitted { conn, accepted_at }).is_err() {
                // Every worker has ended (panicked): nobody will serve it.
                aimd.in_flight.fetch_sub(1, Ordering::Relaxed);
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let _ = conn.write_all(BUSY);
        drop(conn);
        let cpu = thread_cpu_time().saturating_sub(cpu_before);
        shared.rejected.fetch_add(1, Ordering::Relaxed);
        shared
            .reject_cpu_ns
            .fetch_add(cpu.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A worker of the in-app mode: serves what the acceptor queued until the queue is
/// disconnected; once stopping, closes what it takes unanswered.
fn pool_worker(queue: &Mutex<mpsc::Receiver<Admitted>>, shared: &BackendShared) {
    let aimd = shared.aimd.as_ref().expect("in-app mode");
    loop {
        let next = queue.lock().expect("backend queue").recv();
        let Ok(Admitted {
            mut conn,
            accepted_at,
        }) = next
        else {
            break;
        };
        shared.busy.fetch_add(1, Ordering::Relaxed);
        let answered = respond(&mut conn, shared);
        let latency = accepted_at.elapsed();
        drop(conn);
        shared.busy.fetch_sub(1, Ordering::Relaxed);
        aimd.in_flight.fetch_sub(1, Ordering::Relaxed);
        if answered {
            shared.served.fetch_add(1, Ordering::Relaxed);
            aimd.completed(latency);
        } else {
            shared.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Serve one connection; true when the response was written. Closes it on return.
fn serve(mut conn: TcpStream, shared: &BackendShared) -> bool {
    read_request(&mut conn, shared) && respond(&mut conn, shared)
}

/// Read the request; false if it did not come, in time and right.
fn read_request(conn: &mut TcpStream, shared: &BackendShared) -> bool {
    // Short read timeouts so that a stop is noticed while waiting for the request.
    if conn
        .set_read_timeout(Some(Duration::from_millis(50)))
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; REQUEST.len()];
    let mut got = 0;
    let give_up = std::time::Instant::now() + REQUEST_READ_TIMEOUT;
    while got < buf.len() {
        match conn.read(&mut buf[got..]) {
            Ok(0) => return false,
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if shared.stopping() || std::time::Instant::now() >= give_up {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    &buf == REQUEST
}

/// Hold the request for the service time and answer; true when the response was written.
fn respond(conn: &mut TcpStream, shared: &BackendShared) -> bool {
    let service = Duration::from_micros(shared.service_us.load(Ordering::Relaxed));
    if !shared.sleep(service) {
        return false;
    }
    conn.write_all(RESPONSE).is_ok()
}

// ---------------------------------------------------------------------------------------
// Client side: namespace preparation, one request
// ---------------------------------------------------------------------------------------

/// Make a client namespace fit for thousands of short connections per second: the whole
/// ephemeral port range (`net.ipv4.ip_local_port_range = 1024 65535`) and reuse of
/// TIME_WAIT ports for new outgoing connections (`net.ipv4.tcp_tw_reuse = 1`). Both are
/// per network namespace. Panics if they cannot be set.
pub fn prepare_client_namespace(ns: &Netns) {
    ns.run(|| {
        // /proc/sys/net shows the namespace of the thread that opens it.
        for (path, value) in [
            ("/proc/sys/net/ipv4/ip_local_port_range", "1024 65535"),
            ("/proc/sys/net/ipv4/tcp_tw_reuse", "1"),
        ] {
            std::fs::write(path, value).unwrap_or_else(|e| panic!("writing {path}: {e}"));
            let back =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let back = back.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(back, value, "{path} did not take {value:?}");
        }
    });
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
    /// response); the messages are counted in [`LoadReport::errors`].
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
async fn attempt(target: SocketAddr, source: IpAddr) -> Result<(), (Outcome, io::Error)> {
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

/// One request with its deadline and retries: (outcome, attempts, error message).
async fn request(
    target: SocketAddr,
    source: IpAddr,
    deadline: Instant,
    retries: u32,
) -> (Outcome, u32, Option<String>) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match tokio::time::timeout_at(deadline, attempt(target, source)).await {
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

// ---------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------

/// Outcome counts and ok-latencies of a set of requests (one class or all, over a window).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// Arrivals (every scheduled request, dropped ones included).
    pub offered: u64,
    pub ok: u64,
    pub refused: u64,
    pub reset: u64,
    pub busy: u64,
    pub timeout: u64,
    pub error: u64,
    pub generator_dropped: u64,
    /// Connection attempts, retries included.
    pub attempts: u64,
    /// Latencies of the ok requests in microseconds, from the scheduled arrival to the
    /// response, unsorted.
    pub latencies_us: Vec<u32>,
}

impl Counts {
    fn add(&mut self, r: &Record) {
        self.offered += 1;
        self.attempts += u64::from(r.attempts);
        match r.outcome {
            Outcome::Ok => {
                self.ok += 1;
                self.latencies_us
                    .push(r.elapsed.as_micros().min(u32::MAX as u128) as u32);
            }
            Outcome::Refused => self.refused += 1,
            Outcome::Reset => self.reset += 1,
            Outcome::Busy => self.busy += 1,
            Outcome::Timeout => self.timeout += 1,
            Outcome::Error => self.error += 1,
            Outcome::GeneratorDropped => self.generator_dropped += 1,
        }
    }

    /// Add another set.
    pub fn merge(&mut self, other: &Counts) {
        self.offered += other.offered;
        self.ok += other.ok;
        self.refused += other.refused;
        self.reset += other.reset;
        self.busy += other.busy;
        self.timeout += other.timeout;
        self.error += other.error;
        self.generator_dropped += other.generator_dropped;
        self.attempts += other.attempts;
        self.latencies_us.extend_from_slice(&other.latencies_us);
    }

    /// Requests that did not end ok.
    pub fn failed(&self) -> u64 {
        self.offered - self.ok
    }

    /// `n` as a share of the offered requests (0 when nothing was offered).
    pub fn share(&self, n: u64) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            n as f64 / self.offered as f64
        }
    }

    /// The q-quantile (0..=1, nearest rank) of the ok latencies; None without ok requests.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        if self.latencies_us.is_empty() {
            return None;
        }
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
        Some(Duration::from_micros(u64::from(v[rank - 1])))
    }

    /// Median latency of the ok requests.
    pub fn p50(&self) -> Option<Duration> {
        self.latency_quantile(0.50)
    }

    /// 99th percentile latency of the ok requests.
    pub fn p99(&self) -> Option<Duration> {
        self.latency_quantile(0.99)
    }
}

/// The requests that arrived in `[start, start + seconds)` seconds after the run began,
/// per class (in the order the classes were given) and all together. A per-second row
/// ([`SecondStats`]) is a window of one second.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// First second (since the run began).
    pub start: u64,
    /// Length in seconds.
    pub seconds: u64,
    /// Class labels, indexing `by_class`.
    pub labels: Arc<[String]>,
    pub by_class: Vec<Counts>,
    pub all: Counts,
}

/// One second of a run, by arrival time.
pub type SecondStats = Window;

impl Window {
    fn empty(labels: Arc<[String]>, start: u64, seconds: u64) -> Self {
        Self {
            start,
            seconds,
            by_class: vec![Counts::default(); labels.len()],
            labels,
            all: Counts::default(),
        }
    }

    /// The counts of the class called `label`.
    pub fn class(&self, label: &str) -> Option<&Counts> {
        let i = self.labels.iter().position(|l| l == label)?;
        self.by_class.get(i)
    }

    /// Ok requests per second over the window.
    pub fn goodput(&self) -> f64 {
        self.all.ok as f64 / self.seconds.max(1) as f64
    }

    /// Ok requests per second of the class called `label` over the window (0 if unknown).
    pub fn class_goodput(&self, label: &str) -> f64 {
        self.class(label)
            .map_or(0.0, |c| c.ok as f64 / self.seconds.max(1) as f64)
    }

    /// Arrivals per second over the window.
    pub fn offered_rate(&self) -> f64 {
        self.all.offered as f64 / self.seconds.max(1) as f64
    }

    fn merge(&mut self, other: &Window) {
        for (a, b) in self.by_class.iter_mut().zip(&other.by_class) {
            a.merge(b);
        }
        self.all.merge(&other.all);
    }

    /// The column headers matching this window's `Display` row.
    pub fn header(&self) -> String {
        let mut s = format!(
            "{:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>7} {:>5} {:>7} {:>8} {:>8}",
            "t(s)",
            "offered",
            "ok",
            "refused",
            "reset",
            "busy",
            "timeout",
            "error",
            "dropped",
            "p50(ms)",
            "p99(ms)"
        );
        for label in self.labels.iter() {
            s.push_str(&format!(" {:>14}", format!("{label} ok/off")));
        }
        s
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

impl fmt::Display for Window {
    /// One table row (see [`Window::header`]): counts over the window, latencies of ok
    /// requests, then ok/offered per class.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = if self.seconds == 1 {
            format!("{}", self.start)
        } else {
            format!("{}-{}", self.start, self.start + self.seconds)
        };
        let a = &self.all;
        write!(
            f,
            "{span:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>7} {:>5} {:>7} {:>8} {:>8}",
            a.offered,
            a.ok,
            a.refused,
            a.reset,
            a.busy,
            a.timeout,
            a.error,
            a.generator_dropped,
            ms(a.p50()),
            ms(a.p99())
        )?;
        for c in &self.by_class {
            write!(f, " {:>14}", format!("{}/{}", c.ok, c.offered))?;
        }
        Ok(())
    }
}

/// One request as it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Index into the class mix.
    pub class: usize,
    /// Scheduled arrival, since the run began.
    pub start: Duration,
    pub outcome: Outcome,
    /// From the scheduled arrival to the outcome (the latency, for ok requests).
    pub elapsed: Duration,
    /// Connection attempts (1 + retries made; 0 for generator-dropped arrivals).
    pub attempts: u32,
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Class labels, in the order given.
    pub labels: Arc<[String]>,
    /// One window per second of the schedule, by arrival time.
    pub seconds: Vec<SecondStats>,
    /// Every request, in completion order.
    pub records: Vec<Record>,
    /// Messages of the `Error` outcomes, counted.
    pub errors: BTreeMap<String, u64>,
    /// The largest delay between a scheduled arrival and the moment the generator started
    /// it. Latencies and deadlines count from the scheduled time, so a generator that falls
    /// behind shows here and in the latencies, never as fewer arrivals.
    pub max_dispatch_lag: Duration,
    /// The cap on outstanding requests in force (after the file-descriptor limit).
    pub max_outstanding: usize,
}

impl LoadReport {
    /// The whole run.
    pub fn total(&self) -> Window {
        self.range(0..self.seconds.len() as u64)
    }

    /// The seconds in `range` (clamped to the run), e.g. a phase.
    pub fn range(&self, range: Range<u64>) -> Window {
        let end = range.end.min(self.seconds.len() as u64);
        let start = range.start.min(end);
        let mut w = Window::empty(self.labels.clone(), start, end - start);
        for s in &self.seconds[start as usize..end as usize] {
            w.merge(s);
        }
        w
    }

    /// The last `n` seconds.
    pub fn last(&self, n: u64) -> Window {
        let len = self.seconds.len() as u64;
        self.range(len.saturating_sub(n)..len)
    }

    /// The per-second table with a total line, for printing.
    pub fn table(&self) -> String {
        let total = self.total();
        let mut s = total.header();
        s.push('\n');
        for w in &self.seconds {
            s.push_str(&format!("{w}\n"));
        }
        s.push_str(&format!("{total}\n"));
        s
    }
}

// ---------------------------------------------------------------------------------------
// Schedule
// ---------------------------------------------------------------------------------------

/// An arrival rate in requests per second.
#[derive(Clone)]
pub enum Rate {
    Constant(f64),
    /// A function of the time since the phase began (evaluated every millisecond).
    Fn(Arc<dyn Fn(Duration) -> f64 + Send + Sync>),
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Constant(r) => write!(f, "Constant({r})"),
            Self::Fn(_) => write!(f, "Fn(..)"),
        }
    }
}

/// A stretch of the schedule.
#[derive(Clone, Debug)]
pub struct Phase {
    pub duration: Duration,
    pub rate: Rate,
}

impl Phase {
    /// `rate` requests per second for `duration`.
    pub fn constant(duration: Duration, rate: f64) -> Self {
        Self {
            duration,
            rate: Rate::Constant(rate),
        }
    }

    /// From `from` to `to` requests per second, linearly over `duration`.
    pub fn ramp(duration: Duration, from: f64, to: f64) -> Self {
        let len = duration.as_secs_f64().max(1e-9);
        Self::function(duration, move |t| {
            from + (to - from) * t.as_secs_f64() / len
        })
    }

    /// `rate(t)` requests per second, `t` since the phase began.
    pub fn function(
        duration: Duration,
        rate: impl Fn(Duration) -> f64 + Send + Sync + 'static,
    ) -> Self {
        Self {
            duration,
            rate: Rate::Fn(Arc::new(rate)),
        }
    }

    fn rate_at(&self, t: Duration) -> f64 {
        let r = match &self.rate {
            Rate::Constant(r) => *r,
            Rate::Fn(f) => f(t),
        };
        if r.is_finite() { r.max(0.0) } else { 0.0 }
    }
}

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arrivals {
    /// A Poisson process (exponential gaps), seeded: the realistic open-loop default.
    #[default]
    Poisson,
    /// Evenly spaced at the current rate.
    Uniform,
}

/// xorshift64*: tiny, seeded, good enough for arrival gaps and class picks.
#[derive(Clone, Debug)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean 1.
    fn exp1(&mut self) -> f64 {
        -(1.0 - self.unit()).ln()
    }
}

/// The arrival times of a schedule: each arrival consumes a unit (uniform) or an Exp(1)
/// (Poisson) amount of integrated rate, so rate changes are honoured exactly at phase
/// boundaries and to the millisecond inside function phases.
struct ArrivalClock {
    phases: Vec<Phase>,
    idx: usize,
    phase_start: Duration,
    t: Duration,
    rng: XorShift,
    arrivals: Arrivals,
}

impl ArrivalClock {
    fn new(phases: Vec<Phase>, arrivals: Arrivals, seed: u64) -> Self {
        Self {
            phases,
            idx: 0,
            phase_start: Duration::ZERO,
            t: Duration::ZERO,
            rng: XorShift::new(seed),
            arrivals,
        }
    }

    fn next(&mut self) -> Option<Duration> {
        let mut need = match self.arrivals {
            Arrivals::Poisson => self.rng.exp1(),
            Arrivals::Uniform => 1.0,
        };
        loop {
            let phase = self.phases.get(self.idx)?;
            let phase_end = self.phase_start + phase.duration;
            if self.t >= phase_end {
                self.idx += 1;
                self.phase_start = phase_end;
                continue;
            }
            let step_end = match phase.rate {
                Rate::Constant(_) => phase_end,
                Rate::Fn(_) => (self.t + Duration::from_millis(1)).min(phase_end),
            };
            let rate = phase.rate_at(self.t - self.phase_start);
            let span = (step_end - self.t).as_secs_f64();
            if rate > 0.0 && rate * span >= need {
                self.t += Duration::from_secs_f64(need / rate);
                if self.t >= phase_end {
                    // Rounding: keep the arrival inside its phase.
                    self.t = phase_end - Duration::from_nanos(1);
                }
                return Some(self.t);
            }
            need -= rate * span;
            self.t = step_end;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Load generator
// ---------------------------------------------------------------------------------------

/// One class of the mix.
#[derive(Clone, Debug)]
pub struct ClassMix {
    pub label: String,
    /// Source address bound before connecting (its family must match the target's);
    /// unspecified lets the kernel choose.
    pub source: IpAddr,
    /// Share of the arrivals (normalised over all classes).
    pub fraction: f64,
    /// Distinct clients: each request comes from `source + k` for a `k` drawn uniformly
    /// from `0..hosts` (its retries from the same address). 1: every request from `source`.
    /// The addresses must be local to the client namespace (see [`add_local_range`]).
    pub hosts: u32,
}

/// The `k`-th address after `base` (wrapping within the family).
pub fn nth_address(base: IpAddr, k: u32) -> IpAddr {
    match base {
        IpAddr::V4(a) => IpAddr::V4(u32::from(a).wrapping_add(k).into()),
        IpAddr::V6(a) => IpAddr::V6(u128::from(a).wrapping_add(u128::from(k)).into()),
    }
}

/// Make every address of the IPv4 `prefix` (e.g. `"198.18.50.0/24"`) local to `ns`
/// ("AnyIP": a `local` route via `lo`), so clients can bind to any of them and the namespace
/// answers ARP for them on its other interfaces.
pub fn add_local_range(ns: &Netns, prefix: &str) {
    ns.ip(&["route", "add", "local", prefix, "dev", "lo"]);
}

/// An open-loop load generator: requests start on a schedule whether or not earlier ones
/// have finished, each with a deadline that bounds connect + send + response. Build it with
/// the methods below, then [`run`](LoadGen::run) / [`run_in`](LoadGen::run_in) (blocking,
/// with a callback per completed second) or [`start`](LoadGen::start) /
/// [`start_in`](LoadGen::start_in) (a [`LoadHandle`] with a receiver of seconds).
///
/// A second is reported once every request that arrived in it has finished, that is about
/// one deadline after it ends.
#[derive(Clone, Debug)]
pub struct LoadGen {
    pub target: SocketAddr,
    pub phases: Vec<Phase>,
    /// The class mix; empty means one class `"all"` from a kernel-chosen source.
    pub classes: Vec<ClassMix>,
    /// Whole-request deadline from the scheduled arrival (default 1 s).
    pub deadline: Duration,
    /// Immediate retries after a refused, reset or busy attempt while the deadline allows
    /// (default 0). Every attempt is counted.
    pub retries: u32,
    /// Cap on outstanding requests (default 20,000; lowered to the file-descriptor limit
    /// less a margin). Arrivals beyond it are counted as `generator_dropped`.
    pub max_outstanding: usize,
    pub arrivals: Arrivals,
    /// Seed of the arrival gaps and class picks: the same seed and schedule give the same
    /// arrivals.
    pub seed: u64,
}

impl LoadGen {
    /// A generator aimed at `target`, with no phases yet and the defaults above.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            phases: Vec::new(),
            classes: Vec::new(),
            deadline: Duration::from_secs(1),
            retries: 0,
            max_outstanding: 20_000,
            arrivals: Arrivals::Poisson,
            seed: 1,
        }
    }

    /// Append a phase of `rate` requests per second for `duration`.
    pub fn phase(mut self, duration: Duration, rate: f64) -> Self {
        self.phases.push(Phase::constant(duration, rate));
        self
    }

    /// Append a linear ramp from `from` to `to` requests per second over `duration`.
    pub fn ramp(mut self, duration: Duration, from: f64, to: f64) -> Self {
        self.phases.push(Phase::ramp(duration, from, to));
        self
    }

    /// Append a phase whose rate is `rate(t)`, `t` since the phase began.
    pub fn rate_fn(
        mut self,
        duration: Duration,
        rate: impl Fn(Duration) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.phases.push(Phase::function(duration, rate));
        self
    }

    /// Add a class: `fraction` of the arrivals, connecting from `source`.
    pub fn class(self, label: &str, source: IpAddr, fraction: f64) -> Self {
        self.class_hosts(label, source, 1, fraction)
    }

    /// Add a class of `hosts` distinct clients from `source` on (see [`ClassMix::hosts`]).
    pub fn class_hosts(mut self, label: &str, source: IpAddr, hosts: u32, fraction: f64) -> Self {
        assert!(hosts >= 1, "class {label}: at least one host");
        self.classes.push(ClassMix {
            label: label.to_string(),
            source,
            fraction,
            hosts,
        });
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    pub fn max_outstanding(mut self, max: usize) -> Self {
        self.max_outstanding = max;
        self
    }

    pub fn arrivals(mut self, arrivals: Arrivals) -> Self {
        self.arrivals = arrivals;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Length of the schedule.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Start on a new thread in the calling thread's network namespace (threads inherit
    /// it); returns at once.
    pub fn start(self) -> LoadHandle {
        let prepared = self.prepare();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::Builder::new()
                .name("loadgen".into())
                .spawn(move || prepared.run(tx, stop))
                .expect("spawning the load generator")
        };
        LoadHandle {
            seconds: rx,
            stop,
            thread: Some(thread),
        }
    }

    /// Start on a new thread inside `ns`; returns at once.
    pub fn start_in(self, ns: &Netns) -> LoadHandle {
        let prepared = self.prepare();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            ns.spawn(move || prepared.run(tx, stop))
        };
        LoadHandle {
            seconds: rx,
            stop,
            thread: Some(thread),
        }
    }

    /// Run the whole schedule in the calling thread's namespace, calling `on_second` for
    /// each second as it completes, and return the report.
    pub fn run(self, on_second: impl FnMut(&SecondStats)) -> LoadReport {
        self.start().follow(on_second)
    }

    /// [`LoadGen::run`] inside `ns`.
    pub fn run_in(self, ns: &Netns, on_second: impl FnMut(&SecondStats)) -> LoadReport {
        self.start_in(ns).follow(on_second)
    }

    /// Check the configuration (panics with a message) and fill in the defaults.
    fn prepare(mut self) -> Prepared {
        if self.classes.is_empty() {
            let any = if self.target.is_ipv4() {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            };
            self.classes.push(ClassMix {
                label: "all".into(),
                source: any,
                fraction: 1.0,
                hosts: 1,
            });
        }
        for c in &self.classes {
            assert!(
                c.source.is_ipv4() == self.target.is_ipv4(),
                "class {}: source {} and target {} are of different families",
                c.label,
                c.source,
                self.target
            );
            assert!(
                c.fraction >= 0.0 && c.fraction.is_finite(),
                "class {}: bad fraction {}",
                c.label,
                c.fraction
            );
        }
        let sum: f64 = self.classes.iter().map(|c| c.fraction).sum();
        assert!(sum > 0.0, "the class fractions add up to zero");
        let mut acc = 0.0;
        let cumulative = self
            .classes
            .iter()
            .map(|c| {
                acc += c.fraction / sum;
                acc
            })
            .collect();
        let nofile = raise_nofile_limit();
        let max_outstanding = self
            .max_outstanding
            .min((nofile as usize).saturating_sub(256))
            .max(1);
        let labels: Arc<[String]> = self.classes.iter().map(|c| c.label.clone()).collect();
        Prepared {
            seconds: self.duration().as_secs_f64().ceil() as u64,
            labels,
            cumulative,
            max_outstanding,
            config: self,
        }
    }
}

/// A running [`LoadGen`]. Completed seconds arrive on `seconds` (in order, about one
/// deadline after they end); [`LoadHandle::wait`] returns the report. Dropping the handle
/// stops the schedule and waits for the requests in flight.
pub struct LoadHandle {
    pub seconds: mpsc::Receiver<SecondStats>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<LoadReport>>,
}

impl LoadHandle {
    /// End the schedule now: no new arrivals; requests in flight finish (within their
    /// deadline) and the report covers the seconds begun.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Wait for the end of the run and return its report (which has every second, received
    /// or not).
    pub fn wait(mut self) -> LoadReport {
        let thread = self.thread.take().expect("joined once");
        thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// Whether the run has ended (its report is ready for [`LoadHandle::wait`]).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Call `on_second` for each second as it completes, then return the report.
    pub fn follow(self, mut on_second: impl FnMut(&SecondStats)) -> LoadReport {
        for s in self.seconds.iter() {
            on_second(&s);
        }
        self.wait()
    }
}

impl Drop for LoadHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop();
            let _ = t.join();
        }
    }
}

struct Prepared {
    config: LoadGen,
    labels: Arc<[String]>,
    cumulative: Vec<f64>,
    max_outstanding: usize,
    seconds: u64,
}

/// What the request tasks and the dispatcher share.
struct Agg {
    labels: Arc<[String]>,
    slots: Vec<Slot>,
    records: Vec<Record>,
    errors: BTreeMap<String, u64>,
    /// Arrivals up to here have been dispatched.
    dispatched_through: Duration,
    /// No more arrivals.
    done: bool,
    next_emit: usize,
    emitted: Vec<Window>,
}

struct Slot {
    window: Window,
    /// Dispatched arrivals not finished yet.
    pending: u64,
}

impl Agg {
    fn slot(&mut self, second: u64) -> &mut Slot {
        while self.slots.len() as u64 <= second {
            let start = self.slots.len() as u64;
            self.slots.push(Slot {
                window: Window::empty(self.labels.clone(), start, 1),
                pending: 0,
            });
        }
        &mut self.slots[second as usize]
    }

    fn finish(&mut self, record: Record, error: Option<String>) {
        let slot = self.slot(record.start.as_secs());
        slot.window.by_class[record.class].add(&record);
        slot.window.all.add(&record);
        slot.pending = slot.pending.saturating_sub(1);
        if let Some(e) = error {
            *self.errors.entry(e).or_default() += 1;
        }
        self.records.push(record);
    }

    /// Seconds that are complete and not yet emitted.
    fn take_complete(&mut self) -> Vec<Window> {
        let mut out = Vec::new();
        loop {
            let s = self.next_emit;
            if s >= self.slots.len() {
                break;
            }
            // At the end (nothing outstanding) everything is complete.
            let passed = self.dispatched_through >= Duration::from_secs(s as u64 + 1);
            if !self.done && (!passed || self.slots[s].pending > 0) {
                break;
            }
            let w = self.slots[s].window.clone();
            self.emitted.push(w.clone());
            out.push(w);
            self.next_emit += 1;
        }
        out
    }
}

/// One outstanding request, released when its task ends (even by a panic, so the run
/// still ends).
struct Outstanding(Arc<AtomicUsize>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Prepared {
    fn run(self, tx: mpsc::Sender<SecondStats>, stop: Arc<AtomicBool>) -> LoadReport {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("loadgen-worker")
            .enable_all()
            .build()
            .expect("building the load generator's runtime");
        runtime.block_on(self.drive(tx, stop))
    }

    async fn drive(self, tx: mpsc::Sender<SecondStats>, stop: Arc<AtomicBool>) -> LoadReport {
        let Prepared {
            config,
            labels,
            cumulative,
            max_outstanding,
            seconds,
        } = self;
        let agg = Arc::new(Mutex::new(Agg {
            labels: labels.clone(),
            slots: Vec::new(),
            records: Vec::new(),
            errors: BTreeMap::new(),
            dispatched_through: Duration::ZERO,
            done: false,
            next_emit: 0,
            emitted: Vec::new(),
        }));
        {
            // Every second of the schedule gets a row, even one without arrivals.
            let mut a = agg.lock().expect("agg");
            if seconds > 0 {
                a.slot(seconds - 1);
            }
        }
        let outstanding = Arc::new(AtomicUsize::new(0));
        let emitter = {
            let (agg, tx) = (agg.clone(), tx.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    tick.tick().await;
                    let rows = agg.lock().expect("agg").take_complete();
                    for r in rows {
                        let _ = tx.send(r);
                    }
                }
            })
        };

        let sources: Arc<[(IpAddr, u32)]> =
            config.classes.iter().map(|c| (c.source, c.hosts)).collect();
        let mut host_rng = XorShift::new(config.seed ^ 0x0005_0a5c_e5e5_0001);
        let mut clock = ArrivalClock::new(config.phases.clone(), config.arrivals, config.seed);
        let mut class_rng = XorShift::new(config.seed ^ 0x5eed_c1a5_5e5e_d000);
        let mut max_lag = Duration::ZERO;
        let t0 = Instant::now();
        while let Some(at) = clock.next() {
            let when = t0 + at;
            // Sleep in short steps so that a stop is noticed at low rates too.
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let now = Instant::now();
                if now >= when {
                    break;
                }
                // Everything scheduled before now has been dispatched: lets quiet seconds
                // complete without waiting for the next arrival.
                agg.lock().expect("agg").dispatched_through = now - t0;
                tokio::time::sleep_until(when.min(now + Duration::from_millis(50))).await;
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            max_lag = max_lag.max(Instant::now().saturating_duration_since(when));
            let u = class_rng.unit();
            let class = cumulative
                .iter()
                .position(|&c| u < c)
                .unwrap_or(cumulative.len() - 1);
            let second = at.as_secs();
            if outstanding.load(Ordering::Relaxed) >= max_outstanding {
                let mut a = agg.lock().expect("agg");
                a.dispatched_through = at;
                a.slot(second).pending += 1;
                a.finish(
                    Record {
                        class,
                        start: at,
                        outcome: Outcome::GeneratorDropped,
                        elapsed: Duration::ZERO,
                        attempts: 0,
                    },
                    None,
                );
                continue;
            }
            {
                let mut a = agg.lock().expect("agg");
                a.dispatched_through = at;
                a.slot(second).pending += 1;
            }
            outstanding.fetch_add(1, Ordering::Relaxed);
            let guard = Outstanding(outstanding.clone());
            let agg = agg.clone();
            let (base, hosts) = sources[class];
            let source = if hosts > 1 {
                let k = ((host_rng.unit() * f64::from(hosts)) as u32).min(hosts - 1);
                nth_address(base, k)
            } else {
                base
            };
            let target = config.target;
            let (deadline, retries) = (when + config.deadline, config.retries);
            tokio::spawn(async move {
                let (outcome, attempts, error) = request(target, source, deadline, retries).await;
                let record = Record {
                    class,
                    start: at,
                    outcome,
                    elapsed: Instant::now().saturating_duration_since(when),
                    attempts,
                };
                agg.lock().expect("agg").finish(record, error);
                drop(guard);
            });
        }
        {
            let mut a = agg.lock().expect("agg");
            let end = if stop.load(Ordering::Relaxed) {
                t0.elapsed()
            } else {
                config.duration()
            };
            a.dispatched_through = a.dispatched_through.max(end);
        }
        // Wait out the schedule (a quiet tail has no arrivals but is still part of it),
        // then the requests in flight; each ends by its deadline.
        if !stop.load(Ordering::Relaxed) {
            tokio::time::sleep_until(t0 + config.duration()).await;
        }
        while outstanding.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        emitter.abort();
        let mut a = agg.lock().expect("agg");
        if stop.load(Ordering::Relaxed) {
            // Keep only the seconds begun.
            let begun = a.dispatched_through.as_secs_f64().ceil() as usize;
            let keep = begun.max(a.next_emit);
            a.slots.truncate(keep);
        }
        a.done = true;
        for r in a.take_complete() {
            let _ = tx.send(r);
        }
        LoadReport {
            labels,
            seconds: std::mem::take(&mut a.emitted),
            records: std::mem::take(&mut a.records),
            errors: std::mem::take(&mut a.errors),
            max_dispatch_lag: max_lag,
            max_outstanding,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Capacity
// ---------------------------------------------------------------------------------------

/// What [`measure_capacity`] found.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Completed requests per second over the measurement.
    pub rps: f64,
    /// Requests completed in the measurement window.
    pub completed: u64,
    /// Requests that failed (any outcome but ok) in the window.
    pub failed: u64,
    /// Median latency of the completed requests.
    pub p50: Option<Duration>,
}

/// Measure a backend's capacity with a closed loop: `concurrency` clients (use twice the
/// backend's workers, so its accept queue never runs dry) each sending one request after
/// another from `source` to `target` for 200 ms of warm-up plus `duration`; the rate of
/// completions within `duration` is the capacity. Runs in the calling thread's network
/// namespace (e.g. inside `pair.client.run(..)`); blocks.
pub fn measure_capacity(
    target: SocketAddr,
    source: IpAddr,
    concurrency: usize,
    duration: Duration,
) -> Capacity {
    const WARMUP: Duration = Duration::from_millis(200);
    raise_nofile_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a runtime");
    runtime.block_on(async move {
        let t0 = Instant::now();
        let (from, to) = (t0 + WARMUP, t0 + WARMUP + duration);
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..concurrency.max(1) {
            clients.spawn(async move {
                let mut c = Counts::default();
                loop {
                    let start = Instant::now();
                    if start >= to {
                        break c;
                    }
                    let deadline = start + Duration::from_secs(2);
                    let (outcome, attempts, _) = request(target, source, deadline, 0).await;
                    let end = Instant::now();
                    if end >= from && end < to {
                        c.add(&Record {
                            class: 0,
                            start: Duration::ZERO,
                            outcome,
                            elapsed: end - start,
                            attempts,
                        });
                    }
                    if outcome != Outcome::Ok {
                        // Do not spin on a dead target.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            });
        }
        let mut total = Counts::default();
        while let Some(c) = clients.join_next().await {
            total.merge(&c.expect("capacity client"));
        }
        Capacity {
            rps: total.ok as f64 / duration.as_secs_f64(),
            completed: total.ok,
            failed: total.failed(),
            p50: total.p50(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(phases: Vec<Phase>, kind: Arrivals) -> Vec<Duration> {
        let mut c = ArrivalClock::new(phases, kind, 7);
        std::iter::from_fn(|| c.next()).collect()
    }

    #[test]
    fn uniform_arrivals_follow_the_phases() {
        let a = arrivals(
            vec![
                Phase::constant(Duration::from_secs(1), 10.0),
                Phase::constant(Duration::from_secs(1), 0.0),
                Phase::constant(Duration::from_secs(1), 100.0),
            ],
            Arrivals::Uniform,
        );
        let in_second = |s: u64| a.iter().filter(|t| t.as_secs() == s).count();
        assert_eq!(in_second(0), 10);
        assert_eq!(in_second(1), 0);
        assert!((99..=101).contains(&in_second(2)), "{}", in_second(2));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_arrivals_have_the_right_mean_and_spread() {
        let a = arrivals(
            vec![Phase::constant(Duration::from_secs(100), 200.0)],
            Arrivals::Poisson,
        );
        let n = a.len() as f64;
        assert!((n - 20_000.0).abs() < 600.0, "{n}");
        // Exponential gaps: the coefficient of variation is 1.
        let gaps: Vec<f64> = a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    }

    #[test]
    fn ramps_integrate_the_rate() {
        // 0 → 200/s over 2 s: 200 arrivals, a quarter of them in the first second.
        let a = arrivals(
            vec![Phase::ramp(Duration::from_secs(2), 0.0, 200.0)],
            Arrivals::Uniform,
        );
        assert!((199..=201).contains(&a.len()), "{}", a.len());
        let first = a.iter().filter(|t| t.as_secs() == 0).count();
        assert!((49..=51).contains(&first), "{first}");
    }

    #[test]
    fn aimd_grows_by_one_only_when_binding_and_fast() {
        let cfg = InAppAimd::default();
        let fast = Some(Duration::from_millis(30));
        assert_eq!(aimd_next(10, fast, true, &cfg), 11);
        assert_eq!(aimd_next(10, fast, false, &cfg), 10);
        // Exactly at the target is not above it.
        assert_eq!(aimd_next(10, Some(cfg.target_latency), true, &cfg), 11);
        // Nothing completed: no latency to judge by.
        assert_eq!(aimd_next(10, None, true, &cfg), 10);
        assert_eq!(aimd_next(cfg.max_limit, fast, true, &cfg), cfg.max_limit);
    }

    #[test]
    fn aimd_backs_off_by_a_tenth_when_slow() {
        let cfg = InAppAimd::default();
        let slow = Some(Duration::from_millis(51));
        for binding in [false, true] {
            assert_eq!(aimd_next(100, slow, binding, &cfg), 90);
            assert_eq!(aimd_next(10, slow, binding, &cfg), 9);
            assert_eq!(aimd_next(15, slow, binding, &cfg), 13);
            assert_eq!(aimd_next(1, slow, binding, &cfg), cfg.min_limit);
        }
        let floor = InAppAimd {
            min_limit: 8,
            ..cfg
        };
        assert_eq!(aimd_next(8, slow, true, &floor), 8);
    }

    #[test]
    fn admission_stops_at_the_limit_and_marks_it_binding() {
        let aimd = Aimd::new(InAppAimd {
            initial_limit: 3,
            ..InAppAimd::default()
        });
        assert!(aimd.try_admit());
        assert!(!aimd.binding.load(Ordering::Relaxed));
        assert!(aimd.try_admit());
        assert!(aimd.try_admit());
        assert!(aimd.binding.load(Ordering::Relaxed), "reached the limit");
        aimd.binding.store(false, Ordering::Relaxed);
        assert!(!aimd.try_admit());
        assert!(aimd.binding.load(Ordering::Relaxed), "shed one");
        assert_eq!(aimd.in_flight.load(Ordering::Relaxed), 3);
        aimd.in_flight.fetch_sub(1, Ordering::Relaxed);
        assert!(aimd.try_admit());
    }

    #[test]
    fn nth_address_counts_from_the_base() {
        let v4: IpAddr = "198.18.50.0".parse().unwrap();
        assert_eq!(nth_address(v4, 0), v4);
        assert_eq!(
            nth_address(v4, 257),
            "198.18.51.1".parse::<IpAddr>().unwrap()
        );
        let v6: IpAddr = "2001:db8:50::".parse().unwrap();
        assert_eq!(
            nth_address(v6, 0x1_0001),
            "2001:db8:50::1:1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let c = Counts {
            latencies_us: (1..=100).rev().collect(),
            ..Counts::default()
        };
        assert_eq!(c.p50(), Some(Duration::from_micros(50)));
        assert_eq!(c.p99(), Some(Duration::from_micros(99)));
        assert_eq!(c.latency_quantile(1.0), Some(Duration::from_micros(100)));
        assert_eq!(Counts::default().p99(), None);
    }
}
