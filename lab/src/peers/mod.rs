//! The peers shedder is compared against in the overload benchmark, as an SRE would set them
//! up today: an nftables SYN rate limit ([`Nft`]), a real haproxy in TCP mode with a
//! per-server connection limit and a queue timeout ([`Haproxy`]), and Debian's nginx, which
//! is also the TLS backend and answers 503 from its own `limit_conn` / `limit_req`
//! ([`Nginx`]); and a QUIC server and client (quinn) for the QUIC services
//! ([`QuicServer`], [`QuicClient`]). Each runs inside a test network namespace and is removed when its guard
//! drops (also while unwinding).
//!
//! All are entered with `nsenter --net=...` (not `ip netns exec`, which remounts /sys).

mod haproxy;
mod nft;
mod nginx;
mod quic;
mod wrk;

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

pub use haproxy::{Haproxy, HaproxyConfig};
pub use nft::Nft;
pub use nginx::{Nginx, NginxConfig, NginxLimit, TlsFiles};
pub use quic::{
    QUIC_SERVER_NAME, QuicClient, QuicOutcome, QuicServer, QuicServerConfig, QuicTally, QuicWork,
    closed_loop as quic_closed_loop, open_loop as quic_open_loop,
};

pub use wrk::{H2Result, Wrk, WrkConfig, WrkResult, closed_loop_rate, h2load};

use crate::netns::Netns;

/// `nsenter --net=<ns> <program>`: the program runs in the namespace's network stack only.
fn nsenter(ns_name: &str, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/var/run/netns/{ns_name}"))
        .arg(program);
    c
}

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A peer's process, its directory and its configuration file's text. Dropping it sends
/// SIGTERM (SIGKILL after 2 s) and removes the directory, also while unwinding.
struct PeerProcess {
    name: &'static str,
    child: Option<Child>,
    dir: PathBuf,
    config: String,
}

impl PeerProcess {
    /// A new directory under the temp dir holding `config` as `file`.
    fn new(name: &'static str, file: &str, config: impl FnOnce(&Path) -> String) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "shedder-{name}-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let p = Self {
            name,
            child: None,
            config: config(&dir),
            dir,
        };
        std::fs::write(p.path(file), &p.config).unwrap_or_else(|e| panic!("writing {file}: {e}"));
        p
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Run the program's own configuration check; panics with its output and the
    /// configuration if it fails.
    fn check(&self, mut c: Command) {
        let out = c
            .output()
            .unwrap_or_else(|e| panic!("spawning {} (is its package installed?): {e}", self.name));
        if !out.status.success() {
            panic!(
                "{} rejected the configuration ({}):\n{}{}\n{}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.config
            );
        }
    }

    /// Spawn `c` (an `nsenter` without --fork, so the child's pid is the program's) and
    /// wait until `port` on the namespace's loopback accepts connections; panics with the
    /// file `log` if the process exits first or 5 s pass.
    fn spawn(&mut self, mut c: Command, ns: &Netns, port: u16, log: &str) {
        self.child = Some(
            c.stdin(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawning {}: {e}", self.name)),
        );
        let log = self.path(log);
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        let child = self.child.as_mut().expect("just started");
        let deadline = Instant::now() + Duration::from_secs(5);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        loop {
            if let Some(status) = child.try_wait().ok().flatten() {
                panic!("{} exited ({status}):\n{}", self.name, log());
            }
            if ns
                .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(200)))
                .is_ok()
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} did not accept connections on port {port} within 5 s:\n{}",
                    self.name,
                    log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) on our child's pid, not yet reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Total CPU time (user and system) of process `pid`, all its threads including those that
/// have exited, in nanoseconds: its process CPU-time clock (`clock_getcpuclockid`), which
/// the kernel keeps from the same scheduler runtime as `/proc/<pid>/task/*/schedstat`.
pub fn process_cpu_time(pid: u32) -> io::Result<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: a valid out-pointer; returns an error number instead of setting errno.
    let rc = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    crate::load::read_clock(clock)
}
