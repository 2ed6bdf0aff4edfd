//! Watching that refusals leave the host: the driver's XDP transmit errors per interface,
//! and, for native XDP on a veth with resets, whether the peer still takes XDP_TX frames.
//! A reset the kernel drops looks like a reset sent to shedder's own counters; only the
//! driver knows, so its statistic is read, exported and warned about when it rises.

use std::time::{Duration, Instant};

use tracing::warn;

/// How often the driver statistics are read.
const READ_EVERY: Duration = Duration::from_secs(1);
/// The most often a rising error count is logged per interface.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One interface's error count between readings, and when it was last warned about.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorTrend {
    /// The driver's cumulative count at the last reading.
    pub last: Option<u64>,
    /// Errors seen since the last warning, not yet reported.
    unreported: u64,
    last_warned: Option<Instant>,
}

impl ErrorTrend {
    /// Take a reading; returns the errors to warn about now (new ones since the last
    /// warning, at most once per [`WARN_EVERY`]).
    pub fn observe(&mut self, reading: Option<u64>, now: Instant) -> Option<u64> {
        if let (Some(prev), Some(cur)) = (self.last, reading) {
            // A smaller count means the counter was reset (interface re-created).
            self.unreported += cur.checked_sub(prev).unwrap_or(cur);
        }
        self.last = reading.or(self.last);
        let due = self
            .last_warned
            .is_none_or(|t| now.duration_since(t) >= WARN_EVERY);
        if self.unreported > 0 && due {
            self.last_warned = Some(now);
            return Some(std::mem::take(&mut self.unreported));
        }
        None
    }
}

#[derive(Debug)]
struct Watched {
    iface: String,
    native: bool,
    errors: ErrorTrend,
    /// For native XDP with resets: why they cannot leave, at the last reading.
    problem: Option<String>,
}

/// The interfaces shedder is attached to, watched for refusals that do not leave.
#[derive(Debug, Default)]
pub struct Monitor {
    watched: Vec<Watched>,
    last_read: Option<Instant>,
}

impl Monitor {
    /// `attached`: (interface, whether it runs native XDP).
    pub fn new(attached: impl IntoIterator<Item = (String, bool)>) -> Self {
        Self {
            watched: attached
                .into_iter()
                .map(|(iface, native)| Watched {
                    iface,
                    native,
                    errors: ErrorTrend::default(),
                    problem: None,
                })
                .collect(),
            last_read: None,
        }
    }

    /// Read the statistics if a second has passed, and warn about what went wrong since.
    /// `replies`: some enforcing service answers with resets.
    pub fn poll(&mut self, now: Instant, replies: bool) {
        if self
            .last_read
            .is_some_and(|t| now.duration_since(t) < READ_EVERY)
        {
            return;
        }
        self.last_read = Some(now);
        for w in &mut self.watched {
            let reading = super::xdp_tx_errors(&w.iface).ok().flatten();
            if let Some(n) = w.errors.observe(reading, now) {
                warn!(
                    interface = %w.iface,
                    errors = n,
                    "frames sent back by XDP_TX (resets) failed to leave the interface (the \
                     driver's xdp_tx_errors rose): refused clients wait for a timeout instead \
                     of a reset; `shedder doctor` checks the interface"
                );
            }
            let problem = (w.native && replies)
                .then(|| super::native_reset_problem(&w.iface))
                .flatten();
            if let Some(p) = &problem
                && w.problem.is_none()
            {
                warn!(
                    interface = %w.iface,
                    "{p}: restart shedder with attach = \"auto\" (tc on a veth) or give the \
                     peer an XDP program"
                );
            }
            w.problem = problem;
        }
    }

    /// What is wrong now, for `status`: native veths whose peer takes no XDP_TX frames.
    pub fn problems(&self) -> Vec<String> {
        self.watched
            .iter()
            .filter_map(|w| w.problem.clone())
            .collect()
    }

    /// The driver's cumulative XDP_TX error count of `iface` at the last reading.
    pub fn errors(&self, iface: &str) -> Option<u64> {
        self.watched
            .iter()
            .find(|w| w.iface == iface)
            .and_then(|w| w.errors.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rising_count_is_reported_at_most_every_ten_seconds() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut e = ErrorTrend::default();
        assert_eq!(
            e.observe(Some(5), at(0)),
            None,
            "the first reading is the baseline"
        );
        assert_eq!(e.observe(Some(5), at(1)), None);
        assert_eq!(e.observe(Some(9), at(2)), Some(4));
        assert_eq!(e.observe(Some(12), at(3)), None, "warned a second ago");
        assert_eq!(e.observe(Some(12), at(11)), None, "9 s since the warning");
        assert_eq!(e.observe(Some(12), at(12)), Some(3), "the 3 held back");
    }

    #[test]
    fn pending_errors_are_reported_once_due() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut e = ErrorTrend::default();
        e.observe(Some(0), at(0));
        assert_eq!(e.observe(Some(1), at(1)), Some(1));
        assert_eq!(e.observe(Some(4), at(2)), None);
        assert_eq!(e.observe(Some(4), at(12)), Some(3));
        assert_eq!(e.observe(Some(4), at(30)), None);
        // A reset counter (interface re-created) counts from zero.
        assert_eq!(e.observe(Some(2), at(31)), Some(2));
        // An unreadable statistic keeps the last value.
        assert_eq!(e.observe(None, at(50)), None);
        assert_eq!(e.last, Some(2));
    }
}
