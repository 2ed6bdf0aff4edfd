//! `shedder doctor`: check everything shedder needs on this host — kernel, pseudo-filesystems,
//! capabilities, BPF settings, the configured interfaces and cgroups, the daemon — each with a
//! verdict and, when something is wrong, a concrete fix.
//!
//! Every check is independent and never panics: a check that cannot run reports why.
//! Interfaces are looked up in the caller's network namespace.

use std::{fmt::Write as _, io, path::Path};

use serde::Serialize;

use crate::{
    config::{Attach, Config, Daemon},
    kernel::{
        netdev::ifindex,
        version::{
            KernelVersion, MEMCG_BPF_KERNEL, MIN_KERNEL, TCX_KERNEL, TESTED_KERNEL, kernel_release,
            parse_kernel_release, running_kernel,
        },
    },
};

/// Below [`MEMCG_BPF_KERNEL`], a locked-memory limit under this is reported.
const MIN_MEMLOCK_BYTES: u64 = 64 << 20;

const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
const BPF_JIT_SYSCTL: &str = "/proc/sys/net/core/bpf_jit_enable";
const PSI_CPU: &str = "/proc/pressure/cpu";
/// The command that starts the daemon, as the fixes print it: with the configuration's path
/// when doctor was given one.
fn start_command(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("shedder run --config {}", p.display()),
        None => "shedder run --config FILE".into(),
    }
}

/// Capabilities shedder needs: (number, name, what for).
const CAPABILITIES: [(u32, &str, &str); 4] = [
    (39, "CAP_BPF", "loading programs and maps"),
    (
        38,
        "CAP_PERFMON",
        "tracepoints and pointer arithmetic in programs",
    ),
    (12, "CAP_NET_ADMIN", "attaching to interfaces"),
    (
        21,
        "CAP_SYS_ADMIN",
        "BPF statistics, mounting bpffs/tracefs, reading program info",
    ),
];
const CAP_SYS_ADMIN: u32 = 21;

/// Drivers known to have native XDP, used when the kernel cannot tell (before 6.3, which
/// added the netdev family's `xdp-features`). A heuristic: the list is not exhaustive.
const NATIVE_XDP_DRIVERS: &[&str] = &[
    "veth",
    "virtio_net",
    "tun",
    "bonding",
    "i40e",
    "ice",
    "ixgbe",
    "ixgbevf",
    "igb",
    "igc",
    "mlx4_en",
    "mlx5_core",
    "bnxt_en",
    "nfp",
    "qede",
    "ena",
    "gve",
    "hv_netvsc",
    "sfc",
    "mvneta",
    "mvpp2",
    "fec",
];

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One check: what was looked at, the verdict, what was found, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Run every check. With a configuration (and the path it was read from, for the fixes),
/// its interfaces, cgroups, pin directory and control socket are checked; without, the
/// defaults.
pub fn run(config: Option<&Config>, path: Option<&Path>) -> Vec<Check> {
    let start = start_command(path);
    let default_daemon = Daemon::default();
    let daemon = config.map_or(&default_daemon, |c| &c.daemon);
    let release = kernel_release();
    let kernel = release.as_deref().ok().and_then(parse_kernel_release);
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_cap_eff(&s));
    let can_mount = caps.is_some_and(|c| has_cap(c, CAP_SYS_ADMIN));
    let mounts = std::fs::read_to_string("/proc/mounts").map(|t| parse_mounts(&t));

    let mut out = vec![
        check_kernel(release.as_deref().map_err(|e| e.to_string())),
        check_btf(Path::new(BTF_VMLINUX).exists()),
        check_capabilities(caps),
    ];
    let tracefs_mounted = match &mounts {
        Ok(m) => {
            out.push(check_mount(m, MountSpec::BPFFS, can_mount));
            out.push(check_mount(m, MountSpec::TRACEFS, can_mount));
            is_mounted(m, MountSpec::TRACEFS.dir, MountSpec::TRACEFS.fstype)
        }
        Err(e) => {
            for spec in [MountSpec::BPFFS, MountSpec::TRACEFS] {
                out.push(Check::fail(
                    spec.name,
                    format!("cannot read /proc/mounts: {e}"),
                    "mount procfs at /proc",
                ));
            }
            false
        }
    };
    out.push(check_tracepoints(tracefs_mounted));
    out.push(check_jit(
        std::fs::read_to_string(BPF_JIT_SYSCTL),
        in_initial_netns(),
    ));
    out.push(check_bpf_stats(
        std::fs::read_to_string(BPF_STATS_SYSCTL),
        can_mount,
    ));
    if let Some(check) = check_memlock(kernel, memlock_limit()) {
        out.push(check);
    }
    out.extend(check_cgroups(config));
    match config {
        None => out.push(Check::ok(
            "config",
            format!(
                "none given: interfaces and cgroups not checked; daemon checked at {}",
                daemon.pin_dir.display()
            ),
        )),
        // Stated in the file (validation refuses no interface otherwise): not a fault.
        Some(cfg) if cfg.daemon.measure_only => out.push(Check::ok(
            "interface",
            "none: daemon.measure_only = true (measures and serves status and metrics, sheds nothing)",
        )),
        Some(cfg) => {
            for iface in &cfg.daemon.interfaces {
                out.extend(check_interface(cfg, iface, &start));
            }
        }
    }
    if let Some(f) = config.and_then(|c| c.fleet.as_ref()) {
        out.push(check_fleet(f));
    }
    let pins = crate::kernel::pins::inspect(&daemon.pin_dir);
    out.push(check_fail_static(&pins, config));
    let pin_path = pins.map_or_else(|_| daemon.pin_dir.clone(), |p| p.path);
    let privileged = caps.is_some_and(|c| missing_capabilities(c).is_empty());
    let (daemon_check, alive) = check_daemon(&pin_path, privileged, &start);
    out.push(daemon_check);
    out.push(check_control_socket(&daemon.control_socket, alive));
    out
}

/// Whether the pins outlive the daemon (fail-static), and what the daemon does if not.
fn check_fail_static(
    pins: &io::Result<crate::kernel::pins::PinDir>,
    config: Option<&Config>,
) -> Check {
    const NAME: &str = "fail-static";
    let pins = match pins {
        Ok(p) => p,
        Err(e) => {
            return Check::warn(
                NAME,
                format!("cannot tell where the pins would go: {e}"),
                "run doctor as root",
            );
        }
    };
    let enforcing = config.is_none_or(Config::enforces);
    let required = config.is_none_or(|c| c.daemon.fail_static);
    match &pins.durability {
        crate::kernel::pins::Durability::Private(_) if required && enforcing => Check::fail(
            NAME,
            format!(
                "pins under {}: the daemon refuses to start here",
                pins.describe()
            ),
            "start it in the host's mount namespace (`nsenter --net=/var/run/netns/NAME`, not `ip netns exec`; in a container, bind-mount the host's /sys/fs/bpf), or set daemon.fail_static = false",
        ),
        crate::kernel::pins::Durability::Private(_) => Check::warn(
            NAME,
            format!(
                "pins under {}: a daemon that dies takes its programs with it (fail_static = false or nothing enforced)",
                pins.describe()
            ),
            "start it in the host's mount namespace to keep protection after a crash",
        ),
        _ => Check::ok(
            NAME,
            format!(
                "pins under {}: a daemon that dies leaves its programs attached (last limits, then the fallback limits)",
                pins.describe()
            ),
        ),
    }
}

/// Fleet mode: etcd answers at the configured endpoints, with the configured credentials.
fn check_fleet(f: &crate::config::Fleet) -> Check {
    match crate::fleet::probe(f) {
        Ok(detail) => Check::ok("fleet", detail),
        Err(e) => Check::fail(
            "fleet",
            format!("etcd at {}: {e:#}", f.endpoints.join(",")),
            "start etcd or fix fleet.endpoints (and the TLS/auth files); without etcd the daemon \
             runs on each shared service's static share (global_limit × safety / max_nodes)",
        ),
    }
}

/// The human table: one line per check, the status first; a `fix:` line under each check
/// that is not ok; a summary last.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let label = match c.status {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        let _ = writeln!(out, "{label:<4}  {:<width$}  {}", c.name, c.detail);
        if let (Some(fix), false) = (&c.fix, c.status == Status::Ok) {
            let _ = writeln!(out, "{:indent$}fix: {fix}", "", indent = 4 + 2 + width + 2);
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let (warn, fail) = (count(Status::Warn), count(Status::Fail));
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let _ = writeln!(
        out,
        "{}: {} ok, {}, {}",
        plural(checks.len(), "check"),
        count(Status::Ok),
        plural(warn, "warning"),
        plural(fail, "failure"),
    );
    out
}

/// 0 when nothing failed (warnings allowed), 1 otherwise.
pub fn exit_code(checks: &[Check]) -> u8 {
    u8::from(checks.iter().any(|c| c.status == Status::Fail))
}

// ---------------------------------------------------------------------------------------
// Kernel

fn check_kernel(release: Result<&str, String>) -> Check {
    const NAME: &str = "kernel";
    let release = match release {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("uname failed: {e}"),
                "cannot tell the kernel version",
            );
        }
    };
    let Some(v) = parse_kernel_release(release) else {
        return Check::warn(
            NAME,
            format!("{release}: cannot parse the version"),
            format!("shedder needs Linux {MIN_KERNEL} or newer; check it by hand"),
        );
    };
    if v < MIN_KERNEL {
        Check::fail(
            NAME,
            format!(
                "{release}: older than {MIN_KERNEL}, the oldest kernel shedder is tested on \
                 (tested: {TESTED_KERNEL}; see docs/kernels.md)"
            ),
            format!("run a kernel ≥ {MIN_KERNEL}"),
        )
    } else {
        Check::ok(NAME, format!("{release} (tested: {TESTED_KERNEL})"))
    }
}

fn check_btf(present: bool) -> Check {
    if present {
        Check::ok("btf", BTF_VMLINUX)
    } else {
        Check::warn(
            "btf",
            format!(
                "{BTF_VMLINUX} missing: shedder does not need CO-RE, but verifier logs and bpftool are far better with it"
            ),
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        )
    }
}

fn check_memlock(kernel: Option<KernelVersion>, limit: Option<u64>) -> Option<Check> {
    let v = kernel?;
    let limit = limit?;
    (v < MEMCG_BPF_KERNEL && limit < MIN_MEMLOCK_BYTES).then(|| {
        Check::warn(
            "memlock",
            format!(
                "RLIMIT_MEMLOCK is {} KiB and kernel {v} charges BPF maps to it: loading may fail with EPERM",
                limit >> 10
            ),
            "LimitMEMLOCK=infinity in the systemd unit, or `ulimit -l unlimited` before starting shedder",
        )
    })
}

/// The soft locked-memory limit in bytes (`u64::MAX` when unlimited).
fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return None;
    }
    // RLIM_INFINITY is u64::MAX.
    Some(rl.rlim_cur)
}

// ---------------------------------------------------------------------------------------
// Capabilities

/// The `CapEff` mask of a `/proc/<pid>/status` text.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let hex = line.strip_prefix("CapEff:")?.trim();
        u64::from_str_radix(hex, 16).ok()
    })
}

fn has_cap(mask: u64, cap: u32) -> bool {
    mask & (1u64 << cap) != 0
}

/// Capabilities of [`CAPABILITIES`] missing from `mask`. CAP_SYS_ADMIN stands in for
/// CAP_BPF and CAP_PERFMON (the kernel accepts either).
pub fn missing_capabilities(mask: u64) -> Vec<&'static str> {
    let admin = has_cap(mask, CAP_SYS_ADMIN);
    CAPABILITIES
        .iter()
        .filter(|&&(cap, name, _)| {
            let implied = admin && matches!(name, "CAP_BPF" | "CAP_PERFMON");
            !has_cap(mask, cap) && !implied
        })
        .map(|&(_, name, _)| name)
        .collect()
}

fn check_capabilities(cap_eff: Option<u64>) -> Check {
    const NAME: &str = "capabilities";
    let all: Vec<&str> = CAPABILITIES.iter().map(|c| c.1).collect();
    let unit_fix = format!(
        "run as root, or in the systemd unit: AmbientCapabilities={}",
        all.join(" ")
    );
    let Some(mask) = cap_eff else {
        return Check::fail(NAME, "cannot read CapEff from /proc/self/status", unit_fix);
    };
    let missing = missing_capabilities(mask);
    if missing.is_empty() {
        return Check::ok(NAME, format!("{} (effective)", all.join(" ")));
    }
    let why: Vec<String> = CAPABILITIES
        .iter()
        .filter(|c| missing.contains(&c.1))
        .map(|&(_, name, what)| format!("{name} ({what})"))
        .collect();
    Check::fail(NAME, format!("missing {}", why.join(", ")), unit_fix)
}

// ---------------------------------------------------------------------------------------
// Pseudo-filesystems

/// `(mount point, filesystem type)` of each line of a `/proc/mounts` text.
pub fn parse_mounts(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            Some((unescape_mount(dir), fstype.to_string()))
        })
        .collect()
}

/// `/proc/mounts` writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = bytes.get(i + 1..i + 4)
            && oct.iter().all(|b| (b'0'..=b'7').contains(b))
            && let Ok(v) = u8::try_from(oct.iter().fold(0u32, |a, b| a * 8 + u32::from(b - b'0')))
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn is_mounted(mounts: &[(String, String)], dir: &str, fstype: &str) -> bool {
    mounts.iter().any(|(d, t)| d == dir && t == fstype)
}

#[derive(Clone, Copy)]
struct MountSpec {
    name: &'static str,
    dir: &'static str,
    fstype: &'static str,
    needed_for: &'static str,
}

impl MountSpec {
    const BPFFS: Self = Self {
        name: "bpffs",
        dir: crate::kernel::sysfs::BPFFS,
        fstype: "bpf",
        needed_for: "pinned maps and links",
    };
    const TRACEFS: Self = Self {
        name: "tracefs",
        dir: crate::kernel::sysfs::TRACEFS,
        fstype: "tracefs",
        needed_for: "the sock tracepoints",
    };
}

fn check_mount(mounts: &[(String, String)], spec: MountSpec, can_mount: bool) -> Check {
    let MountSpec {
        name,
        dir,
        fstype,
        needed_for,
    } = spec;
    let fix = format!("mount -t {fstype} {fstype} {dir}");
    if is_mounted(mounts, dir, fstype) {
        Check::ok(name, format!("mounted at {dir}"))
    } else if let Some((_, other)) = mounts.iter().rev().find(|(d, _)| d == dir) {
        Check::fail(
            name,
            format!("{dir} holds a {other} filesystem, not {fstype} ({needed_for})"),
            format!("umount {dir}; {fix}"),
        )
    } else if can_mount {
        Check::warn(
            name,
            format!("not mounted at {dir} ({needed_for}); shedder mounts it when it starts"),
            fix,
        )
    } else {
        Check::fail(
            name,
            format!(
                "not mounted at {dir} ({needed_for}), and shedder cannot mount it without CAP_SYS_ADMIN"
            ),
            fix,
        )
    }
}

fn check_tracepoints(tracefs_mounted: bool) -> Check {
    const NAME: &str = "tracepoints";
    if !tracefs_mounted {
        return Check::warn(
            NAME,
            "not checked: tracefs is not mounted",
            format!(
                "mount -t tracefs tracefs {} and run doctor again",
                crate::kernel::sysfs::TRACEFS
            ),
        );
    }
    let events = format!("{}/events/sock", crate::kernel::sysfs::TRACEFS);
    if let Err(e) = std::fs::read_dir(&events)
        && e.kind() == io::ErrorKind::PermissionDenied
    {
        return Check::warn(
            NAME,
            format!("not checked: {events}: {e}"),
            "run doctor as root",
        );
    }
    match crate::kernel::check_tracepoint_formats() {
        Ok(missing) => match crate::kernel::missing_tracepoints_note(&missing) {
            None => Check::ok(
                NAME,
                "sock:inet_sock_set_state, sock_recv_length, sock_send_length have the layout shedder reads",
            ),
            Some(note) => Check::warn(
                NAME,
                note,
                format!(
                    "for latency-driven limits run Linux ≥ {}",
                    shedder_common::programs::LATENCY_TRACEPOINTS_SINCE
                ),
            ),
        },
        Err(e) => Check::fail(
            NAME,
            e,
            format!(
                "without these tracepoints shedder cannot count connections: use a kernel ≥ {MIN_KERNEL} with CONFIG_TRACEPOINTS=y, or report this kernel's layout"
            ),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// BPF settings

/// Whether this process is in the initial network namespace (`None`: cannot tell), from a
/// sysctl registered there only (`net.core.netdev_max_backlog`, like `bpf_jit_enable`).
fn in_initial_netns() -> Option<bool> {
    let core = Path::new("/proc/sys/net/core");
    core.is_dir()
        .then(|| core.join("netdev_max_backlog").exists())
}

fn check_jit(sysctl: io::Result<String>, initial_netns: Option<bool>) -> Check {
    const NAME: &str = "bpf jit";
    let fix = "sysctl -w net.core.bpf_jit_enable=1";
    if let (Err(e), Some(false)) = (&sysctl, initial_netns)
        && e.kind() == io::ErrorKind::NotFound
    {
        return Check::warn(
            NAME,
            "not checked: net.core.bpf_jit_enable exists only in the initial network namespace",
            "run doctor in the initial network namespace to check it",
        );
    }
    match sysctl.as_deref().map(str::trim) {
        Ok("1") => Check::ok(NAME, "enabled"),
        Ok("2") => Check::warn(
            NAME,
            "enabled with debug output to the kernel log (bpf_jit_enable=2)",
            fix,
        ),
        Ok("0") => Check::warn(
            NAME,
            "disabled: programs run interpreted, several times slower",
            fix,
        ),
        Ok(other) => Check::warn(NAME, format!("bpf_jit_enable is `{other}`"), fix),
        Err(e) => Check::warn(
            NAME,
            format!("cannot read {BPF_JIT_SYSCTL}: {e}"),
            "a kernel with CONFIG_BPF_JIT=y",
        ),
    }
}

fn check_bpf_stats(sysctl: io::Result<String>, can_enable: bool) -> Check {
    const NAME: &str = "bpf stats";
    match sysctl {
        Ok(v) if v.trim() == "1" => Check::ok(NAME, "enabled (kernel.bpf_stats_enabled=1)"),
        Ok(_) if can_enable => Check::ok(
            NAME,
            "available: the daemon turns them on with BPF_ENABLE_STATS while it runs",
        ),
        Ok(_) => Check::warn(
            NAME,
            "available, but BPF_ENABLE_STATS needs CAP_SYS_ADMIN: no per-program cost metric",
            "grant CAP_SYS_ADMIN, or sysctl -w kernel.bpf_stats_enabled=1",
        ),
        Err(e) => Check::warn(
            NAME,
            format!("{BPF_STATS_SYSCTL}: {e}: no per-program cost metric"),
            "a kernel ≥ 5.8 (BPF run-time statistics)",
        ),
    }
}

// ---------------------------------------------------------------------------------------
// cgroups and PSI

fn check_cgroups(config: Option<&Config>) -> Vec<Check> {
    let services: Vec<(&str, &str)> = config
        .map(|c| {
            c.services
                .iter()
                .filter_map(|s| Some((s.name.as_str(), s.cgroup.as_deref()?)))
                .collect()
        })
        .unwrap_or_default();
    let needed = !services.is_empty();
    let mut out = Vec::new();
    let mount = crate::signals::psi::cgroup2_mount();
    out.push(match &mount {
        Ok(m) => {
            let hybrid = std::fs::read_to_string("/proc/mounts")
                .map(|t| parse_mounts(&t).iter().any(|(_, t)| t == "cgroup"))
                .unwrap_or(false);
            let note = if hybrid {
                " (hybrid: v1 controllers mounted too)"
            } else {
                ""
            };
            Check::ok("cgroup v2", format!("mounted at {}{note}", m.display()))
        }
        Err(e) => {
            let detail = format!("{e}: cgroup pressure and throttling signals unavailable");
            let fix = "mount -t cgroup2 none /sys/fs/cgroup (or boot with systemd.unified_cgroup_hierarchy=1)";
            if needed {
                Check::fail("cgroup v2", detail, fix)
            } else {
                Check::warn("cgroup v2", detail, fix)
            }
        }
    });
    let psi = std::fs::read_to_string(PSI_CPU);
    out.push(match &psi {
        Ok(_) => Check::ok("psi", "pressure stall information enabled"),
        Err(e) => {
            let detail = format!("{PSI_CPU}: {e}: no CPU pressure signal");
            let fix = "boot with psi=1 (kernel with CONFIG_PSI=y)";
            if needed {
                Check::fail("psi", detail, fix)
            } else {
                Check::warn("psi", detail, fix)
            }
        }
    });
    if let Ok(mount) = &mount {
        for (service, cgroup) in services {
            out.push(check_service_cgroup(
                service,
                &mount.join(cgroup),
                psi.is_ok(),
            ));
        }
    }
    out
}

fn check_service_cgroup(service: &str, dir: &Path, psi: bool) -> Check {
    const NAME: &str = "cgroup";
    if !dir.is_dir() {
        return Check::fail(
            NAME,
            format!("{service}: {} does not exist", dir.display()),
            format!(
                "set service.cgroup of `{service}` to its cgroup relative to the cgroup v2 mount (for a systemd unit: system.slice/<unit>.service; `systemctl status <unit>` shows it)"
            ),
        );
    }
    let unreadable: Vec<String> = ["cpu", "memory", "io"]
        .iter()
        .filter_map(|r| {
            let file = format!("{r}.pressure");
            std::fs::read_to_string(dir.join(&file))
                .err()
                .map(|e| format!("{file} ({e})"))
        })
        .collect();
    if !unreadable.is_empty() {
        let fix = if psi {
            "run doctor as the daemon's user; check the cgroup's files are readable".to_string()
        } else {
            "boot with psi=1 (kernel with CONFIG_PSI=y)".to_string()
        };
        return Check::fail(
            NAME,
            format!("{service}: cannot read {}", unreadable.join(", ")),
            fix,
        );
    }
    let throttling = std::fs::read_to_string(dir.join("cpu.stat"))
        .ok()
        .and_then(|t| crate::signals::psi::parse_throttling(&t));
    if throttling.is_none() {
        return Check::warn(
            NAME,
            format!(
                "{service}: {}: pressure ok, but the cpu controller is not enabled for this cgroup in the v2 hierarchy (hybrid host?): CPU throttling is not reported",
                dir.display()
            ),
            "enable it on every parent: echo +cpu > <parent>/cgroup.subtree_control (a hybrid host binds cpu to v1: boot with systemd.unified_cgroup_hierarchy=1)",
        );
    }
    Check::ok(
        NAME,
        format!("{service}: {}: pressure and throttling", dir.display()),
    )
}

// ---------------------------------------------------------------------------------------
// Interfaces

use crate::kernel::netdev::XDP_ACT_BASIC;

fn check_interface(cfg: &Config, iface: &str, start: &str) -> Vec<Check> {
    let Some(ifindex) = ifindex(iface) else {
        return vec![Check::fail(
            "interface",
            format!("{iface}: no such interface in this network namespace"),
            "fix daemon.interfaces (`ip link` lists the interfaces), or run doctor in the daemon's network namespace",
        )];
    };
    let driver = crate::kernel::netdev::driver(iface).unwrap_or_else(|| "virtual".to_string());
    let features = crate::kernel::netdev::netlink::xdp_features(ifindex).ok();
    let native = match features {
        Some(f) => Some(f & XDP_ACT_BASIC != 0),
        None if NATIVE_XDP_DRIVERS.contains(&driver.as_str()) => Some(true),
        None => None,
    };
    let support = match (native, features.is_some()) {
        (Some(true), true) => "native XDP",
        (Some(true), false) => "native XDP likely",
        (Some(false), _) => "no native XDP",
        (None, _) => "native XDP unknown",
    };
    let head = format!("{iface}: {driver}, {support}");
    let mut out = Vec::new();
    let tcx = running_kernel().map(|v| v >= TCX_KERNEL);
    let facts = crate::kernel::netdev::Facts {
        driver: Some(driver.clone()),
        xdp_features: features,
    };
    // The mode the daemon would choose so that the configured action is delivered.
    let chosen = crate::kernel::netdev::choose(
        iface,
        cfg.daemon.attach,
        &facts,
        cfg.sends_replies(),
        tcx != Some(false),
    );
    let attach = match &chosen {
        Ok((mode, _)) => *mode,
        Err(_) => cfg.daemon.attach,
    };
    let asked = cfg.daemon.attach.as_str();
    out.push(match (&chosen, attach, native) {
        (Err(why), _, _) => Check::fail(
            "interface",
            format!("{head}; {why}"),
            "set daemon.attach = \"auto\" or \"tc\" (or action = \"drop\")",
        ),
        (Ok(_), Attach::Tc, _) if tcx == Some(false) => Check::fail(
            "interface",
            format!(
                "{head}; attach = tc needs tcx (Linux {TCX_KERNEL} and later): this kernel \
                 can attach TC programs only through netlink, which shedder does not manage"
            ),
            "set daemon.attach = \"native\" or \"generic\" (XDP) on this kernel",
        ),
        (Ok((_, Some(_))), Attach::Tc | Attach::Generic, _) if asked == "auto" => Check::ok(
            "interface",
            format!(
                "{head}; attach = auto → {} (action = rst on a veth: native XDP_TX would depend on the peer)",
                if attach == Attach::Tc { "tc" } else { "generic XDP" }
            ),
        ),
        (Ok(_), Attach::Tc, _) => Check::ok("interface", format!("{head}; attach = tc")),
        (Ok(_), Attach::Generic, _) => Check::ok("interface", format!("{head}; attach = generic")),
        (Ok(_), Attach::Native, Some(false)) => Check::fail(
            "interface",
            format!("{head}; attach = native cannot work"),
            "set daemon.attach = \"auto\" (generic XDP fallback) or \"tc\"",
        ),
        (Ok(_), Attach::Native, None) => Check::warn(
            "interface",
            format!("{head}; attach = native may fail"),
            "if attaching fails, set daemon.attach = \"auto\" or \"tc\"",
        ),
        (Ok((_, Some(note))), Attach::Native, Some(true)) => Check::warn(
            "interface",
            format!("{head}; attach = native: {note}"),
            "set daemon.attach = \"auto\" (tc on a veth with rst)",
        ),
        (Ok(_), Attach::Native, Some(true)) => {
            Check::ok("interface", format!("{head}; attach = native"))
        }
        (Ok(_), Attach::Auto, Some(false)) => {
            Check::ok("interface", format!("{head}; attach = auto → generic XDP"))
        }
        (Ok(_), Attach::Auto, _) => Check::ok("interface", format!("{head}; attach = auto → native")),
    });
    let xdp = crate::kernel::netdev::netlink::xdp_attachment(ifindex);
    let ours = match &xdp {
        Ok(Some(a)) => {
            let name = program_name(a.prog_id);
            let ours = name.as_deref() == Some(shedder_common::programs::XDP);
            Some((*a, name, ours))
        }
        _ => None,
    };
    out.push(check_attachment(cfg, iface, &xdp, ours.as_ref(), start));
    // What runs now: shedder's native XDP program on a veth whose peer takes no XDP_TX
    // frames drops every reset it sends.
    if cfg.sends_replies()
        && matches!(&ours, Some((a, _, true)) if a.mode == crate::kernel::netdev::netlink::XDP_ATTACHED_DRV)
        && let Some(problem) = facts.reset_problem(iface)
    {
        out.push(Check::fail(
            "resets",
            problem,
            format!(
                "shedder detach, then {start} with daemon.attach = \"auto\" (tc on a veth), or give the peer an XDP program"
            ),
        ));
    }
    match crate::kernel::netdev::xdp_tx_errors(iface) {
        Ok(Some(n)) if n > 0 => out.push(Check::warn(
            "resets",
            format!(
                "{iface}: the driver counts {n} frames XDP_TX failed to send (xdp_tx_errors): resets that never reached a client, now or earlier"
            ),
            "watch shedder_xdp_tx_errors_total; on a veth use daemon.attach = \"auto\" or \"tc\"",
        )),
        _ => {}
    }
    out
}

/// shedder's attachment to `iface`: the pinned link against the XDP program the kernel
/// reports (`attached`: the attachment, the program's name, whether it is shedder's).
fn check_attachment(
    cfg: &Config,
    iface: &str,
    xdp: &io::Result<Option<crate::kernel::netdev::netlink::XdpAttachment>>,
    attached: Option<&(
        crate::kernel::netdev::netlink::XdpAttachment,
        Option<String>,
        bool,
    )>,
    start: &str,
) -> Check {
    const NAME: &str = "attachment";
    let pin = cfg.daemon.pin_dir.join("links").join(iface);
    let pinned = match std::fs::metadata(&pin) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Check::warn(
                NAME,
                format!("{iface}: cannot look for {}: {e}", pin.display()),
                "run doctor as root",
            );
        }
        Err(_) => false,
    };
    let is_shedder = attached.is_some_and(|a| a.2);
    let prog = attached.map(|(a, name, _)| (a, name.clone()));
    let describe = |(a, name): &(
        &crate::kernel::netdev::netlink::XdpAttachment,
        Option<String>,
    )| {
        format!(
            "{} (prog id {}, {})",
            a.mode_name(),
            a.prog_id,
            name.as_deref().unwrap_or("name unknown")
        )
    };
    match (pinned, &prog, cfg.daemon.attach) {
        (true, Some(p), _) if is_shedder => Check::ok(
            NAME,
            format!("{iface}: {}, link pinned at {}", describe(p), pin.display()),
        ),
        (true, None, Attach::Tc) => Check::ok(
            NAME,
            format!("{iface}: tc link pinned at {}", pin.display()),
        ),
        (true, Some(p), _) => Check::warn(
            NAME,
            format!(
                "{iface}: link pinned at {}, but the XDP program attached is {}",
                pin.display(),
                describe(p)
            ),
            format!(
                "bpftool net show dev {iface}; if stale: shedder detach --pin-dir {}, then {start}",
                cfg.daemon.pin_dir.display()
            ),
        ),
        (true, None, _) => Check::warn(
            NAME,
            format!(
                "{iface}: link pinned at {} but no XDP program attached (interface re-created, or attached with tc)",
                pin.display()
            ),
            format!(
                "shedder detach --pin-dir {}, then {start}",
                cfg.daemon.pin_dir.display()
            ),
        ),
        (false, Some(p), _) if is_shedder => Check::warn(
            NAME,
            format!(
                "{iface}: {} attached but not pinned under {}",
                describe(p),
                cfg.daemon.pin_dir.display()
            ),
            "another pin directory or a process holds it: check daemon.pin_dir",
        ),
        (false, Some(p), Attach::Tc) => Check::warn(
            NAME,
            format!(
                "{iface}: not attached; another XDP program runs before shedder's TC program: {}",
                describe(p)
            ),
            format!("bpftool net show dev {iface} shows it; then {start}"),
        ),
        (false, Some(p), _) => Check::fail(
            NAME,
            format!(
                "{iface}: another XDP program is attached, shedder cannot attach next to it: {}",
                describe(p)
            ),
            format!(
                "find its owner (`bpftool net show dev {iface}`) and remove it, or set daemon.attach = \"tc\""
            ),
        ),
        (false, None, _) => {
            let note = match xdp {
                Err(e) => format!(" (XDP state unknown: {e})"),
                Ok(_) => String::new(),
            };
            Check::warn(
                NAME,
                format!("{iface}: shedder is not attached{note}"),
                start,
            )
        }
    }
}

/// The name of the loaded BPF program `id`.
fn program_name(id: u32) -> Option<String> {
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == id)
        .and_then(|p| p.name_as_str().map(str::to_string))
}

// ---------------------------------------------------------------------------------------
// The daemon

/// Check the pinned state and the heartbeat; also says whether a daemon is alive.
fn check_daemon(pin_dir: &Path, privileged: bool, start: &str) -> (Check, bool) {
    use crate::kernel::MapReader;
    const NAME: &str = "daemon";
    let maps = pin_dir.join("maps");
    if let Err(e) = std::fs::metadata(&maps)
        && e.kind() == io::ErrorKind::PermissionDenied
    {
        return (
            Check::warn(
                NAME,
                format!("cannot look under {}: {e}", pin_dir.display()),
                "run doctor as root",
            ),
            false,
        );
    }
    if !maps.is_dir() {
        return (
            Check::warn(
                NAME,
                format!(
                    "shedder is not attached: nothing pinned under {}",
                    pin_dir.display()
                ),
                start,
            ),
            false,
        );
    }
    let reset = if privileged {
        format!(
            "if they come from another shedder version: shedder detach --pin-dir {}, then {start}",
            pin_dir.display()
        )
    } else {
        "run doctor as root (reading pinned maps needs CAP_BPF)".to_string()
    };
    let globals = match crate::kernel::PinnedMaps::open(pin_dir).and_then(|m| m.globals()) {
        Ok(g) => g,
        Err(e) => {
            return (
                Check::fail(
                    NAME,
                    format!("cannot read the maps under {}: {e}", pin_dir.display()),
                    reset,
                ),
                false,
            );
        }
    };
    let links = describe_links(&pinned_links(pin_dir));
    let now = current_jiffies();
    let verdict = heartbeat_verdict(
        globals.heartbeat_jiffies,
        globals.heartbeat_timeout_jiffies,
        now.unwrap_or(globals.clock_jiffies),
        globals.hz,
    );
    let caveat = if now.is_none() {
        " (as of the daemon's last clock reading: /proc/timer_list unreadable)"
    } else {
        ""
    };
    match verdict {
        Heartbeat::Never => (
            Check::warn(
                NAME,
                format!(
                    "attached ({links}), no daemon has ever stamped the heartbeat: fallback limits in force"
                ),
                start,
            ),
            false,
        ),
        Heartbeat::Stale { age, timeout } => (
            Check::warn(
                NAME,
                format!(
                    "no daemon: heartbeat {age} old{caveat}, timeout {timeout}: fallback limits in force ({links})"
                ),
                start,
            ),
            false,
        ),
        Heartbeat::Fresh { age, timeout } => (
            Check::ok(
                NAME,
                format!("alive: heartbeat {age} ago{caveat}, timeout {timeout} ({links})"),
            ),
            true,
        ),
    }
}

/// `links eth0 eth1 + 3 tracepoints`.
fn describe_links(names: &[String]) -> String {
    let (tracepoints, ifaces): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.starts_with("tp-"));
    let mut parts: Vec<String> = ifaces.iter().map(|s| s.to_string()).collect();
    if !tracepoints.is_empty() {
        parts.push(format!("+ {} tracepoints", tracepoints.len()));
    }
    if parts.is_empty() {
        "no links pinned".to_string()
    } else {
        format!("links {}", parts.join(" "))
    }
}

fn pinned_links(pin_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(pin_dir.join("links"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The heartbeat's state, ages rendered in ms (or jiffies when HZ is unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heartbeat {
    Never,
    Stale { age: String, timeout: String },
    Fresh { age: String, timeout: String },
}

/// Judge a heartbeat stamped at `heartbeat` jiffies with the kernel at `now`, as the packet
/// path does: stale when older than `timeout` jiffies, or never stamped.
pub fn heartbeat_verdict(heartbeat: u64, timeout: u64, now: u64, hz: u32) -> Heartbeat {
    if heartbeat == 0 {
        return Heartbeat::Never;
    }
    let show = |jiffies: u64| {
        if hz == 0 {
            format!("{jiffies} jiffies")
        } else {
            format!("{} ms", jiffies.saturating_mul(1000) / hz as u64)
        }
    };
    let age = now.saturating_sub(heartbeat);
    let (age_s, timeout_s) = (show(age), show(timeout));
    if age > timeout {
        Heartbeat::Stale {
            age: age_s,
            timeout: timeout_s,
        }
    } else {
        Heartbeat::Fresh {
            age: age_s,
            timeout: timeout_s,
        }
    }
}

/// The kernel's jiffies now, from `/proc/timer_list` (root only).
fn current_jiffies() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/timer_list").ok()?;
    parse_timer_list_jiffies(&text)
}

fn parse_timer_list_jiffies(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("jiffies:")?.trim().parse().ok())
}

fn check_control_socket(path: &Path, daemon_alive: bool) -> Check {
    use std::os::unix::fs::FileTypeExt;
    const NAME: &str = "control socket";
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => Check::ok(NAME, format!("{shown}: the daemon listens")),
            Err(e) if daemon_alive => Check::warn(
                NAME,
                format!("{shown}: the daemon runs but nobody listens: {e}"),
                "check daemon.control_socket matches the running daemon's configuration",
            ),
            Err(_) => Check::ok(
                NAME,
                format!("{shown}: stale (left by a daemon that is gone)"),
            ),
        },
        Ok(_) => Check::warn(
            NAME,
            format!("{shown} exists but is not a socket"),
            format!("remove {shown} and restart the daemon, or set daemon.control_socket"),
        ),
        Err(_) if daemon_alive => Check::warn(
            NAME,
            format!("the daemon runs but {shown} does not exist"),
            "check daemon.control_socket matches the running daemon's configuration (and that its directory is writable)",
        ),
        Err(_) => Check::ok(NAME, format!("{shown} absent (no daemon)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_thresholds() {
        let status = |r: &str| check_kernel(Ok(r)).status;
        assert_eq!(status("4.19.0"), Status::Fail);
        assert_eq!(status("5.10.200"), Status::Fail);
        assert_eq!(status("5.14.21"), Status::Fail);
        assert_eq!(status("5.15.0-91-generic"), Status::Fail);
        assert_eq!(status("6.0.19"), Status::Fail);
        assert_eq!(status("6.1.0-28-amd64"), Status::Ok);
        assert_eq!(status("6.12.9"), Status::Ok);
        assert_eq!(status("6.18.44-fc-v782"), Status::Ok);
        assert_eq!(status("7.0"), Status::Ok);
        assert_eq!(status("weird"), Status::Warn);
        assert_eq!(check_kernel(Err("EFAULT".into())).status, Status::Fail);
        assert!(check_kernel(Ok("5.10.0")).fix.is_some());
    }

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tcat\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n";
        let mask = parse_cap_eff(status).expect("CapEff");
        assert_eq!(mask, 0x000001fffeffffff);
        assert!(missing_capabilities(mask).is_empty());
        assert_eq!(check_capabilities(Some(mask)).status, Status::Ok);
        assert_eq!(parse_cap_eff("Name:\tcat\n"), None);
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn missing_capabilities_are_listed() {
        assert_eq!(
            missing_capabilities(0),
            ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"]
        );
        // CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON.
        let admin_net = (1 << 21) | (1 << 12);
        assert!(missing_capabilities(admin_net).is_empty());
        let bpf_only = (1u64 << 39) | (1 << 38) | (1 << 12);
        assert_eq!(missing_capabilities(bpf_only), ["CAP_SYS_ADMIN"]);
        let c = check_capabilities(Some(bpf_only));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("CAP_SYS_ADMIN"), "{}", c.detail);
        assert!(
            c.fix.as_deref().unwrap().contains("AmbientCapabilities="),
            "{c:?}"
        );
        assert_eq!(check_capabilities(None).status, Status::Fail);
    }

    const MOUNTS: &str = "\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
bpf /sys/fs/bpf bpf rw,relatime 0 0
none /mnt/with\\040space tmpfs rw 0 0
";

    #[test]
    fn parses_mounts() {
        let m = parse_mounts(MOUNTS);
        assert_eq!(m.len(), 5);
        assert!(is_mounted(&m, "/sys/fs/bpf", "bpf"));
        assert!(!is_mounted(&m, "/sys/kernel/tracing", "tracefs"));
        assert!(!is_mounted(&m, "/sys/fs/bpf", "tmpfs"));
        assert!(is_mounted(&m, "/mnt/with space", "tmpfs"));
        assert_eq!(unescape_mount("a\\134b"), "a\\b");
        assert_eq!(unescape_mount("trailing\\"), "trailing\\");
        assert_eq!(unescape_mount("short\\04"), "short\\04");
    }

    #[test]
    fn mount_verdicts() {
        let m = parse_mounts(MOUNTS);
        assert_eq!(check_mount(&m, MountSpec::BPFFS, false).status, Status::Ok);
        let t = check_mount(&m, MountSpec::TRACEFS, true);
        assert_eq!(t.status, Status::Warn);
        assert_eq!(
            t.fix.as_deref(),
            Some("mount -t tracefs tracefs /sys/kernel/tracing")
        );
        assert_eq!(
            check_mount(&m, MountSpec::TRACEFS, false).status,
            Status::Fail
        );
        let shadowed = parse_mounts("tmpfs /sys/fs/bpf tmpfs rw 0 0\n");
        assert_eq!(
            check_mount(&shadowed, MountSpec::BPFFS, true).status,
            Status::Fail
        );
    }

    #[test]
    fn sysctl_verdicts() {
        assert_eq!(check_jit(Ok("1\n".into()), Some(true)).status, Status::Ok);
        assert_eq!(check_jit(Ok("0\n".into()), Some(true)).status, Status::Warn);
        assert_eq!(check_jit(Ok("2\n".into()), Some(true)).status, Status::Warn);
        assert_eq!(
            check_jit(Err(io::ErrorKind::NotFound.into()), Some(true)).status,
            Status::Warn
        );
        let elsewhere = check_jit(Err(io::ErrorKind::NotFound.into()), Some(false));
        assert!(
            elsewhere.detail.contains("initial network namespace"),
            "{elsewhere:?}"
        );
        assert_eq!(check_bpf_stats(Ok("0\n".into()), true).status, Status::Ok);
        assert_eq!(
            check_bpf_stats(Ok("0\n".into()), false).status,
            Status::Warn
        );
        assert_eq!(check_bpf_stats(Ok("1\n".into()), false).status, Status::Ok);
        assert_eq!(
            check_bpf_stats(Err(io::ErrorKind::NotFound.into()), true).status,
            Status::Warn
        );
    }

    #[test]
    fn memlock_only_matters_before_memcg_accounting() {
        let old = Some(KernelVersion::new(5, 10, 0));
        let new = Some(KernelVersion::new(5, 11, 0));
        assert_eq!(
            check_memlock(old, Some(64 << 10)).map(|c| c.status),
            Some(Status::Warn)
        );
        assert_eq!(check_memlock(old, Some(u64::MAX)), None);
        assert_eq!(check_memlock(new, Some(64 << 10)), None);
        assert_eq!(check_memlock(None, Some(0)), None);
    }

    #[test]
    fn heartbeat_ages() {
        assert_eq!(heartbeat_verdict(0, 750, 1000, 250), Heartbeat::Never);
        assert_eq!(
            heartbeat_verdict(1000, 750, 1050, 250),
            Heartbeat::Fresh {
                age: "200 ms".into(),
                timeout: "3000 ms".into()
            }
        );
        assert_eq!(
            heartbeat_verdict(1000, 750, 1751, 250),
            Heartbeat::Stale {
                age: "3004 ms".into(),
                timeout: "3000 ms".into()
            }
        );
        // Exactly the timeout is still fresh, as in the packet path.
        assert!(matches!(
            heartbeat_verdict(1000, 750, 1750, 250),
            Heartbeat::Fresh { .. }
        ));
        // A clock behind the heartbeat is age 0; unknown HZ shows jiffies.
        assert_eq!(
            heartbeat_verdict(1000, 750, 900, 0),
            Heartbeat::Fresh {
                age: "0 jiffies".into(),
                timeout: "750 jiffies".into()
            }
        );
        let names = ["tp-a", "eth0", "tp-b"].map(String::from);
        assert_eq!(describe_links(&names), "links eth0 + 2 tracepoints");
        assert_eq!(describe_links(&[]), "no links pinned");
        assert_eq!(
            parse_timer_list_jiffies("now at 1 nsecs\n\njiffies: 4296587655\n"),
            Some(4296587655)
        );
    }

    fn sample() -> Vec<Check> {
        vec![
            Check::ok("kernel", "6.18.44"),
            Check::warn("btf", "missing", "CONFIG_DEBUG_INFO_BTF=y"),
            Check::fail("capabilities", "missing CAP_BPF", "run as root"),
        ]
    }

    #[test]
    fn renders_an_aligned_table() {
        let text = render(&sample());
        let expected = "\
ok    kernel        6.18.44
WARN  btf           missing
                    fix: CONFIG_DEBUG_INFO_BTF=y
FAIL  capabilities  missing CAP_BPF
                    fix: run as root
3 checks: 1 ok, 1 warning, 1 failure
";
        assert_eq!(text, expected);
        assert_eq!(render(&[]), "0 checks: 0 ok, 0 warnings, 0 failures\n");
    }

    #[test]
    fn exit_codes() {
        let mut checks = sample();
        assert_eq!(exit_code(&checks), 1);
        checks.pop();
        assert_eq!(exit_code(&checks), 0, "warnings are allowed");
        assert_eq!(exit_code(&[]), 0);
    }

    #[test]
    fn serializes_lowercase_status() {
        let json = serde_json::to_string(&sample()[1]).expect("json");
        assert_eq!(
            json,
            r#"{"name":"btf","status":"warn","detail":"missing","fix":"CONFIG_DEBUG_INFO_BTF=y"}"#
        );
    }

    #[test]
    fn run_on_this_machine() {
        let checks = run(None, None);
        print!("{}", render(&checks));
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        for name in [
            "kernel",
            "btf",
            "capabilities",
            "bpffs",
            "tracefs",
            "tracepoints",
            "bpf jit",
            "bpf stats",
            "cgroup v2",
            "psi",
            "config",
            "daemon",
            "control socket",
        ] {
            assert!(names.contains(&name), "no `{name}` check in {names:?}");
        }
        for c in &checks {
            assert!(!c.detail.is_empty(), "{c:?}");
            if c.status == Status::Fail {
                assert!(c.fix.is_some(), "a failure without a fix: {c:?}");
            }
        }
    }

    #[test]
    fn run_with_a_config_reports_what_is_missing() {
        let cfg = Config::parse(
            r#"
[daemon]
interfaces = ["shedder-nope0"]
pin_dir = "/sys/fs/bpf/shedder-doctor-test-none"

[[service]]
name = "web"
ports = [8080]
cgroup = "shedder-doctor-test/none.service"
"#,
        )
        .expect("config");
        let checks = run(Some(&cfg), Some(Path::new("/etc/shedder/test.toml")));
        print!("{}", render(&checks));
        let find = |name: &str| checks.iter().find(|c| c.name == name);
        let iface = find("interface").expect("interface check");
        assert_eq!(iface.status, Status::Fail, "{iface:?}");
        assert!(iface.detail.contains("shedder-nope0"), "{iface:?}");
        let cgroup = find("cgroup")
            .or_else(|| find("cgroup v2"))
            .expect("cgroup");
        assert_eq!(cgroup.status, Status::Fail, "{cgroup:?}");
        let daemon = find("daemon").expect("daemon check");
        assert_eq!(daemon.status, Status::Warn);
        assert_eq!(
            daemon.fix.as_deref(),
            Some("shedder run --config /etc/shedder/test.toml"),
            "fixes name the configuration doctor was given"
        );
        assert_eq!(exit_code(&checks), 1);
    }
}
