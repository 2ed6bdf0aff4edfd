//! Reading the signals each tick: the maps, sock_diag, /proc and PSI, with each source's
//! last good value remembered for a while after it fails.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use shedder_common::{
    COUNTERS_PER_SERVICE, NUM_CLASSES, NUM_VERDICTS, REASON_SLOTS, Reason, ServiceCounters,
    VERDICT_DROP, VERDICT_DRY_RUN, VERDICT_PASS, VERDICT_RST, decision_index, hist,
};

use crate::{
    config::Protocol,
    kernel::{MapReader, diag},
};

use super::{
    AcceptQueue, ClassRates, ClassSources, Overflows, PressureWindow, Pressures, Quantiles,
    Reading, RetryWindow, ServiceSpec, Signals, ThrottlingWindow, UdpQueue, Unproven,
    UnprovenRates, Waiting, netstat, psi, retry_ratio, snmp,
};

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
    counters_prev: Option<ServiceCounters>,
    retry_window: RetryTally,
    psi_files: Option<psi::CgroupFiles>,
    psi_prev: [Option<psi::Pressure>; 3],
    throttle_prev: Option<psi::Throttling>,
    inflight: Remembered<[u32; NUM_CLASSES]>,
    accept_queue: Remembered<AcceptQueue>,
    udp: Remembered<UdpQueue>,
    /// A QUIC service's sockets (address, port, drops) at the last tick, for the drops'
    /// difference.
    udp_prev: Option<Vec<(std::net::IpAddr, u16, u32)>>,
    /// The drops counted tick by tick since the reader started.
    udp_drops: u64,
}

/// What a tick reads once for every service: the namespace's sockets, the pending epoch.
struct Shared {
    listeners: Result<Vec<diag::Listener>, String>,
    udp: Result<Vec<diag::UdpSocket>, String>,
    /// The fair-share epoch and the hold slot of the kernel's clock.
    epoch: Result<(u64, u64), String>,
}

/// Turns cumulative kernel state into per-tick [`Signals`].
pub struct SignalReader {
    services: Vec<ServiceReader>,
    /// Ticks the percentile window spans.
    window_ticks: usize,
    netstat_prev: Option<netstat::ListenCounters>,
    /// The namespace's UDP errors at the last tick.
    udp_errors: Option<snmp::UdpCounters>,
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
                    retry_window: RetryTally::default(),
                    psi_prev: [None; 3],
                    throttle_prev: None,
                    inflight: Remembered::default(),
                    accept_queue: Remembered::default(),
                    udp: Remembered::default(),
                    udp_prev: None,
                    udp_drops: 0,
                })
                .collect(),
            window_ticks: window_ticks.max(1),
            netstat_prev: None,
            udp_errors: None,
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
        // UDP sockets only when some service is QUIC's (a host may hold many).
        let udp = if self
            .services
            .iter()
            .any(|s| s.spec.protocol == Protocol::Quic)
        {
            diag::udp_sockets().map_err(|e| format!("sock_diag (UDP): {e}"))
        } else {
            Ok(Vec::new())
        };
        let listen = self.listen_window(elapsed);
        self.udp_errors = snmp::read().ok();
        let globals = shedder.globals().map_err(|e| e.to_string());
        let shared = Shared {
            listeners,
            udp,
            epoch: globals
                .as_ref()
                .map(|g| (g.epoch(g.clock_jiffies), g.hold_slot(g.clock_jiffies)))
                .map_err(Clone::clone),
        };
        let window_ticks = self.window_ticks;
        self.services
            .iter_mut()
            .map(|s| s.tick(shedder, now, elapsed, window_ticks, &shared, listen.clone()))
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
    /// The decision counters (unique attempts), indexed by `decision_index`.
    pub counters: Option<[u64; COUNTERS_PER_SERVICE]>,
    /// SYN retransmits per class.
    pub retransmits: Option<[u64; NUM_CLASSES]>,
    /// Retries per class (the attempt's own class, before demotion).
    pub retries: Option<[u64; NUM_CLASSES]>,
    /// The unproven attempts' decision counters, as `counters`.
    pub unproven: Option<[u64; COUNTERS_PER_SERVICE]>,
    /// Connections born of unproven attempts, and proven attempts disowned, per class.
    pub completed_unproven: Option<[u64; NUM_CLASSES]>,
    pub disowned: Option<[u64; NUM_CLASSES]>,
    pub histograms: Option<Vec<u64>>,
    pub sums_us: Option<[u64; hist::KINDS as usize]>,
    /// A QUIC service's datagrams dropped at its sockets since the daemon started.
    pub udp_drops: Option<u64>,
}

impl SignalReader {
    /// Per service, the cumulative counters and histograms read at the last tick.
    pub fn cumulative(&self) -> Vec<Cumulative> {
        self.services
            .iter()
            .map(|s| Cumulative {
                counters: s.counters_prev.map(|c| c.n),
                retransmits: s.counters_prev.map(|c| c.retransmits),
                retries: s.counters_prev.map(|c| c.retries),
                unproven: s.counters_prev.map(|c| c.unproven),
                completed_unproven: s.counters_prev.map(|c| c.completed_unproven),
                disowned: s.counters_prev.map(|c| c.disowned),
                histograms: s.hist_prev.clone(),
                sums_us: s.hist_sums,
                udp_drops: (s.spec.protocol == Protocol::Quic).then_some(s.udp_drops),
            })
            .collect()
    }

    /// The namespace's listen counters (cumulative) at the last tick.
    pub fn listen_counters(&self) -> Option<netstat::ListenCounters> {
        self.netstat_prev
    }

    /// The namespace's UDP errors (cumulative) at the last tick.
    pub fn udp_errors(&self) -> Option<snmp::UdpCounters> {
        self.udp_errors
    }
}

impl ServiceReader {
    fn tick(
        &mut self,
        shedder: &impl MapReader,
        now: Instant,
        elapsed: Option<Duration>,
        window_ticks: usize,
        shared: &Shared,
        listen: Reading<Overflows>,
    ) -> Signals {
        let Shared {
            listeners,
            udp,
            epoch,
        } = shared;
        let id = self.spec.id;
        let (queue_age, latency, window_ms) = self.histograms(shedder, elapsed, window_ticks);
        let read = shedder.inflight(id).map_err(|e| e.to_string());
        let inflight = self
            .inflight
            .update(now, read.as_ref().map(|i| i.class).map_err(Clone::clone));
        let (connections, waiting) = match self.spec.protocol {
            Protocol::Tcp => (
                match read {
                    Ok(i) => Reading::Ok {
                        value: i.connections,
                    },
                    Err(e) => Reading::missing(e),
                },
                self.waiting(shedder),
            ),
            Protocol::Quic => (
                Reading::missing("a QUIC service: see inflight"),
                Reading::missing("a QUIC service: its answers are not seen (see queue_age)"),
            ),
        };
        let held = match (shedder.pending(id), epoch) {
            (Ok(p), Ok((_, hold))) => Ok(p
                .count(*hold)
                .map(|c| c.map(|n| n.min(u32::MAX as u64) as u32))),
            (Err(e), _) => Err(e.to_string()),
            (_, Err(e)) => Err(e.clone()),
        };
        let pending = match &held {
            Ok([proven, _]) => Reading::Ok { value: *proven },
            Err(e) => Reading::missing(e.clone()),
        };
        let (rates, retry, unproven_rates) = self.rates(shedder, elapsed, window_ticks);
        let unproven = match (unproven_rates, &held) {
            (Ok(rates), Ok([_, held])) => Reading::Ok {
                value: Unproven { rates, held: *held },
            },
            (Err(e), _) => Reading::missing(e),
            (_, Err(e)) => Reading::missing(e.clone()),
        };
        let sources = match (shedder.fairness(id), epoch) {
            (Ok(f), Ok((epoch, _))) => Reading::Ok {
                value: std::array::from_fn(|c| {
                    let w = f.window(c, *epoch);
                    ClassSources {
                        active: f.previous(c, *epoch).sources,
                        surplus: w.surplus,
                        preempted: w.preempted,
                        firsts: w.firsts,
                        retries: w.retries,
                    }
                }),
            },
            (Err(e), _) => Reading::missing(e.to_string()),
            (_, Err(e)) => Reading::missing(e.clone()),
        };
        let (accept_queue, udp) = match self.spec.protocol {
            Protocol::Tcp => (
                self.accept_queue
                    .update(now, listeners.clone().and_then(|l| self.spec.queue(&l))),
                Reading::missing("a TCP service: see accept_queue"),
            ),
            Protocol::Quic => {
                let found = udp.clone().and_then(|u| self.udp_queue(&u));
                (
                    Reading::missing("a QUIC service has no accept queue: see udp"),
                    self.udp.update(now, found),
                )
            }
        };
        let pressure = self.pressure(elapsed);
        Signals {
            service: self.spec.name.clone(),
            window_ms,
            queue_age,
            latency,
            inflight,
            connections,
            waiting,
            pending,
            unproven,
            rates,
            retry,
            sources,
            accept_queue,
            udp,
            listen,
            pressure,
        }
    }

    /// The receive queues of this QUIC service's sockets, and their drops since the last
    /// tick (compared socket by socket: a socket that came or went since leaves the drops
    /// unknown for one tick rather than counting its whole history).
    fn udp_queue(&mut self, sockets: &[diag::UdpSocket]) -> Result<UdpQueue, String> {
        let mine: Vec<&diag::UdpSocket> = sockets
            .iter()
            .filter(|u| self.spec.serves(u.addr, u.port))
            .collect();
        if mine.is_empty() {
            self.udp_prev = None;
            return Err(format!(
                "no UDP socket bound to port(s) {:?} in this network namespace",
                self.spec.ports
            ));
        }
        let now: Vec<(std::net::IpAddr, u16, u32)> =
            mine.iter().map(|u| (u.addr, u.port, u.drops)).collect();
        let drops = self.udp_prev.as_ref().and_then(|prev| {
            let mut sum = 0u64;
            for (addr, port, d) in &now {
                let (_, _, p) = prev.iter().find(|(a, q, _)| a == addr && q == port)?;
                sum += u64::from(d.saturating_sub(*p));
            }
            (prev.len() == now.len()).then_some(sum)
        });
        self.udp_prev = Some(now);
        self.udp_drops += drops.unwrap_or(0);
        Ok(UdpQueue {
            depth: mine.iter().map(|u| u64::from(u.receive_queue)).sum(),
            buffer: mine.iter().map(|u| u64::from(u.receive_buffer)).sum(),
            sockets: mine.len() as u32,
            drops,
        })
    }

    /// The ages of the requests in service.
    fn waiting(&self, shedder: &impl MapReader) -> Reading<Waiting> {
        match shedder.work(self.spec.id) {
            Ok(t) => Reading::Ok {
                value: super::waiting(&t),
            },
            Err(e) => Reading::missing(format!("requests in service: {e}")),
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

    /// Per-class rates over the last tick, the retry window, and the unproven attempts'
    /// rates, from the service's counters.
    fn rates(
        &mut self,
        shedder: &impl MapReader,
        elapsed: Option<Duration>,
        window_ticks: usize,
    ) -> TickRates {
        let current = match shedder
            .service_counters(self.spec.id)
            .map_err(|e| e.to_string())
        {
            Ok(c) => c,
            Err(e) => {
                self.counters_prev = None;
                self.retry_window.clear();
                let why = format!("counters: {e}");
                return (
                    Reading::missing(why.clone()),
                    Reading::missing(why.clone()),
                    Err(why),
                );
            }
        };
        let (Some(prev), Some(elapsed)) = (self.counters_prev.replace(current), elapsed) else {
            const WHY: &str = "first tick: no previous counters";
            return (
                Reading::missing(WHY),
                Reading::missing(WHY),
                Err(WHY.into()),
            );
        };
        let delta = TickCounts::between(&prev, &current);
        let retry = self.retry_window.push(&delta, elapsed, window_ticks);
        (
            Reading::Ok {
                value: delta.rates(elapsed),
            },
            Reading::Ok { value: retry },
            Ok(delta.unproven_rates(elapsed)),
        )
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

/// The (retries, shed attempts) of each tick of the signal window.
#[derive(Debug, Default)]
struct RetryTally {
    ticks: VecDeque<(u64, u64)>,
}

impl RetryTally {
    /// Add a tick (`elapsed` long) and sum the last `window_ticks`.
    fn push(&mut self, tick: &TickCounts, elapsed: Duration, window_ticks: usize) -> RetryWindow {
        self.ticks.push_back((tick.retries(), tick.shed()));
        while self.ticks.len() > window_ticks.max(1) {
            self.ticks.pop_front();
        }
        let (retries, shed) = self
            .ticks
            .iter()
            .fold((0, 0), |(r, s), (dr, ds)| (r + dr, s + ds));
        RetryWindow {
            window_ms: elapsed.as_millis() as u64 * self.ticks.len() as u64,
            shed,
            retries,
            ratio: retry_ratio(retries, shed),
        }
    }

    fn clear(&mut self) {
        self.ticks.clear();
    }
}

/// One tick's per-class rates, retry window, and unproven attempts' rates.
type TickRates = (
    Reading<[ClassRates; NUM_CLASSES]>,
    Reading<RetryWindow>,
    Result<[UnprovenRates; NUM_CLASSES], String>,
);

/// What one tick added to a service's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TickCounts(ServiceCounters);

impl TickCounts {
    /// `current - prev`, counter by counter (a counter that went backwards, e.g. maps
    /// recreated, counts 0).
    fn between(prev: &ServiceCounters, current: &ServiceCounters) -> Self {
        let mut d = ServiceCounters::default();
        let sub = |out: &mut [u64], cur: &[u64], prev: &[u64]| {
            for ((o, c), p) in out.iter_mut().zip(cur).zip(prev) {
                *o = c.saturating_sub(*p);
            }
        };
        sub(&mut d.n, &current.n, &prev.n);
        sub(&mut d.retransmits, &current.retransmits, &prev.retransmits);
        sub(&mut d.retries, &current.retries, &prev.retries);
        sub(&mut d.unproven, &current.unproven, &prev.unproven);
        sub(
            &mut d.completed_unproven,
            &current.completed_unproven,
            &prev.completed_unproven,
        );
        sub(&mut d.disowned, &current.disowned, &prev.disowned);
        Self(d)
    }

    /// Per-class rates of the unproven attempts over `elapsed`.
    fn unproven_rates(&self, elapsed: Duration) -> [UnprovenRates; NUM_CLASSES] {
        let secs = elapsed.as_secs_f64().max(1e-6);
        std::array::from_fn(|class| {
            let c = class as u32;
            let verdict = |v| self.0.unproven_verdict(c, v) as f64 / secs;
            let refused = verdict(VERDICT_DROP) + verdict(VERDICT_RST) + verdict(VERDICT_DRY_RUN);
            UnprovenRates {
                offered: verdict(VERDICT_PASS) + refused,
                admitted: verdict(VERDICT_PASS),
                refused,
                capped: [VERDICT_DROP, VERDICT_RST, VERDICT_DRY_RUN]
                    .iter()
                    .map(|&v| {
                        self.0.unproven[decision_index(c, v, Reason::Unproven as u32) as usize]
                            as f64
                    })
                    .sum::<f64>()
                    / secs,
                completed: self.0.completed_unproven[class] as f64 / secs,
                disowned: self.0.disowned[class] as f64 / secs,
            }
        })
    }

    fn verdict(&self, class: usize, verdict: u32) -> u64 {
        (0..REASON_SLOTS)
            .map(|reason| self.0.n[decision_index(class as u32, verdict, reason) as usize])
            .sum()
    }

    /// Attempts whose source the packet path remembered as shed, every class: dropped,
    /// reset, or shed in dry-run.
    fn shed(&self) -> u64 {
        (0..NUM_CLASSES)
            .flat_map(|c| [VERDICT_DROP, VERDICT_RST, VERDICT_DRY_RUN].map(|v| self.verdict(c, v)))
            .sum()
    }

    /// Attempts of `class` refused (or, dry-run, that would have been) for `reason`.
    fn refused(&self, class: usize, reason: u32) -> u64 {
        self.0.refused(class as u32, reason)
    }

    fn retries(&self) -> u64 {
        self.0.retries.iter().sum()
    }

    /// Per-class rates over `elapsed`. Offered, admitted, shed and dry-run are sums of the
    /// decision counters of proven attempts only, less those their source disowned
    /// (forged in a known client's name and admitted), plus the unproven attempts that
    /// became connections (proven since): retransmits never enter the offered load, and
    /// neither do attempts from forged addresses.
    fn rates(&self, elapsed: Duration) -> [ClassRates; NUM_CLASSES] {
        let secs = elapsed.as_secs_f64().max(1e-6);
        std::array::from_fn(|class| {
            let per_second = |verdict| self.verdict(class, verdict) as f64 / secs;
            let completed = self.0.completed_unproven[class] as f64 / secs;
            let disowned = self.0.disowned[class] as f64 / secs;
            let admitted = (per_second(VERDICT_PASS) - disowned).max(0.0);
            let offered = ((0..NUM_VERDICTS).map(per_second).sum::<f64>() - disowned).max(0.0);
            ClassRates {
                admitted: admitted + completed,
                shed: per_second(VERDICT_DROP) + per_second(VERDICT_RST),
                dry_run: per_second(VERDICT_DRY_RUN),
                offered: offered + completed,
                retransmits: self.0.retransmits[class] as f64 / secs,
                retries: self.0.retries[class] as f64 / secs,
                refused_by_reason: std::array::from_fn(|r| {
                    self.refused(class, r as u32) as f64 / secs
                }),
                disowned,
            }
        })
    }
}

impl ServiceSpec {
    /// Whether a socket bound to `addr:port` receives this service's connections: one of
    /// its ports, and a wildcard address (it serves every one) or one of its addresses.
    fn serves(&self, addr: std::net::IpAddr, port: u16) -> bool {
        crate::config::socket_serves(&self.ports, &self.addresses, addr, port)
    }

    /// The accept queues of this service's listeners.
    fn queue(&self, listeners: &[diag::Listener]) -> Result<AcceptQueue, String> {
        let mut q = AcceptQueue {
            depth: 0,
            backlog: 0,
            listeners: 0,
        };
        for l in listeners {
            if self.serves(l.addr, l.port) {
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

#[cfg(test)]
mod tests {
    use shedder_common::{CLASS_CRITICAL, CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE, Reason};

    use super::*;

    fn count(c: &mut ServiceCounters, class: u32, verdict: u32, reason: Reason, n: u64) {
        c.n[decision_index(class, verdict, reason as u32) as usize] += n;
    }

    #[test]
    fn the_retry_ratio_is_retries_per_shed_attempt_and_absent_without_shedding() {
        assert_eq!(retry_ratio(0, 0), None, "nothing shed: no ratio, not 0/0");
        assert_eq!(
            retry_ratio(7, 0),
            None,
            "retries of sheds before the window"
        );
        assert_eq!(retry_ratio(0, 10), Some(0.0), "refused clients stayed away");
        assert_eq!(retry_ratio(3, 4), Some(0.75));
        assert_eq!(retry_ratio(10, 10), Some(1.0), "every refusal came back");
        assert_eq!(retry_ratio(6, 3), Some(2.0), "refused again, back again");
    }

    /// The offered load the controller sees comes from the decision counters `n` only: a
    /// tick with nothing but retransmitted SYNs offers nothing, while retries are offered
    /// attempts (counted in `n` too) and also counted apart.
    #[test]
    fn retransmits_are_not_offered_load() {
        let prev = ServiceCounters::default();
        let mut cur = prev;
        // 10 SHEDDABLE attempts dropped, then each SYN retransmitted twice.
        count(
            &mut cur,
            CLASS_SHEDDABLE,
            VERDICT_DROP,
            Reason::Priority,
            10,
        );
        cur.retransmits[CLASS_SHEDDABLE as usize] += 20;
        // 4 HIGH attempts admitted; 2 of them retries (counted under HIGH before demotion,
        // decided as MEDIUM and admitted there).
        count(&mut cur, CLASS_HIGH, VERDICT_PASS, Reason::Floor, 2);
        count(&mut cur, CLASS_MEDIUM, VERDICT_PASS, Reason::Floor, 2);
        cur.retries[CLASS_HIGH as usize] += 2;
        let tick = TickCounts::between(&prev, &cur);
        let r = tick.rates(Duration::from_millis(500));
        let s = CLASS_SHEDDABLE as usize;
        assert_eq!(
            (r[s].offered, r[s].shed, r[s].retransmits),
            (20.0, 20.0, 40.0)
        );
        let (h, m) = (CLASS_HIGH as usize, CLASS_MEDIUM as usize);
        assert_eq!((r[h].offered, r[h].retries), (4.0, 4.0));
        assert_eq!((r[m].offered, r[m].retries), (4.0, 0.0));
        let offered: f64 = r.iter().map(|c| c.offered).sum();
        assert_eq!(offered, 28.0, "14 unique attempts in half a second");
        // Refused at its share: pressure. A ceiling or a bucket would not be.
        assert_eq!(r[s].refused_by_reason[Reason::Priority as usize], 20.0);
        assert_eq!((r[s].pressed(), r[h].pressed()), (20.0, 0.0));
        assert_eq!((tick.shed(), tick.retries()), (10, 2));

        // Retransmits alone: no offered load, no demand for the allocation.
        let mut only = cur;
        only.retransmits[CLASS_SHEDDABLE as usize] += 1000;
        only.retransmits[CLASS_CRITICAL as usize] += 1000;
        let r = TickCounts::between(&cur, &only).rates(Duration::from_secs(1));
        assert!(r.iter().all(|c| c.offered == 0.0 && c.shed == 0.0));
        assert_eq!(r[s].retransmits, 1000.0);
    }

    #[test]
    fn the_retry_window_slides_over_the_signal_window() {
        let tick = |retries: u64, shed: u64| {
            let mut c = ServiceCounters::default();
            count(
                &mut c,
                CLASS_MEDIUM,
                VERDICT_RST,
                Reason::Priority,
                shed / 2,
            );
            count(
                &mut c,
                CLASS_SHEDDABLE,
                VERDICT_DROP,
                Reason::Priority,
                shed - shed / 2,
            );
            // Admitted attempts are not shed ones.
            count(&mut c, CLASS_SHEDDABLE, VERDICT_PASS, Reason::Floor, 100);
            c.retries[CLASS_MEDIUM as usize] = retries;
            TickCounts::between(&ServiceCounters::default(), &c)
        };
        let mut t = RetryTally::default();
        let ms200 = Duration::from_millis(200);
        let w = t.push(&tick(0, 0), ms200, 3);
        assert_eq!((w.window_ms, w.shed, w.retries, w.ratio), (200, 0, 0, None));
        let w = t.push(&tick(0, 10), ms200, 3);
        assert_eq!((w.shed, w.retries, w.ratio), (10, 0, Some(0.0)));
        let w = t.push(&tick(5, 10), ms200, 3);
        assert_eq!(
            (w.window_ms, w.shed, w.retries, w.ratio),
            (600, 20, 5, Some(0.25))
        );
        // The first tick leaves the window (3 ticks): same sums.
        let w = t.push(&tick(5, 0), ms200, 3);
        assert_eq!(
            (w.window_ms, w.shed, w.retries, w.ratio),
            (600, 20, 10, Some(0.5))
        );
        // Shedding stopped: once its ticks leave the window there is no ratio.
        t.push(&tick(0, 0), ms200, 3);
        let w = t.push(&tick(0, 0), ms200, 3);
        assert_eq!((w.shed, w.retries, w.ratio), (0, 5, None));
        let w = t.push(&tick(0, 0), ms200, 3);
        assert_eq!((w.shed, w.retries, w.ratio), (0, 0, None));
        t.clear();
        let w = t.push(&tick(1, 4), ms200, 3);
        assert_eq!((w.window_ms, w.ratio), (200, Some(0.25)));
    }

    #[test]
    fn a_dry_run_shed_is_a_shed_attempt() {
        // The packet path remembers a dry-run service's would-be-shed sources as shed, so
        // its retries are measured against them.
        let mut c = ServiceCounters::default();
        count(
            &mut c,
            CLASS_SHEDDABLE,
            VERDICT_DRY_RUN,
            Reason::Priority,
            8,
        );
        count(&mut c, CLASS_SHEDDABLE, VERDICT_PASS, Reason::UnderLimit, 8);
        c.retries[CLASS_SHEDDABLE as usize] = 2;
        let tick = TickCounts::between(&ServiceCounters::default(), &c);
        let w = RetryTally::default().push(&tick, Duration::from_secs(1), 5);
        assert_eq!((w.shed, w.retries, w.ratio), (8, 2, Some(0.25)));
    }

    #[test]
    fn counters_going_backwards_count_nothing() {
        let mut prev = ServiceCounters::default();
        prev.retransmits[0] = 5;
        prev.retries[1] = 5;
        count(&mut prev, CLASS_HIGH, VERDICT_DROP, Reason::Priority, 5);
        let tick = TickCounts::between(&prev, &ServiceCounters::default());
        assert_eq!(tick.0, ServiceCounters::default());
    }

    #[test]
    fn signals_without_the_retry_fields_still_parse() {
        // A daemon from before retries were counted reports neither `retry` nor the per-class
        // retransmit and retry rates.
        let rates: ClassRates = serde_json::from_str(
            r#"{"offered": 1.0, "admitted": 1.0, "shed": 0.0, "dry_run": 0.0}"#,
        )
        .unwrap();
        assert_eq!((rates.retransmits, rates.retries), (0.0, 0.0));
    }
}
