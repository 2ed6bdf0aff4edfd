//! Pressure stall information of a cgroup v2 (`cpu`, `memory`, `io`), with the CPU
//! throttling counters read alongside (CFS throttling inflates CPU pressure).

use std::{
    io,
    path::{Path, PathBuf},
};

/// One `some`/`full` line pair of a `*.pressure` file.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    /// Share of the last 10 s some task was stalled, percent.
    pub some_avg10: f64,
    /// Cumulative stall time of some task, µs.
    pub some_total_us: u64,
    /// Share of the last 10 s all tasks were stalled, percent (absent for cpu on old kernels).
    pub full_avg10: Option<f64>,
    pub full_total_us: Option<u64>,
}

/// `cpu.stat` throttling counters (present only where the cpu controller is enabled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttling {
    pub nr_throttled: u64,
    pub throttled_usec: u64,
}

/// The cgroup v2 mount point, from `/proc/mounts` (e.g. `/sys/fs/cgroup` on a unified
/// host, `/sys/fs/cgroup/unified` on a hybrid one).
pub fn cgroup2_mount() -> io::Result<PathBuf> {
    find_cgroup2(&std::fs::read_to_string("/proc/mounts")?).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no cgroup2 filesystem in /proc/mounts",
        )
    })
}

fn find_cgroup2(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir.replace("\\040", " ")))
    })
}

/// Parse a `*.pressure` file.
pub fn parse_pressure(text: &str) -> io::Result<Pressure> {
    let mut p = Pressure::default();
    let mut some = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let (mut avg10, mut total) = (None, None);
        for kv in words {
            match kv.split_once('=') {
                Some(("avg10", v)) => avg10 = v.parse::<f64>().ok(),
                Some(("total", v)) => total = v.parse::<u64>().ok(),
                _ => {}
            }
        }
        match (kind, avg10, total) {
            (Some("some"), Some(a), Some(t)) => {
                p.some_avg10 = a;
                p.some_total_us = t;
                some = true;
            }
            (Some("full"), Some(a), Some(t)) => {
                p.full_avg10 = Some(a);
                p.full_total_us = Some(t);
            }
            _ => {}
        }
    }
    if !some {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "no `some` line"));
    }
    Ok(p)
}

/// Parse `cpu.stat`; `None` when it has no throttling counters.
pub fn parse_throttling(text: &str) -> Option<Throttling> {
    let mut t = Throttling::default();
    let mut found = 0;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("nr_throttled", v)) => {
                t.nr_throttled = v.trim().parse().ok()?;
                found += 1;
            }
            Some(("throttled_usec", v)) => {
                t.throttled_usec = v.trim().parse().ok()?;
                found += 1;
            }
            _ => {}
        }
    }
    (found == 2).then_some(t)
}

/// A cgroup file kept open and re-read from offset 0 each time (cgroupfs regenerates it
/// on every read), which saves an open and a close per read.
#[derive(Debug)]
pub struct OpenFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl OpenFile {
    pub fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    /// The file's current content; on any error the file is reopened next time.
    pub fn read(&mut self) -> io::Result<String> {
        use std::os::unix::fs::FileExt;
        let result = (|| {
            if self.file.is_none() {
                self.file = Some(std::fs::File::open(&self.path)?);
            }
            let file = self.file.as_ref().expect("opened above");
            let mut buf = vec![0u8; 4096];
            let n = file.read_at(&mut buf, 0)?;
            buf.truncate(n);
            String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        })();
        if result.is_err() {
            self.file = None;
        }
        result.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))
    }
}

/// The pressure and throttling files of one cgroup, kept open.
#[derive(Debug)]
pub struct CgroupFiles {
    pub pressure: [OpenFile; 3],
    pub cpu_stat: OpenFile,
}

impl CgroupFiles {
    pub fn new(cgroup: &Path) -> Self {
        Self {
            pressure: ["cpu", "memory", "io"]
                .map(|r| OpenFile::new(cgroup.join(format!("{r}.pressure")))),
            cpu_stat: OpenFile::new(cgroup.join("cpu.stat")),
        }
    }

    /// Pressure of resource `i` (0 cpu, 1 memory, 2 io).
    pub fn pressure(&mut self, i: usize) -> io::Result<Pressure> {
        parse_pressure(&self.pressure[i].read()?)
    }

    pub fn throttling(&mut self) -> io::Result<Throttling> {
        let text = self.cpu_stat.read()?;
        parse_throttling(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} has no throttling counters (the cpu controller is not enabled for it)",
                    self.cpu_stat.path.display()
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let hybrid = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(
            find_cgroup2(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(find_cgroup2("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn parses_pressure() {
        let p = parse_pressure(
            "some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\n\
             full avg10=0.25 avg60=0.00 avg300=0.00 total=678\n",
        )
        .unwrap();
        assert_eq!(p.some_avg10, 1.5);
        assert_eq!(p.some_total_us, 12345);
        assert_eq!(p.full_avg10, Some(0.25));
        assert_eq!(p.full_total_us, Some(678));
        let cpu_only_some =
            parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=9\n").unwrap();
        assert_eq!(cpu_only_some.full_total_us, None);
        assert!(parse_pressure("").is_err());
    }

    #[test]
    fn parses_throttling() {
        let t =
            parse_throttling("usage_usec 10\nnr_periods 5\nnr_throttled 2\nthrottled_usec 900\n");
        assert_eq!(
            t,
            Some(Throttling {
                nr_throttled: 2,
                throttled_usec: 900
            })
        );
        assert_eq!(parse_throttling("usage_usec 10\n"), None);
    }
}
