//! `shedder doctor`: check everything shedder needs on this host — kernel, pseudo-filesystems,
//! capabilities, BPF settings, the configured interfaces, cgroups and services' sockets, the
//! daemon — each with a verdict and, when something is wrong, a concrete fix.
//!
//! Every check is independent and never panics: a check that cannot run reports why.
//! Interfaces are looked up in the caller's network namespace.
//!
//! One file per group of checks; this one holds the verdicts, runs the groups in order and
//! renders the report.

mod bpf;
mod capabilities;
mod cgroups;
mod daemon;
mod fail_static;
mod filesystems;
mod fleet;
mod flood;
mod interfaces;
mod kernel;
mod recall;
mod sockets;
mod wire;
mod work;

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use self::{
    bpf::{BPF_JIT_SYSCTL, BPF_STATS_SYSCTL, check_bpf_stats, check_jit, in_initial_netns},
    capabilities::{CAP_SYS_ADMIN, CAP_SYS_RESOURCE, check_capabilities, has_cap},
    cgroups::check_cgroups,
    daemon::{check_control_socket, check_daemon},
    fail_static::check_fail_static,
    filesystems::{MountSpec, check_mount},
    fleet::check_fleet,
    interfaces::check_interface,
    kernel::{check_kernel, check_memlock, memlock_limit},
    sockets::{check_quic_kernel, check_sockets},
};
pub use self::{
    capabilities::{missing_capabilities, parse_cap_eff},
    daemon::{Heartbeat, heartbeat_verdict},
    filesystems::{is_mounted, parse_mounts},
};
use crate::{
    config::{Config, Daemon},
    kernel::version::{kernel_release, parse_kernel_release},
};

/// The command that starts the daemon, as the fixes print it: with the configuration's path
/// when doctor was given one.
fn start_command(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("shedder run --config {}", p.display()),
        None => "shedder run --config FILE".into(),
    }
}

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
        check_capabilities(caps),
    ];
    match &mounts {
        Ok(m) => out.push(check_mount(m, MountSpec::BPFFS, can_mount)),
        Err(e) => out.push(Check::fail(
            MountSpec::BPFFS.name,
            format!("cannot read /proc/mounts: {e}"),
            "mount procfs at /proc",
        )),
    }
    out.push(check_jit(
        std::fs::read_to_string(BPF_JIT_SYSCTL),
        in_initial_netns(),
    ));
    out.push(check_bpf_stats(
        std::fs::read_to_string(BPF_STATS_SYSCTL),
        can_mount,
    ));
    let can_raise = caps.is_some_and(|c| has_cap(c, CAP_SYS_RESOURCE));
    if let Some(check) = check_memlock(kernel, memlock_limit(), can_raise) {
        out.push(check);
    }
    out.extend(check_cgroups(config, mounts.as_deref().ok()));
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
    if let Some(cfg) = config {
        out.extend(check_quic_kernel(cfg, kernel));
        out.extend(recall::check_recall(cfg));
        out.extend(check_sockets(cfg));
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
    out.extend(flood::check_flood(&daemon.control_socket, alive));
    out.extend(work::check_work(&daemon.control_socket, alive));
    out.extend(wire::check_wire(&daemon.control_socket, alive));
    out
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

#[cfg(test)]
mod tests {
    use super::*;

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
            "capabilities",
            "bpffs",
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
