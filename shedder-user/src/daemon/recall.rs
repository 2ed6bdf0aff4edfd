//! Recalling keep-alive connections each tick (see [`crate::control::recall`] for which):
//! list the services' connections once through sock_diag when some class is over the bound
//! the gate refuses it at, close the chosen ones, count them. The tracking counts a port's
//! connections in every network namespace (a service in a container or a pod), so recall
//! looks in every namespace with a listener on a recalling service's port, found again at
//! most every [`REFRESH`].

use std::{
    collections::{BTreeSet, HashMap},
    io,
    time::{Duration, Instant},
};

use shedder_common::NUM_CLASSES;
use tracing::{debug, info, warn};

use super::service::ServiceControl;
use crate::{
    api::state::ServiceState,
    config::{Config, Mode, Prefix, Protocol, socket_serves},
    control::{
        policy::class_rules,
        recall::{Budget, Conn, Settled, choose, classify, quiet_below, wanted},
    },
    kernel::{
        diag::{self, Destroyer, TCP_ESTABLISHED, TcpSocket},
        netns::{Namespace, in_namespace, namespaces},
    },
    signals::Signals,
};

/// How often the namespaces with a recalling service's listener are looked for again (a
/// walk of every process's namespace).
const REFRESH: Duration = Duration::from_secs(10);
/// A recall pass longer than this is logged: the tick waits on it.
const SLOW_PASS: Duration = Duration::from_millis(50);
/// How often a service's recalls are logged at most (the counts in between are summed).
const LOG_EVERY: Duration = Duration::from_secs(5);

/// One service's recall history, kept by name across reloads.
#[derive(Debug, Default)]
struct Record {
    budget: Budget,
    /// Since when each class has had quiet classes below it.
    settled: Settled,
    recalled: [u64; NUM_CLASSES],
    errors: u64,
    /// Recalled since the last log line, and when that was.
    unlogged: [u64; NUM_CLASSES],
    logged: Option<Instant>,
}

/// A network namespace with a listener on a recalling service's port, and the sock_diag
/// socket that closes its connections (made inside it: a netlink socket speaks to the
/// namespace it was made in).
struct Space {
    ns: Namespace,
    destroyer: Option<Destroyer>,
}

/// The daemon's recall state.
pub struct Recall {
    rules: Vec<(Prefix, u32)>,
    records: HashMap<String, Record>,
    spaces: Vec<Space>,
    /// When `spaces` was last found.
    found: Option<Instant>,
    last: Option<Instant>,
    /// The clock `Settled` reads from.
    origin: Instant,
    /// Why recall cannot close connections on this host (the first refusal that is not a
    /// connection gone); once set, recall counts what it would have done and closes nothing.
    unavailable: Option<String>,
}

impl Recall {
    pub fn new(cfg: &Config) -> Self {
        Self {
            rules: class_rules(cfg),
            records: HashMap::new(),
            spaces: Vec::new(),
            found: None,
            last: None,
            origin: Instant::now(),
            unavailable: None,
        }
    }

    /// A reload: the new class rules, the namespaces found again; the counts stay.
    pub fn reload(&mut self, cfg: &Config) {
        self.rules = class_rules(cfg);
        self.found = None;
    }

    /// Why recall closes nothing here, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// One tick: for each TCP service with recall on whose work is counted from data, the
    /// recalls its policy and work call for, within its rate.
    pub fn tick(&mut self, now: Instant, services: &[ServiceControl], signals: &[Signals]) {
        let dt = self
            .last
            .map_or(Duration::from_millis(100), |l| now.duration_since(l));
        self.last = Some(now);
        let mut due = Vec::new();
        for (sc, sig) in services.iter().zip(signals) {
            let cfg = &sc.cfg;
            if cfg.protocol != Protocol::Tcp || cfg.recall_per_second == 0 {
                continue;
            }
            let record = self.records.entry(cfg.name.clone()).or_default();
            // Without the data event every open connection counts as work, and recalling
            // by it would close idle pools: no recall (doctor's `work` check says why).
            let (Some(policy), Some(busy), Some(_)) =
                (sc.written(), sig.inflight.ok(), sig.waiting.ok())
            else {
                record.budget.spent(cfg.recall_per_second, dt, 0);
                continue;
            };
            // At most what every busy connection being reused would call for: nothing over
            // any bound, no listing.
            let may = record
                .settled
                .update(quiet_below(policy, busy), now.duration_since(self.origin));
            if wanted(policy, busy, busy, &may).iter().all(|&n| n == 0) {
                record.budget.spent(cfg.recall_per_second, dt, 0);
                continue;
            }
            due.push((sc, *busy, may));
        }
        if due.is_empty() {
            return;
        }
        let started = Instant::now();
        if self.found.is_none_or(|t| now.duration_since(t) >= REFRESH) {
            // Every recalling service's ports, not only the ones due now: a namespace found
            // is kept until the next refresh, whichever service comes due meanwhile.
            let ports: BTreeSet<u16> = services
                .iter()
                .filter(|sc| sc.cfg.protocol == Protocol::Tcp && sc.cfg.recall_per_second > 0)
                .flat_map(|sc| sc.cfg.ports.iter().copied())
                .collect();
            self.spaces = with_listeners(&ports);
            self.found = Some(now);
        }
        let mut sockets = Vec::new();
        for (k, space) in self.spaces.iter().enumerate() {
            match in_namespace(&space.ns, diag::open_sockets) {
                Ok(found) => sockets.extend(found.into_iter().map(|s| (k, s))),
                // Its last process exited: found again at the next refresh.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => warn!(
                    namespace = %space.ns.path.display(),
                    error = %e,
                    "listing connections to recall"
                ),
            }
        }
        debug!(
            services = due.len(),
            namespaces = self.spaces.len(),
            sockets = sockets.len(),
            "recall: connections listed"
        );
        for (sc, busy, may) in due {
            self.service(sc, (&busy, &may), &sockets, dt, now);
        }
        let took = started.elapsed();
        if took > SLOW_PASS {
            warn!(
                took_ms = took.as_millis() as u64,
                sockets = sockets.len(),
                namespaces = self.spaces.len(),
                "listing and recalling connections took long; the tick waited on it"
            );
        }
    }

    fn service(
        &mut self,
        sc: &ServiceControl,
        (busy, may): (&[u32; NUM_CLASSES], &[bool; NUM_CLASSES]),
        sockets: &[(usize, TcpSocket)],
        dt: Duration,
        now: Instant,
    ) {
        let cfg = &sc.cfg;
        let Some(policy) = sc.written() else { return };
        let mine: Vec<&(usize, TcpSocket)> = sockets
            .iter()
            .filter(|(_, s)| {
                s.state == TCP_ESTABLISHED
                    && socket_serves(&cfg.ports, &cfg.addresses, s.local, s.local_port)
            })
            .collect();
        let default = cfg.default_class.id();
        let conns: Vec<Conn> = mine
            .iter()
            .map(|(_, s)| {
                let busy_ms = s.busy_for_ms();
                Conn {
                    class: classify(&self.rules, default, s.remote),
                    busy: busy_ms.is_some(),
                    since_ms: busy_ms.unwrap_or_else(|| s.since_data.map_or(u32::MAX, |d| d.0)),
                    answered: s.answered(),
                }
            })
            .collect();
        // The class's work less its fresh connections (a first request in service): what
        // arrived over keep-alive. Counted this way rather than by tcp_info's busy keep-alive
        // connections: its times are in jiffies, and a request that follows its answer
        // within one reads as idle (back-to-back requests, the heaviest keep-alive load);
        // a connection that never answered is told apart exactly (nothing sent).
        let mut fresh = [0u32; NUM_CLASSES];
        for c in conns.iter().filter(|c| c.busy && !c.answered) {
            fresh[c.class as usize] += 1;
        }
        let reused: [u32; NUM_CLASSES] = std::array::from_fn(|c| busy[c].saturating_sub(fresh[c]));
        let want = wanted(policy, busy, &reused, may);
        debug!(
            service = %cfg.name,
            connections = conns.len(),
            ?busy,
            ?reused,
            ?want,
            "recall: wanted"
        );
        let record = self.records.entry(cfg.name.clone()).or_default();
        let allowance = record.budget.allowance(cfg.recall_per_second, dt);
        let chosen = choose(&conns, &want, allowance);
        let mut done = 0;
        for i in chosen {
            let closed = if cfg.mode == Mode::DryRun || self.unavailable.is_some() {
                Closed::Yes
            } else {
                let (k, s) = mine[i];
                close(&mut self.spaces[*k], s, &mut self.unavailable)
            };
            match closed {
                Closed::Yes => {
                    record.recalled[conns[i].class as usize] += 1;
                    record.unlogged[conns[i].class as usize] += 1;
                    done += 1;
                }
                Closed::No => record.errors += 1,
                Closed::Stop => {
                    record.errors += 1;
                    break;
                }
            }
        }
        record.budget.spent(cfg.recall_per_second, dt, done);
        if record.unlogged.iter().any(|&n| n > 0)
            && record
                .logged
                .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            let [_, high, medium, sheddable] = record.unlogged;
            let verb = match (cfg.mode, &self.unavailable) {
                (Mode::DryRun, _) => "would have recalled (dry-run)",
                (_, Some(_)) => "would have recalled (recall unavailable)",
                _ => "recalled",
            };
            info!(
                service = %cfg.name,
                high, medium, sheddable,
                per_second = cfg.recall_per_second,
                "{verb} keep-alive connections of refused classes"
            );
            record.unlogged = [0; NUM_CLASSES];
            record.logged = Some(now);
        }
    }

    /// Fill a service's state with its recall counts.
    pub fn fill(&self, s: &mut ServiceState) {
        if let Some(r) = self.records.get(&s.name) {
            for (c, n) in s.classes.iter_mut().zip(r.recalled) {
                c.recalled = n;
            }
            s.recall_errors = r.errors;
        }
    }
}

/// The namespaces with a listener on one of `ports`.
fn with_listeners(ports: &BTreeSet<u16>) -> Vec<Space> {
    namespaces()
        .into_iter()
        .filter(|ns| {
            in_namespace(ns, diag::listeners)
                .is_ok_and(|ls| ls.iter().any(|l| ports.contains(&l.port)))
        })
        .map(|ns| Space {
            ns,
            destroyer: None,
        })
        .collect()
}

/// What closing one connection came to.
enum Closed {
    Yes,
    No,
    /// No answer in time: the rest of this tick's recalls wait for the next tick.
    Stop,
}

/// Close one connection. A connection gone since the listing counts as closed (its client
/// is already back at the gate); any other refusal is counted as an error, and one that
/// says the host cannot do it turns recall into counting only, said loudly once.
fn close(space: &mut Space, s: &TcpSocket, unavailable: &mut Option<String>) -> Closed {
    let destroyer = &mut space.destroyer;
    let d = match destroyer {
        Some(d) => d,
        None => match in_namespace(&space.ns, Destroyer::new) {
            Ok(d) => destroyer.insert(d),
            Err(e) => {
                warn!(error = %e, "opening a sock_diag socket to recall connections");
                return Closed::Stop;
            }
        },
    };
    match d.destroy(s) {
        Ok(()) => Closed::Yes,
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT | libc::ESTALE) => Closed::Yes,
            Some(libc::EOPNOTSUPP | libc::EPERM | libc::EACCES) => {
                let why = format!(
                    "the kernel refused to close a connection ({e}): it needs \
                     CONFIG_INET_DIAG_DESTROY and CAP_NET_ADMIN"
                );
                warn!("recall is unavailable: {why}; refusing new connections still works");
                *unavailable = Some(why);
                Closed::No
            }
            Some(libc::EAGAIN | libc::EINTR) => {
                // A late answer would be read as the next request's: start afresh.
                warn!(error = %e, "no answer to a recall in time; retrying next tick");
                *destroyer = None;
                Closed::Stop
            }
            _ => {
                warn!(error = %e, remote = %s.remote, "recalling a connection");
                Closed::No
            }
        },
    }
}
