//! What the daemon makes of the unproven attempts (see `shedder_common::proof`): whether a
//! class is under a flood of them, and how much of its unproven part its new clients need.
//! Pure: the rates come in, the verdicts go out.

use std::time::Duration;

use shedder_common::NUM_CLASSES;

use crate::signals::{Unproven, UnprovenRates};

/// Below this many unproven attempts a second a class is not said to be flooded, whatever
/// becomes of them: a handful of stray SYNs is no attack.
pub const FLOOD_MIN_RATE: f64 = 50.0;
/// A class stays flooded this long after its last flooded tick, so a flood that pauses
/// for a moment is reported as one.
pub const FLOOD_HOLD: Duration = Duration::from_secs(5);
/// Each tick what new clients need decays this far toward its new reading (as the demand
/// does): new clients come in bursts.
const NEED_DECAY: f64 = 0.8;

/// Whether one tick's unproven attempts of a class look like a flood: many of them, and
/// most of those admitted never became a connection (a real client's handshake completes
/// within the hold; a spoofed SYN's never does). With none admitted (the class full, or
/// its cap held by earlier ones) the refusals for the cap tell: a cap held by attempts that
/// do not complete.
pub fn flooded(r: &UnprovenRates) -> bool {
    if r.offered < FLOOD_MIN_RATE {
        return false;
    }
    if r.admitted > 0.0 {
        r.completed < 0.5 * r.admitted
    } else {
        r.capped >= 0.5 * r.offered
    }
}

/// Per class, a flood of unproven attempts: reported from its first flooded tick until
/// [`FLOOD_HOLD`] after its last.
#[derive(Clone, Debug, Default)]
pub struct FloodWatch {
    last: [Option<Duration>; NUM_CLASSES],
}

impl FloodWatch {
    /// Take a tick's rates at `now`; returns which classes are flooded.
    pub fn observe(&mut self, u: &Unproven, now: Duration) -> [bool; NUM_CLASSES] {
        std::array::from_fn(|c| {
            if flooded(&u.rates[c]) {
                self.last[c] = Some(now);
            }
            self.last[c].is_some_and(|t| now.saturating_sub(t) < FLOOD_HOLD)
        })
    }

    /// Which classes are flooded as of the last tick at `now`.
    pub fn state(&self, now: Duration) -> [bool; NUM_CLASSES] {
        std::array::from_fn(|c| self.last[c].is_some_and(|t| now.saturating_sub(t) < FLOOD_HOLD))
    }
}

/// Per class, the unproven handshakes in progress that new clients need (their completions
/// a second times the hold, Little's law), held at its recent peak: only completed
/// handshakes count, so a flood of spoofed SYNs cannot raise it.
pub fn need(previous: [f64; NUM_CLASSES], u: &Unproven, hold: Duration) -> [f64; NUM_CLASSES] {
    std::array::from_fn(|c| {
        let now = u.rates[c].completed * hold.as_secs_f64();
        now.max(previous[c] * NEED_DECAY)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(offered: f64, admitted: f64, completed: f64, capped: f64) -> UnprovenRates {
        UnprovenRates {
            offered,
            admitted,
            refused: offered - admitted,
            capped,
            completed,
            disowned: 0.0,
        }
    }

    #[test]
    fn a_flood_is_many_unproven_attempts_that_do_not_complete() {
        // 100,000 spoofed SYNs a second, 125 admitted within the cap, none completing.
        assert!(flooded(&rates(100_000.0, 125.0, 0.0, 99_875.0)));
        // New clients: as many complete as were admitted.
        assert!(!flooded(&rates(400.0, 400.0, 396.0, 0.0)));
        // New clients refused for pressure in an overload: what was admitted completes.
        assert!(!flooded(&rates(600.0, 200.0, 190.0, 0.0)));
        // A few stray SYNs are no flood.
        assert!(!flooded(&rates(20.0, 20.0, 0.0, 0.0)));
        // Nothing admitted, the cap full of attempts that never complete.
        assert!(flooded(&rates(5_000.0, 0.0, 0.0, 5_000.0)));
        // Nothing admitted because the class is full: not a verdict on the sources.
        assert!(!flooded(&rates(5_000.0, 0.0, 0.0, 0.0)));
    }

    #[test]
    fn a_flood_is_reported_until_it_has_been_over_for_a_while() {
        let mut w = FloodWatch::default();
        let mut u = Unproven::default();
        u.rates[2] = rates(100_000.0, 125.0, 0.0, 0.0);
        let s = Duration::from_secs;
        assert_eq!(w.observe(&u, s(10)), [false, false, true, false]);
        u.rates[2] = rates(0.0, 0.0, 0.0, 0.0);
        assert_eq!(w.observe(&u, s(14)), [false, false, true, false]);
        assert_eq!(w.observe(&u, s(15)), [false; 4]);
        assert_eq!(w.state(s(15)), [false; 4]);
    }

    #[test]
    fn new_clients_need_what_their_completed_handshakes_hold_not_what_a_flood_sends() {
        let mut u = Unproven::default();
        u.rates[1] = rates(100_000.0, 125.0, 300.0, 99_000.0);
        let n = need([0.0; 4], &u, Duration::from_millis(10));
        assert!((n[1] - 3.0).abs() < 1e-9, "{n:?}");
        // The peak decays a fifth a tick.
        u.rates[1].completed = 0.0;
        let n = need(n, &u, Duration::from_millis(10));
        assert!((n[1] - 2.4).abs() < 1e-9, "{n:?}");
    }
}
