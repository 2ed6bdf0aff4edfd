//! Network namespaces for tests: uniquely named, removed when the guard drops (also while
//! unwinding from a panic). Code runs inside one on a scoped thread that `setns`-es into it,
//! so sockets, links and attachments made there belong to that namespace only.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Run a command, panicking with its output if it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("spawning {args:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace that is deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Attach the pass-everything baseline XDP program natively to this namespace's
    /// [`IFACE`]; held while the returned object lives.
    pub fn attach_pass_program(&self) -> aya::Ebpf {
        let mut ebpf = aya::Ebpf::load(shedder::kernel::BASELINE_OBJECT).expect("baseline object");
        let prog: &mut aya::programs::Xdp = ebpf
            .program_mut(shedder_common::programs::BASELINE_XDP)
            .expect("baseline program")
            .try_into()
            .expect("xdp program");
        prog.load().expect("load baseline");
        self.run(|| prog.attach(IFACE, aya::programs::XdpMode::Driver))
            .expect("attach the baseline XDP program");
        ebpf
    }

    /// The empty TC classifier at both hooks of [`IFACE`] (tcx), as shedder's TC attachment
    /// places its ingress and egress programs: what any program at those hooks costs.
    pub fn attach_pass_tc(&self) -> aya::Ebpf {
        use aya::programs::{SchedClassifier, TcAttachType};
        let mut ebpf = aya::Ebpf::load(shedder::kernel::BASELINE_OBJECT).expect("baseline object");
        let prog: &mut SchedClassifier = ebpf
            .program_mut(shedder_common::programs::BASELINE_TC)
            .expect("baseline classifier")
            .try_into()
            .expect("tc program");
        prog.load().expect("load baseline classifier");
        for hook in [TcAttachType::Ingress, TcAttachType::Egress] {
            self.run(|| prog.attach(IFACE, hook))
                .expect("attach the baseline classifier");
        }
        ebpf
    }

    /// A new namespace named `shd-<tag>-<pid>-<n>` with loopback up.
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("shd-{tag}-{}-{n}", std::process::id());
        sh(&["ip", "netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Run a program inside the namespace (`ip netns exec`).
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Set a per-namespace sysctl under `/proc/sys/net`, e.g. `("ipv4/ip_forward", "1")`,
    /// and read it back. Written from a thread inside the namespace (`/proc/sys/net` shows
    /// the namespace of the thread that opens it), so no `sysctl` binary is needed: a
    /// minimal root has none. Panics if the value does not take.
    pub fn sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/net/{key}");
        self.run(|| {
            std::fs::write(&path, value).unwrap_or_else(|e| panic!("writing {path}: {e}"));
            let back =
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let back = back.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(back, value, "{path} did not take {value:?}");
        })
    }

    /// Enter the namespace on the calling thread. Only for threads that belong to the test
    /// (see [`Netns::run`]); the main test thread should never switch.
    pub fn enter(&self) {
        let path = format!("/var/run/netns/{}", self.name);
        let f = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: valid fd of a network namespace.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            panic!("setns({path}): {}", std::io::Error::last_os_error());
        }
    }

    /// Run `f` on a thread inside the namespace and return its result (panics propagate).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter();
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Spawn a long-running thread inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
            // SAFETY: valid fd of a network namespace.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                panic!("setns({path}): {}", std::io::Error::last_os_error());
            }
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace removes its interfaces and detaches their programs.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two namespaces joined by a veth pair: `client` (`198.18.0.1/16`, `2001:db8::1/64`, plus
/// the class test sources) and `server` (`198.18.0.2/16`, `2001:db8::2/64`), each interface
/// named `veth0` inside its namespace.
pub struct Pair {
    pub client: Netns,
    pub server: Netns,
}

pub const IFACE: &str = "veth0";

impl Pair {
    /// Attach the pass-everything baseline XDP program to the client's veth; held while the
    /// returned object lives. Native XDP_TX on a veth is delivered only while the peer has
    /// an XDP program (or GRO on); otherwise the kernel drops the frame and counts it in
    /// the sender's `xdp_tx_errors`. Only tests of native mode with `rst` arrange this, as a
    /// user who chooses native on a veth must; `attach = "auto"` needs none.
    pub fn pass_program_on_client(&self) -> aya::Ebpf {
        self.client.attach_pass_program()
    }

    pub fn new(tag: &str) -> Self {
        let client = Netns::new(&format!("{tag}c"));
        let server = Netns::new(&format!("{tag}s"));
        veth(&client, &server, IFACE, ("shc", "shs"));
        for addr in [
            "198.18.0.1/16",
            "198.18.10.1/16",
            "198.18.10.200/16",
            "198.18.20.1/16",
            "198.18.99.1/16",
        ] {
            client.ip(&["addr", "add", addr, "dev", IFACE]);
        }
        for addr in [
            "2001:db8::1/64",
            "2001:db8:10::1/128",
            "2001:db8:20::1/128",
            "2001:db8:99::1/128",
        ] {
            client.ip(&["addr", "add", addr, "dev", IFACE, "nodad"]);
        }
        server.ip(&["addr", "add", "198.18.0.2/16", "dev", IFACE]);
        server.ip(&["addr", "add", "2001:db8::2/64", "dev", IFACE, "nodad"]);
        client.ip(&["link", "set", IFACE, "up"]);
        server.ip(&["link", "set", IFACE, "up"]);
        // The extra client IPv6 sources live outside 2001:db8::/64: route them via veth.
        server.ip(&["-6", "route", "add", "2001:db8::/32", "dev", IFACE]);
        client.ip(&["-6", "route", "add", "2001:db8::/32", "dev", IFACE]);
        Self { client, server }
    }

    /// A third namespace behind the server, as a backend on another host is behind a
    /// load-balancer node: `upstream` (`198.19.0.2/24`) joined to the server's `veth1`
    /// (`198.19.0.1/24`). Deleted on drop, with its link.
    pub fn upstream(&self, tag: &str) -> Netns {
        let upstream = Netns::new(&format!("{tag}u"));
        veth(&self.server, &upstream, UPSTREAM_IFACE, ("shu", "shv"));
        self.server
            .ip(&["addr", "add", "198.19.0.1/24", "dev", UPSTREAM_IFACE]);
        upstream.ip(&["addr", "add", "198.19.0.2/24", "dev", UPSTREAM_IFACE]);
        self.server.ip(&["link", "set", UPSTREAM_IFACE, "up"]);
        upstream.ip(&["link", "set", UPSTREAM_IFACE, "up"]);
        upstream
    }
}

/// A veth pair between namespaces `a` and `b`, named `iface` in both (created under unique
/// names with the prefixes `tmp`, then renamed inside each namespace).
fn veth(a: &Netns, b: &Netns, iface: &str, tmp: (&str, &str)) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id() % 100_000;
    let (ta, tb) = (format!("{}{pid}x{n}", tmp.0), format!("{}{pid}x{n}", tmp.1));
    sh(&[
        "ip", "link", "add", &ta, "netns", &a.name, "type", "veth", "peer", "name", &tb, "netns",
        &b.name,
    ]);
    a.ip(&["link", "set", &ta, "name", iface]);
    b.ip(&["link", "set", &tb, "name", iface]);
}

/// The server's interface towards [`Pair::upstream`], and the upstream's own.
pub const UPSTREAM_IFACE: &str = "veth1";
/// The upstream namespace's address.
pub const UPSTREAM_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 19, 0, 2);
