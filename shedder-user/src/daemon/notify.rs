//! Telling systemd how the daemon is (sd_notify(3), for `Type=notify` and `WatchdogSec=`):
//! READY=1 once the first tick has published the figures, RELOADING=1 and READY=1 around a
//! SIGHUP reload, STOPPING=1 on the way out, and WATCHDOG=1 from the tick loop, so that a
//! loop that hangs (no heartbeat stamped, the packet path on its fallback limits) gets the
//! daemon restarted. Each message is one datagram to `$NOTIFY_SOCKET` (a path, or an
//! abstract socket written `@name`); without it (not under systemd) nothing is sent.

use std::{
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
    time::{Duration, Instant},
};

use tracing::{debug, warn};

/// Where `$NOTIFY_SOCKET` points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Path(std::path::PathBuf),
    /// An abstract socket's name, without the leading `@` (or NUL).
    Abstract(Vec<u8>),
}

/// Read `$NOTIFY_SOCKET`'s value: `/path`, or `@name` for an abstract socket. Anything else
/// (a relative path, `vsock:` on a VM host) is not a socket this daemon can reach.
pub fn target(value: &str) -> Option<Target> {
    if let Some(name) = value.strip_prefix('@') {
        return (!name.is_empty()).then(|| Target::Abstract(name.as_bytes().to_vec()));
    }
    value.starts_with('/').then(|| Target::Path(value.into()))
}

/// How often systemd wants WATCHDOG=1 (`$WATCHDOG_USEC`), if the watchdog is for this
/// process (`$WATCHDOG_PID` unset, or this pid).
pub fn watchdog(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// One notification: `KEY=value` lines.
pub fn message(fields: &[(&str, &str)]) -> String {
    fields.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// The monotonic clock in µs, as RELOADING=1 carries it (MONOTONIC_USEC), so that systemd
/// can tell this reload from an older one.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the local timespec only.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// The daemon's side of the notification socket.
pub struct Notifier {
    to: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
    /// Ping at least this often (a quarter of WATCHDOG_USEC: late pings are not fatal).
    ping_every: Option<Duration>,
    last_ping: Option<Instant>,
    failed: bool,
}

impl Notifier {
    /// From the environment systemd gives the main process.
    pub fn from_env() -> Self {
        let var = |k| std::env::var(k).ok();
        let to = var("NOTIFY_SOCKET").and_then(|v| {
            let t = target(&v);
            if t.is_none() {
                warn!(NOTIFY_SOCKET = %v, "not a unix socket: systemd is not notified");
            }
            t
        });
        let dog = watchdog(
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        );
        Self::new(to, dog)
    }

    pub fn new(to: Option<Target>, watchdog: Option<Duration>) -> Self {
        let to = to.and_then(|t| {
            let addr = match &t {
                Target::Path(p) => std::os::unix::net::SocketAddr::from_pathname(p),
                Target::Abstract(name) => std::os::unix::net::SocketAddr::from_abstract_name(name),
            };
            match (UnixDatagram::unbound(), addr) {
                (Ok(s), Ok(a)) => Some((s, a)),
                (Err(e), _) | (_, Err(e)) => {
                    warn!(error = %e, target = ?t, "systemd's notification socket is unusable");
                    None
                }
            }
        });
        if let (Some(_), Some(d)) = (&to, watchdog) {
            debug!(watchdog_ms = d.as_millis() as u64, "systemd watchdog on");
        }
        Self {
            ping_every: to.as_ref().and(watchdog).map(|d| d / 4),
            to,
            last_ping: None,
            failed: false,
        }
    }

    fn send(&mut self, fields: &[(&str, &str)]) {
        let Some((socket, addr)) = &self.to else {
            return;
        };
        let msg = message(fields);
        match socket.send_to_addr(msg.as_bytes(), addr) {
            Ok(_) => self.failed = false,
            Err(e) => {
                // Said once per run of failures: a watchdog ping is sent many times a second.
                if !self.failed {
                    warn!(error = %e, "notifying systemd");
                }
                self.failed = true;
            }
        }
    }

    /// Started (after the first tick), or done reloading.
    pub fn ready(&mut self) {
        self.send(&[("READY", "1")]);
    }

    /// A reload begins (READY=1 ends it).
    pub fn reloading(&mut self) {
        let now = monotonic_usec().to_string();
        self.send(&[("RELOADING", "1"), ("MONOTONIC_USEC", &now)]);
    }

    pub fn stopping(&mut self) {
        self.send(&[("STOPPING", "1")]);
    }

    /// The loop is alive at `now`: WATCHDOG=1 if one is due.
    pub fn alive(&mut self, now: Instant) {
        let Some(every) = self.ping_every else {
            return;
        };
        if self
            .last_ping
            .is_some_and(|at| now.saturating_duration_since(at) < every)
        {
            return;
        }
        self.last_ping = Some(now);
        self.send(&[("WATCHDOG", "1")]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_a_path_or_an_abstract_name() {
        assert_eq!(
            target("/run/systemd/notify"),
            Some(Target::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            target("@/org/freedesktop/systemd1/notify/42"),
            Some(Target::Abstract(
                b"/org/freedesktop/systemd1/notify/42".to_vec()
            ))
        );
        assert_eq!(target("@"), None);
        assert_eq!(target("relative/notify"), None);
        assert_eq!(target("vsock:2:1234"), None);
    }

    #[test]
    fn the_watchdog_is_ours_unless_another_pid_is_named() {
        let s = Some("10000000");
        assert_eq!(watchdog(s, None, 7), Some(Duration::from_secs(10)));
        assert_eq!(watchdog(s, Some("7"), 7), Some(Duration::from_secs(10)));
        assert_eq!(watchdog(s, Some("8"), 7), None);
        assert_eq!(watchdog(Some("0"), None, 7), None);
        assert_eq!(watchdog(Some("ten"), None, 7), None);
        assert_eq!(watchdog(None, None, 7), None);
    }

    #[test]
    fn a_message_is_key_value_lines() {
        assert_eq!(message(&[("READY", "1")]), "READY=1\n");
        assert_eq!(
            message(&[("RELOADING", "1"), ("MONOTONIC_USEC", "123")]),
            "RELOADING=1\nMONOTONIC_USEC=123\n"
        );
    }

    fn received(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn notifications_reach_a_path_socket_and_watchdog_pings_are_paced() {
        let dir = std::env::temp_dir().join(format!("shedder-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let systemd = UnixDatagram::bind(&path).expect("bind");
        systemd
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut n = Notifier::new(Some(Target::Path(path)), Some(Duration::from_secs(4)));
        n.ready();
        assert_eq!(received(&systemd), "READY=1\n");
        let t0 = Instant::now();
        n.alive(t0);
        n.alive(t0 + Duration::from_millis(999)); // within a quarter of 4 s: not sent
        n.alive(t0 + Duration::from_secs(1));
        n.reloading();
        n.stopping();
        assert_eq!(received(&systemd), "WATCHDOG=1\n");
        assert_eq!(received(&systemd), "WATCHDOG=1\n");
        let reload = received(&systemd);
        assert!(
            reload.starts_with("RELOADING=1\nMONOTONIC_USEC="),
            "{reload}"
        );
        assert_eq!(received(&systemd), "STOPPING=1\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn notifications_reach_an_abstract_socket() {
        let name = format!("shedder-test-notify-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let systemd = UnixDatagram::bind_addr(&addr).expect("bind");
        systemd
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let to = target(&format!("@{name}"));
        let mut n = Notifier::new(to, None);
        n.alive(Instant::now()); // no watchdog: nothing
        n.ready();
        assert_eq!(received(&systemd), "READY=1\n");
    }

    #[test]
    fn without_a_socket_nothing_is_sent() {
        let mut n = Notifier::new(None, Some(Duration::from_secs(1)));
        n.ready();
        n.alive(Instant::now());
        assert!(n.ping_every.is_none());
    }
}
