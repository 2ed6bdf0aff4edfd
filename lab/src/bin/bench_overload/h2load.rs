//! A second, independent open-loop generator against the TLS backend: Debian's `h2load`
//! (nghttp2-client), HTTP/1.1 over TLS, one request per connection, connections started at a
//! fixed rate. Its timeouts start only once a connection is up, so a SYN dropped without an
//! answer stalls it: it runs against the systems that answer their refusals before the
//! handshake (shedder `rst`, HAProxy). nginx's limiters answer only after it, and under
//! overload the kernel drops the SYNs that find nginx's accept queue full.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use shedder_lab::{load::HTTPS_PATH, load::pin_process, netns::Netns};

/// Connections are started every this often (h2load's `--rate-period`), `rate × period` at a
/// time: short enough that the bursts are small against a 1 s deadline.
const PERIOD: Duration = Duration::from_millis(10);

/// What one h2load run reported.
#[derive(Clone, Debug, Serialize)]
pub struct H2load {
    /// The offered load as a multiple of the capacity.
    pub factor: f64,
    /// Connections (one request each) started per second.
    pub offered_rps: f64,
    pub seconds: f64,
    /// Connections h2load was asked to make.
    pub requests: u64,
    /// 2xx responses started after the settling seconds and completed by one deadline
    /// after the last connection was due (h2load keeps no deadline per request; later ones
    /// are not counted).
    pub ok: u64,
    /// 5xx responses in the same window.
    pub status_5xx: u64,
    /// From h2load's summary (None if it had to be stopped): requests that failed without
    /// a response (refused, reset, timed out).
    pub errored: Option<u64>,
    /// h2load was still running 5 s after the last connection was due and was stopped.
    pub stopped: bool,
    /// 2xx a second over the counted seconds, % of the capacity measured with the
    /// project's generator.
    pub goodput_pct: f64,
    /// shedder only: its refusals over the run by "class reason".
    pub refused: Vec<(String, u64)>,
    pub command: String,
}

/// Run h2load in `ns` (the client namespace) against `target` at `factor × capacity`
/// connections a second for `seconds`, on `cpu` if given. `-T 1` closes any connection
/// still open a second after it is up; responses are counted from h2load's per-request log
/// from `settle` seconds in (as the ladder's steps leave out their start while the systems
/// adapt) up to one deadline (`deadline`) after the last connection was due.
pub fn run(
    ns: &Netns,
    target: SocketAddr,
    (capacity, factor): (f64, f64),
    (seconds, settle): (u64, u64),
    deadline: Duration,
    cpu: Option<usize>,
) -> Result<H2load> {
    let per_period = (factor * capacity * PERIOD.as_secs_f64()).round().max(1.0) as u64;
    let periods = seconds * (Duration::from_secs(1).as_millis() / PERIOD.as_millis()) as u64;
    let requests = per_period * periods;
    let offered_rps = per_period as f64 / PERIOD.as_secs_f64();
    let log = std::env::temp_dir().join(format!("shedder-h2load-{}.log", std::process::id()));
    let args = [
        "--h1".to_string(),
        "-t1".into(),
        format!("-n{requests}"),
        format!("-c{requests}"),
        format!("-r{per_period}"),
        format!("--rate-period={}ms", PERIOD.as_millis()),
        "-T1".into(),
        format!("--log-file={}", log.display()),
        format!("https://{target}{HTTPS_PATH}"),
    ];
    let command = format!("h2load {}", args.join(" "));
    let started = SystemTime::now();
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", ns.name))
        .arg("h2load")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning h2load (is nghttp2-client installed?)")?;
    if let Some(cpu) = cpu {
        // nsenter execs h2load: the pid is h2load's.
        pin_process(child.id(), cpu).context("pinning h2load")?;
    }
    // Against a system that leaves SYNs unanswered h2load waits out the kernel's SYN
    // retries (minutes): stop it once nothing more can count.
    let give_up = Instant::now() + Duration::from_secs(seconds + 5);
    let mut stopped = false;
    while child.try_wait()?.is_none() {
        if Instant::now() > give_up {
            // SAFETY: plain kill(2) on our child's pid, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            stopped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().context("waiting for h2load")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !stopped && !out.status.success() {
        bail!("`{command}` failed ({}): {text}", out.status);
    }
    let entries = std::fs::read_to_string(&log);
    let _ = std::fs::remove_file(&log);
    let entries = entries.with_context(|| format!("reading h2load's log {}", log.display()))?;
    let since_epoch = started.duration_since(UNIX_EPOCH)?;
    let window = (
        (since_epoch + Duration::from_secs(settle)).as_micros() as u64,
        (since_epoch + Duration::from_secs(seconds) + deadline).as_micros() as u64,
    );
    let (ok, status_5xx) = count_log(&entries, window);
    let counted = (seconds - settle) as f64;
    let errored = if stopped {
        None
    } else {
        Some(errored(&text).with_context(|| format!("h2load's output:\n{text}"))?)
    };
    Ok(H2load {
        factor,
        offered_rps,
        seconds: seconds as f64,
        requests,
        ok,
        status_5xx,
        errored,
        stopped,
        goodput_pct: 100.0 * ok as f64 / counted / capacity,
        refused: Vec::new(),
        command,
    })
}

/// (2xx, 5xx) among the log's requests started from `from` and completed by `end` (µs since
/// the epoch). A line: start time in µs since the epoch, status, µs to the end of the
/// response (tab-separated).
fn count_log(log: &str, (from, end): (u64, u64)) -> (u64, u64) {
    log.lines()
        .filter_map(|l| {
            let mut f = l.split('\t').map(|x| x.trim().parse::<u64>().ok());
            let (start, status, took) = (f.next()??, f.next()??, f.next()??);
            (start >= from && start + took <= end).then_some(status)
        })
        .fold((0, 0), |(ok, busy), status| match status {
            200..=299 => (ok + 1, busy),
            500..=599 => (ok, busy + 1),
            _ => (ok, busy),
        })
}

/// Requests that failed without a response, from h2load's summary line
/// `requests: N total, ... E errored, T timeout`.
fn errored(text: &str) -> Result<u64> {
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("requests:"))
        .context("no \"requests:\" line")?;
    line.split(',')
        .find_map(|item| {
            let mut it = item.split_whitespace();
            let n = it.next()?;
            (it.next()? == "errored").then(|| n.parse().ok())?
        })
        .with_context(|| format!("no \"errored\" in {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_and_the_log_are_read() {
        let text = "finished in 5.01s, 220.00 req/s, 60KB/s\n\
                    requests: 8000 total, 8000 started, 1200 done, 1100 succeeded, 6900 failed, \
                    6800 errored, 3 timeout\n";
        assert_eq!(errored(text).unwrap(), 6800);
        assert!(errored("requests: 1 total\n").is_err());
        let log = "1000\t200\t50\n1010\t503\t20\n1020\t200\t100\n1030\t200\t5\nbad\n";
        assert_eq!(count_log(log, (0, 1050)), (2, 1));
        assert_eq!(count_log(log, (0, 2000)), (3, 1));
        assert_eq!(count_log(log, (1005, 2000)), (2, 1));
    }
}
