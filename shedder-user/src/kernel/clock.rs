//! The kernel's clock: jiffies read through the clock program, HZ calibrated, and the
//! pure arithmetic between milliseconds and jiffies.

use aya::programs::{TestRun, TestRunOptions};
use shedder_common::{CLOCK_STAMP_HEARTBEAT, programs};

use super::{Error, MapReader as _, Result, Shedder};

impl Shedder {
    /// The kernel's jiffies, read by running the clock program; with `stamp_heartbeat` the
    /// program also records them as the daemon's heartbeat.
    pub fn clock(&mut self, stamp_heartbeat: bool) -> Result<u64> {
        let mut frame = [0u8; 64];
        if stamp_heartbeat {
            frame[0] = CLOCK_STAMP_HEARTBEAT;
        }
        let prog = self.xdp_program(programs::CLOCK)?;
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            ..Default::default()
        })
        .map_err(|source| Error::Program {
            program: programs::CLOCK,
            source,
        })?;
        Ok(self.globals()?.clock_jiffies)
    }

    /// Stamp the heartbeat: the packet path's adaptive limits stay in force for the
    /// configured timeout from now.
    pub fn heartbeat(&mut self) -> Result<u64> {
        self.clock(true)
    }

    /// Measure the kernel's HZ over `window` (at least 50 ms), snapped to the usual
    /// CONFIG_HZ values when within 5% of one.
    pub fn calibrate_hz(&mut self, window: std::time::Duration) -> Result<u32> {
        let window = window.max(std::time::Duration::from_millis(50));
        let j0 = self.clock(false)?;
        let t0 = std::time::Instant::now();
        std::thread::sleep(window);
        let j1 = self.clock(false)?;
        let secs = t0.elapsed().as_secs_f64();
        let measured = (j1.saturating_sub(j0)) as f64 / secs;
        Ok(snap_hz(measured))
    }
}

/// The usual CONFIG_HZ values, to snap a measurement to.
const KNOWN_HZ: [u32; 5] = [100, 250, 300, 1000, 1200];

pub(super) fn snap_hz(measured: f64) -> u32 {
    for hz in KNOWN_HZ {
        if (measured - hz as f64).abs() <= hz as f64 * 0.05 {
            return hz;
        }
    }
    measured.round().max(1.0) as u32
}

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

/// Milliseconds to jiffies at `hz`, rounded up.
pub fn ms_to_jiffies(ms: u64, hz: u32) -> u64 {
    (ms * hz as u64).div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hz_snaps_to_known_values() {
        assert_eq!(snap_hz(251.7), 250);
        assert_eq!(snap_hz(990.0), 1000);
        assert_eq!(snap_hz(101.0), 100);
        assert_eq!(snap_hz(500.0), 500);
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
