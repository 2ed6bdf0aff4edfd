//! The arithmetic between time and the kernel's jiffies: windows, epochs and the hold
//! slot the packet path keeps, at the HZ the kernel side calibrated.

/// The epoch shift (in jiffies) giving pending-attempt epochs closest to one second.
pub fn epoch_shift_for(hz: u32) -> u32 {
    let mut best = 0;
    let mut best_err = f64::MAX;
    for shift in 0..32u32 {
        let secs = (1u64 << shift) as f64 / hz.max(1) as f64;
        let err = (secs - 1.0).abs();
        if err < best_err {
            best = shift;
            best_err = err;
        }
    }
    best
}

/// The hold slot's bits (`Globals::hold_bits`) for attempts to be held at least `hold_us`
/// microseconds at `hz`: an attempt is held one to two slots of `2^bits` jiffies, so the
/// slot is the smallest power of two of jiffies not shorter than the hold (capped at
/// [`shedder_common::MAX_HOLD_BITS`]).
pub fn hold_bits_for(hold_us: u64, hz: u32) -> u32 {
    let jiffies = (hold_us.saturating_mul(hz as u64))
        .div_ceil(1_000_000)
        .max(1);
    let bits = u64::BITS - (jiffies - 1).leading_zeros();
    bits.min(shedder_common::MAX_HOLD_BITS)
}

/// How long an attempt is held before its connection should be born, from the round-trip
/// times of established connections: twice the 99th percentile, since a handshake takes a
/// round trip and the client's reply, and a client slower than most should still be held.
/// `None` with no sample.
pub fn hold_us_from_rtts(rtts_us: &mut [u32]) -> Option<u64> {
    if rtts_us.is_empty() {
        return None;
    }
    rtts_us.sort_unstable();
    let i = ((rtts_us.len() as f64 * 0.99).ceil() as usize).clamp(1, rtts_us.len()) - 1;
    Some(2 * rtts_us[i] as u64)
}

/// The hold assumed before any round trip is measured: 250 ms, a slow client's handshake
/// across a continent.
pub const DEFAULT_HOLD_US: u64 = 250_000;

/// Milliseconds to jiffies at `hz`, rounded up.
pub fn ms_to_jiffies(ms: u64, hz: u32) -> u64 {
    (ms * hz as u64).div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_covers_twice_the_slow_round_trips_in_whole_slots() {
        // 250 ms at HZ 250: 62.5 jiffies, a slot of 64.
        assert_eq!(hold_bits_for(DEFAULT_HOLD_US, 250), 6);
        // 0.2 ms on a LAN: one jiffy.
        assert_eq!(hold_bits_for(200, 250), 0);
        assert_eq!(hold_bits_for(0, 1000), 0);
        // 5 ms at HZ 1000: a slot of 8 jiffies.
        assert_eq!(hold_bits_for(5_000, 1000), 3);
        assert_eq!(hold_bits_for(4_000, 1000), 2);
        // Capped: two seconds at most.
        assert_eq!(
            hold_bits_for(60_000_000, 1000),
            shedder_common::MAX_HOLD_BITS
        );
        let mut rtts: Vec<u32> = (1..=100).collect();
        assert_eq!(hold_us_from_rtts(&mut rtts), Some(198));
        assert_eq!(hold_us_from_rtts(&mut [7]), Some(14));
        assert_eq!(hold_us_from_rtts(&mut []), None);
    }

    #[test]
    fn epoch_about_one_second() {
        assert_eq!(epoch_shift_for(250), 8);
        assert_eq!(epoch_shift_for(1000), 10);
        assert_eq!(epoch_shift_for(100), 7);
    }

    #[test]
    fn ms_round_up() {
        assert_eq!(ms_to_jiffies(3000, 250), 750);
        assert_eq!(ms_to_jiffies(1, 250), 1);
        assert_eq!(ms_to_jiffies(0, 250), 0);
    }
}
