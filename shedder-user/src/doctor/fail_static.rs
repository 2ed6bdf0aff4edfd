//! Fail-static: whether the pins outlive the daemon.

use std::io;

use super::Check;
use crate::config::Config;

/// Whether the pins outlive the daemon (fail-static), and what the daemon does if not.
pub(super) fn check_fail_static(
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
