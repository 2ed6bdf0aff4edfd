//! The [`Backend`]: a TCP request/response server of known capacity, plain or shedding in
//! the application under an AIMD limit ([`InAppAimd`]).

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
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

use super::{
    cpu::{burn, pin_current_thread, read_clock},
    protocol::{BUSY, REQUEST, RESPONSE},
};
use crate::netns::Netns;

/// How long a worker waits for the request bytes of a connection it accepted before it
/// gives up on it.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// What holding a request for its service time means.
    pub work: Work,
    /// Run every thread of the backend on this CPU (None: wherever the scheduler likes).
    pub cpu: Option<usize>,
}

/// What a worker does with a request for its service time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Work {
    /// Wait (a request blocked on I/O or on another service): workers are the limit, not
    /// the CPU, and a refusal after accept costs the backend little it needs.
    #[default]
    Sleep,
    /// Compute: the service time is CPU time (see [`crate::load::burn`]), so workers on
    /// one core share it, and whatever else runs on that core (the kernel's packet
    /// processing, refusing) takes from serving.
    Burn,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            port: 0,
            workers: 4,
            service_time: Duration::from_millis(20),
            backlog: 1024,
            in_app: None,
            work: Work::Sleep,
            cpu: None,
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

    /// Compute (or wait) for the service time.
    pub fn work(mut self, work: Work) -> Self {
        self.work = work;
        self
    }

    /// Run every thread on `cpu`.
    pub fn cpu(mut self, cpu: usize) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Nominal capacity in requests per second: workers / service time (workers that
    /// compute share the CPUs they may run on).
    pub fn capacity(&self) -> f64 {
        nominal_capacity(self.servers(), self.service_time)
    }

    /// How many requests can be held at once: the workers, or for computing workers the
    /// CPUs they run on if fewer.
    fn servers(&self) -> usize {
        match (self.work, self.cpu) {
            (Work::Sleep, _) => self.workers,
            (Work::Burn, Some(_)) => 1,
            (Work::Burn, None) => self.workers.min(super::cpu::online_cpus()),
        }
    }
}

fn nominal_capacity(servers: usize, service_time: Duration) -> f64 {
    servers as f64 / service_time.as_secs_f64().max(1e-9)
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
    /// Time the workers have held connections, summed over workers (from taking one to
    /// closing it: reading the request, the service time, writing the answer). A worker's
    /// other time is spent waiting for a connection.
    pub busy_time: Duration,
    /// Requests shed in the application: answered [`BUSY`] (or the write of it failed).
    pub rejected: u64,
    /// CPU time the acceptor thread spent on the shed requests (`CLOCK_THREAD_CPUTIME_ID`,
    /// from before `accept()` to after the close: accept, read, write [`BUSY`], close). The
    /// kernel's work for them in softirq context (handshake, ACKs, FIN) is not included.
    pub reject_cpu: Duration,
    /// The in-application limit now; None without [`BackendConfig::in_app`].
    pub limit: Option<u32>,
}

impl BackendStats {
    /// The connections a second `servers` workers get through when never idle, at the pace
    /// they kept between `earlier` and this snapshot: servers × connections ÷ busy time.
    /// Below the nominal capacity when the machine slows the workers (late wake-ups, CPU
    /// taken by a load generator on the same cores). None when none was handled.
    pub fn busy_rate_since(&self, earlier: &BackendStats, servers: usize) -> Option<f64> {
        let handled = (self.served + self.failed).saturating_sub(earlier.served + earlier.failed);
        busy_pace(
            handled,
            self.busy_time.saturating_sub(earlier.busy_time),
            servers,
        )
    }
}

/// The requests a second `servers` servers get through when never idle, having handled
/// `handled` in `busy` of busy time summed over them. None when none was handled.
pub fn busy_pace(handled: u64, busy: Duration, servers: usize) -> Option<f64> {
    let busy = busy.as_secs_f64();
    (handled > 0 && busy > 0.0).then(|| servers as f64 * handled as f64 / busy)
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
    /// Requests that can be held at once ([`BackendConfig::servers`]).
    servers: usize,
    work: Work,
    service_us: AtomicU64,
    stopping: AtomicBool,
    stop_lock: Mutex<bool>,
    stop_cv: Condvar,
    accepted: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
    busy: AtomicUsize,
    busy_ns: AtomicU64,
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

    /// A worker takes a connection: count it busy from now.
    fn hold(&self) -> std::time::Instant {
        self.busy.fetch_add(1, Ordering::Relaxed);
        std::time::Instant::now()
    }

    /// The worker is done with the connection it took at `held`.
    fn release(&self, held: std::time::Instant) {
        self.busy_ns
            .fetch_add(held.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.busy.fetch_sub(1, Ordering::Relaxed);
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
            servers: config.servers(),
            work: config.work,
            service_us: AtomicU64::new(config.service_time.as_micros() as u64),
            stopping: AtomicBool::new(false),
            stop_lock: Mutex::new(false),
            stop_cv: Condvar::new(),
            accepted: AtomicU64::new(0),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            busy_ns: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            reject_cpu_ns: AtomicU64::new(0),
            aimd: config.in_app.map(Aimd::new),
        });
        let cpu = config.cpu;
        let spawn = |name: String, f: Box<dyn FnOnce() + Send + 'static>| {
            thread::Builder::new()
                .name(name)
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_current_thread(cpu);
                    }
                    f()
                })
                .expect("spawning a backend thread")
        };
        let mut threads = Vec::with_capacity(config.workers + 1);
        match &config.in_app {
            None => {
                for i in 0..config.workers {
                    let (listener, shared) = (listener.clone(), shared.clone());
                    threads.push(spawn(
                        format!("backend-{port}-{i}"),
                        Box::new(move || worker(&listener, &shared)),
                    ));
                }
            }
            Some(aimd) => {
                // In flight never exceeds the limit, so the queue never fills.
                let (tx, rx) = mpsc::sync_channel(aimd.max_limit as usize);
                let rx = Arc::new(Mutex::new(rx));
                for i in 0..config.workers {
                    let (rx, shared) = (rx.clone(), shared.clone());
                    threads.push(spawn(
                        format!("backend-{port}-{i}"),
                        Box::new(move || pool_worker(&rx, &shared)),
                    ));
                }
                let (listener, shared) = (listener.clone(), shared.clone());
                threads.push(spawn(
                    format!("backend-{port}-a"),
                    Box::new(move || acceptor(&listener, &shared, tx)),
                ));
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

    /// Nominal capacity now, in requests per second (see [`BackendConfig::capacity`]).
    pub fn capacity(&self) -> f64 {
        nominal_capacity(self.shared.servers, self.service_time())
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
            busy_time: Duration::from_nanos(self.shared.busy_ns.load(Ordering::Relaxed)),
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
        let held = shared.hold();
        let answered = serve(conn, shared);
        shared.release(held);
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
        let held = shared.hold();
        let answered = respond(&mut conn, shared);
        let latency = accepted_at.elapsed();
        drop(conn);
        shared.release(held);
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
    let held = match shared.work {
        Work::Sleep => shared.sleep(service),
        Work::Burn => burn(service, || shared.stopping()),
    };
    held && conn.write_all(RESPONSE).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
