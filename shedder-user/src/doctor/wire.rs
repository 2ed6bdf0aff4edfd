//! Whether the packet path sees the protected services' traffic: it measures connections,
//! requests and latency from the packets crossing the interfaces shedder is attached to
//! (ingress and TC egress). A client on the same host, or packets that come in or leave by
//! another interface, are not seen: the daemon's sweep finds their connections in the
//! kernel's sockets and counts them, but their requests and latency are not measured.

use std::path::Path;

use super::Check;
use crate::api::state::State;

const NAME: &str = "wire";

/// Ask the daemon on `socket` for its state; with none answering, nothing to say.
pub(super) fn check_wire(socket: &Path, daemon_alive: bool) -> Option<Check> {
    Some(verdict(&super::flood::daemon_state(socket, daemon_alive)?))
}

/// The check from the daemon's state.
pub(super) fn verdict(state: &State) -> Check {
    let blind: Vec<&String> = state
        .warnings
        .iter()
        .filter(|w| w.contains("the egress program did not attach"))
        .collect();
    if !blind.is_empty() {
        return Check::fail(
            NAME,
            blind
                .iter()
                .map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            "free the interface's TC egress hook (`tc filter show dev <iface> egress`), or attach on a kernel with tcx (Linux 6.6+)",
        );
    }
    let unseen: Vec<String> = state
        .services
        .iter()
        .filter(|s| s.protocol == "tcp" && s.unseen_connections > 0)
        .map(|s| {
            format!(
                "{}: {} connections the packet path did not see",
                s.name, s.unseen_connections
            )
        })
        .collect();
    if unseen.is_empty() {
        return Check::ok(
            NAME,
            "the protected services' connections cross the attached interfaces (the last sweep \
             found none the packet path had not seen)",
        );
    }
    Check::warn(
        NAME,
        format!(
            "{}: their clients are on this host or their packets use an interface shedder is \
             not attached to; the fallback counts them from the kernel's sockets every 5 s \
             (toward the connection ceiling and the limit's occupancy), but their requests and \
             latency are not measured and their attempts are not decided",
            unseen.join("; ")
        ),
        "add the interface they arrive on to daemon.interfaces, or send local clients through \
         an attached interface; `ss -tn state established '( sport = :PORT )'` shows them",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn state(unseen: u32, warning: Option<&str>) -> State {
        let mut state: State =
            serde_json::from_str(include_str!("../../golden/state.json")).expect("golden state");
        state.services.truncate(1);
        state.services[0].protocol = "tcp".into();
        state.services[0].unseen_connections = unseen;
        state.warnings = warning.map(String::from).into_iter().collect();
        state
    }

    #[test]
    fn unseen_connections_warn_and_a_blind_egress_fails() {
        assert_eq!(verdict(&state(0, None)).status, Status::Ok);
        let w = verdict(&state(3, None));
        assert_eq!(w.status, Status::Warn);
        assert!(
            w.detail
                .contains("3 connections the packet path did not see"),
            "{}",
            w.detail
        );
        let f = verdict(&state(
            0,
            Some("eth0: the egress program did not attach (busy)"),
        ));
        assert_eq!(f.status, Status::Fail);
    }
}
