//! The kernel's clock: jiffies read through the clock program, and HZ calibrated. The
//! arithmetic between time and jiffies is `control::clock`.

use aya::programs::{TestRun, TestRunOptions};
use shedder_common::{CLOCK_STAMP_HEARTBEAT, programs};

use super::{Error, MapReader as _, Result, Shedder};

/// CLOCK_MONOTONIC in nanoseconds: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

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
}
