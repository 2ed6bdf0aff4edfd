//! What a run measured: outcome counts and latencies per class ([`Counts`]), over a window
//! of seconds ([`Window`]), and the whole run ([`LoadReport`]).

use std::{collections::BTreeMap, fmt, ops::Range, sync::Arc, time::Duration};

use super::client::Outcome;
use crate::stats::nearest_rank;

/// Outcome counts and ok-latencies of a set of requests (one class or all, over a window).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// Arrivals (every scheduled request, dropped ones included).
    pub offered: u64,
    pub ok: u64,
    pub refused: u64,
    pub reset: u64,
    pub busy: u64,
    pub timeout: u64,
    pub error: u64,
    pub generator_dropped: u64,
    /// Connection attempts, retries included.
    pub attempts: u64,
    /// Latencies of the ok requests in microseconds, from the scheduled arrival to the
    /// response, unsorted.
    pub latencies_us: Vec<u32>,
}

impl Counts {
    pub(super) fn add(&mut self, r: &Record) {
        self.offered += 1;
        self.attempts += u64::from(r.attempts);
        match r.outcome {
            Outcome::Ok => {
                self.ok += 1;
                self.latencies_us
                    .push(r.elapsed.as_micros().min(u32::MAX as u128) as u32);
            }
            Outcome::Refused => self.refused += 1,
            Outcome::Reset => self.reset += 1,
            Outcome::Busy => self.busy += 1,
            Outcome::Timeout => self.timeout += 1,
            Outcome::Error => self.error += 1,
            Outcome::GeneratorDropped => self.generator_dropped += 1,
        }
    }

    /// Add another set.
    pub fn merge(&mut self, other: &Counts) {
        self.offered += other.offered;
        self.ok += other.ok;
        self.refused += other.refused;
        self.reset += other.reset;
        self.busy += other.busy;
        self.timeout += other.timeout;
        self.error += other.error;
        self.generator_dropped += other.generator_dropped;
        self.attempts += other.attempts;
        self.latencies_us.extend_from_slice(&other.latencies_us);
    }

    /// Requests that did not end ok.
    pub fn failed(&self) -> u64 {
        self.offered - self.ok
    }

    /// `n` as a share of the offered requests (0 when nothing was offered).
    pub fn share(&self, n: u64) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            n as f64 / self.offered as f64
        }
    }

    /// The q-quantile (0..=1, nearest rank) of the ok latencies; None without ok requests.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let us = nearest_rank(self.latencies_us.iter().copied(), q)?;
        Some(Duration::from_micros(u64::from(us)))
    }

    /// Median latency of the ok requests.
    pub fn p50(&self) -> Option<Duration> {
        self.latency_quantile(0.50)
    }

    /// 99th percentile latency of the ok requests.
    pub fn p99(&self) -> Option<Duration> {
        self.latency_quantile(0.99)
    }
}

/// The requests that arrived in `[start, start + seconds)` seconds after the run began,
/// per class (in the order the classes were given) and all together. A per-second row
/// ([`SecondStats`]) is a window of one second.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// First second (since the run began).
    pub start: u64,
    /// Length in seconds.
    pub seconds: u64,
    /// Class labels, indexing `by_class`.
    pub labels: Arc<[String]>,
    pub by_class: Vec<Counts>,
    pub all: Counts,
}

/// One second of a run, by arrival time.
pub type SecondStats = Window;

impl Window {
    pub(super) fn empty(labels: Arc<[String]>, start: u64, seconds: u64) -> Self {
        Self {
            start,
            seconds,
            by_class: vec![Counts::default(); labels.len()],
            labels,
            all: Counts::default(),
        }
    }

    /// The counts of the class called `label`.
    pub fn class(&self, label: &str) -> Option<&Counts> {
        let i = self.labels.iter().position(|l| l == label)?;
        self.by_class.get(i)
    }

    /// Ok requests per second over the window.
    pub fn goodput(&self) -> f64 {
        self.all.ok as f64 / self.seconds.max(1) as f64
    }

    /// Arrivals per second over the window.
    pub fn offered_rate(&self) -> f64 {
        self.all.offered as f64 / self.seconds.max(1) as f64
    }

    fn merge(&mut self, other: &Window) {
        for (a, b) in self.by_class.iter_mut().zip(&other.by_class) {
            a.merge(b);
        }
        self.all.merge(&other.all);
    }

    /// The column headers matching this window's `Display` row.
    pub fn header(&self) -> String {
        let mut s = format!(
            "{:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>7} {:>5} {:>7} {:>8} {:>8}",
            "t(s)",
            "offered",
            "ok",
            "refused",
            "reset",
            "busy",
            "timeout",
            "error",
            "dropped",
            "p50(ms)",
            "p99(ms)"
        );
        for label in self.labels.iter() {
            s.push_str(&format!(" {:>14}", format!("{label} ok/off")));
        }
        s
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

impl fmt::Display for Window {
    /// One table row (see [`Window::header`]): counts over the window, latencies of ok
    /// requests, then ok/offered per class.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = if self.seconds == 1 {
            format!("{}", self.start)
        } else {
            format!("{}-{}", self.start, self.start + self.seconds)
        };
        let a = &self.all;
        write!(
            f,
            "{span:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>7} {:>5} {:>7} {:>8} {:>8}",
            a.offered,
            a.ok,
            a.refused,
            a.reset,
            a.busy,
            a.timeout,
            a.error,
            a.generator_dropped,
            ms(a.p50()),
            ms(a.p99())
        )?;
        for c in &self.by_class {
            write!(f, " {:>14}", format!("{}/{}", c.ok, c.offered))?;
        }
        Ok(())
    }
}

/// One request as it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Index into the class mix.
    pub class: usize,
    /// Scheduled arrival, since the run began.
    pub start: Duration,
    pub outcome: Outcome,
    /// From the scheduled arrival to the outcome (the latency, for ok requests).
    pub elapsed: Duration,
    /// Connection attempts (1 + retries made; 0 for generator-dropped arrivals).
    pub attempts: u32,
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Class labels, in the order given.
    pub labels: Arc<[String]>,
    /// One window per second of the schedule, by arrival time.
    pub seconds: Vec<SecondStats>,
    /// Every request, in completion order.
    pub records: Vec<Record>,
    /// Messages of the `Error` outcomes, counted.
    pub errors: BTreeMap<String, u64>,
    /// The largest delay between a scheduled arrival and the moment the generator started
    /// it. Latencies and deadlines count from the scheduled time, so a generator that falls
    /// behind shows here and in the latencies, never as fewer arrivals.
    pub max_dispatch_lag: Duration,
    /// The cap on outstanding requests in force (after the file-descriptor limit).
    pub max_outstanding: usize,
}

impl LoadReport {
    /// The whole run.
    pub fn total(&self) -> Window {
        self.range(0..self.seconds.len() as u64)
    }

    /// The seconds in `range` (clamped to the run), e.g. a phase.
    pub fn range(&self, range: Range<u64>) -> Window {
        let end = range.end.min(self.seconds.len() as u64);
        let start = range.start.min(end);
        let mut w = Window::empty(self.labels.clone(), start, end - start);
        for s in &self.seconds[start as usize..end as usize] {
            w.merge(s);
        }
        w
    }

    /// The last `n` seconds.
    pub fn last(&self, n: u64) -> Window {
        let len = self.seconds.len() as u64;
        self.range(len.saturating_sub(n)..len)
    }

    /// The per-second table with a total line, for printing.
    pub fn table(&self) -> String {
        let total = self.total();
        let mut s = total.header();
        s.push('\n');
        for w in &self.seconds {
            s.push_str(&format!("{w}\n"));
        }
        s.push_str(&format!("{total}\n"));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let c = Counts {
            latencies_us: (1..=100).rev().collect(),
            ..Counts::default()
        };
        assert_eq!(c.p50(), Some(Duration::from_micros(50)));
        assert_eq!(c.p99(), Some(Duration::from_micros(99)));
        assert_eq!(c.latency_quantile(1.0), Some(Duration::from_micros(100)));
        assert_eq!(Counts::default().p99(), None);
    }
}
