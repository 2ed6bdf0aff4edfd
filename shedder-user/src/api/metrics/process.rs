//! The standard `process_*` metrics (CPU time, memory, descriptors, start time) that
//! Prometheus users expect of every exporter, read from `/proc/self` at scrape time.
//! prometheus-client has no process collector; the parsing here is pure and tested on
//! literal text, the reading is the rest.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// What `/proc/self/stat` says (in the kernel's units).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// User and system CPU time, in clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// When the process started, in clock ticks after boot.
    pub starttime: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
}

/// Parse `/proc/PID/stat`. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so the fields are counted after the *last* `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: n(14)?,
        stime: n(15)?,
        starttime: n(22)?,
        vsize_bytes: n(23)?,
        rss_pages: n(24)?,
    })
}

/// A `Key:   N kB` line of `/proc/PID/status`, in bytes.
pub fn status_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut it = v.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") => Some(n * 1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// The boot time (`btime`, seconds since the epoch) from `/proc/stat`.
pub fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// One scrape's figures, in Prometheus's units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub start_time_seconds: Option<f64>,
}

/// Texts and numbers read from the kernel, turned into a sample.
pub struct Read<'a> {
    pub stat: Option<&'a str>,
    pub status: Option<&'a str>,
    pub proc_stat: Option<&'a str>,
    pub clock_ticks: u64,
    pub page_size: u64,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl Read<'_> {
    pub fn sample(&self) -> Sample {
        let stat = self.stat.and_then(parse_stat);
        let hz = self.clock_ticks.max(1) as f64;
        let status = |key| self.status.and_then(|s| status_bytes(s, key));
        Sample {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / hz),
            // status counts in kB what stat counts in pages; either will do, status first.
            resident_bytes: status("VmRSS")
                .or_else(|| stat.map(|s| s.rss_pages * self.page_size))
                .map(|b| b as f64),
            virtual_bytes: status("VmSize")
                .or_else(|| stat.map(|s| s.vsize_bytes))
                .map(|b| b as f64),
            open_fds: self.open_fds.map(|n| n as f64),
            max_fds: self.max_fds.map(|n| n as f64),
            start_time_seconds: match (stat, self.proc_stat.and_then(boot_time)) {
                (Some(s), Some(boot)) => Some(boot as f64 + s.starttime as f64 / hz),
                _ => None,
            },
        }
    }
}

/// Read this process's figures now.
pub fn sample() -> Sample {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let (stat, status, proc_stat) = (
        read("/proc/self/stat"),
        read("/proc/self/status"),
        read("/proc/stat"),
    );
    // SAFETY: sysconf and getrlimit only read, into a local.
    let (clock_ticks, page_size, max_fds) = unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = (libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0
            && lim.rlim_cur != libc::RLIM_INFINITY)
            .then_some(lim.rlim_cur);
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as u64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
            max,
        )
    };
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    Read {
        stat: stat.as_deref(),
        status: status.as_deref(),
        proc_stat: proc_stat.as_deref(),
        clock_ticks,
        page_size,
        open_fds,
        max_fds,
    }
    .sample()
}

/// The `process_*` families, read at each scrape.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let s = sample();
        if let Some(v) = s.cpu_seconds {
            let name = "process_cpu_seconds";
            let m =
                encoder.encode_descriptor(name, super::help(name), None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m)?;
        }
        for (name, v) in [
            ("process_resident_memory_bytes", s.resident_bytes),
            ("process_virtual_memory_bytes", s.virtual_bytes),
            ("process_open_fds", s.open_fds),
            ("process_max_fds", s.max_fds),
            ("process_start_time_seconds", s.start_time_seconds),
        ] {
            let Some(v) = v else { continue };
            let m = encoder.encode_descriptor(name, super::help(name), None, MetricType::Gauge)?;
            ConstGauge::new(v).encode(m)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line's shape, with a command name holding spaces and parentheses.
    const STAT: &str = "4242 (shed (der) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
        250 130 0 0 20 0 5 0 98765 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 \
        0 0 0 17 1 0 0 0 0 0\n";

    const STATUS: &str = "Name:\tshedder\nUmask:\t0022\nState:\tS (sleeping)\n\
        VmPeak:\t  130000 kB\nVmSize:\t  120560 kB\nVmRSS:\t    9000 kB\nThreads:\t5\n";

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                utime: 250,
                stime: 130,
                starttime: 98765,
                vsize_bytes: 123_456_789,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("1 (x) S 1 2"), None, "truncated");
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn status_lines_are_read_in_bytes() {
        assert_eq!(status_bytes(STATUS, "VmRSS"), Some(9000 * 1024));
        assert_eq!(status_bytes(STATUS, "VmSize"), Some(120_560 * 1024));
        // VmRSS is not VmRSSx, and a missing key is none.
        assert_eq!(status_bytes("VmRSSx:\t1 kB\n", "VmRSS"), None);
        assert_eq!(status_bytes(STATUS, "VmSwap"), None);
        assert_eq!(status_bytes("Threads:\t5\n", "Threads"), Some(5));
    }

    #[test]
    fn a_sample_is_in_seconds_and_bytes() {
        let read = Read {
            stat: Some(STAT),
            status: Some(STATUS),
            proc_stat: Some("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            clock_ticks: 100,
            page_size: 4096,
            open_fds: Some(17),
            max_fds: Some(8192),
        };
        let s = read.sample();
        assert_eq!(s.cpu_seconds, Some(3.8));
        assert_eq!(s.resident_bytes, Some(9000.0 * 1024.0));
        assert_eq!(s.virtual_bytes, Some(120_560.0 * 1024.0));
        assert_eq!(s.start_time_seconds, Some(1_700_000_000.0 + 987.65));
        assert_eq!((s.open_fds, s.max_fds), (Some(17.0), Some(8192.0)));
        // Without status, stat's pages and bytes; without /proc/stat, no start time.
        let s = Read {
            status: None,
            proc_stat: None,
            ..read
        }
        .sample();
        assert_eq!(s.resident_bytes, Some(2048.0 * 4096.0));
        assert_eq!(s.virtual_bytes, Some(123_456_789.0));
        assert_eq!(s.start_time_seconds, None);
    }

    #[test]
    fn this_process_can_be_read() {
        let s = sample();
        assert!(s.cpu_seconds.is_some_and(|v| v >= 0.0), "{s:?}");
        assert!(s.resident_bytes.is_some_and(|v| v > 0.0), "{s:?}");
        assert!(s.open_fds.is_some_and(|v| v >= 3.0), "{s:?}");
        assert!(s.start_time_seconds.is_some_and(|v| v > 1e9), "{s:?}");
    }
}
