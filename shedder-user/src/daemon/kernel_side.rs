//! The daemon's kernel side: the programs and their maps, what they are attached to, the
//! kernel's clock, and what the programs cost.

use std::time::{Duration, Instant};

use crate::{
    api::state::{Attachment, ProgramCost},
    kernel::{Shedder, netdev::delivery, pins::PinDir, refusals::RefusalReader},
};

pub(super) struct KernelSide {
    pub(super) shedder: Shedder,
    /// The kernel's HZ, calibrated at start.
    pub(super) hz: u32,
    pub(super) attach: Vec<Attachment>,
    /// Keeps the kernel's BPF run-time statistics on while held (`None`: unavailable).
    pub(super) stats_enabled: Option<std::os::fd::OwnedFd>,
    pub(super) last_run_stats: Vec<(&'static str, Duration, u64)>,
    pub(super) programs: Vec<ProgramCost>,
    pub(super) last_heartbeat: Instant,
    /// Where the pins are (see [`crate::kernel::pins`]).
    pub(super) pins: PinDir,
    /// Refusals that do not leave the host: the drivers' XDP transmit errors.
    pub(super) delivery: delivery::Monitor,
    /// The packet path's sampled refusals (`None`: the ring could not be opened; said at
    /// start and in `status`).
    pub(super) refusals: Option<RefusalReader>,
}

impl KernelSide {
    /// What each program cost since the last tick, from the kernel's run-time statistics
    /// (nothing while they are off).
    pub(super) fn update_program_costs(&mut self) {
        if self.stats_enabled.is_none() {
            return;
        }
        let now = self.shedder.run_stats();
        self.programs = now
            .iter()
            .map(|&(name, time, runs)| {
                let prev = self.last_run_stats.iter().find(|(n, _, _)| *n == name);
                let ns_per_run = prev.and_then(|&(_, t0, r0)| {
                    let dr = runs.saturating_sub(r0);
                    (dr > 0).then(|| time.saturating_sub(t0).as_nanos() as f64 / dr as f64)
                });
                ProgramCost {
                    program: name.to_string(),
                    runs,
                    run_seconds: time.as_secs_f64(),
                    ns_per_run,
                }
            })
            .collect();
        self.last_run_stats = now;
    }
}
