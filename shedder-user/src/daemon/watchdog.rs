//! Saying so when the tick stalls. A tick that does not finish stamps no heartbeat, and the
//! packet path falls back to the fallback limits once the heartbeat is stale: the tick
//! cannot report that itself, so a thread watches it and logs which step it is stuck in.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{info, warn};

/// The steps of a tick, as the watchdog names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Between ticks (serving requests, sleeping).
    Idle = 0,
    Signals,
    Controllers,
    Recall,
    Sweep,
    Heartbeat,
    Report,
}

impl Step {
    fn name(v: u8) -> &'static str {
        match v {
            1 => "reading the signals",
            2 => "running the controllers and writing the limits",
            3 => "listing and recalling keep-alive connections",
            4 => "checking the tracked connections against the kernel's sockets",
            5 => "stamping the heartbeat",
            6 => "reporting the state and metrics",
            _ => "between ticks",
        }
    }
}

/// What the tick shares with its watchdog.
#[derive(Default)]
struct Shared {
    step: AtomicU8,
    /// When the current step began (ms since the watchdog started).
    since_ms: AtomicU64,
}

/// The tick's side: mark each step as it begins.
#[derive(Clone)]
pub struct Watchdog {
    shared: Arc<Shared>,
    origin: Instant,
}

impl Watchdog {
    /// Start the watching thread: a step that lasts longer than `stalled` is logged (and
    /// again every `stalled` while it lasts), and its end once it ends.
    pub fn start(stalled: Duration) -> Self {
        let dog = Self {
            shared: Arc::new(Shared::default()),
            origin: Instant::now(),
        };
        let watched = dog.clone();
        std::thread::Builder::new()
            .name("tick-watchdog".into())
            .spawn(move || watched.watch(stalled))
            .expect("spawning the tick watchdog");
        dog
    }

    pub fn step(&self, step: Step) {
        self.shared
            .since_ms
            .store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.shared.step.store(step as u8, Ordering::Relaxed);
    }

    fn watch(&self, stalled: Duration) {
        let poll = (stalled / 4).max(Duration::from_millis(50));
        let mut state = Seen::default();
        loop {
            std::thread::sleep(poll);
            let step = self.shared.step.load(Ordering::Relaxed);
            let since = self.shared.since_ms.load(Ordering::Relaxed);
            let now = self.origin.elapsed().as_millis() as u64;
            match state.look(step, since, now, stalled.as_millis() as u64) {
                Some(Said::Stuck { step, ms }) => warn!(
                    step = Step::name(step),
                    stuck_ms = ms,
                    "the tick is stuck: no heartbeat is stamped meanwhile, and the fallback \
                     limits take over once it is stale"
                ),
                Some(Said::Moving { step, ms }) => info!(
                    step = Step::name(step),
                    stuck_ms = ms,
                    "the tick is moving again"
                ),
                None => {}
            }
        }
    }
}

/// What the watchdog says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    /// `step` has lasted `ms`.
    Stuck { step: u8, ms: u64 },
    /// The stuck `step` ended, about `ms` after it began.
    Moving { step: u8, ms: u64 },
}

/// The watchdog's memory: the stall it reported (its step and start) and when.
#[derive(Default)]
struct Seen {
    reported: Option<(u8, u64)>,
    last_ms: u64,
}

impl Seen {
    /// Looking at step `step` begun at `since` (ms), now `now`: a stall of at least
    /// `stalled` ms is said, and said again every `stalled` while it lasts; its end once.
    fn look(&mut self, step: u8, since: u64, now: u64, stalled: u64) -> Option<Said> {
        let ms = now.saturating_sub(since);
        if step != Step::Idle as u8 && ms >= stalled {
            if self.reported != Some((step, since)) || now - self.last_ms >= stalled {
                self.reported = Some((step, since));
                self.last_ms = now;
                return Some(Said::Stuck { step, ms });
            }
            return None;
        }
        let (step, at) = self.reported.take()?;
        Some(Said::Moving {
            step,
            ms: now.saturating_sub(at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_said_while_it_lasts_and_its_end_once() {
        let mut seen = Seen::default();
        let recall = Step::Recall as u8;
        // Ticks that end in time: nothing.
        assert_eq!(seen.look(Step::Signals as u8, 0, 300, 1000), None);
        assert_eq!(seen.look(Step::Idle as u8, 0, 5000, 1000), None);
        // Stuck in recall from 10 s: said at 1 s, not again before another second.
        assert_eq!(seen.look(recall, 10_000, 10_500, 1000), None);
        assert_eq!(
            seen.look(recall, 10_000, 11_000, 1000),
            Some(Said::Stuck {
                step: recall,
                ms: 1000
            })
        );
        assert_eq!(seen.look(recall, 10_000, 11_500, 1000), None);
        assert_eq!(
            seen.look(recall, 10_000, 12_000, 1000),
            Some(Said::Stuck {
                step: recall,
                ms: 2000
            })
        );
        // Moving again: said once.
        assert_eq!(
            seen.look(Step::Heartbeat as u8, 12_100, 12_200, 1000),
            Some(Said::Moving {
                step: recall,
                ms: 2200
            })
        );
        assert_eq!(seen.look(Step::Idle as u8, 12_100, 12_300, 1000), None);
    }
}
