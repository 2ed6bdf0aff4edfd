//! Debian's `wrk`, an HTTP/1.1 load generator over persistent connections, as clients of a
//! load balancer use it: each connection sends a request, waits for the answer, thinks
//! for a while (about [`WrkConfig::think`], drawn uniformly from half to one and a half
//! times it) and sends the next on the same connection. A connection the server closes or
//! resets is opened again at once, through the gate.
//!
//! Latency is measured per request from the response alone: the script stamps each request
//! with the monotonic clock (`X-Sent`, LuaJIT's FFI) and [`HttpBackend`] sends the stamp
//! back, so the answers that count are the ones within the deadline after the warm-up,
//! whatever wrk's own whole-run histogram says.
//!
//! [`h2load`] runs Debian's `h2load` over HTTP/2, many requests to a connection.
//!
//! [`HttpBackend`]: crate::load::HttpBackend

use std::{
    net::SocketAddr,
    process::{Child, Stdio},
    time::Duration,
};

use super::{PeerProcess, nsenter};
use crate::netns::Netns;

/// How to run [`Wrk`].
#[derive(Clone, Debug)]
pub struct WrkConfig {
    pub target: SocketAddr,
    pub connections: u32,
    pub duration: Duration,
    /// Mean pause between an answer and the connection's next request.
    pub think: Duration,
    /// Answers to requests sent before this much of the run are not judged.
    pub warm_up: Duration,
    /// An answer later than this after its request is late.
    pub deadline: Duration,
}

impl WrkConfig {
    /// What the connections offer a second while answers are quick: one request per think
    /// time each.
    pub fn offered(&self) -> f64 {
        self.connections as f64 / self.think.as_secs_f64()
    }
}

/// What one wrk run reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkResult {
    /// After the warm-up: 200s within the deadline, and answers late or not 200.
    pub good: u64,
    pub late: u64,
    /// The whole run: responses, and wrk's socket errors (a reset connection is a read
    /// error) and its requests without an answer within its timeout.
    pub responses: u64,
    pub connect_errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub timeouts: u64,
    /// Judged time: the run less the warm-up (s).
    pub judged_s: f64,
}

impl WrkResult {
    /// Good answers a second over the judged time.
    pub fn goodput(&self) -> f64 {
        self.good as f64 / self.judged_s
    }

    /// The part of the judged requests answered in time; the requests a reset lost count
    /// against it (all of the run's, judged or not: an upper bound on the loss).
    pub fn success(&self) -> f64 {
        let lost = self.read_errors + self.write_errors + self.timeouts;
        let all = self.good + self.late + lost;
        if all == 0 {
            0.0
        } else {
            self.good as f64 / all as f64
        }
    }
}

const SCRIPT: &str = r#"
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } shedder_ts;
int clock_gettime(int clk, shedder_ts *tp);
]]
local ts = ffi.new("shedder_ts")
local function now_ms()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  warm_until = now_ms() + tonumber(args[1])
  deadline = tonumber(args[2])
  think = tonumber(args[3])
  good = 0
  late = 0
  math.randomseed(os.time())
end
function delay() return math.random(math.floor(think / 2), math.floor(think * 3 / 2)) end
function request()
  return wrk.format("GET", "/", { ["X-Sent"] = string.format("%.3f", now_ms()) })
end
function response(status, headers, body)
  -- haproxy writes header names in lower case.
  local sent = tonumber(headers["X-Sent"] or headers["x-sent"])
  if sent == nil or sent < warm_until then return end
  if status == 200 and now_ms() - sent <= deadline then good = good + 1 else late = late + 1 end
end
function done(summary, latency, requests)
  local g, l = 0, 0
  for _, t in ipairs(threads) do g = g + t:get("good"); l = l + t:get("late") end
  local e = summary.errors
  io.write(string.format("SHEDDER good=%d late=%d responses=%d connect=%d read=%d write=%d timeout=%d\n",
    g, l, summary.requests, e.connect, e.read, e.write, e.timeout))
end
"#;

/// A running wrk; [`Wrk::wait`] for its result.
pub struct Wrk {
    process: PeerProcess,
    config: WrkConfig,
}

impl Wrk {
    /// Start wrk (one thread) inside `ns`.
    pub fn start(ns: &Netns, config: &WrkConfig) -> Self {
        let mut process = PeerProcess::new("wrk", "shedder.lua", |_| SCRIPT.to_string());
        let url = match config.target {
            SocketAddr::V4(a) => format!("http://{a}/"),
            SocketAddr::V6(a) => format!("http://[{}]:{}/", a.ip(), a.port()),
        };
        let mut c = nsenter(&ns.name, "wrk");
        c.args(["-t1", "-c"])
            .arg(config.connections.to_string())
            .arg("-d")
            .arg(format!("{}s", config.duration.as_secs()))
            .args(["--timeout", "10s", "-s"])
            .arg(process.path("shedder.lua"))
            .arg(url)
            .arg("--")
            .arg(config.warm_up.as_millis().to_string())
            .arg(config.deadline.as_millis().to_string())
            .arg(config.think.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        process.child = Some(
            c.spawn()
                .expect("spawning wrk (is the wrk package installed?)"),
        );
        Self {
            process,
            config: config.clone(),
        }
    }

    /// Wait for the run to end and read its result; panics with wrk's output if it printed
    /// none.
    pub fn wait(mut self) -> WrkResult {
        let child: Child = self.process.child.take().expect("running");
        let out = child.wait_with_output().expect("waiting for wrk");
        let line = summary_line("wrk", &out, "SHEDDER ");
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in wrk's line: {line}"))
        };
        WrkResult {
            good: field("good"),
            late: field("late"),
            responses: field("responses"),
            connect_errors: field("connect"),
            read_errors: field("read"),
            write_errors: field("write"),
            timeouts: field("timeout"),
            judged_s: self
                .config
                .duration
                .saturating_sub(self.config.warm_up)
                .as_secs_f64(),
        }
    }
}

/// The line of `tool`'s output that starts with `prefix`; panics with all it printed if
/// there is none.
fn summary_line(tool: &str, out: &std::process::Output, prefix: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find(|l| l.starts_with(prefix)) {
        Some(l) => l.to_string(),
        None => panic!(
            "{tool} printed no {prefix:?} line ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Requests a second `connections` wrk connections get answered without a pause (one
/// thread, `duration` long): the capacity of what answers them.
pub fn closed_loop_rate(
    ns: &Netns,
    target: SocketAddr,
    connections: u32,
    duration: Duration,
) -> f64 {
    let run = Wrk::start(
        ns,
        &WrkConfig {
            target,
            connections,
            duration,
            think: Duration::ZERO,
            warm_up: Duration::ZERO,
            deadline: Duration::from_secs(10),
        },
    );
    let r = run.wait();
    r.responses as f64 / duration.as_secs_f64()
}

/// What an `h2load` run over HTTP/2 (cleartext, prior knowledge) reported: its summary's
/// request counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct H2Result {
    pub total: u64,
    pub started: u64,
    pub done: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub errored: u64,
    pub timeout: u64,
    /// Requests in its per-request log (`--log-file`): answered 2xx, and the rest (a
    /// status other than 2xx, or -1 for a stream that ended without one).
    pub logged_2xx: u64,
    pub logged_other: u64,
    /// Of the 2xx, those answered within `deadline` of their start.
    pub logged_in_time: u64,
    /// The summary's lines, as printed.
    pub summary: String,
}

/// Run Debian's `h2load` in `ns` against `target` over HTTP/2 without TLS: `clients`
/// connections each keeping `streams` requests in flight (a closed loop: each answer starts
/// the next request) for `duration`. Returns when it ends.
pub fn h2load(
    ns: &Netns,
    target: SocketAddr,
    (clients, streams): (u32, u32),
    duration: Duration,
    deadline: Duration,
) -> H2Result {
    let log = std::env::temp_dir().join(format!(
        "shedder-h2load-{}-{}.log",
        std::process::id(),
        target.port()
    ));
    let out = nsenter(&ns.name, "h2load")
        .arg(format!("--log-file={}", log.display()))
        .arg(format!("-c{clients}"))
        .arg(format!("-m{streams}"))
        .arg("-t1")
        .arg(format!("-D{}", duration.as_secs()))
        .arg(format!("http://{target}/"))
        .stdin(Stdio::null())
        .output()
        .expect("spawning h2load (is nghttp2-client installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = summary_line("h2load", &out, "requests:");
    // "requests: 10 total, 10 started, 10 done, 9 succeeded, 1 failed, 1 errored, 0 timeout"
    let count = |name: &str| -> u64 {
        line.split(',')
            .find_map(|part| {
                let mut words = part.split_whitespace().rev();
                (words.next() == Some(name)).then(|| words.next()?.parse().ok())?
            })
            .unwrap_or(0)
    };
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    // Columns: start (µs since the epoch), status, duration (µs).
    let rows: Vec<(i64, u64)> = logged
        .lines()
        .filter_map(|l| {
            let mut cols = l.split('\t').skip(1);
            Some((
                cols.next()?.trim().parse().ok()?,
                cols.next()?.trim().parse().ok()?,
            ))
        })
        .collect();
    let ok = || rows.iter().filter(|(s, _)| (200..300).contains(s));
    H2Result {
        logged_2xx: ok().count() as u64,
        logged_other: rows.len() as u64 - ok().count() as u64,
        logged_in_time: ok()
            .filter(|(_, us)| *us as u128 <= deadline.as_micros())
            .count() as u64,
        total: count("total"),
        started: count("started"),
        done: count("done"),
        succeeded: count("succeeded"),
        failed: count("failed"),
        errored: count("errored"),
        timeout: count("timeout"),
        summary: stdout
            .lines()
            .filter(|l| {
                l.starts_with("requests:")
                    || l.starts_with("status codes:")
                    || l.starts_with("finished in")
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}
