//! Floods of unproven attempts, as the running daemon sees them (see
//! `shedder_common::proof`): a warning naming the flooded services and classes, the rate of
//! unproven attempts and what became of them.

use std::path::Path;

use super::Check;
use crate::api::{
    control::Client,
    state::{ServiceState, State},
};

const NAME: &str = "syn flood";

/// Ask the daemon on `socket` for its state; with none answering, nothing to say.
pub(super) fn check_flood(socket: &Path, daemon_alive: bool) -> Option<Check> {
    Some(verdict(&daemon_state(socket, daemon_alive)?))
}

/// The running daemon's state from its control socket; `None` without a daemon alive, or
/// when it does not answer.
pub(super) fn daemon_state(socket: &Path, daemon_alive: bool) -> Option<State> {
    if !daemon_alive {
        return None;
    }
    let body = Client::new(socket)
        .call("GET", "/shedding/state", b"")
        .ok()?;
    serde_json::from_str(&body).ok()
}

/// One service's flood, in words: "api (medium, high): 99870/s unproven attempts, 0.0/s
/// completing".
fn describe(s: &ServiceState) -> Option<String> {
    if s.flooded.is_empty() {
        return None;
    }
    let u = s.signals.unproven.value()?;
    Some(format!(
        "{} ({}): {:.0}/s unproven attempts, {:.1}/s completing",
        s.name,
        s.flooded.join(", "),
        u.offered(),
        u.rates.iter().map(|r| r.completed).sum::<f64>()
    ))
}

/// The check from the daemon's state.
pub(super) fn verdict(state: &State) -> Check {
    let floods: Vec<String> = state.services.iter().filter_map(describe).collect();
    if floods.is_empty() {
        return Check::ok(
            NAME,
            "none: attempts from sources without standing complete as real ones do",
        );
    }
    Check::warn(
        NAME,
        format!("SYN flood: {}", floods.join("; ")),
        "sources with standing are decided without it; new clients share each class's unproven \
         cap with the flood (raise the service's unproven_share to give them more), and the \
         refusals of unproven attempts are answered only within daemon.max_replies_unproven_per_s. \
         Ask the upstream to filter the forged traffic",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_named_with_its_rate_and_a_calm_service_is_fine() {
        let mut state: State =
            serde_json::from_str(include_str!("../../golden/state.json")).expect("golden state");
        for s in &mut state.services {
            s.flooded.clear();
        }
        let ok = verdict(&state);
        assert_eq!(ok.status, super::super::Status::Ok, "{ok:?}");
        let s = &mut state.services[0];
        s.flooded = vec!["medium".into()];
        let mut u = crate::signals::Unproven::default();
        u.rates[2].offered = 99_870.0;
        u.rates[2].admitted = 120.0;
        u.rates[2].completed = 0.5;
        s.signals.unproven = crate::signals::Reading::Ok { value: u };
        let name = s.name.clone();
        let c = verdict(&state);
        assert_eq!(c.status, super::super::Status::Warn);
        assert_eq!(
            c.detail,
            format!("SYN flood: {name} (medium): 99870/s unproven attempts, 0.5/s completing")
        );
    }
}
