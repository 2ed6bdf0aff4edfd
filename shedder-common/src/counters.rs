//! What the packet path counts per service: decisions, by (class, verdict, reason), and
//! the histograms of the tracking programs. Per-CPU map values, summed by the daemon.

use crate::hist;
use crate::ids::{NUM_CLASSES, NUM_VERDICTS, VERDICT_DROP, VERDICT_DRY_RUN, VERDICT_RST};
use crate::reasons::REASON_SLOTS;

/// Decision counters of one service: one per (class, verdict, reason).
pub const COUNTERS_PER_SERVICE: usize = NUM_CLASSES * NUM_VERDICTS as usize * REASON_SLOTS as usize;

/// Index of (class, verdict, reason) within [`ServiceCounters`].
#[inline(always)]
pub const fn decision_index(class: u32, verdict: u32, reason: u32) -> u32 {
    (class * NUM_VERDICTS + verdict) * REASON_SLOTS + reason
}

/// A flat numbering of every decision counter of every service (service-major), for
/// callers that keep all counters in one vector.
#[inline(always)]
pub const fn counter_index(service: u32, class: u32, verdict: u32, reason: u32) -> u32 {
    service * COUNTERS_PER_SERVICE as u32 + decision_index(class, verdict, reason)
}

/// The per-CPU decision counters of one service (one map entry per service, so the daemon
/// reads a service's counters with one lookup).
///
/// `n` counts *unique* attempts: a retransmitted SYN (same 4-tuple and initial sequence
/// number within the retransmit window) is counted in `retransmits` only, so the sum of
/// `n` is the offered load the controller sees.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceCounters {
    pub n: [u64; COUNTERS_PER_SERVICE],
    /// Attempts from sources without standing ([`crate::proof`]), laid out as `n` (and right after
    /// it: the packet path indexes both as one array). They are not in `n`: they count
    /// neither as demand nor as offered load until proven.
    pub unproven: [u64; COUNTERS_PER_SERVICE],
    /// Retransmitted SYNs, by the class of the attempt they repeat.
    pub retransmits: [u64; NUM_CLASSES],
    /// New attempts from a source shed for this service within its retry window, by the
    /// class before demotion (each is also a unique attempt in `n`, under the class it was
    /// decided in).
    pub retries: [u64; NUM_CLASSES],
    /// Connections born of unproven attempts (the tracking path counts them): what the
    /// unproven attempts turned out to be worth.
    pub completed_unproven: [u64; NUM_CLASSES],
    /// Admitted proven attempts their source disowned: a reset from the source answering
    /// the server's SYN-ACK, so the SYN was spoofed in its name. The attempt is retired at
    /// once and its token refunded.
    pub disowned: [u64; NUM_CLASSES],
}

impl Default for ServiceCounters {
    fn default() -> Self {
        Self {
            n: [0; COUNTERS_PER_SERVICE],
            unproven: [0; COUNTERS_PER_SERVICE],
            retransmits: [0; NUM_CLASSES],
            retries: [0; NUM_CLASSES],
            completed_unproven: [0; NUM_CLASSES],
            disowned: [0; NUM_CLASSES],
        }
    }
}

impl ServiceCounters {
    /// Attempts of `class` refused for `reason`: dropped, reset, or (dry-run) that would
    /// have been.
    pub fn refused(&self, class: u32, reason: u32) -> u64 {
        [VERDICT_DROP, VERDICT_RST, VERDICT_DRY_RUN]
            .iter()
            .map(|&v| self.n[decision_index(class, v, reason) as usize])
            .sum()
    }

    /// Unproven attempts of `class` with `verdict`, every reason.
    pub fn unproven_verdict(&self, class: u32, verdict: u32) -> u64 {
        (0..REASON_SLOTS)
            .map(|r| self.unproven[decision_index(class, verdict, r) as usize])
            .sum()
    }
}

/// Histogram buckets of one service: `b[kind * hist::BUCKETS + bucket]`.
pub const HIST_PER_SERVICE: usize = (hist::KINDS * hist::BUCKETS) as usize;

/// The per-CPU histograms of one service, with the sum of the observations (µs) per kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceHist {
    pub b: [u64; HIST_PER_SERVICE],
    pub sum_us: [u64; hist::KINDS as usize],
}

impl Default for ServiceHist {
    fn default() -> Self {
        Self {
            b: [0; HIST_PER_SERVICE],
            sum_us: [0; hist::KINDS as usize],
        }
    }
}

const _: () = {
    assert!(core::mem::offset_of!(ServiceCounters, unproven) == 8 * COUNTERS_PER_SERVICE);
    assert!(COUNTERS_PER_SERVICE.is_power_of_two());
};
