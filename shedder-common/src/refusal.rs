//! Sampled refusals: who is being refused, for the operator.
//!
//! The packet path counts every refusal per service, class, verdict and reason, but not by
//! source: a per-source counter would be an unbounded table. Instead each CPU hands the
//! daemon a bounded sample of its refusals, through a ring buffer, at most
//! [`SAMPLES_PER_WINDOW`] per window of 2^[`WINDOW_SHIFT`] ns (about 480 a second per CPU),
//! and the daemon keeps the heaviest sources and prefixes of that sample in a summary of
//! fixed size. Under a flood the sample is a fraction of the refusals, taken evenly over
//! time, so the shares it shows are the shares of the refusals.
//!
//! A sample says whether its source had proven its address (completed a handshake
//! recently): an unproven source address may be forged, and the operator must not be led
//! to block an address an attacker put in a SYN.

/// A window of the sampler: 2^26 ns, about 67 ms.
pub const WINDOW_SHIFT: u32 = 26;
/// Samples one CPU may hand over per window.
pub const SAMPLES_PER_WINDOW: u32 = 32;
/// The ring buffer's size: about 2,700 samples (24 bytes and an 8-byte header each), over
/// two seconds of both CPUs' full rate, for a daemon that drains it every tick.
pub const RING_BYTES: u32 = 1 << 16;

/// One sampled refusal.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// The source address as its words lie in the packet (network byte order in memory);
    /// IPv4 uses word 0.
    pub addr: [u32; 4],
    pub service: u16,
    pub class: u8,
    pub reason: u8,
    /// The verdict the refusal met (`VERDICT_*`: a reset, a drop, a dry-run pass).
    pub verdict: u8,
    /// 1 for IPv6.
    pub v6: u8,
    /// 1 when the source had proven its address.
    pub proven: u8,
    pub _pad: u8,
}

const _: () = assert!(size_of::<Sample>() == 24);

/// One CPU's sampler state: its current window and the samples taken in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sampler {
    pub window: u64,
    pub taken: u32,
    pub _pad: u32,
}

impl Sampler {
    /// Whether a refusal at `now_ns` may be sampled; counts it if so.
    #[inline(always)]
    pub fn take(&mut self, now_ns: u64) -> bool {
        let window = now_ns >> WINDOW_SHIFT;
        if self.window != window {
            self.window = window;
            self.taken = 0;
        }
        if self.taken >= SAMPLES_PER_WINDOW {
            return false;
        }
        self.taken += 1;
        true
    }
}

impl Sample {
    /// A sample from the bytes of a ring-buffer record (`None` if it is too short).
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: at least size_of::<Sample>() bytes; Sample is plain data of integers,
        // valid for any bytes; read_unaligned needs no alignment.
        Some(unsafe { core::ptr::read_unaligned(b.as_ptr().cast::<Self>()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_samples_at_most_its_budget_per_window() {
        let mut s = Sampler::default();
        let w = 5u64 << WINDOW_SHIFT;
        let taken = (0..100).filter(|i| s.take(w + i)).count();
        assert_eq!(taken, SAMPLES_PER_WINDOW as usize);
        // The next window starts a new budget.
        assert!(s.take(w + (1 << WINDOW_SHIFT)));
    }

    #[test]
    fn a_sample_reads_back_from_its_bytes() {
        let s = Sample {
            addr: [0x0100_12c6, 0, 0, 0],
            service: 7,
            class: 2,
            reason: 1,
            verdict: 3,
            v6: 0,
            proven: 1,
            _pad: 0,
        };
        // SAFETY: viewing a plain-data struct as its bytes.
        let bytes = unsafe {
            core::slice::from_raw_parts((&raw const s).cast::<u8>(), size_of::<Sample>())
        };
        assert_eq!(Sample::from_bytes(bytes), Some(s));
        assert_eq!(Sample::from_bytes(&bytes[..23]), None);
    }
}
