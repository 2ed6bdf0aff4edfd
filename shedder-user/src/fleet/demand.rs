//! A node's demand for a shared service, as it publishes it: unique attempts per class
//! (refused ones included, retransmits not), and the connections those attempts would hold
//! if all were admitted (pure).
//!
//! Attempts are a rate and a share is a number of connections; Little's law joins them.
//! The node measures how long an admitted attempt holds its connection, `occupancy /
//! admissions per second`, so its *need* in a class is `attempts per second × hold`. Rates,
//! occupancy and admissions are exponentially weighted means with a time constant of
//! [`DEMAND_TAU`]: a one-tick burst does not move a share, a shift in demand does within a
//! couple of seconds (a lease TTL by default).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shedder_common::NUM_CLASSES;

/// The time constant of the demand's moving means.
pub const DEMAND_TAU: Duration = Duration::from_secs(1);

/// The hold assumed by a node that has admitted nothing yet and knows no other node's.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(1);

/// What a node publishes of its demand for one service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// Unique attempts per second by class (CRITICAL first), refused ones included.
    pub attempts: [f64; NUM_CLASSES],
    /// The connections those attempts would hold if all were admitted, by class.
    pub need: [f64; NUM_CLASSES],
    /// How long an admitted attempt holds its connection here (ms; `None`: nothing admitted
    /// yet, the need was computed with another node's hold).
    pub hold_ms: Option<f64>,
}

impl Demand {
    /// All classes' attempts per second.
    pub fn total_attempts(&self) -> f64 {
        self.attempts.iter().sum()
    }

    /// Whether `self` differs enough from what was published to publish again: a class's
    /// need moved by more than a tenth and by more than half a connection.
    pub fn moved_from(&self, published: &Demand) -> bool {
        self.need.iter().zip(&published.need).any(|(a, b)| {
            let d = (a - b).abs();
            d > 0.5 && d > 0.1 * b.max(*a)
        })
    }

    /// Rounded for publishing (a tenth of an attempt or connection, a millisecond).
    pub fn rounded(&self) -> Demand {
        let r = |v: f64| (v * 10.0).round() / 10.0;
        Demand {
            attempts: self.attempts.map(r),
            need: self.need.map(r),
            hold_ms: self.hold_ms.map(f64::round),
        }
    }
}

/// One service's moving means on this node.
#[derive(Clone, Debug, Default)]
pub struct Smoother {
    attempts: [f64; NUM_CLASSES],
    admitted: f64,
    occupancy: f64,
    started: bool,
}

impl Smoother {
    /// Take one tick's readings, `dt` after the last: attempts and admissions per second,
    /// and the connections held now.
    pub fn update(
        &mut self,
        dt: Duration,
        attempts: [f64; NUM_CLASSES],
        admitted: f64,
        occupancy: u32,
    ) {
        if !self.started {
            *self = Self {
                attempts,
                admitted,
                occupancy: occupancy as f64,
                started: true,
            };
            return;
        }
        // The exact weight of a step of `dt` in a mean of time constant τ.
        let a = 1.0 - (-dt.as_secs_f64() / DEMAND_TAU.as_secs_f64()).exp();
        let mix = |old: f64, new: f64| old + a * (new - old);
        for (o, n) in self.attempts.iter_mut().zip(attempts) {
            *o = mix(*o, n);
        }
        self.admitted = mix(self.admitted, admitted);
        self.occupancy = mix(self.occupancy, occupancy as f64);
    }

    /// The hold measured here: `occupancy / admissions per second` (`None` while too little
    /// is admitted to say, under one attempt every ten seconds).
    pub fn hold(&self) -> Option<Duration> {
        (self.admitted >= 0.1).then(|| Duration::from_secs_f64(self.occupancy / self.admitted))
    }

    /// The demand to publish, with `fallback_hold` (another node's, or [`DEFAULT_HOLD`]) when
    /// nothing is admitted here.
    pub fn demand(&self, fallback_hold: Duration) -> Demand {
        let own = self.hold();
        let hold = own.unwrap_or(fallback_hold).as_secs_f64();
        Demand {
            attempts: self.attempts,
            need: self.attempts.map(|a| a * hold),
            hold_ms: own.map(|h| h.as_secs_f64() * 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn need_is_attempts_times_the_measured_hold() {
        // 100 MEDIUM attempts a second, 40 admitted, 16 connections held: each holds its
        // connection 400 ms, so admitting all 100 would take 40 connections.
        let mut s = Smoother::default();
        for _ in 0..50 {
            s.update(TICK, [0.0, 0.0, 100.0, 0.0], 40.0, 16);
        }
        let d = s.demand(DEFAULT_HOLD);
        assert!((d.hold_ms.unwrap() - 400.0).abs() < 1e-6);
        assert!((d.need[2] - 40.0).abs() < 1e-6);
        assert_eq!(d.total_attempts(), 100.0);
    }

    #[test]
    fn a_node_that_admits_nothing_uses_the_fallback_hold() {
        let mut s = Smoother::default();
        s.update(TICK, [10.0, 0.0, 0.0, 0.0], 0.0, 0);
        let d = s.demand(Duration::from_millis(250));
        assert_eq!(d.hold_ms, None);
        assert!((d.need[0] - 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_shift_in_demand_shows_within_the_time_constant_a_burst_barely() {
        let mut s = Smoother::default();
        s.update(TICK, [0.0, 0.0, 100.0, 0.0], 100.0, 40);
        // One tick of 1,000 attempts moves the mean by under a tenth of the jump.
        s.update(TICK, [0.0, 0.0, 1000.0, 0.0], 100.0, 40);
        assert!((s.attempts[2] - 185.6).abs() < 0.1, "{}", s.attempts[2]);
        for _ in 0..60 {
            s.update(TICK, [0.0, 0.0, 100.0, 0.0], 100.0, 40);
        }
        // Demand that halves for good: past 63% of the way within one time constant, past
        // 95% within three.
        let mut t = Duration::ZERO;
        while s.attempts[2] > 50.0 + 0.37 * 50.0 {
            s.update(TICK, [0.0, 0.0, 50.0, 0.0], 50.0, 20);
            t += TICK;
        }
        assert!(t <= DEMAND_TAU + TICK, "{t:?}");
        while s.attempts[2] > 50.0 + 0.05 * 50.0 {
            s.update(TICK, [0.0, 0.0, 50.0, 0.0], 50.0, 20);
            t += TICK;
        }
        assert!(t <= 3 * DEMAND_TAU, "{t:?}");
    }

    #[test]
    fn small_moves_are_not_published_again() {
        let d = |n: f64| Demand {
            need: [0.0, 0.0, n, 0.0],
            ..Default::default()
        };
        assert!(!d(40.0).moved_from(&d(38.0)), "5%");
        assert!(d(40.0).moved_from(&d(30.0)), "a third");
        assert!(!d(0.4).moved_from(&d(0.0)), "under half a connection");
        assert!(d(2.0).moved_from(&d(0.0)));
    }
}
