//! The open-loop load generator ([`LoadGen`]): requests on a schedule from a mix of
//! classes, each with a deadline, reported per second as they complete.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::Duration,
};

use tokio::time::Instant;

use super::{
    client::{Outcome, Protocol, raise_nofile_limit, request},
    cpu::pin_current_thread,
    schedule::{ArrivalClock, Arrivals, Phase, XorShift},
    stats::{LoadReport, Record, SecondStats, Window},
};
use crate::netns::Netns;

/// One class of the mix.
#[derive(Clone, Debug)]
pub struct ClassMix {
    pub label: String,
    /// Source address bound before connecting (its family must match the target's);
    /// unspecified lets the kernel choose.
    pub source: IpAddr,
    /// Share of the arrivals (normalised over all classes).
    pub fraction: f64,
    /// Distinct clients: each request comes from `source + k` for a `k` drawn uniformly
    /// from `0..hosts` (its retries from the same address). 1: every request from `source`.
    /// The addresses must be local to the client namespace (see [`add_local_range`]).
    pub hosts: u32,
}

/// The `k`-th address after `base` (wrapping within the family).
pub fn nth_address(base: IpAddr, k: u32) -> IpAddr {
    match base {
        IpAddr::V4(a) => IpAddr::V4(u32::from(a).wrapping_add(k).into()),
        IpAddr::V6(a) => IpAddr::V6(u128::from(a).wrapping_add(u128::from(k)).into()),
    }
}

/// Make every address of the IPv4 `prefix` (e.g. `"198.18.50.0/24"`) local to `ns`
/// ("AnyIP": a `local` route via `lo`), so clients can bind to any of them and the namespace
/// answers ARP for them on its other interfaces.
pub fn add_local_range(ns: &Netns, prefix: &str) {
    ns.ip(&["route", "add", "local", prefix, "dev", "lo"]);
}

/// An open-loop load generator: requests start on a schedule whether or not earlier ones
/// have finished, each with a deadline that bounds connect + send + response. Build it with
/// the methods below, then [`run`](LoadGen::run) / [`run_in`](LoadGen::run_in) (blocking,
/// with a callback per completed second) or [`start`](LoadGen::start) /
/// [`start_in`](LoadGen::start_in) (a [`LoadHandle`] with a receiver of seconds).
///
/// A second is reported once every request that arrived in it has finished, that is about
/// one deadline after it ends.
#[derive(Clone, Debug)]
pub struct LoadGen {
    pub target: SocketAddr,
    pub phases: Vec<Phase>,
    /// The class mix; empty means one class `"all"` from a kernel-chosen source.
    pub classes: Vec<ClassMix>,
    /// Whole-request deadline from the scheduled arrival (default 1 s).
    pub deadline: Duration,
    /// Immediate retries after a refused, reset or busy attempt while the deadline allows
    /// (default 0). Every attempt is counted.
    pub retries: u32,
    /// Cap on outstanding requests (default 20,000; lowered to the file-descriptor limit
    /// less a margin). Arrivals beyond it are counted as `generator_dropped`.
    pub max_outstanding: usize,
    pub arrivals: Arrivals,
    /// Seed of the arrival gaps and class picks: the same seed and schedule give the same
    /// arrivals.
    pub seed: u64,
    /// Run the generator's threads on this CPU only (None: anywhere), so that it does not
    /// take the CPU of what it measures.
    pub cpu: Option<usize>,
    /// What each connection speaks (default: the line protocol).
    pub protocol: Protocol,
}

impl LoadGen {
    /// A generator aimed at `target`, with no phases yet and the defaults above.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            phases: Vec::new(),
            classes: Vec::new(),
            deadline: Duration::from_secs(1),
            retries: 0,
            max_outstanding: 20_000,
            arrivals: Arrivals::Poisson,
            seed: 1,
            cpu: None,
            protocol: Protocol::Line,
        }
    }

    /// Append a phase of `rate` requests per second for `duration`.
    pub fn phase(mut self, duration: Duration, rate: f64) -> Self {
        self.phases.push(Phase::constant(duration, rate));
        self
    }

    /// Append a linear ramp from `from` to `to` requests per second over `duration`.
    pub fn ramp(mut self, duration: Duration, from: f64, to: f64) -> Self {
        self.phases.push(Phase::ramp(duration, from, to));
        self
    }

    /// Add a class: `fraction` of the arrivals, connecting from `source`.
    pub fn class(self, label: &str, source: IpAddr, fraction: f64) -> Self {
        self.class_hosts(label, source, 1, fraction)
    }

    /// Add a class of `hosts` distinct clients from `source` on (see [`ClassMix::hosts`]).
    pub fn class_hosts(mut self, label: &str, source: IpAddr, hosts: u32, fraction: f64) -> Self {
        assert!(hosts >= 1, "class {label}: at least one host");
        self.classes.push(ClassMix {
            label: label.to_string(),
            source,
            fraction,
            hosts,
        });
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    pub fn max_outstanding(mut self, max: usize) -> Self {
        self.max_outstanding = max;
        self
    }

    pub fn arrivals(mut self, arrivals: Arrivals) -> Self {
        self.arrivals = arrivals;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Run on `cpu` only.
    pub fn cpu(mut self, cpu: usize) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Speak `protocol` on every connection.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Length of the schedule.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Start on a new thread in the calling thread's network namespace (threads inherit
    /// it); returns at once.
    pub fn start(self) -> LoadHandle {
        let prepared = self.prepare();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            thread::Builder::new()
                .name("loadgen".into())
                .spawn(move || prepared.run(tx, stop))
                .expect("spawning the load generator")
        };
        LoadHandle {
            seconds: rx,
            stop,
            thread: Some(thread),
        }
    }

    /// Start on a new thread inside `ns`; returns at once.
    pub fn start_in(self, ns: &Netns) -> LoadHandle {
        let prepared = self.prepare();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            ns.spawn(move || prepared.run(tx, stop))
        };
        LoadHandle {
            seconds: rx,
            stop,
            thread: Some(thread),
        }
    }

    /// Run the whole schedule in the calling thread's namespace, calling `on_second` for
    /// each second as it completes, and return the report.
    pub fn run(self, on_second: impl FnMut(&SecondStats)) -> LoadReport {
        self.start().follow(on_second)
    }

    /// [`LoadGen::run`] inside `ns`.
    pub fn run_in(self, ns: &Netns, on_second: impl FnMut(&SecondStats)) -> LoadReport {
        self.start_in(ns).follow(on_second)
    }

    /// Check the configuration (panics with a message) and fill in the defaults.
    fn prepare(mut self) -> Prepared {
        if self.classes.is_empty() {
            let any = if self.target.is_ipv4() {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            };
            self.classes.push(ClassMix {
                label: "all".into(),
                source: any,
                fraction: 1.0,
                hosts: 1,
            });
        }
        for c in &self.classes {
            assert!(
                c.source.is_ipv4() == self.target.is_ipv4(),
                "class {}: source {} and target {} are of different families",
                c.label,
                c.source,
                self.target
            );
            assert!(
                c.fraction >= 0.0 && c.fraction.is_finite(),
                "class {}: bad fraction {}",
                c.label,
                c.fraction
            );
        }
        let sum: f64 = self.classes.iter().map(|c| c.fraction).sum();
        assert!(sum > 0.0, "the class fractions add up to zero");
        let mut acc = 0.0;
        let cumulative = self
            .classes
            .iter()
            .map(|c| {
                acc += c.fraction / sum;
                acc
            })
            .collect();
        let nofile = raise_nofile_limit();
        let max_outstanding = self
            .max_outstanding
            .min((nofile as usize).saturating_sub(256))
            .max(1);
        let labels: Arc<[String]> = self.classes.iter().map(|c| c.label.clone()).collect();
        Prepared {
            seconds: self.duration().as_secs_f64().ceil() as u64,
            labels,
            cumulative,
            max_outstanding,
            config: self,
        }
    }
}

/// A running [`LoadGen`]. Completed seconds arrive on `seconds` (in order, about one
/// deadline after they end); [`LoadHandle::wait`] returns the report. Dropping the handle
/// stops the schedule and waits for the requests in flight.
pub struct LoadHandle {
    pub seconds: mpsc::Receiver<SecondStats>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<LoadReport>>,
}

impl LoadHandle {
    /// End the schedule now: no new arrivals; requests in flight finish (within their
    /// deadline) and the report covers the seconds begun.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Wait for the end of the run and return its report (which has every second, received
    /// or not).
    pub fn wait(mut self) -> LoadReport {
        let thread = self.thread.take().expect("joined once");
        thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// Whether the run has ended (its report is ready for [`LoadHandle::wait`]).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Call `on_second` for each second as it completes, then return the report.
    pub fn follow(self, mut on_second: impl FnMut(&SecondStats)) -> LoadReport {
        for s in self.seconds.iter() {
            on_second(&s);
        }
        self.wait()
    }
}

impl Drop for LoadHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop();
            let _ = t.join();
        }
    }
}

struct Prepared {
    config: LoadGen,
    labels: Arc<[String]>,
    cumulative: Vec<f64>,
    max_outstanding: usize,
    seconds: u64,
}

/// What the request tasks and the dispatcher share.
struct Agg {
    labels: Arc<[String]>,
    slots: Vec<Slot>,
    records: Vec<Record>,
    errors: BTreeMap<String, u64>,
    /// Arrivals up to here have been dispatched.
    dispatched_through: Duration,
    /// No more arrivals.
    done: bool,
    next_emit: usize,
    emitted: Vec<Window>,
}

struct Slot {
    window: Window,
    /// Dispatched arrivals not finished yet.
    pending: u64,
}

impl Agg {
    fn slot(&mut self, second: u64) -> &mut Slot {
        while self.slots.len() as u64 <= second {
            let start = self.slots.len() as u64;
            self.slots.push(Slot {
                window: Window::empty(self.labels.clone(), start, 1),
                pending: 0,
            });
        }
        &mut self.slots[second as usize]
    }

    fn finish(&mut self, record: Record, error: Option<String>) {
        let slot = self.slot(record.start.as_secs());
        slot.window.by_class[record.class].add(&record);
        slot.window.all.add(&record);
        slot.pending = slot.pending.saturating_sub(1);
        if let Some(e) = error {
            *self.errors.entry(e).or_default() += 1;
        }
        self.records.push(record);
    }

    /// Seconds that are complete and not yet emitted.
    fn take_complete(&mut self) -> Vec<Window> {
        let mut out = Vec::new();
        loop {
            let s = self.next_emit;
            if s >= self.slots.len() {
                break;
            }
            // At the end (nothing outstanding) everything is complete.
            let passed = self.dispatched_through >= Duration::from_secs(s as u64 + 1);
            if !self.done && (!passed || self.slots[s].pending > 0) {
                break;
            }
            let w = self.slots[s].window.clone();
            self.emitted.push(w.clone());
            out.push(w);
            self.next_emit += 1;
        }
        out
    }
}

/// One outstanding request, released when its task ends (even by a panic, so the run
/// still ends).
struct Outstanding(Arc<AtomicUsize>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Prepared {
    fn run(self, tx: mpsc::Sender<SecondStats>, stop: Arc<AtomicBool>) -> LoadReport {
        let cpu = self.config.cpu;
        if let Some(cpu) = cpu {
            pin_current_thread(cpu);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("loadgen-worker")
            .on_thread_start(move || {
                if let Some(cpu) = cpu {
                    pin_current_thread(cpu);
                }
            })
            .enable_all()
            .build()
            .expect("building the load generator's runtime");
        runtime.block_on(self.drive(tx, stop))
    }

    async fn drive(self, tx: mpsc::Sender<SecondStats>, stop: Arc<AtomicBool>) -> LoadReport {
        let Prepared {
            config,
            labels,
            cumulative,
            max_outstanding,
            seconds,
        } = self;
        let agg = Arc::new(Mutex::new(Agg {
            labels: labels.clone(),
            slots: Vec::new(),
            records: Vec::new(),
            errors: BTreeMap::new(),
            dispatched_through: Duration::ZERO,
            done: false,
            next_emit: 0,
            emitted: Vec::new(),
        }));
        {
            // Every second of the schedule gets a row, even one without arrivals.
            let mut a = agg.lock().expect("agg");
            if seconds > 0 {
                a.slot(seconds - 1);
            }
        }
        let outstanding = Arc::new(AtomicUsize::new(0));
        let emitter = {
            let (agg, tx) = (agg.clone(), tx.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    tick.tick().await;
                    let rows = agg.lock().expect("agg").take_complete();
                    for r in rows {
                        let _ = tx.send(r);
                    }
                }
            })
        };

        let sources: Arc<[(IpAddr, u32)]> =
            config.classes.iter().map(|c| (c.source, c.hosts)).collect();
        let protocol = Arc::new(config.protocol.clone());
        let mut host_rng = XorShift::new(config.seed ^ 0x0005_0a5c_e5e5_0001);
        let mut clock = ArrivalClock::new(config.phases.clone(), config.arrivals, config.seed);
        let mut class_rng = XorShift::new(config.seed ^ 0x5eed_c1a5_5e5e_d000);
        let mut max_lag = Duration::ZERO;
        let t0 = Instant::now();
        while let Some(at) = clock.next() {
            let when = t0 + at;
            // Sleep in short steps so that a stop is noticed at low rates too.
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let now = Instant::now();
                if now >= when {
                    break;
                }
                // Everything scheduled before now has been dispatched: lets quiet seconds
                // complete without waiting for the next arrival.
                agg.lock().expect("agg").dispatched_through = now - t0;
                tokio::time::sleep_until(when.min(now + Duration::from_millis(50))).await;
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            max_lag = max_lag.max(Instant::now().saturating_duration_since(when));
            let u = class_rng.unit();
            let class = cumulative
                .iter()
                .position(|&c| u < c)
                .unwrap_or(cumulative.len() - 1);
            let second = at.as_secs();
            if outstanding.load(Ordering::Relaxed) >= max_outstanding {
                let mut a = agg.lock().expect("agg");
                a.dispatched_through = at;
                a.slot(second).pending += 1;
                a.finish(
                    Record {
                        class,
                        start: at,
                        outcome: Outcome::GeneratorDropped,
                        elapsed: Duration::ZERO,
                        attempts: 0,
                    },
                    None,
                );
                continue;
            }
            {
                let mut a = agg.lock().expect("agg");
                a.dispatched_through = at;
                a.slot(second).pending += 1;
            }
            outstanding.fetch_add(1, Ordering::Relaxed);
            let guard = Outstanding(outstanding.clone());
            let agg = agg.clone();
            let (base, hosts) = sources[class];
            let source = if hosts > 1 {
                let k = ((host_rng.unit() * f64::from(hosts)) as u32).min(hosts - 1);
                nth_address(base, k)
            } else {
                base
            };
            let target = config.target;
            let (deadline, retries) = (when + config.deadline, config.retries);
            let protocol = protocol.clone();
            tokio::spawn(async move {
                let (outcome, attempts, error) =
                    request(target, source, &protocol, deadline, retries).await;
                let record = Record {
                    class,
                    start: at,
                    outcome,
                    elapsed: Instant::now().saturating_duration_since(when),
                    attempts,
                };
                agg.lock().expect("agg").finish(record, error);
                drop(guard);
            });
        }
        {
            let mut a = agg.lock().expect("agg");
            let end = if stop.load(Ordering::Relaxed) {
                t0.elapsed()
            } else {
                config.duration()
            };
            a.dispatched_through = a.dispatched_through.max(end);
        }
        // Wait out the schedule (a quiet tail has no arrivals but is still part of it),
        // then the requests in flight; each ends by its deadline.
        if !stop.load(Ordering::Relaxed) {
            tokio::time::sleep_until(t0 + config.duration()).await;
        }
        while outstanding.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        emitter.abort();
        let mut a = agg.lock().expect("agg");
        if stop.load(Ordering::Relaxed) {
            // Keep only the seconds begun.
            let begun = a.dispatched_through.as_secs_f64().ceil() as usize;
            let keep = begun.max(a.next_emit);
            a.slots.truncate(keep);
        }
        a.done = true;
        for r in a.take_complete() {
            let _ = tx.send(r);
        }
        LoadReport {
            labels,
            seconds: std::mem::take(&mut a.emitted),
            records: std::mem::take(&mut a.records),
            errors: std::mem::take(&mut a.errors),
            max_dispatch_lag: max_lag,
            max_outstanding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_address_counts_from_the_base() {
        let v4: IpAddr = "198.18.50.0".parse().unwrap();
        assert_eq!(nth_address(v4, 0), v4);
        assert_eq!(
            nth_address(v4, 257),
            "198.18.51.1".parse::<IpAddr>().unwrap()
        );
        let v6: IpAddr = "2001:db8:50::".parse().unwrap();
        assert_eq!(
            nth_address(v6, 0x1_0001),
            "2001:db8:50::1:1".parse::<IpAddr>().unwrap()
        );
    }
}
