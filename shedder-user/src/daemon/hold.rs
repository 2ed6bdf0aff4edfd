//! The handshake hold: how long the packet path counts an admitted attempt as occupancy
//! before its connection is born (see `Globals::hold_bits`). An attempt whose handshake
//! never completes, a spoofed SYN's, holds capacity this long and no longer, so it is kept
//! to about what a real handshake takes: twice the 99th percentile of the protected
//! connections' round-trip times, measured every few seconds, unless configured.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Daemon;
use crate::{
    config::{Config, Protocol},
    control::clock::{hold_bits_for, hold_us_from_rtts},
    kernel::{MapReader as _, diag},
};

/// How often the round trips are sampled.
const EVERY: Duration = Duration::from_secs(2);
/// The most connections one sample reads.
const SAMPLE: usize = 4096;

/// What the daemon holds attempts for, and what it measured.
#[derive(Clone, Debug)]
pub struct Hold {
    /// `Globals::hold_bits` as written.
    pub bits: u32,
    /// `daemon.handshake_hold_ms` set: nothing is measured.
    configured: bool,
    last: Option<Instant>,
    /// The last measurement: the hold it asked for (µs) and the connections sampled.
    pub measured: Option<(u64, usize)>,
}

impl Hold {
    /// The hold a start or a reload writes (the compiled `bits`).
    pub fn new(cfg: &Config, bits: u32) -> Self {
        Self {
            bits,
            configured: cfg.daemon.handshake_hold_ms > 0,
            last: None,
            measured: None,
        }
    }

    /// The shortest time an attempt is held: one slot of `2^bits` jiffies.
    pub fn duration(&self, hz: u32) -> Duration {
        Duration::from_secs_f64((1u64 << self.bits) as f64 / hz.max(1) as f64)
    }
}

impl Daemon {
    /// Measure the round trips of the protected TCP services' connections and write the
    /// hold they ask for, if it changed (at most every [`EVERY`]). With no connection to
    /// sample the hold stays as it is.
    pub(super) fn measure_hold(&mut self, now: Instant) {
        if self.control.hold.configured
            || self
                .control
                .hold
                .last
                .is_some_and(|t| now.duration_since(t) < EVERY)
        {
            return;
        }
        self.control.hold.last = Some(now);
        let ports: Vec<u16> = self
            .cfg
            .services
            .iter()
            .filter(|s| s.protocol == Protocol::Tcp)
            .flat_map(|s| s.ports.iter().copied())
            .collect();
        if ports.is_empty() {
            return;
        }
        let mut rtts = match diag::round_trips(&ports, SAMPLE) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "sampling round-trip times (sock_diag): the handshake hold stays as it is");
                return;
            }
        };
        let Some(us) = hold_us_from_rtts(&mut rtts) else {
            return;
        };
        self.control.hold.measured = Some((us, rtts.len()));
        let bits = hold_bits_for(us, self.kernel.hz);
        if bits == self.control.hold.bits {
            return;
        }
        let written = self.kernel.shedder.globals().and_then(|mut g| {
            g.hold_bits = bits;
            self.kernel.shedder.set_globals(&g)
        });
        match written {
            Ok(()) => {
                info!(
                    hold_ms = (1u64 << bits) as f64 * 1000.0 / self.kernel.hz as f64,
                    previous_ms =
                        (1u64 << self.control.hold.bits) as f64 * 1000.0 / self.kernel.hz as f64,
                    rtt_p99_us = us / 2,
                    connections = rtts.len(),
                    "handshake hold changed"
                );
                self.control.hold.bits = bits;
            }
            Err(e) => warn!(error = %e, "writing the handshake hold"),
        }
    }
}
