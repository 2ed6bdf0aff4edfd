//! haproxy in TCP mode: a per-server connection limit with a queue.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use super::{nsenter, process_cpu_time, temp_dir, terminate, wait_ready};
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
}

impl HaproxyConfig {
    /// The configuration file: TCP mode, one thread, no logging.
    fn render(&self) -> String {
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
             \x20   mode tcp\n\
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

/// A haproxy process (`haproxy -db`, no master process) in a namespace. Dropping it sends
/// SIGTERM (SIGKILL after 2 s) and removes its directory.
///
/// When a queued connection's `timeout queue` expires, haproxy closes the client
/// connection without a response: the client reads EOF (a FIN, no RST), which the load
/// generator counts as [`Outcome::Reset`](crate::load::Outcome::Reset).
pub struct Haproxy {
    child: Option<Child>,
    dir: PathBuf,
    config: String,
}

impl Haproxy {
    /// Write the configuration to a new directory under the temp dir, check it with
    /// `haproxy -c`, start haproxy inside `ns` and wait until its port accepts connections
    /// (panics with haproxy's stderr if it does not within 5 s).
    pub fn start(ns: &Netns, cfg: &HaproxyConfig) -> Self {
        let dir = temp_dir("haproxy");
        let mut h = Self {
            child: None,
            config: cfg.render(),
            dir,
        };
        let path = h.dir.join("haproxy.cfg");
        std::fs::write(&path, &h.config).expect("write haproxy.cfg");
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("spawn haproxy -c (is the haproxy package installed?)");
        if !check.status.success() {
            panic!(
                "haproxy -c rejected the configuration ({}):\n{}{}\n{}",
                check.status,
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr),
                h.config
            );
        }
        let stderr = std::fs::File::create(h.stderr_path()).expect("haproxy stderr file");
        // nsenter without --fork execs haproxy: the child's pid is haproxy's.
        h.child = Some(
            nsenter(&ns.name, "haproxy")
                .arg("-db")
                .arg("-f")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn haproxy"),
        );
        let log = h.stderr_path();
        let child = h.child.as_mut().expect("just started");
        wait_ready(child, ns, cfg.listen_port, "haproxy", || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        h
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.join("haproxy.stderr")
    }

    /// The haproxy process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// CPU time haproxy has used so far.
    pub fn cpu_time(&self) -> Duration {
        process_cpu_time(self.pid()).expect("haproxy's CPU time")
    }

    /// The configuration file's text.
    pub fn config_text(&self) -> &str {
        &self.config
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            terminate(c);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
