//! A real QUIC server and client (quinn, on rustls): the QUIC services' tests and their
//! overload run. Debian's packages have no HTTP/3 server or client.
//!
//! The server is an event loop, as HTTP/3 servers are (nginx, HAProxy, Envoy's workers): one
//! thread runs the handshakes and the requests, and a request's work is CPU time on that
//! thread, so an overloaded server falls behind on everything, its new connections'
//! handshakes included, and its socket's receive queue grows until it drops datagrams.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use quinn::{
    ClientConfig, ConnectionError, Endpoint, EndpointConfig, IdleTimeout, ServerConfig,
    TransportConfig, crypto::rustls::QuicClientConfig,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::TlsFiles;
use crate::{
    load::{REQUEST, RESPONSE, burn},
    netns::Netns,
};

/// The server's name in its certificate.
pub const QUIC_SERVER_NAME: &str = "h3.shedder.test";

/// The QUIC server's settings.
#[derive(Clone, Debug)]
pub struct QuicServerConfig {
    pub port: u16,
    /// CPU time of one request, spent on the event loop.
    pub service_time: Duration,
    /// Run the server's thread on this CPU.
    pub cpu: Option<usize>,
}

/// A QUIC server in a namespace, listening on `[::]:port` (dual-stack), answering each
/// bidirectional stream's request with [`RESPONSE`] after its service time. Stops when
/// dropped.
pub struct QuicServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

/// What the server's event loop counts as it goes.
#[derive(Default)]
struct Counts {
    served: AtomicU64,
    handshakes: AtomicU64,
    /// Requests whose work is done (answered or not).
    worked: AtomicU64,
    /// Wall-clock time spent in requests' work, in ns: their CPU time, and more when the
    /// machine takes the server's CPU from it.
    busy_ns: AtomicU64,
}

/// The server's work so far: requests worked and the wall-clock time their work took.
#[derive(Clone, Copy, Debug)]
pub struct QuicWork {
    pub requests: u64,
    pub busy: Duration,
}

impl QuicWork {
    /// The requests a second the server gets through when never idle, at the pace it kept
    /// between `earlier` and this snapshot: below its capacity when the machine slows it.
    pub fn pace_since(&self, earlier: &QuicWork) -> Option<f64> {
        crate::load::busy_pace(
            self.requests.saturating_sub(earlier.requests),
            self.busy.saturating_sub(earlier.busy),
            1,
        )
    }
}

impl QuicServer {
    pub fn start(ns: &Netns, tls: &TlsFiles, cfg: QuicServerConfig) -> Self {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
            .expect("reading the certificate")
            .collect::<Result<_, _>>()
            .expect("parsing the certificate");
        let key = PrivateKeyDer::from_pem_file(&tls.key).expect("reading the key");
        let mut server = ServerConfig::with_single_cert(certs, key).expect("server config");
        let mut transport = TransportConfig::default();
        transport.max_idle_timeout(Some(IdleTimeout::from(quinn::VarInt::from_u32(10_000))));
        server.transport_config(Arc::new(transport));
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (stop, counts) = (stop.clone(), counts.clone());
            ns.spawn(move || {
                if let Some(cpu) = cfg.cpu {
                    crate::load::pin_current_thread(cpu);
                }
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let addr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), cfg.port);
                    let endpoint = Endpoint::server(server, addr).expect("binding the server");
                    ready_tx.send(()).expect("ready");
                    serve(endpoint, cfg.service_time, stop, counts).await;
                });
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the QUIC server did not start");
        Self {
            stop,
            thread: Some(thread),
            counts,
        }
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.counts.served.load(Ordering::Relaxed)
    }

    /// Handshakes completed so far.
    pub fn handshakes(&self) -> u64 {
        self.counts.handshakes.load(Ordering::Relaxed)
    }

    /// The requests worked so far and the time their work took.
    pub fn work(&self) -> QuicWork {
        QuicWork {
            requests: self.counts.worked.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.counts.busy_ns.load(Ordering::Relaxed)),
        }
    }
}

impl Drop for QuicServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    endpoint: Endpoint,
    service_time: Duration,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                continue;
            }
        };
        let Some(incoming) = incoming else { break };
        let counts = counts.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            counts.handshakes.fetch_add(1, Ordering::Relaxed);
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                let counts = counts.clone();
                tokio::spawn(async move {
                    if recv.read_to_end(64).await.is_err() {
                        return;
                    }
                    // The work, on the event loop (see the module's comment).
                    let started = Instant::now();
                    burn(service_time, || false);
                    counts
                        .busy_ns
                        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    counts.worked.fetch_add(1, Ordering::Relaxed);
                    if send.write_all(RESPONSE).await.is_ok() && send.finish().is_ok() {
                        counts.served.fetch_add(1, Ordering::Relaxed);
                        let _ = send.stopped().await;
                    }
                });
            }
        });
    }
    endpoint.close(0u32.into(), b"stopping");
    endpoint.wait_idle().await;
}

/// How one request over a new QUIC connection ended.
#[derive(Clone, Debug, PartialEq)]
pub enum QuicOutcome {
    /// Answered.
    Ok,
    /// The server refused the connection with Version Negotiation.
    Refused,
    /// Nothing within the deadline.
    TimedOut,
    /// Anything else, with quinn's words.
    Failed(String),
}

/// A client's settings for one connection: the certificate to trust, how long the
/// handshake may be silent before quinn gives up.
#[derive(Clone)]
pub struct QuicClient {
    config: ClientConfig,
}

impl QuicClient {
    pub fn new(tls: &TlsFiles, idle: Duration) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&tls.cert).expect("reading the certificate") {
            roots.add(c.expect("parsing")).expect("adding the root");
        }
        let crypto = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut config = ClientConfig::new(Arc::new(
            QuicClientConfig::try_from(crypto).expect("QUIC client config"),
        ));
        let mut transport = TransportConfig::default();
        transport.max_idle_timeout(Some(
            IdleTimeout::try_from(idle).expect("an idle timeout in range"),
        ));
        config.transport_config(Arc::new(transport));
        Self { config }
    }

    /// One request over a new connection from its own UDP socket on `src`, as a browser
    /// opens one: (outcome, time to it). Call inside a runtime in the client's namespace.
    pub async fn request(
        &self,
        src: IpAddr,
        server: SocketAddr,
        deadline: Duration,
    ) -> (QuicOutcome, Duration) {
        let start = Instant::now();
        let outcome = match tokio::time::timeout(deadline, self.exchange(src, server)).await {
            Ok(o) => o,
            Err(_) => QuicOutcome::TimedOut,
        };
        (outcome, start.elapsed())
    }

    async fn exchange(&self, src: IpAddr, server: SocketAddr) -> QuicOutcome {
        let endpoint = match client_endpoint(SocketAddr::new(src, 0)) {
            Ok(e) => e,
            Err(e) => return QuicOutcome::Failed(format!("client socket: {e}")),
        };
        let connecting = match endpoint.connect_with(self.config.clone(), server, QUIC_SERVER_NAME)
        {
            Ok(c) => c,
            Err(e) => return QuicOutcome::Failed(format!("connect: {e}")),
        };
        let conn = match connecting.await {
            Ok(c) => c,
            Err(ConnectionError::VersionMismatch) => return QuicOutcome::Refused,
            Err(ConnectionError::TimedOut) => return QuicOutcome::TimedOut,
            Err(e) => return QuicOutcome::Failed(format!("handshake: {e}")),
        };
        let outcome = async {
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(REQUEST).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            let body = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
            if body == RESPONSE[..] {
                Ok(())
            } else {
                Err(format!("unexpected response {body:?}"))
            }
        }
        .await;
        // Closed without waiting for the close to drain: the endpoint's driver sends it.
        conn.close(0u32.into(), b"done");
        match outcome {
            Ok(()) => QuicOutcome::Ok,
            Err(e) => QuicOutcome::Failed(e),
        }
    }
}

/// A client's endpoint on its own UDP socket, with datagrams of at most 1,500 bytes. quinn
/// sizes an endpoint's receive buffer by its largest datagram (64 KiB by default) times the
/// segments and datagrams it may take in at once: 128 MiB for each endpoint, 3 MiB so. With
/// an endpoint for every connection at the overload run's 190 a second, the clients' CPU
/// sat at 100% for seconds, the test process grew to 2 GiB, and the clients answered the
/// server late by up to a second, which the shedder rightly read as slow handshakes
/// (goodput 64–86% in such runs). The smaller buffer alone did not cure it (still 1.9 GiB,
/// 41% of the time clearing pages): the allocator setting in client_runtime did.
fn client_endpoint(addr: SocketAddr) -> std::io::Result<Endpoint> {
    let mut config = EndpointConfig::default();
    config
        .max_udp_payload_size(1500)
        .expect("1,500 bytes is a valid datagram size");
    let runtime =
        quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime"))?;
    Endpoint::new(config, None, std::net::UdpSocket::bind(addr)?, runtime)
}

/// The clients' runtime: two threads, on `cpu` if given (threads inherit the affinity of the
/// thread that creates them).
fn client_runtime(cpu: Option<usize>) -> tokio::runtime::Runtime {
    if let Some(cpu) = cpu {
        crate::load::pin_current_thread(cpu);
    }
    // Allocations from 256 KiB up are mapped afresh and unmapped when freed, whatever was
    // freed before: each client endpoint's receive buffer (see client_endpoint) then costs
    // a mapping, and its zeroed pages are touched only as datagrams arrive. Left to adjust
    // itself, glibc raises the threshold past the buffer's size after the first is freed,
    // and every later one is carved from the heap and zeroed byte by byte.
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What became of the requests from one source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicTally {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub failed: u64,
}

impl QuicTally {
    fn count(&mut self, o: &QuicOutcome) {
        self.sent += 1;
        match o {
            QuicOutcome::Ok => self.ok += 1,
            QuicOutcome::Refused => self.refused += 1,
            QuicOutcome::TimedOut => self.timed_out += 1,
            QuicOutcome::Failed(_) => self.failed += 1,
        }
    }

    /// Share of the requests answered.
    pub fn success(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.ok as f64 / self.sent as f64
    }
}

/// Open-loop load from the client's namespace: `rate` new connections a second for
/// `duration`, each one request with `deadline`, the sources taking turns by weight
/// (`mix`: address and weight); one tally per source, for the requests begun after `warmup`.
/// The client's threads run on `cpu` (not the server's).
#[allow(clippy::too_many_arguments)]
pub fn open_loop(
    ns: &Netns,
    client: &QuicClient,
    server: SocketAddr,
    mix: &[(IpAddr, u32)],
    rate: f64,
    duration: Duration,
    warmup: Duration,
    deadline: Duration,
    cpu: Option<usize>,
) -> Vec<QuicTally> {
    let pattern: Vec<usize> = mix
        .iter()
        .enumerate()
        .flat_map(|(i, &(_, w))| std::iter::repeat_n(i, w as usize))
        .collect();
    let sources: Vec<IpAddr> = mix.iter().map(|&(a, _)| a).collect();
    let client = client.clone();
    ns.run(move || {
        let rt = client_runtime(cpu);
        rt.block_on(async move {
            let mut tasks = Vec::new();
            let start = tokio::time::Instant::now();
            let interval = Duration::from_secs_f64(1.0 / rate);
            let mut i = 0usize;
            loop {
                let at = start + interval.mul_f64(i as f64);
                if at.duration_since(start) >= duration {
                    break;
                }
                tokio::time::sleep_until(at).await;
                let source = pattern[i % pattern.len()];
                let counted = at.duration_since(start) >= warmup;
                let (client, src) = (client.clone(), sources[source]);
                tasks.push(tokio::spawn(async move {
                    let (o, _) = client.request(src, server, deadline).await;
                    (source, counted, o)
                }));
                i += 1;
            }
            let mut tallies = vec![QuicTally::default(); sources.len()];
            for t in tasks {
                if let Ok((source, true, o)) = t.await {
                    tallies[source].count(&o);
                }
            }
            tallies
        })
    })
}

/// The server's capacity in requests a second, one request per connection: `clients`
/// clients each opening connections back to back for `duration` from `src`, their threads
/// on `cpu`.
pub fn closed_loop(
    ns: &Netns,
    client: &QuicClient,
    server: SocketAddr,
    src: IpAddr,
    clients: usize,
    duration: Duration,
    cpu: Option<usize>,
) -> f64 {
    let client = client.clone();
    let served = ns.run(move || {
        let rt = client_runtime(cpu);
        rt.block_on(async move {
            let end = tokio::time::Instant::now() + duration;
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    let mut ok = 0u64;
                    while tokio::time::Instant::now() < end {
                        if client.request(src, server, Duration::from_secs(2)).await.0
                            == QuicOutcome::Ok
                        {
                            ok += 1;
                        }
                    }
                    ok
                }));
            }
            let mut ok = 0;
            for t in tasks {
                ok += t.await.unwrap_or(0);
            }
            ok
        })
    });
    served as f64 / duration.as_secs_f64()
}
