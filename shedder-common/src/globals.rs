//! Node-wide settings and the daemon's heartbeat, and the clock of the packet path.

use crate::mask;

/// Node-wide settings and the daemon's heartbeat (single-entry array).
///
/// Time on the packet path is `jiffies` (`bpf_jiffies64`, which the verifier inlines into a
/// single load; every helper call costs tens of nanoseconds on machines with return-thunk
/// mitigations). Userspace cannot read jiffies directly, so the heartbeat is stamped by the
/// kernel: the daemon runs the `shedder_clock` program (BPF_PROG_TEST_RUN) each tick, which
/// writes the current jiffies into `heartbeat_jiffies` (and always into `clock_jiffies`,
/// which the daemon also uses to calibrate HZ for converting milliseconds).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Globals {
    /// Jiffies of the daemon's last tick (0 = never: the fallback limits are in force).
    pub heartbeat_jiffies: u64,
    /// A heartbeat older than this many jiffies puts the fallback limits in force.
    pub heartbeat_timeout_jiffies: u64,
    /// Jiffies at the last run of the clock program.
    pub clock_jiffies: u64,
    /// Epochs (of the fair shares, the retry budget and the floors in admissions) are
    /// `2^shift` jiffies long; 0 selects [`DEFAULT_EPOCH_SHIFT`].
    pub epoch_bits: u32,
    /// The kernel's HZ as calibrated by the daemon (informational).
    pub hz: u32,
    /// Bumped by the daemon whenever it rewrites the policy; informational.
    pub generation: u64,
    /// A SYN repeating a remembered attempt (same 4-tuple and initial sequence number) this
    /// many jiffies after it is a retransmit; 0 disables retransmit recognition.
    pub retransmit_window_jiffies: u64,
    /// Seed of the attempt tables' hash ([`crate::table::hash`]): random per daemon start, so
    /// senders cannot pick keys that collide in one set.
    pub table_seed: u64,
    /// Admitted attempts are held (counted as occupancy until their connection is born, or
    /// their source disowns them) in slots of `2^hold_bits` jiffies, for one to two slots:
    /// at least as long as a handshake takes, which the daemon measures ([`Globals::hold_slot`]).
    pub hold_bits: u32,
    /// An address proven this many units of [`crate::proof::SEEN_SHIFT`] jiffies ago or less has
    /// standing ([`crate::proof`]); 0: only an address proven in the current unit.
    pub standing_window: u32,
    /// The node's budgets for answering refused attempts (resets, Version Negotiation),
    /// `[proven, unproven]`: a token bucket each (nanoseconds per reply, and the burst in
    /// nanoseconds); an interval of 0 answers without a bound. Above a budget a refusal is
    /// dropped instead, so refusals cannot be used as a reflector.
    pub reply_interval_ns: [u64; 2],
    pub reply_burst_ns: [u64; 2],
}

impl Globals {
    /// The length of an epoch as a power of two of jiffies: `epoch_bits`, or
    /// [`DEFAULT_EPOCH_SHIFT`] when that is 0 or over [`MAX_EPOCH_SHIFT`].
    #[inline(always)]
    pub fn epoch_shift(&self) -> u32 {
        // With a mask, not a branch (see [`mask`]): the shift is carried on into the
        // fair-share arithmetic, where two values of it would double what the verifier
        // walks.
        let s = self.epoch_bits;
        let bad = (mask::zero(s as u64) | mask::sign(MAX_EPOCH_SHIFT as i64 - s as i64)) as u32;
        (s & !bad) | (DEFAULT_EPOCH_SHIFT & bad)
    }

    /// The epoch of `jiffies` (fair shares, the retry budget, floors in admissions).
    #[inline(always)]
    pub fn epoch(&self, jiffies: u64) -> u64 {
        jiffies >> self.epoch_shift()
    }

    /// The hold slot of `jiffies`: the shed path counts an admitted attempt in it, the
    /// tracking path retires it from it or the previous one, and it counts while the
    /// current slot is it or the next ([`crate::Pending::count`]). `hold_bits` is capped at
    /// [`MAX_HOLD_BITS`].
    #[inline(always)]
    pub fn hold_slot(&self, jiffies: u64) -> u64 {
        jiffies >> mask::min(self.hold_bits as u64, MAX_HOLD_BITS as u64)
    }
}

/// The longest hold slot: 2^8 jiffies (0.26 s at HZ 1000, 1 s at HZ 250), so an attempt
/// whose handshake never completes is held at most about two seconds.
pub const MAX_HOLD_BITS: u32 = 8;

/// The longest epoch: 2^24 jiffies (4.7 hours at HZ=1000), far past the second the daemon
/// picks; it keeps the fair-share arithmetic, in 1/256 jiffies, within 64 bits.
pub const MAX_EPOCH_SHIFT: u32 = 24;

/// 2^8 jiffies: 1.024 s at HZ=250, 0.256 s at HZ=1000, 2.56 s at HZ=100. The daemon picks
/// the shift for about one second from the calibrated HZ.
pub const DEFAULT_EPOCH_SHIFT: u32 = 8;

/// First byte of the clock program's input: also stamp the heartbeat.
pub const CLOCK_STAMP_HEARTBEAT: u8 = 1;

const _: () = assert!(size_of::<Globals>() == 96);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_use_the_shift_or_the_default() {
        let g = |shift| Globals {
            epoch_bits: shift,
            ..Default::default()
        };
        assert_eq!(g(10).epoch(5 << 10), 5);
        assert_eq!(g(0).epoch(3 << DEFAULT_EPOCH_SHIFT), 3);
        assert_eq!(g(64).epoch(3 << DEFAULT_EPOCH_SHIFT), 3);
        assert_eq!(g(MAX_EPOCH_SHIFT).epoch_shift(), MAX_EPOCH_SHIFT);
        assert_eq!(g(MAX_EPOCH_SHIFT + 1).epoch_shift(), DEFAULT_EPOCH_SHIFT);
    }

    #[test]
    fn hold_slots_use_their_bits_capped() {
        let g = |bits| Globals {
            hold_bits: bits,
            ..Default::default()
        };
        assert_eq!(g(0).hold_slot(5), 5);
        assert_eq!(g(2).hold_slot(9), 2);
        assert_eq!(g(40).hold_slot(3 << MAX_HOLD_BITS), 3);
    }
}
