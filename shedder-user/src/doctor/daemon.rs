//! The daemon: its pinned state and heartbeat, and its control socket.

use std::{io, path::Path};

use super::Check;

/// Check the pinned state and the heartbeat; also says whether a daemon is alive.
pub(super) fn check_daemon(pin_dir: &Path, privileged: bool, start: &str) -> (Check, bool) {
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
    let (tracepoints, rest): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.starts_with("tp-"));
    let (egress, ifaces): (Vec<&String>, Vec<&String>) = rest
        .into_iter()
        .partition(|n| n.starts_with(crate::kernel::EGRESS_PIN_PREFIX));
    let mut parts: Vec<String> = ifaces
        .iter()
        .map(
            |s| match s.strip_prefix(crate::kernel::INGRESS_NETLINK_PREFIX) {
                Some(iface) => format!("{iface} (tc netlink)"),
                None => s.to_string(),
            },
        )
        .collect();
    if !egress.is_empty() {
        parts.push(format!("+ {} egress", egress.len()));
    }
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

pub(super) fn check_control_socket(path: &Path, daemon_alive: bool) -> Check {
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
        let names = ["tp-a", "egress-eth0", "eth0"].map(String::from);
        assert_eq!(
            describe_links(&names),
            "links eth0 + 1 egress + 1 tracepoints"
        );
        assert_eq!(describe_links(&[]), "no links pinned");
        assert_eq!(
            parse_timer_list_jiffies("now at 1 nsecs\n\njiffies: 4296587655\n"),
            Some(4296587655)
        );
    }
}
