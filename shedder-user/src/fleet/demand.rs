//! A node's demand for a shared service, as it publishes it: unique attempts per class
//! (refused ones included, retransmits not), and the connections those attempts would hold
//! if all were admitted (pure).
//!
//! Attempts are a rate and a share is a number of connections; Little's law joins them.
//! The node measures how long an admitted attempt holds its connection, `established
//! connections / admissions per second`, so its *need* in a class is `attempts per second ×
//! hold`. Only established connections count: an attempt admitted but never completed (a
//! SYN from a spoofed address) holds a slot on the packet path for a while but no
//! connection, so a flood of them adds admissions and no connections, and shortens the
//! hold in proportion. With the packet path counting proven attempts only, the need is
//! exactly the proven attempts' need; counting every attempt, it still is as long as the
//! flood is admitted in the same proportion as the real clients (see the tests). Rates,
//! connections and admissions are means over the last [`DEMAND_WINDOW`]: a one-tick burst
//! moves a share little, and a shift in demand is fully in the means one window later. (An
//! exponential mean with a time constant of 1 s, about as steady as a 2 s window, passes
//! 78% of a shift in 1.5 s and 95% in 3 s; the 1.5 s window is about 15% noisier.)

use std::{collections::VecDeque, time::Duration};

use serde::{Deserialize, Serialize};
use shedder_common::NUM_CLASSES;

/// The window of the demand's means.
pub const DEMAND_WINDOW: Duration = Duration::from_millis(1500);

/// The hold assumed by a node that has admitted nothing yet and knows no other node's.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(1);

/// Admissions per second below which a node's hold is not measured (one attempt every ten
/// seconds).
pub const MIN_ADMITTED: f64 = 0.1;

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
    /// Admissions per second, all classes (absent from records of versions without it: 0).
    #[serde(default)]
    pub admitted: f64,
    /// Established connections held (the mean): what the node has proved it holds. The
    /// others cap its need by it (see `fleet::trust`).
    #[serde(default)]
    pub established: f64,
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
            admitted: r(self.admitted),
            established: r(self.established),
        }
    }
}

/// One tick's readings, `dt` long.
#[derive(Clone, Copy, Debug)]
struct Sample {
    dt: f64,
    attempts: [f64; NUM_CLASSES],
    admitted: f64,
    established: f64,
}

/// One service's means over the last [`DEMAND_WINDOW`] on this node.
#[derive(Clone, Debug, Default)]
pub struct Smoother {
    /// The readings inside the window, oldest first; the oldest weighed by its part inside.
    samples: VecDeque<Sample>,
}

impl Smoother {
    /// Take one tick's readings, `dt` after the last: attempts and admissions per second,
    /// and the established connections held now.
    pub fn update(
        &mut self,
        dt: Duration,
        attempts: [f64; NUM_CLASSES],
        admitted: f64,
        established: u32,
    ) {
        // The first reading stands for the window until more come.
        let dt = if self.samples.is_empty() {
            DEMAND_WINDOW.as_secs_f64()
        } else {
            dt.as_secs_f64()
        };
        if dt <= 0.0 {
            return;
        }
        self.samples.push_back(Sample {
            dt,
            attempts,
            admitted,
            established: established as f64,
        });
        // Keep exactly the window: drop what lies wholly before it, weigh the oldest by
        // the part of it inside.
        let window = DEMAND_WINDOW.as_secs_f64();
        let mut span: f64 = self.samples.iter().map(|s| s.dt).sum();
        while let Some(first) = self.samples.front_mut() {
            if span - first.dt >= window {
                span -= first.dt;
                self.samples.pop_front();
            } else {
                if span > window {
                    first.dt -= span - window;
                }
                break;
            }
        }
    }

    /// The time-weighted mean of `f` over the window (0 before any reading).
    fn mean(&self, f: impl Fn(&Sample) -> f64) -> f64 {
        let span: f64 = self.samples.iter().map(|s| s.dt).sum();
        if span <= 0.0 {
            return 0.0;
        }
        self.samples.iter().map(|s| f(s) * s.dt).sum::<f64>() / span
    }

    /// Attempts per second by class over the window.
    fn attempts(&self) -> [f64; NUM_CLASSES] {
        std::array::from_fn(|c| self.mean(|s| s.attempts[c]))
    }

    /// The hold measured here: `established connections / admissions per second` (`None`
    /// while too little is admitted to say, under [`MIN_ADMITTED`]).
    pub fn hold(&self) -> Option<Duration> {
        let admitted = self.mean(|s| s.admitted);
        (admitted >= MIN_ADMITTED)
            .then(|| Duration::from_secs_f64(self.mean(|s| s.established) / admitted))
    }

    /// The demand to publish, with `fallback_hold` (another node's, or [`DEFAULT_HOLD`]) when
    /// nothing is admitted here.
    pub fn demand(&self, fallback_hold: Duration) -> Demand {
        let own = self.hold();
        let hold = own.unwrap_or(fallback_hold).as_secs_f64();
        let attempts = self.attempts();
        Demand {
            attempts,
            need: attempts.map(|a| a * hold),
            hold_ms: own.map(|h| h.as_secs_f64() * 1000.0),
            admitted: self.mean(|s| s.admitted),
            established: self.mean(|s| s.established),
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
        assert!((d.total_attempts() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_flood_of_attempts_that_never_complete_adds_no_need() {
        // The same node under a flood of 1,000 SYNs a second that never complete, decided
        // like its clients' (two in five admitted): 400 more admissions a second, none of
        // which becomes a connection. The hold shrinks by as much as the attempts grow, and
        // the need is the clients' 40 connections.
        let mut s = Smoother::default();
        for _ in 0..20 {
            s.update(TICK, [0.0, 0.0, 1100.0, 0.0], 440.0, 16);
        }
        let d = s.demand(DEFAULT_HOLD);
        assert!((d.need[2] - 40.0).abs() < 1e-6, "{d:?}");
        assert!((d.established - 16.0).abs() < 1e-9);
        assert!((d.admitted - 440.0).abs() < 1e-9);
        // Counting proven attempts only, the packet path hands over the clients' own
        // figures: the same need.
        let mut proven = Smoother::default();
        for _ in 0..20 {
            proven.update(TICK, [0.0, 0.0, 100.0, 0.0], 40.0, 16);
        }
        assert!((proven.demand(DEFAULT_HOLD).need[2] - 40.0).abs() < 1e-6);
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
    fn a_shift_in_demand_is_whole_one_window_later_a_burst_barely_shows() {
        let mut s = Smoother::default();
        for _ in 0..20 {
            s.update(TICK, [0.0, 0.0, 100.0, 0.0], 100.0, 40);
        }
        // One tick of 1,000 attempts a second in a window of fifteen ticks moves the mean
        // by a fifteenth of the jump; it leaves the window fifteen ticks later.
        s.update(TICK, [0.0, 0.0, 1000.0, 0.0], 100.0, 40);
        assert!(
            (s.attempts()[2] - 160.0).abs() < 1e-6,
            "{}",
            s.attempts()[2]
        );
        for _ in 0..15 {
            s.update(TICK, [0.0, 0.0, 100.0, 0.0], 100.0, 40);
        }
        assert!(
            (s.attempts()[2] - 100.0).abs() < 1e-6,
            "{}",
            s.attempts()[2]
        );
        // Demand that halves for good: half of the way in half a window, all of it in one.
        for _ in 0..7 {
            s.update(TICK, [0.0, 0.0, 50.0, 0.0], 50.0, 20);
        }
        assert!((s.attempts()[2] - (50.0 + 50.0 * 8.0 / 15.0)).abs() < 1e-6);
        for _ in 0..8 {
            s.update(TICK, [0.0, 0.0, 50.0, 0.0], 50.0, 20);
        }
        assert!((s.attempts()[2] - 50.0).abs() < 1e-6, "{}", s.attempts()[2]);
        assert!((s.hold().unwrap().as_secs_f64() - 0.4).abs() < 1e-9);
    }

    #[test]
    fn ticks_of_any_length_weigh_by_their_time_inside_the_window() {
        let mut s = Smoother::default();
        s.update(TICK, [0.0, 0.0, 10.0, 0.0], 10.0, 4);
        // A tick of a whole second and one of 900 ms: the window holds the last 1.5 s,
        // 600 ms of the first and all of the second.
        s.update(Duration::from_secs(1), [0.0, 0.0, 20.0, 0.0], 10.0, 4);
        s.update(Duration::from_millis(900), [0.0, 0.0, 40.0, 0.0], 10.0, 4);
        let want = (20.0 * 0.6 + 40.0 * 0.9) / 1.5;
        assert!((s.attempts()[2] - want).abs() < 1e-9, "{}", s.attempts()[2]);
        // A zero-length tick changes nothing.
        s.update(Duration::ZERO, [0.0, 0.0, 1e6, 0.0], 10.0, 4);
        assert!((s.attempts()[2] - want).abs() < 1e-9);
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
