//! The schedule: phases of arrival rates ([`Phase`]) and the arrival times they give,
//! Poisson or evenly spaced ([`Arrivals`]), from a seeded generator.

use std::{fmt, sync::Arc, time::Duration};

/// An arrival rate in requests per second.
#[derive(Clone)]
pub enum Rate {
    Constant(f64),
    /// A function of the time since the phase began (evaluated every millisecond).
    Fn(Arc<dyn Fn(Duration) -> f64 + Send + Sync>),
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Constant(r) => write!(f, "Constant({r})"),
            Self::Fn(_) => write!(f, "Fn(..)"),
        }
    }
}

/// A stretch of the schedule.
#[derive(Clone, Debug)]
pub struct Phase {
    pub duration: Duration,
    pub rate: Rate,
}

impl Phase {
    /// `rate` requests per second for `duration`.
    pub fn constant(duration: Duration, rate: f64) -> Self {
        Self {
            duration,
            rate: Rate::Constant(rate),
        }
    }

    /// From `from` to `to` requests per second, linearly over `duration`.
    pub fn ramp(duration: Duration, from: f64, to: f64) -> Self {
        let len = duration.as_secs_f64().max(1e-9);
        Self::function(duration, move |t| {
            from + (to - from) * t.as_secs_f64() / len
        })
    }

    /// `rate(t)` requests per second, `t` since the phase began.
    pub fn function(
        duration: Duration,
        rate: impl Fn(Duration) -> f64 + Send + Sync + 'static,
    ) -> Self {
        Self {
            duration,
            rate: Rate::Fn(Arc::new(rate)),
        }
    }

    fn rate_at(&self, t: Duration) -> f64 {
        let r = match &self.rate {
            Rate::Constant(r) => *r,
            Rate::Fn(f) => f(t),
        };
        if r.is_finite() { r.max(0.0) } else { 0.0 }
    }
}

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arrivals {
    /// A Poisson process (exponential gaps), seeded: the realistic open-loop default.
    #[default]
    Poisson,
    /// Evenly spaced at the current rate.
    Uniform,
}

/// xorshift64*: tiny, seeded, good enough for arrival gaps, class picks, forged headers
/// and generated frames.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// The generator started at `state` as it is (not 0), for a sequence fixed by it.
    pub fn from_state(state: u64) -> Self {
        Self(state | 1)
    }

    pub(super) fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean 1.
    fn exp1(&mut self) -> f64 {
        -(1.0 - self.unit()).ln()
    }
}

/// The arrival times of a schedule: each arrival consumes a unit (uniform) or an Exp(1)
/// (Poisson) amount of integrated rate, so rate changes are honoured exactly at phase
/// boundaries and to the millisecond inside function phases.
pub(super) struct ArrivalClock {
    phases: Vec<Phase>,
    idx: usize,
    phase_start: Duration,
    t: Duration,
    rng: XorShift,
    arrivals: Arrivals,
}

impl ArrivalClock {
    pub(super) fn new(phases: Vec<Phase>, arrivals: Arrivals, seed: u64) -> Self {
        Self {
            phases,
            idx: 0,
            phase_start: Duration::ZERO,
            t: Duration::ZERO,
            rng: XorShift::new(seed),
            arrivals,
        }
    }

    pub(super) fn next(&mut self) -> Option<Duration> {
        let mut need = match self.arrivals {
            Arrivals::Poisson => self.rng.exp1(),
            Arrivals::Uniform => 1.0,
        };
        loop {
            let phase = self.phases.get(self.idx)?;
            let phase_end = self.phase_start + phase.duration;
            if self.t >= phase_end {
                self.idx += 1;
                self.phase_start = phase_end;
                continue;
            }
            let step_end = match phase.rate {
                Rate::Constant(_) => phase_end,
                Rate::Fn(_) => (self.t + Duration::from_millis(1)).min(phase_end),
            };
            let rate = phase.rate_at(self.t - self.phase_start);
            let span = (step_end - self.t).as_secs_f64();
            if rate > 0.0 && rate * span >= need {
                self.t += Duration::from_secs_f64(need / rate);
                if self.t >= phase_end {
                    // Rounding: keep the arrival inside its phase.
                    self.t = phase_end - Duration::from_nanos(1);
                }
                return Some(self.t);
            }
            need -= rate * span;
            self.t = step_end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(phases: Vec<Phase>, kind: Arrivals) -> Vec<Duration> {
        let mut c = ArrivalClock::new(phases, kind, 7);
        std::iter::from_fn(|| c.next()).collect()
    }

    #[test]
    fn uniform_arrivals_follow_the_phases() {
        let a = arrivals(
            vec![
                Phase::constant(Duration::from_secs(1), 10.0),
                Phase::constant(Duration::from_secs(1), 0.0),
                Phase::constant(Duration::from_secs(1), 100.0),
            ],
            Arrivals::Uniform,
        );
        let in_second = |s: u64| a.iter().filter(|t| t.as_secs() == s).count();
        assert_eq!(in_second(0), 10);
        assert_eq!(in_second(1), 0);
        assert!((99..=101).contains(&in_second(2)), "{}", in_second(2));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_arrivals_have_the_right_mean_and_spread() {
        let a = arrivals(
            vec![Phase::constant(Duration::from_secs(100), 200.0)],
            Arrivals::Poisson,
        );
        let n = a.len() as f64;
        assert!((n - 20_000.0).abs() < 600.0, "{n}");
        // Exponential gaps: the coefficient of variation is 1.
        let gaps: Vec<f64> = a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    }

    #[test]
    fn ramps_integrate_the_rate() {
        // 0 → 200/s over 2 s: 200 arrivals, a quarter of them in the first second.
        let a = arrivals(
            vec![Phase::ramp(Duration::from_secs(2), 0.0, 200.0)],
            Arrivals::Uniform,
        );
        assert!((199..=201).contains(&a.len()), "{}", a.len());
        let first = a.iter().filter(|t| t.as_secs() == 0).count();
        assert!((49..=51).contains(&first), "{first}");
    }
}
