//! The data model of a tick's signals: readings that say when they are missing or stale,
//! and the per-service snapshot the controller and the API see.

use std::{net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};
use shedder_common::NUM_CLASSES;

use super::Waiting;
use crate::config::Protocol;

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
///
/// `offered`, `admitted`, `shed` and `dry_run` come from the decision counters, which count
/// *unique* attempts: a retransmitted SYN is not in them (the packet path counts it in
/// `retransmits` only), so a client whose SYN was dropped and who retransmits it is one
/// attempt, not one a second. They count proven attempts only (a source with standing, see
/// `shedder_common::proof`), and the unproven ones that became connections (in `offered`
/// and `admitted`): attempts from forged addresses never complete, so they are never
/// demand. This is the offered load the controller and the class allocation see
/// ([`crate::daemon::service::demand`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassRates {
    /// Every new attempt that reached a decision (retransmits excluded).
    pub offered: f64,
    pub admitted: f64,
    /// Dropped or reset.
    pub shed: f64,
    /// Would have been shed (dry-run services).
    pub dry_run: f64,
    /// Retransmitted SYNs of attempts of this class (not in `offered`).
    #[serde(default)]
    pub retransmits: f64,
    /// New attempts of this class (before demotion) from a source the service shed within
    /// its retry window (also in `offered`, under the class they were decided in).
    #[serde(default)]
    pub retries: f64,
    /// Refused (dropped, reset, or dry-run) per second, by reason number
    /// ([`shedder_common::Reason`]), one per counter slot.
    #[serde(default)]
    pub refused_by_reason: [f64; shedder_common::REASON_SLOTS as usize],
    /// Proven attempts admitted per second that their source then disowned (SYNs forged
    /// in a known client's name; not in `admitted` or `offered`).
    #[serde(default)]
    pub disowned: f64,
}

impl ClassRates {
    /// The part of the proven attempts admitted that were real (not disowned): the part
    /// of the class's attempts in handshake that stands for demand. 1 when none was
    /// admitted.
    pub fn kept(&self) -> f64 {
        let real = self.admitted;
        if real + self.disowned <= 0.0 {
            1.0
        } else {
            real / (real + self.disowned)
        }
    }

    /// Refused (or, dry-run, would have been) per second for pressure
    /// ([`shedder_common::PRESSURE_REASONS`]): the class wants more of the service than it
    /// got.
    pub fn pressed(&self) -> f64 {
        shedder_common::Reason::ALL
            .into_iter()
            .filter(|&r| shedder_common::is_pressure(r as u32) == 1)
            .map(|r| self.refused_by_reason[r as usize])
            .sum()
    }
}

/// What attempts from sources without standing ([`shedder_common::proof`]) of one class
/// did over the last tick, per second. They are not in [`ClassRates`]: nothing counts them
/// as demand until they complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnprovenRates {
    /// Every unproven attempt that reached a decision.
    pub offered: f64,
    pub admitted: f64,
    /// Dropped or reset (or, dry-run, that would have been).
    pub refused: f64,
    /// Refused because the class held its cap of unproven attempts (`unproven`).
    pub capped: f64,
    /// Connections born of unproven attempts: new clients proving themselves.
    pub completed: f64,
    /// Proven attempts whose source disowned them (its reset answered the SYN-ACK of an
    /// attempt made in its name).
    pub disowned: f64,
}

/// The unproven attempts of a service: their rates by class, and those held now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Unproven {
    pub rates: [UnprovenRates; NUM_CLASSES],
    /// Admitted unproven attempts still in handshake, by class.
    pub held: [u32; NUM_CLASSES],
}

impl Unproven {
    /// Unproven attempts per second, every class.
    pub fn offered(&self) -> f64 {
        self.rates.iter().map(|r| r.offered).sum()
    }
}

/// One class's sources and budget as the packet path's fair-share memory holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassSources {
    /// Sources that sent an attempt to the class in the last whole epoch (about a second).
    pub active: u32,
    /// Over the window (this epoch and the last): attempts admitted while their source was
    /// over its share, and within-share ones admitted over a full class in their place.
    pub surplus: u32,
    pub preempted: u32,
    /// First attempts and retries admitted over the window: the retry budget's use.
    pub firsts: u32,
    pub retries: u32,
}

/// Retries against shed attempts over the signal window: whether shedding reduced demand
/// or the refused clients came back (a retry storm: refusals that turn into more demand).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RetryWindow {
    /// Width of the window: the same ticks as the percentiles, fewer just after a start
    /// or a failed read.
    pub window_ms: u64,
    /// Attempts shed in the window: dropped or reset, or, for a dry-run service, that
    /// would have been (the packet path remembers their sources as shed all the same, so
    /// their retries are counted as enforcing would count them).
    pub shed: u64,
    /// Retries in the window, every class.
    pub retries: u64,
    /// `retries / shed`; `None` when nothing was shed in the window (there is nothing to
    /// come back, so no ratio — never a NaN or an invented zero). See [`retry_ratio`].
    pub ratio: Option<f64>,
}

/// The retry ratio: retries per shed attempt over the same window. Near 0: refused clients
/// stay away (shedding reduces demand); near 1: about every refused attempt comes back
/// within the retry window (refusing only delays it). It can exceed 1: a source refused
/// again retries again (each return counts), a retry may come back for an attempt shed
/// before the window began, and all clients behind one address (NAT) are one source. `None`
/// without shed attempts.
pub fn retry_ratio(retries: u64, shed: u64) -> Option<f64> {
    (shed > 0).then(|| retries as f64 / shed as f64)
}

fn retry_missing() -> Reading<RetryWindow> {
    Reading::missing("not reported")
}

/// Accept queues of the service's listening sockets, summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptQueue {
    pub depth: u32,
    pub backlog: u32,
    pub listeners: u32,
}

/// The receive queues of a QUIC service's UDP sockets, summed, and their drops in the last
/// tick (sock_diag: what `ss -lnum` shows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpQueue {
    /// Bytes waiting for the service to read (as charged against the receive buffers).
    pub depth: u64,
    /// The receive buffers' sizes (`SO_RCVBUF`), summed.
    pub buffer: u64,
    pub sockets: u32,
    /// Datagrams the sockets dropped during the last tick (a full receive buffer, mostly);
    /// `None` on the first tick, or when the sockets changed.
    pub drops: Option<u64>,
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
    /// Work in flight per class (kernel count): connections holding a request not yet
    /// answered (see `shedder_common::work`), or every established connection on a kernel
    /// without `sock:sk_data_ready` (`waiting` says which).
    pub inflight: Reading<[u32; NUM_CLASSES]>,
    /// Established connections per class, busy or idle: what `max_connections` bounds.
    #[serde(default = "connections_missing")]
    pub connections: Reading<[u32; NUM_CLASSES]>,
    /// The requests in service now and how long they have waited so far.
    #[serde(default = "waiting_missing")]
    pub waiting: Reading<Waiting>,
    /// Admitted proven attempts not yet established, per class.
    pub pending: Reading<[u32; NUM_CLASSES]>,
    /// Attempts from sources without standing: what they did and what they hold.
    #[serde(default = "unproven_missing")]
    pub unproven: Reading<Unproven>,
    pub rates: Reading<[ClassRates; NUM_CLASSES]>,
    /// Retries and shed attempts over the window, and their ratio.
    #[serde(default = "retry_missing")]
    pub retry: Reading<RetryWindow>,
    pub accept_queue: Reading<AcceptQueue>,
    /// A QUIC service's UDP receive queues (missing for a TCP service).
    #[serde(default = "udp_missing")]
    pub udp: Reading<UdpQueue>,
    pub listen: Reading<Overflows>,
    pub pressure: Pressures,
    /// Per class: active sources and the retry budget's use.
    #[serde(default = "sources_missing")]
    pub sources: Reading<[ClassSources; NUM_CLASSES]>,
}

fn connections_missing() -> Reading<[u32; NUM_CLASSES]> {
    Reading::missing("not reported by this daemon")
}

fn waiting_missing() -> Reading<Waiting> {
    Reading::missing("not reported by this daemon")
}

fn unproven_missing() -> Reading<Unproven> {
    Reading::missing("not reported by this daemon")
}

fn udp_missing() -> Reading<UdpQueue> {
    Reading::missing("not reported by this daemon")
}

fn sources_missing() -> Reading<[ClassSources; NUM_CLASSES]> {
    Reading::missing("not reported by this daemon")
}

/// What the reader needs to know of a service.
#[derive(Clone, Debug)]
pub struct ServiceSpec {
    pub id: u32,
    pub name: String,
    pub protocol: Protocol,
    pub ports: Vec<u16>,
    /// Destination addresses; empty = any.
    pub addresses: Vec<IpAddr>,
    /// Absolute path of the service's cgroup v2 directory, if configured.
    pub cgroup: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::ClassRates;

    #[test]
    fn kept_is_the_part_of_admissions_not_disowned() {
        let r = |admitted, disowned| ClassRates {
            admitted,
            disowned,
            ..Default::default()
        };
        assert_eq!(r(0.0, 0.0).kept(), 1.0);
        assert_eq!(r(40.0, 0.0).kept(), 1.0);
        // 40 real a second beside 390 forged in the client's name, all reset by it.
        assert!((r(40.0, 390.0).kept() - 40.0 / 430.0).abs() < 1e-12);
        assert_eq!(r(0.0, 10.0).kept(), 0.0);
    }
}
