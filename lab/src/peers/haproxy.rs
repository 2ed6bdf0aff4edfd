//! haproxy in TCP or HTTP mode: a per-server connection limit with a queue.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use super::{PeerProcess, nsenter, process_cpu_time};
use crate::netns::Netns;

/// How to run [`Haproxy`].
#[derive(Clone, Debug)]
pub struct HaproxyConfig {
    /// Listen on all addresses, IPv4 and IPv6, at this port.
    pub listen_port: u16,
    /// The one backend server.
    pub backend: SocketAddr,
    /// Connections open to the server at once; the rest wait in haproxy's queue.
    pub server_maxconn: u32,
    /// Client connections open at once; beyond it haproxy stops accepting and new ones wait
    /// in the kernel's accept queue.
    pub frontend_maxconn: u32,
    /// How long a connection may wait in the queue before haproxy closes it.
    pub timeout_queue: Duration,
    /// HTTP mode: haproxy keeps its clients' connections alive between requests and queues
    /// each request (not each connection) for a server connection, which it reuses.
    pub http: bool,
}

impl HaproxyConfig {
    /// The configuration file: TCP or HTTP mode, one thread, no logging.
    fn render(&self) -> String {
        let mode = if self.http {
            "mode http\n\
             \x20   option http-keep-alive\n\
             \x20   timeout http-keep-alive 30s\n\
             \x20   http-reuse always"
        } else {
            "mode tcp"
        };
        let backend = match self.backend {
            SocketAddr::V4(a) => a.to_string(),
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
        };
        format!(
            "global\n\
             \x20   maxconn {frontend}\n\
             \x20   nbthread 1\n\
             \n\
             defaults\n\
             \x20   {mode}\n\
             \x20   timeout connect 1s\n\
             \x20   timeout client 10s\n\
             \x20   timeout server 10s\n\
             \x20   timeout queue {queue}ms\n\
             \n\
             frontend fe\n\
             \x20   bind :::{port} v4v6\n\
             \x20   maxconn {frontend}\n\
             \x20   default_backend be\n\
             \n\
             backend be\n\
             \x20   server s1 {backend} maxconn {server}\n",
            frontend = self.frontend_maxconn,
            queue = self.timeout_queue.as_millis(),
            port = self.listen_port,
            server = self.server_maxconn,
        )
    }
}

/// A haproxy process (`haproxy -db`, no master process) in a namespace. Dropping it stops
/// it and removes its directory.
///
/// When a queued connection's `timeout queue` expires, haproxy closes the client
/// connection without a response: the client reads EOF (a FIN, no RST), which the load
/// generator counts as [`Outcome::Reset`](crate::load::Outcome::Reset).
pub struct Haproxy(PeerProcess);

impl Haproxy {
    /// Write the configuration to a new directory under the temp dir, check it with
    /// `haproxy -c`, start haproxy inside `ns` and wait until its port accepts connections
    /// (panics with haproxy's stderr if it does not within 5 s).
    pub fn start(ns: &Netns, cfg: &HaproxyConfig) -> Self {
        let mut p = PeerProcess::new("haproxy", "haproxy.cfg", |_| cfg.render());
        let path = p.path("haproxy.cfg");
        let mut check = Command::new("haproxy");
        check.arg("-c").arg("-f").arg(&path);
        p.check(check);
        let stderr = std::fs::File::create(p.path(STDERR)).expect("haproxy stderr file");
        let mut c = nsenter(&ns.name, "haproxy");
        c.arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(stderr);
        p.spawn(c, ns, cfg.listen_port, STDERR);
        Self(p)
    }

    /// The haproxy process's id.
    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// CPU time haproxy has used so far.
    pub fn cpu_time(&self) -> Duration {
        process_cpu_time(self.pid()).expect("haproxy's CPU time")
    }

    /// The configuration file's text.
    pub fn config_text(&self) -> &str {
        &self.0.config
    }
}

/// haproxy's stderr, in its directory.
const STDERR: &str = "haproxy.stderr";
