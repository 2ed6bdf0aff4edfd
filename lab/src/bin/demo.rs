//! `cargo xtask demo`: shedder against a ramp from half to three times a backend's capacity,
//! then the same ramp unprotected, with a live table and a side-by-side summary.
//!
//! Everything happens in network namespaces the demo makes and removes (also on Ctrl-C): a
//! "load-balancer node" running a backend of known capacity (workers × service time) and
//! the shedder daemon, and a client namespace sending open-loop traffic from four class
//! prefixes, each request with a 1 s deadline.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use shedder::{
    config::Prefix,
    kernel::{AttachMode, MapReader, PinnedMaps, Shedder},
};
use shedder_common::{ACTION_RST, MODE_ENFORCE, hist};
use shedder_lab::{
    interrupt::interrupted,
    load::{LoadReport, Window},
    netns::IFACE,
    policy::open_policy,
    scenario::{Lab, LabConfig},
};

#[derive(Parser)]
#[command(about = "shedder under a 0.5x -> 3x -> 0.5x ramp, then the same ramp unprotected")]
struct Args {
    /// Seconds at 0.5× before the ramp and after it.
    #[arg(long, default_value_t = 8)]
    calm: u64,
    /// Seconds at 3× capacity.
    #[arg(long, default_value_t = 14)]
    overload: u64,
    /// Seconds to ramp up (and, halved, down).
    #[arg(long, default_value_t = 6)]
    ramp: u64,
    /// Attach with `auto` (what a new configuration uses: tc on this veth, since the demo
    /// resets), `tc`, `native` (with a pass-through XDP program on the client's veth, which
    /// native XDP_TX on a veth needs) or `generic`.
    #[arg(long, default_value = "auto")]
    attach: String,
    /// Only the protected run.
    #[arg(long)]
    skip_unprotected: bool,
}

const DEADLINE: Duration = Duration::from_secs(1);
/// The service id the demo's observer uses to measure queue age in both runs.
const OBSERVED: u32 = 30;

/// A per-second reading from the kernel: the daemon's limit (protected run) and the
/// accept-queue age p99 measured by an observer of its own.
#[derive(Clone, Copy, Default)]
struct Kernel {
    limit: Option<u32>,
    queue_age_p99_ms: Option<f64>,
}

struct Run {
    name: &'static str,
    report: LoadReport,
}

fn main() -> ExitCode {
    shedder_lab::interrupt::install();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    if !shedder_lab::is_root() {
        bail!("the demo needs root (namespaces, BPF): run `cargo xtask demo` as root");
    }
    let attach: &'static str = match args.attach.as_str() {
        "auto" => "auto",
        "tc" => "tc",
        "native" => "native",
        "generic" => "generic",
        other => bail!("--attach {other}: use auto, tc, native or generic"),
    };
    let started = Instant::now();
    println!("Setting up: namespaces, a backend of 4 workers × 20 ms, capacity measured...");
    let mut lab = Lab::new(
        "demo",
        LabConfig {
            attach,
            ..LabConfig::default()
        },
    );
    let cap = lab.capacity;
    println!(
        "Backend capacity: {cap:.0} requests/s (4 workers × 20 ms). Classes: critical 5% \
         (198.18.10.0/25), high 25% (198.18.20.0/24, floor 60%), medium 50% (default, floor \
         5%), sheddable 20% (198.18.99.0/24). Deadline 1 s. \"ok crit/high/med/shd\": % of \
         each class's requests answered within the deadline.\n"
    );
    let observer = observer(&lab)?;
    let mut runs = Vec::new();

    println!("== Protected: shedder run (AIMD, target 50 ms, {attach} attach, rst) ==");
    lab.protect();
    runs.push(ramp(&lab, &args, "shedder", &observer)?);
    let mut warnings = Vec::new();
    if let Some(d) = &lab.daemon {
        let log = d.log();
        warnings = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(|l| l.split_once(": ").map_or(l, |(_, w)| w).to_string())
            .collect();
        let decisions: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("limit changed") || l.contains("mode changed"))
            .collect();
        println!(
            "\nThe daemon's decisions ({} logged; the last ones):",
            decisions.len()
        );
        for line in decisions.iter().rev().take(8).rev() {
            println!(
                "  {}",
                line.split_once("shedder::daemon: ")
                    .map_or(*line, |(_, l)| l)
            );
        }
    }
    lab.unprotect();
    if !args.skip_unprotected && !interrupted() {
        // Let the backend finish what the protected run left.
        std::thread::sleep(Duration::from_secs(1));
        println!("\n== Unprotected: the kernel backlog only ==");
        runs.push(ramp(&lab, &args, "unprotected", &observer)?);
    }
    if interrupted() {
        println!("\ninterrupted: removing everything the demo made");
        return Ok(());
    }
    summary(&runs, cap, &args);
    drop(observer);
    drop(lab);
    println!(
        "\nDone in {:.0} s; namespaces, programs and pins removed.",
        started.elapsed().as_secs_f64()
    );
    judge(&runs[0], cap, &args, &warnings)
}

/// What the protected run must show for the demo to pass: CRITICAL served, and at 3× a
/// goodput of at least half the capacity (unprotected, it is near nothing: every request
/// waits past its deadline). A demo that printed a table of shedder doing nothing and
/// exited 0 would tell a new user it works; it fails instead, with the daemon's warnings.
fn judge(protected: &Run, cap: f64, args: &Args, warnings: &[String]) -> Result<()> {
    let start = args.calm + args.ramp;
    let overload = protected.report.range(start..start + args.overload);
    let goodput = overload.goodput() / cap;
    let critical = protected
        .report
        .total()
        .class("critical")
        .map_or(0.0, |c| c.share(c.ok));
    if goodput >= 0.5 && critical >= 0.9 {
        return Ok(());
    }
    let said = if warnings.is_empty() {
        "nothing".to_string()
    } else {
        format!("\n  {}", warnings.join("\n  "))
    };
    bail!(
        "shedder did not protect the backend: at 3x its goodput was {:.0}% of capacity (at \
         least 50% expected) and CRITICAL got {:.1}% (at least 90% expected). The daemon's \
         warnings: {said}",
        100.0 * goodput,
        100.0 * critical
    )
}

/// A Shedder instance of the demo's own, attached with TC beside whatever the daemon
/// attaches, measuring the backend's wait before a connection's first response in both
/// runs (its policy admits everything: it sheds nothing).
fn observer(lab: &Lab) -> Result<Shedder> {
    let mut s = Shedder::load().context("loading the observer")?;
    s.set_policy(OBSERVED, &open_policy(ACTION_RST, MODE_ENFORCE))?;
    s.set_port(lab.cfg.port, Some(OBSERVED))?;
    s.replace_class_rules(&[] as &[(Prefix, u32)])?;
    lab.pair
        .server
        .run(|| s.attach(IFACE, AttachMode::Tc))
        .context("attaching the observer")?;
    Ok(s)
}

/// 0.5× → ramp → 3× → ramp down → 0.5×, printing a row a second.
fn ramp(lab: &Lab, args: &Args, name: &'static str, observer: &Shedder) -> Result<Run> {
    let cap = lab.capacity;
    let handle = lab
        .load()
        .deadline(DEADLINE)
        .phase(Duration::from_secs(args.calm), 0.5 * cap)
        .ramp(Duration::from_secs(args.ramp), 0.5 * cap, 3.0 * cap)
        .phase(Duration::from_secs(args.overload), 3.0 * cap)
        .ramp(Duration::from_secs(args.ramp / 2), 3.0 * cap, 0.5 * cap)
        .phase(Duration::from_secs(args.calm), 0.5 * cap)
        .start_in(&lab.pair.client);
    let mut kernel = Vec::new();
    let daemon_maps = if lab.daemon.is_some() {
        PinnedMaps::open(&lab.pins).ok()
    } else {
        None
    };
    let mut prev_hist = observer.histogram(OBSERVED, hist::KIND_QUEUE_AGE)?;
    println!(
        "{:>4} {:>8} {:>8} {:>8} | {:>24} | {:>6} {:>10} {:>10}",
        "t(s)",
        "offered",
        "goodput",
        "timeouts",
        "ok % crit/high/med/shd",
        "limit",
        "qage p99",
        "p99 ok"
    );
    // Rows arrive about one deadline after their second ends; the kernel is sampled each
    // second as it happens and matched to the rows by index.
    let mut rows = 0usize;
    let mut next = Instant::now() + Duration::from_secs(1);
    let finished = loop {
        if interrupted() {
            handle.stop();
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += Duration::from_secs(1);
        let hist_now = observer.histogram(OBSERVED, hist::KIND_QUEUE_AGE)?;
        let delta: Vec<u64> = hist_now
            .iter()
            .zip(&prev_hist)
            .map(|(a, b)| a - b)
            .collect();
        prev_hist = hist_now;
        kernel.push(Kernel {
            limit: daemon_maps
                .as_ref()
                .and_then(|m| m.policy(0).ok())
                .map(|p| p.total_limit),
            queue_age_p99_ms: hist::quantile(&delta, 0.99).map(|us| us / 1000.0),
        });
        loop {
            match handle.seconds.try_recv() {
                Ok(w) => {
                    print_row(rows, &w, kernel.get(rows).copied().unwrap_or_default());
                    rows += 1;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
            }
        }
        if handle.is_finished() {
            break handle.wait();
        }
    };
    for (t, w) in finished.seconds.iter().enumerate().skip(rows) {
        print_row(t, w, kernel.get(t).copied().unwrap_or_default());
    }
    Ok(Run {
        name,
        report: finished,
    })
}

/// % of a class's requests answered within the deadline ("-" when it sent none).
fn ok_pct(w: &Window, class: &str) -> String {
    w.class(class)
        .filter(|c| c.offered > 0)
        .map_or("-".into(), |c| format!("{:.0}", 100.0 * c.share(c.ok)))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} ms"))
}

fn print_row(t: usize, w: &Window, k: Kernel) {
    let shed = format!(
        "{}/{}/{}/{}",
        ok_pct(w, "critical"),
        ok_pct(w, "high"),
        ok_pct(w, "medium"),
        ok_pct(w, "sheddable")
    );
    println!(
        "{t:>4} {:>8} {:>8} {:>8} | {shed:>25} | {:>6} {:>10} {:>10}",
        w.all.offered,
        w.all.ok,
        w.all.timeout,
        k.limit.map_or("-".into(), |l| l.to_string()),
        ms(k.queue_age_p99_ms),
        ms(w.all.p99().map(|d| d.as_secs_f64() * 1000.0)),
    );
}

fn summary(runs: &[Run], cap: f64, args: &Args) {
    let overload_start = args.calm + args.ramp;
    let overload = overload_start..overload_start + args.overload;
    let after_start = overload.end + args.ramp / 2;
    let after = after_start..after_start + args.calm;
    println!(
        "\n== Summary (capacity {cap:.0}/s; goodput = responses within the 1 s deadline) ==\n"
    );
    println!(
        "| | goodput at 3× (% of capacity) | p99 of successes at 3× | CRITICAL success | high success at 3× | medium success at 3× | sheddable success at 3× | timeouts at 3× | goodput after (% of offered) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let o = r.report.range(overload.clone());
        let a = r.report.range(after.clone());
        let all = r.report.total();
        let crit = all.class("critical").map_or(0.0, |c| c.share(c.ok));
        let class_ok = |c: &str| o.class(c).map_or(0.0, |c| c.share(c.ok));
        println!(
            "| {} | {:.0}% | {} | {:.1}% | {:.0}% | {:.0}% | {:.0}% | {} | {:.0}% |",
            r.name,
            100.0 * o.goodput() / cap,
            ms(o.all.p99().map(|d| d.as_secs_f64() * 1000.0)),
            100.0 * crit,
            100.0 * class_ok("high"),
            100.0 * class_ok("medium"),
            100.0 * class_ok("sheddable"),
            o.all.timeout,
            100.0 * a.all.share(a.all.ok),
        );
    }
}
