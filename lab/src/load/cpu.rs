//! Where the traffic's threads run and what a request costs: pinning a thread (or another
//! task) to one CPU, and burning a set amount of CPU time, so that a benchmark can put the
//! load generator on a core of its own and make serving compete with the node's packet
//! processing on another.

use std::{io, time::Duration};

/// The time on a clock (`clock_gettime(2)`), e.g. a CPU-time clock.
pub fn read_clock(clock: libc::clockid_t) -> io::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; an invalid clock id is an error, not undefined.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Restrict task `tid` (0: the calling thread) to CPU `cpu`.
pub fn pin_task(tid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return Err(io::Error::other(format!("CPU {cpu} is out of range")));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is within the set's capacity, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size passed.
    if unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restrict the calling thread to CPU `cpu`; panics with the reason if the kernel refuses.
pub fn pin_current_thread(cpu: usize) {
    pin_task(0, cpu).unwrap_or_else(|e| panic!("pinning a thread to CPU {cpu}: {e}"));
}

/// Restrict every thread of process `pid` to CPU `cpu` (threads it creates later inherit
/// the affinity of their creator).
pub fn pin_process(pid: u32, cpu: usize) -> io::Result<()> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: i32 = task?
            .file_name()
            .to_string_lossy()
            .parse()
            .map_err(|_| io::Error::other("a task that is not a number"))?;
        match pin_task(tid, cpu) {
            // A thread that ended since the listing.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            other => other?,
        }
    }
    Ok(())
}

/// CPUs this machine has online.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Burn `cpu` of this thread's CPU time hashing, checking `stop` every few hundred
/// microseconds; false if stopped first. CPU time rather than wall time: a request costs
/// the same work whatever else runs on its core, as a real computation would.
pub fn burn(cpu: Duration, stop: impl Fn() -> bool) -> bool {
    let start = read_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default();
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    loop {
        for _ in 0..20_000 {
            h = (h ^ (h >> 31)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        }
        std::hint::black_box(h);
        let used = read_clock(libc::CLOCK_THREAD_CPUTIME_ID)
            .unwrap_or_default()
            .saturating_sub(start);
        if used >= cpu {
            return true;
        }
        if stop() {
            return false;
        }
    }
}

/// The machine's CPU time from `/proc/stat`, summed over all CPUs: what ran (user, nice,
/// system, interrupts), leaving out idle, I/O wait and the time the hypervisor stole. On a
/// virtual machine a neighbour's burst shows up as steal and slows everything; CPU time
/// actually spent per unit of work is steadier than work per wall-clock second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub busy: Duration,
}

impl CpuTimes {
    pub fn read() -> io::Result<Self> {
        let text = std::fs::read_to_string("/proc/stat")?;
        // SAFETY: no arguments; sysconf cannot fail for _SC_CLK_TCK.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Self::parse(&text, hz).ok_or_else(|| io::Error::other("no `cpu` line in /proc/stat"))
    }

    /// The aggregate `cpu` line: user nice system idle iowait irq softirq steal ..., in
    /// clock ticks of `hz`.
    fn parse(text: &str, hz: u64) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let ticks = at(0) + at(1) + at(2) + at(5) + at(6);
        Some(Self {
            busy: Duration::from_nanos(ticks * 1_000_000_000 / hz),
        })
    }

    /// What was spent between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(earlier.busy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burning_takes_the_cpu_time_asked() {
        let t0 = read_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap();
        assert!(burn(Duration::from_millis(3), || false));
        let used = read_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap() - t0;
        assert!(used >= Duration::from_millis(3), "{used:?}");
        assert!(used < Duration::from_millis(30), "{used:?}");
        assert!(!burn(Duration::from_secs(10), || true), "stopped at once");
    }

    #[test]
    fn cpu_times_count_what_ran_and_not_what_was_stolen() {
        let text = "cpu  100 5 50 1000 7 3 2 40 0 0\ncpu0 60 5 20 500 7 3 2 20 0 0\nintr 1\n";
        let t = CpuTimes::parse(text, 100).unwrap();
        // user + nice + system + irq + softirq = 160 ticks of 10 ms; idle, iowait and
        // steal (40) are not.
        assert_eq!(t.busy, Duration::from_millis(1600));
        let later = CpuTimes {
            busy: t.busy + Duration::from_secs(1),
        };
        assert_eq!(later.since(t).busy, Duration::from_secs(1));
        assert_eq!(t.since(later).busy, Duration::ZERO);
        assert_eq!(CpuTimes::parse("intr 1\n", 100), None);
        assert!(CpuTimes::read().unwrap().busy > Duration::ZERO);
    }

    #[test]
    fn a_thread_pinned_runs_on_its_cpu() {
        let cpu = online_cpus() - 1;
        std::thread::spawn(move || {
            pin_current_thread(cpu);
            // SAFETY: no arguments.
            assert_eq!(unsafe { libc::sched_getcpu() }, cpu as i32);
        })
        .join()
        .unwrap();
        assert!(pin_task(0, 100_000).is_err());
    }
}
