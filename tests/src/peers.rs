//! The peers shedder is compared against in the overload benchmark, as an SRE would set them
//! up today: an nftables SYN rate limit ([`Nft`]) and a real haproxy in TCP mode with a
//! per-server connection limit and a queue timeout ([`Haproxy`]). Each runs inside a test
//! network namespace and is removed when its guard drops (also while unwinding).
//!
//! Both are entered with `nsenter --net=...` (not `ip netns exec`, which remounts /sys).

use std::{
    io::{self, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// `nsenter --net=<ns> <program>`: the program runs in the namespace's network stack only.
fn nsenter(ns_name: &str, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/var/run/netns/{ns_name}"))
        .arg(program);
    c
}

// ---------------------------------------------------------------------------------------
// nftables
// ---------------------------------------------------------------------------------------

/// The table [`Nft`] installs.
const NFT_TABLE: &str = "shedder_peer";
/// Its named counter of dropped SYNs.
const NFT_COUNTER: &str = "syn_dropped";

/// An nftables table `inet shedder_peer` in a namespace, deleted on drop.
pub struct Nft {
    ns_name: String,
    ruleset: String,
}

impl Nft {
    /// Drop new TCP connection attempts (SYN without ACK, IPv4 and IPv6) to `port` above
    /// `rate_per_sec` per second, counting them. The token bucket holds a tenth of a
    /// second's worth of SYNs (at least 5), so short clumps of arrivals within the rate
    /// pass. Panics with nft's output if the ruleset is rejected.
    pub fn syn_rate_limit(ns: &Netns, port: u16, rate_per_sec: u32) -> Self {
        let burst = (rate_per_sec / 10).max(5);
        let ruleset = format!(
            "table inet {NFT_TABLE} {{\n\
             \tcounter {NFT_COUNTER} {{\n\
             \t}}\n\
             \tchain input {{\n\
             \t\ttype filter hook input priority filter; policy accept;\n\
             \t\ttcp dport {port} tcp flags & (syn | ack) == syn \
             limit rate over {rate_per_sec}/second burst {burst} packets \
             counter name \"{NFT_COUNTER}\" drop\n\
             \t}}\n\
             }}\n"
        );
        let mut child = nsenter(&ns.name, "nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nft");
        child
            .stdin
            .take()
            .expect("nft stdin")
            .write_all(ruleset.as_bytes())
            .expect("write the ruleset to nft");
        let out = child.wait_with_output().expect("wait for nft");
        if !out.status.success() {
            panic!(
                "nft -f rejected the ruleset ({}): {}\n{ruleset}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self {
            ns_name: ns.name.clone(),
            ruleset,
        }
    }

    /// The ruleset as installed (`nft -f` input).
    pub fn ruleset(&self) -> &str {
        &self.ruleset
    }

    /// SYNs dropped so far (the named counter's packets).
    pub fn dropped(&self) -> u64 {
        let out = nsenter(&self.ns_name, "nft")
            .args(["-j", "list", "table", "inet", NFT_TABLE])
            .output()
            .expect("spawn nft");
        assert!(
            out.status.success(),
            "nft -j list table failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|item| {
                let c = item.get("counter")?;
                (c["name"] == NFT_COUNTER).then(|| c["packets"].as_u64())?
            })
            .unwrap_or_else(|| panic!("no counter {NFT_COUNTER} in {json}"))
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        // Fails harmlessly when the namespace is already gone.
        let _ = nsenter(&self.ns_name, "nft")
            .args(["delete", "table", "inet", NFT_TABLE])
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------------------
// haproxy
// ---------------------------------------------------------------------------------------

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

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
        let dir = std::env::temp_dir().join(format!(
            "shedder-haproxy-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("haproxy temp dir");
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
        let child = nsenter(&ns.name, "haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn haproxy");
        h.child = Some(child);
        h.wait_ready(ns, cfg.listen_port);
        h
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.join("haproxy.stderr")
    }

    /// What haproxy wrote to stderr so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    fn wait_ready(&mut self, ns: &Netns, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .expect("running")
                .try_wait()
                .ok()
                .flatten()
            {
                panic!("haproxy exited ({status}):\n{}", self.stderr());
            }
            if ns
                .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(200)))
                .is_ok()
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "haproxy did not accept connections on port {port} within 5 s:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
