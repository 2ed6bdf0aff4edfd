//! Work and connections against their bounds, as the running daemon sees them: a service
//! whose established connections near `max_connections` (at it, every attempt is refused),
//! or whose work in flight reaches `max_limit` (the limit cannot rise to what it carries).

use std::path::Path;

use super::Check;
use crate::api::state::{ServiceState, State};

const NAME: &str = "work";

/// Connections at this share of `max_connections` are worth a warning.
const NEAR_CEILING: f64 = 0.8;
/// Work in flight at this share of `max_limit` is too.
const NEAR_MAX_LIMIT: f64 = 0.9;

/// Ask the daemon on `socket` for its state; with none answering, nothing to say.
pub(super) fn check_work(socket: &Path, daemon_alive: bool) -> Option<Check> {
    Some(verdict(&super::flood::daemon_state(socket, daemon_alive)?))
}

/// What is wrong with one TCP service's bounds, in words, if anything.
fn problems(s: &ServiceState) -> Vec<String> {
    let mut out = Vec::new();
    if s.protocol != "tcp" {
        return out;
    }
    if let Some(c) = s.signals.connections.value() {
        let open: u32 = c.iter().sum();
        if s.max_connections > 0 && open as f64 >= NEAR_CEILING * s.max_connections as f64 {
            out.push(format!(
                "{}: {open} established connections of max_connections {} ({:.0}%): at the \
                 ceiling every attempt is refused (reason connections)",
                s.name,
                s.max_connections,
                100.0 * open as f64 / s.max_connections as f64
            ));
        }
    }
    if let Some(w) = s.signals.inflight.value() {
        let busy: u32 = w.iter().sum();
        if busy as f64 >= NEAR_MAX_LIMIT * s.max_limit as f64 {
            out.push(format!(
                "{}: {busy} requests in service against max_limit {}: the limit cannot rise to \
                 the work the service carries",
                s.name, s.max_limit
            ));
        }
    }
    out
}

/// The check from the daemon's state.
pub(super) fn verdict(state: &State) -> Check {
    let found: Vec<String> = state.services.iter().flat_map(problems).collect();
    if found.is_empty() {
        return Check::ok(
            NAME,
            "every service's connections and work in flight are within their bounds",
        );
    }
    Check::warn(
        NAME,
        found.join("; "),
        "raise the service's max_connections (at most 262144) or max_limit if the node is meant \
         to carry that much; otherwise find what holds the connections open",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{doctor::Status, signals::Reading};

    /// The golden state's first service as a TCP service with bounds 1000 / 100, holding
    /// `connections` and `busy`.
    fn state(connections: u32, busy: u32) -> State {
        let mut state: State =
            serde_json::from_str(include_str!("../../golden/state.json")).expect("golden state");
        state.services.truncate(1);
        let s = &mut state.services[0];
        s.protocol = "tcp".into();
        s.max_connections = 1000;
        s.max_limit = 100;
        s.signals.connections = Reading::Ok {
            value: [connections, 0, 0, 0],
        };
        s.signals.inflight = Reading::Ok {
            value: [0, busy, 0, 0],
        };
        state
    }

    #[test]
    fn connections_near_their_ceiling_and_work_at_max_limit_warn() {
        assert_eq!(verdict(&state(500, 10)).status, Status::Ok);
        let near = verdict(&state(850, 10));
        assert_eq!(near.status, Status::Warn);
        assert!(
            near.detail
                .contains("850 established connections of max_connections 1000 (85%)"),
            "{}",
            near.detail
        );
        let full = verdict(&state(10, 95));
        assert_eq!(full.status, Status::Warn);
        assert!(
            full.detail
                .contains("95 requests in service against max_limit 100"),
            "{}",
            full.detail
        );
    }
}
