//! Running the real `shedder` daemon in a test: in a chosen network namespace (entered with
//! nsenter unless the test asks for another [`Launch`]), with its own pin directory, killed
//! and unpinned when the guard drops.

use std::{
    io::Write,
    net::{IpAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use shedder::kernel::{MapReader, PinnedMaps};

use crate::{
    netns::{Netns, Pair},
    policy::{CLIENT_V4, SERVER_V4},
    tcp::{Attempt, connect_from},
};

/// The `shedder` binary built beside this executable: a test runs from
/// `target/<profile>/deps/`, a binary such as the demo from `target/<profile>/`.
/// (`cargo build` builds it; `cargo xtask test` and `cargo xtask demo` always do.)
pub fn shedder_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable directory");
    let candidates = [
        dir.join("shedder"),
        dir.parent()
            .map_or_else(PathBuf::new, |p| p.join("shedder")),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no `shedder` binary beside {}: build it with `cargo build -p shedder-user` \
                 (cargo xtask test and demo do)",
                exe.display()
            )
        })
}

/// How a test starts the daemon in a network namespace, as users do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// `nsenter --net=…`: the host's mounts, bpffs included.
    Nsenter,
    /// `ip netns exec`: a private mount namespace with a fresh `/sys` (no bpffs).
    IpNetnsExec,
    /// `ip netns exec … unshare --pid --fork --mount-proc`: pid 1 of its own pid and mount
    /// namespaces, as a container's entry point without the host's bpffs.
    Pid1,
}

/// A daemon process and the files it uses.
pub struct Daemon {
    child: Option<Child>,
    /// The binary the next spawn runs (default: [`shedder_bin`]): another version's, in the
    /// upgrade tests.
    pub binary: PathBuf,
    pub config: PathBuf,
    pub pin_dir: PathBuf,
    pub log: PathBuf,
    /// Environment given to the daemon beside RUST_LOG (e.g. systemd's NOTIFY_SOCKET).
    pub env: Vec<(String, String)>,
}

impl Daemon {
    /// Write `config` and start `shedder run` inside `ns` the way `launch` says.
    pub fn start_as(ns: &Netns, tag: &str, config: &str, pin_dir: &Path, launch: Launch) -> Self {
        let mut d = Self::start_stopped(tag, config, pin_dir);
        d.spawn_as(ns, launch);
        d
    }

    /// [`Daemon::start`] with another binary (an older version's).
    pub fn start_with_binary(
        ns: &Netns,
        tag: &str,
        config: &str,
        pin_dir: &Path,
        binary: &Path,
    ) -> Self {
        let mut d = Self::start_stopped(tag, config, pin_dir);
        d.binary = binary.to_path_buf();
        d.spawn(ns);
        d
    }

    /// Write `config` and start `shedder run` inside `ns` (entered with nsenter).
    pub fn start(ns: &Netns, tag: &str, config: &str, pin_dir: &Path) -> Self {
        Self::start_as(ns, tag, config, pin_dir, Launch::Nsenter)
    }

    /// Write `config` and start `shedder run` inside `ns` (nsenter) with `env` added.
    pub fn start_with_env(
        ns: &Netns,
        tag: &str,
        config: &str,
        pin_dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let mut d = Self::start_stopped(tag, config, pin_dir);
        d.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        d.spawn_as(ns, Launch::Nsenter);
        d
    }

    fn start_stopped(tag: &str, config: &str, pin_dir: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("shedder-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("shedder.toml");
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(stop_detaches(config).as_bytes()))
            .expect("write config");
        Self {
            child: None,
            binary: shedder_bin(),
            config: path,
            pin_dir: pin_dir.to_path_buf(),
            log: dir.join("daemon.log"),
            env: Vec::new(),
        }
    }

    /// Start (again) with the same configuration, appending to the log.
    pub fn spawn(&mut self, ns: &Netns) {
        self.spawn_as(ns, Launch::Nsenter);
    }

    pub fn spawn_as(&mut self, ns: &Netns, launch: Launch) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut command = match launch {
            Launch::Nsenter => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/var/run/netns/{}", ns.name));
                c
            }
            Launch::IpNetnsExec => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name]);
                c
            }
            Launch::Pid1 => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name]);
                c.args(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]);
                c
            }
        };
        let child = command
            .arg(&self.binary)
            .args(["run", "--config"])
            .arg(&self.config)
            .env(
                "RUST_LOG",
                std::env::var("SHEDDER_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shedder run");
        self.child = Some(child);
    }

    /// Wait up to `timeout` for the daemon to exit by itself; its status, or `None` if it
    /// still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let c = self.child.as_mut()?;
            if let Some(status) = c.try_wait().expect("wait") {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until the log contains `needle` `n` times: the log is appended to across
    /// spawns (panics with the log after `timeout`).
    pub fn wait_for_log_count(&self, needle: &str, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.log().matches(needle).count() < n {
            if Instant::now() > deadline {
                panic!(
                    "daemon log never said {needle:?} {n} times:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until the log contains `needle` (panics with the log after `timeout`).
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if Instant::now() > deadline {
                panic!("daemon log never said {needle:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no cleanup at all.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit (panics if it does not exit within 5 s, or if it
    /// had already died with an error: a daemon that crashed during a test leaves the
    /// fallback limits in force, and the test's figures would blame the product's logic).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        if let Some(status) = c.try_wait().expect("wait")
            && !status.success()
        {
            panic!(
                "the daemon died during the test ({status}):\n{}",
                self.log()
            );
        }
        // SAFETY: plain kill(2) on our child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("daemon ignored SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait up to 5 s for the daemon to exit on its own (e.g. after `shedder detach`);
    /// SIGTERM it if it does not. Its exit status.
    pub fn terminate_or_wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let c = self.child.as_mut().expect("running");
            if let Some(status) = c.try_wait().expect("wait") {
                self.child = None;
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.terminate()
    }

    /// SIGHUP (reload the configuration).
    pub fn hangup(&self) {
        // SAFETY: plain kill(2) on our child's pid.
        unsafe { libc::kill(self.pid() as i32, libc::SIGHUP) };
    }

    /// Replace the configuration file's content (for reload tests).
    pub fn rewrite_config(&self, config: &str) {
        std::fs::write(&self.config, stop_detaches(config)).expect("rewrite config");
    }
}

/// `config` with `detach_on_exit = true` unless it says otherwise: a test's daemon detaches
/// when the test stops it (the product's default is to stay attached), so that what a test
/// runs after a stop is unprotected, as the comparisons with no shedder expect, and nothing
/// stays attached between tests.
fn stop_detaches(config: &str) -> String {
    if config.contains("detach_on_exit") {
        return config.to_string();
    }
    config.replacen("[daemon]\n", "[daemon]\ndetach_on_exit = true\n", 1)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        let _ = shedder::kernel::unpin_all(&self.pin_dir);
        // SHEDDER_TEST_KEEP_LOGS=1 keeps the configuration and the log for a post-mortem.
        if let Some(dir) = self.config.parent()
            && std::env::var_os("SHEDDER_TEST_KEEP_LOGS").is_none()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

// Helpers for tests that drive a daemon over a veth pair with the standard addresses.

/// A test daemon's configuration: `veth0` attached with TC, a 100 ms tick, pins under
/// `pin_dir`, the lines `daemon_extra` in `[daemon]`; one service `web` on `port` with a
/// fixed limit of 4 in [1, 100], `fallback_limit = fallback`, and resets.
pub fn web_config(pin_dir: &Path, port: u16, fallback: u32, daemon_extra: &str) -> String {
    format!(
        r#"
[daemon]
interfaces = ["{}"]
attach = "tc"
pin_dir = "{}"
tick_ms = 100
{daemon_extra}

[[service]]
name = "web"
ports = [{port}]
controller = "fixed"
min_limit = 1
max_limit = 100
fixed_limit = 4
fallback_limit = {fallback}
action = "rst"
"#,
        crate::netns::IFACE,
        pin_dir.display()
    )
}

/// A pin directory unique to this test process and `tag`.
pub fn pin_dir(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/bpf/shedder-test-{}-{tag}",
        std::process::id()
    ))
}

pub fn connect(pair: &Pair, port: u16) -> Attempt {
    pair.client.run(|| {
        connect_from(
            IpAddr::V4(CLIENT_V4),
            IpAddr::V4(SERVER_V4),
            port,
            Duration::from_secs(2),
        )
    })
}

pub fn admitted(pair: &Pair, port: u16, what: &str) -> TcpStream {
    match connect(pair, port).result {
        Ok(s) => s,
        Err(e) => panic!("{what}: expected admission, got {e}"),
    }
}

pub fn refused(pair: &Pair, port: u16, what: &str) {
    let a = connect(pair, port);
    match a.result {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => panic!(
            "{what}: expected a reset, got {other:?} after {:?}",
            a.elapsed
        ),
    }
}

/// An admitted connection that sends a request the server holds unanswered (`h`, to a
/// [`crate::tcp::TestServer::holding`] server): work in flight, as shedder counts it.
pub fn busy(pair: &Pair, port: u16, what: &str) -> TcpStream {
    let mut c = admitted(pair, port, what);
    c.write_all(b"h")
        .unwrap_or_else(|e| panic!("{what}: sending the request: {e}"));
    c
}

/// Open `n` busy connections to `port` ([`busy`]), each admitted, and wait until the
/// kernel counts them in flight.
pub fn hold(pair: &Pair, pins: &Path, port: u16, n: u32) -> Vec<TcpStream> {
    let held = (0..n)
        .map(|i| busy(pair, port, &format!("connection {i} of {n}")))
        .collect();
    settle(pins, n);
    held
}

/// Wait until the kernel counts `n` connections in flight (busy: a request not yet
/// answered; connection teardown is asynchronous).
pub fn settle(pin_dir: &Path, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let s = PinnedMaps::open(pin_dir).expect("open pinned maps");
        let got: u32 = s.inflight(0).expect("inflight").class.iter().sum();
        if got == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "in-flight stuck at {got}, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What [`probe_while`] saw: attempts made, and attempts admitted.
#[derive(Default)]
pub struct Probes {
    pub made: std::sync::atomic::AtomicU32,
    pub admitted: std::sync::atomic::AtomicU32,
}

impl Probes {
    pub fn made(&self) -> u32 {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn admitted(&self) -> u32 {
        self.admitted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Connect to `port` from the client every 5 ms while `during` runs (given the counts so
/// far): at the limit every probe must be refused, and one admitted is a moment without
/// protection. Returns what `during` returned, and the counts.
pub fn probe_while<R>(pair: &Pair, port: u16, during: impl FnOnce(&Probes) -> R) -> (R, Probes) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let probes = Probes::default();
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            pair.client.run(|| {
                while !stop.load(Ordering::Relaxed) {
                    let a = connect_from(
                        IpAddr::V4(CLIENT_V4),
                        IpAddr::V4(SERVER_V4),
                        port,
                        Duration::from_secs(1),
                    );
                    probes.made.fetch_add(1, Ordering::Relaxed);
                    if a.result.is_ok() {
                        probes.admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        let r = during(&probes);
        stop.store(true, Ordering::Relaxed);
        r
    });
    (result, probes)
}
