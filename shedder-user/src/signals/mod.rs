//! What the controller sees of each service, once per tick: kernel-measured accept-queue age
//! and response latency over the last window, in-flight connections, offered / admitted /
//! shed rates per class, accept-queue depth, listen overflows and cgroup pressure.
//!
//! A source that cannot be read is reported as [`Reading::Missing`] with the reason, or as
//! [`Reading::Stale`] (the last value and its age) for a short while after a failure; a
//! value is never invented as zero.

pub mod diag;
pub mod netstat;
pub mod psi;

use std::{
    collections::VecDeque,
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use shedder_common::{
    COUNTERS_PER_SERVICE, NUM_CLASSES, NUM_REASONS, NUM_VERDICTS, VERDICT_DROP, VERDICT_DRY_RUN,
    VERDICT_PASS, VERDICT_RST, decision_index, hist,
};

use crate::ebpf::MapReader;

/// A value from one source, or why there is none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Reading<T> {
    Ok {
        value: T,
    },
    /// The source failed this tick; `value` is the last good one, `age_ms` old.
    Stale {
        value: T,
        age_ms: u64,
    },
    Missing {
        reason: String,
    },
}

impl<T> Reading<T> {
    pub fn missing(reason: impl Into<String>) -> Self {
        Self::Missing {
            reason: reason.into(),
        }
    }

    /// The value if fresh.
    pub fn ok(&self) -> Option<&T> {
        match self {
            Self::Ok { value } => Some(value),
            _ => None,
        }
    }

    /// The value, fresh or stale.
    pub fn value(&self) -> Option<&T> {
        match self {
            Self::Ok { value } | Self::Stale { value, .. } => Some(value),
            Self::Missing { .. } => None,
        }
    }
}

/// Percentiles of a duration over the window, in milliseconds; `None` when the window
/// holds no observation (a quiet service), which is not the same as a zero.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub samples: u64,
}

/// Connection attempts of one class per second over the last tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassRates {
    /// Every new attempt that reached a decision.
    pub offered: f64,
    pub admitted: f64,
    /// Dropped or reset.
    pub shed: f64,
    /// Would have been shed (dry-run services).
    pub dry_run: f64,
}

/// Accept queues of the service's listening sockets, summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptQueue {
    pub depth: u32,
    pub backlog: u32,
    pub listeners: u32,
}

/// Listen-queue failures in the network namespace during the last tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflows {
    pub overflows: u64,
    pub drops: u64,
}

/// One resource's pressure: the kernel's 10 s average and the share of the last tick
/// stalled, from the cumulative totals.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PressureWindow {
    pub some_avg10: f64,
    pub full_avg10: Option<f64>,
    /// Fraction (0..1) of the last tick some task was stalled.
    pub some_ratio: f64,
    pub full_ratio: Option<f64>,
}

/// CPU throttling during the last tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottlingWindow {
    pub periods_throttled: u64,
    pub throttled_us: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pressures {
    pub cpu: Reading<PressureWindow>,
    pub memory: Reading<PressureWindow>,
    pub io: Reading<PressureWindow>,
    pub throttling: Reading<ThrottlingWindow>,
}

/// Everything measured about one service at one tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    pub service: String,
    /// Width of the window the percentiles cover.
    pub window_ms: u64,
    /// ESTABLISHED → first read by the application.
    pub queue_age: Reading<Quantiles>,
    /// A read → the next write.
    pub latency: Reading<Quantiles>,
    /// Established connections per class (kernel count).
    pub inflight: Reading<[u32; NUM_CLASSES]>,
    /// Admitted attempts not yet established, per class.
    pub pending: Reading<[u32; NUM_CLASSES]>,
    pub rates: Reading<[ClassRates; NUM_CLASSES]>,
    pub accept_queue: Reading<AcceptQueue>,
    pub listen: Reading<Overflows>,
    pub pressure: Pressures,
}

/// What the reader needs to know of a service.
#[derive(Clone, Debug)]
pub struct ServiceSpec {
    pub id: u32,
    pub name: String,
    pub ports: Vec<u16>,
    /// Destination addresses; empty = any.
    pub addresses: Vec<IpAddr>,
    /// Absolute path of the service's cgroup v2 directory, if configured.
    pub cgroup: Option<PathBuf>,
}

/// A source whose last good value is remembered for `STALE_FOR` after a failure.
struct Remembered<T: Clone> {
    last: Option<(Instant, T)>,
}

impl<T: Clone> Default for Remembered<T> {
    fn default() -> Self {
        Self { last: None }
    }
}

/// How long a failed source keeps reporting its last value (as stale).
const STALE_FOR: Duration = Duration::from_secs(2);

impl<T: Clone> Remembered<T> {
    fn update(&mut self, now: Instant, result: Result<T, String>) -> Reading<T> {
        match result {
            Ok(value) => {
                self.last = Some((now, value.clone()));
                Reading::Ok { value }
            }
            Err(reason) => match &self.last {
                Some((at, value)) if now.duration_since(*at) <= STALE_FOR => Reading::Stale {
                    value: value.clone(),
                    age_ms: now.duration_since(*at).as_millis() as u64,
                },
                _ => Reading::missing(reason),
            },
        }
    }
}

/// Per-service state between ticks.
struct ServiceReader {
    spec: ServiceSpec,
    /// Cumulative histograms at the previous tick, and the per-tick increments of the window.
    hist_prev: Option<Vec<u64>>,
    /// Sums of the observations per kind (µs), cumulative, as last read.
    hist_sums: Option<[u64; hist::KINDS as usize]>,
    hist_window: VecDeque<Vec<u64>>,
    counters_prev: Option<[u64; COUNTERS_PER_SERVICE]>,
    psi_files: Option<psi::CgroupFiles>,
    psi_prev: [Option<psi::Pressure>; 3],
    throttle_prev: Option<psi::Throttling>,
    inflight: Remembered<[u32; NUM_CLASSES]>,
    accept_queue: Remembered<AcceptQueue>,
}

/// Turns cumulative kernel state into per-tick [`Signals`].
pub struct SignalReader {
    services: Vec<ServiceReader>,
    /// Ticks the percentile window spans.
    window_ticks: usize,
    netstat_prev: Option<netstat::ListenCounters>,
    last_tick: Option<Instant>,
}

impl SignalReader {
    /// `window_ticks` ticks of histogram increments make one percentile window.
    pub fn new(services: Vec<ServiceSpec>, window_ticks: usize) -> Self {
        Self {
            services: services
                .into_iter()
                .map(|spec| ServiceReader {
                    psi_files: spec.cgroup.as_deref().map(psi::CgroupFiles::new),
                    spec,
                    hist_prev: None,
                    hist_sums: None,
                    hist_window: VecDeque::new(),
                    counters_prev: None,
                    psi_prev: [None; 3],
                    throttle_prev: None,
                    inflight: Remembered::default(),
                    accept_queue: Remembered::default(),
                })
                .collect(),
            window_ticks: window_ticks.max(1),
            netstat_prev: None,
            last_tick: None,
        }
    }

    /// Read every source once. Call from a thread in the services' network namespace
    /// (listen queues and overflow counters are per namespace). The first tick has no
    /// previous values, so its rates, windows and deltas are missing.
    /// The pending-attempt epoch is taken from the clock the heartbeat last stamped
    /// (`Globals::clock_jiffies`), so the reader needs only read access to the maps: call
    /// [`Shedder::clock`] first for an exact epoch.
    pub fn tick(&mut self, shedder: &impl MapReader, now: Instant) -> Vec<Signals> {
        let elapsed = self.last_tick.map(|t| now.duration_since(t));
        self.last_tick = Some(now);
        let listeners = diag::listeners().map_err(|e| format!("sock_diag: {e}"));
        let listen = self.listen_window(elapsed);
        let window_ticks = self.window_ticks;
        let epoch = shedder
            .globals()
            .map(|g| {
                let shift = match g.pending_epoch_shift {
                    0 | 64.. => shedder_common::DEFAULT_PENDING_EPOCH_SHIFT,
                    s => s,
                };
                g.clock_jiffies >> shift
            })
            .map_err(|e| e.to_string());
        self.services
            .iter_mut()
            .map(|s| {
                s.tick(
                    shedder,
                    now,
                    elapsed,
                    window_ticks,
                    (&listeners, &epoch),
                    listen.clone(),
                )
            })
            .collect()
    }

    fn listen_window(&mut self, elapsed: Option<Duration>) -> Reading<Overflows> {
        match netstat::read() {
            Ok(now) => {
                let prev = self.netstat_prev.replace(now);
                match (prev, elapsed) {
                    (Some(p), Some(_)) => Reading::Ok {
                        value: Overflows {
                            overflows: now.overflows.saturating_sub(p.overflows),
                            drops: now.drops.saturating_sub(p.drops),
                        },
                    },
                    _ => Reading::missing("first tick: no previous counters"),
                }
            }
            Err(e) => {
                self.netstat_prev = None;
                Reading::missing(format!("/proc/thread-self/net/netstat: {e}"))
            }
        }
    }
}

/// The cumulative kernel values a reader saw at its last tick (for the metrics endpoint,
/// which exports counters and histograms as cumulative series).
#[derive(Clone, Debug, Default)]
pub struct Cumulative {
    pub counters: Option<[u64; COUNTERS_PER_SERVICE]>,
    pub histograms: Option<Vec<u64>>,
    pub sums_us: Option<[u64; hist::KINDS as usize]>,
}

impl SignalReader {
    /// Per service, the cumulative counters and histograms read at the last tick.
    pub fn cumulative(&self) -> Vec<Cumulative> {
        self.services
            .iter()
            .map(|s| Cumulative {
                counters: s.counters_prev,
                histograms: s.hist_prev.clone(),
                sums_us: s.hist_sums,
            })
            .collect()
    }

    /// The namespace's listen counters (cumulative) at the last tick.
    pub fn listen_counters(&self) -> Option<netstat::ListenCounters> {
        self.netstat_prev
    }
}

impl ServiceReader {
    fn tick(
        &mut self,
        shedder: &impl MapReader,
        now: Instant,
        elapsed: Option<Duration>,
        window_ticks: usize,
        (listeners, epoch): (&Result<Vec<diag::Listener>, String>, &Result<u64, String>),
        listen: Reading<Overflows>,
    ) -> Signals {
        let id = self.spec.id;
        let (queue_age, latency, window_ms) = self.histograms(shedder, elapsed, window_ticks);
        let inflight = self.inflight.update(
            now,
            shedder
                .inflight(id)
                .map(|i| i.class)
                .map_err(|e| e.to_string()),
        );
        let pending = match (shedder.pending(id), epoch) {
            (Ok(p), Ok(epoch)) => Reading::Ok {
                value: std::array::from_fn(|c| p.count(c, *epoch).0),
            },
            (Err(e), _) => Reading::missing(e.to_string()),
            (_, Err(e)) => Reading::missing(e.clone()),
        };
        let rates = self.rates(shedder, elapsed);
        let accept_queue = self
            .accept_queue
            .update(now, listeners.clone().and_then(|l| self.spec.queue(&l)));
        let pressure = self.pressure(elapsed);
        Signals {
            service: self.spec.name.clone(),
            window_ms,
            queue_age,
            latency,
            inflight,
            pending,
            rates,
            accept_queue,
            listen,
            pressure,
        }
    }

    fn histograms(
        &mut self,
        shedder: &impl MapReader,
        elapsed: Option<Duration>,
        window_ticks: usize,
    ) -> (Reading<Quantiles>, Reading<Quantiles>, u64) {
        let tick_ms = elapsed.map_or(0, |e| e.as_millis() as u64);
        let current = match shedder.histograms_with_sums(self.spec.id) {
            Ok((h, sums)) => {
                self.hist_sums = Some(sums);
                h
            }
            Err(e) => {
                self.hist_sums = None;
                self.hist_prev = None;
                self.hist_window.clear();
                let r = Reading::missing(format!("histograms: {e}"));
                return (r.clone(), r, 0);
            }
        };
        if let Some(prev) = self.hist_prev.replace(current.clone()) {
            let delta: Vec<u64> = current
                .iter()
                .zip(&prev)
                .map(|(c, p)| c.saturating_sub(*p))
                .collect();
            self.hist_window.push_back(delta);
            while self.hist_window.len() > window_ticks {
                self.hist_window.pop_front();
            }
        } else {
            let r = Reading::missing("first tick: no window yet");
            return (r.clone(), r, 0);
        }
        let mut sum = vec![0u64; current.len()];
        for d in &self.hist_window {
            for (s, v) in sum.iter_mut().zip(d) {
                *s += v;
            }
        }
        let quantiles = |kind: u32| {
            let start = hist::index(kind, 0) as usize;
            let counts = &sum[start..start + hist::BUCKETS as usize];
            let samples: u64 = counts.iter().sum();
            let ms = |q| hist::quantile(counts, q).map(|us| us / 1000.0);
            Reading::Ok {
                value: Quantiles {
                    p50_ms: ms(0.50),
                    p90_ms: ms(0.90),
                    p99_ms: ms(0.99),
                    samples,
                },
            }
        };
        (
            quantiles(hist::KIND_QUEUE_AGE),
            quantiles(hist::KIND_LATENCY),
            tick_ms * self.hist_window.len() as u64,
        )
    }

    fn rates(
        &mut self,
        shedder: &impl MapReader,
        elapsed: Option<Duration>,
    ) -> Reading<[ClassRates; NUM_CLASSES]> {
        let current = match shedder.counters(self.spec.id) {
            Ok(c) => c,
            Err(e) => {
                self.counters_prev = None;
                return Reading::missing(format!("counters: {e}"));
            }
        };
        let (Some(prev), Some(elapsed)) = (self.counters_prev.replace(current), elapsed) else {
            return Reading::missing("first tick: no previous counters");
        };
        let secs = elapsed.as_secs_f64().max(1e-6);
        let mut rates = [ClassRates::default(); NUM_CLASSES];
        for (class, r) in rates.iter_mut().enumerate() {
            let per_verdict = |verdict: u32| -> f64 {
                (0..NUM_REASONS)
                    .map(|reason| {
                        let i = decision_index(class as u32, verdict, reason) as usize;
                        current[i].saturating_sub(prev[i])
                    })
                    .sum::<u64>() as f64
                    / secs
            };
            r.admitted = per_verdict(VERDICT_PASS);
            r.shed = per_verdict(VERDICT_DROP) + per_verdict(VERDICT_RST);
            r.dry_run = per_verdict(VERDICT_DRY_RUN);
            r.offered = (0..NUM_VERDICTS).map(per_verdict).sum();
        }
        Reading::Ok { value: rates }
    }

    fn pressure(&mut self, elapsed: Option<Duration>) -> Pressures {
        let Some(files) = self.psi_files.as_mut() else {
            const WHY: &str = "no cgroup configured for this service";
            return Pressures {
                cpu: Reading::missing(WHY),
                memory: Reading::missing(WHY),
                io: Reading::missing(WHY),
                throttling: Reading::missing(WHY),
            };
        };
        let secs = elapsed.map(|e| e.as_secs_f64() * 1e6);
        let prevs = &mut self.psi_prev;
        let [cpu, memory, io] = std::array::from_fn(|i| match files.pressure(i) {
            Ok(p) => match (prevs[i].replace(p), secs) {
                (Some(prev), Some(us)) => Reading::Ok {
                    value: PressureWindow {
                        some_avg10: p.some_avg10,
                        full_avg10: p.full_avg10,
                        some_ratio: p.some_total_us.saturating_sub(prev.some_total_us) as f64 / us,
                        full_ratio: p
                            .full_total_us
                            .zip(prev.full_total_us)
                            .map(|(n, o)| n.saturating_sub(o) as f64 / us),
                    },
                },
                _ => Reading::missing("first tick: no previous totals"),
            },
            Err(e) => {
                prevs[i] = None;
                Reading::missing(e.to_string())
            }
        });
        let throttling = match files.throttling() {
            Ok(t) => match (self.throttle_prev.replace(t), elapsed) {
                (Some(prev), Some(_)) => Reading::Ok {
                    value: ThrottlingWindow {
                        periods_throttled: t.nr_throttled.saturating_sub(prev.nr_throttled),
                        throttled_us: t.throttled_usec.saturating_sub(prev.throttled_usec),
                    },
                },
                _ => Reading::missing("first tick: no previous counters"),
            },
            Err(e) => {
                self.throttle_prev = None;
                Reading::missing(e.to_string())
            }
        };
        Pressures {
            cpu,
            memory,
            io,
            throttling,
        }
    }
}

impl ServiceSpec {
    /// The accept queues of this service's listeners.
    fn queue(&self, listeners: &[diag::Listener]) -> Result<AcceptQueue, String> {
        let mut q = AcceptQueue {
            depth: 0,
            backlog: 0,
            listeners: 0,
        };
        for l in listeners {
            if !self.ports.contains(&l.port) {
                continue;
            }
            // A wildcard listener serves every address; a bound one only its own.
            let serves = self.addresses.is_empty()
                || l.addr.is_unspecified()
                || self.addresses.contains(&l.addr);
            if serves {
                q.depth += l.accept_queue;
                q.backlog += l.backlog;
                q.listeners += 1;
            }
        }
        if q.listeners == 0 {
            return Err(format!(
                "no listening socket on port(s) {:?} in this network namespace",
                self.ports
            ));
        }
        Ok(q)
    }
}
