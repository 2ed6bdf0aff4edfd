//! The `shedder` command.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand};
use shedder::{
    BadInput,
    api::{
        control::{Client, ClientError, OverrideRequest},
        state::State,
    },
    config::Config,
    kernel::{self, AttachMode, MapReader, Shedder, policy::compile},
};
use shedder_common::{
    CLASS_NAMES, NUM_CLASSES, NUM_REASONS, NUM_VERDICTS, REASON_NAMES, VERDICT_NAMES,
    decision_index,
};

/// The golden-file check, shared with the library's tests (test builds only).
#[cfg(test)]
#[path = "golden.rs"]
mod golden;

const EXIT_CODES: &str = "Exit codes:
  0  success
  1  the operation failed (kernel, I/O, the daemon answered with an error)
  2  bad input: command line, configuration or policy; nothing was changed
  3  no daemon answers on the control socket
  4  permission denied (the control socket is for root and daemon.control_group)";

#[derive(Parser)]
#[command(
    name = "shedder",
    version,
    about = "Kernel-edge load shedder: refuses new TCP connections per service and class with XDP/TC",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the daemon's control socket is.
#[derive(Args, Clone)]
struct Target {
    /// The control socket (default: daemon.control_socket of --config, else
    /// /run/shedder/shedder.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Read the control socket's path from this configuration.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

impl Target {
    fn client(&self) -> Result<Client> {
        if let Some(s) = &self.socket {
            return Ok(Client::new(s));
        }
        if let Some(c) = &self.config {
            return Ok(Client::new(load_config(c)?.daemon.control_socket));
        }
        Ok(Client::new(shedder::config::defaults::control_socket()))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (attach, measure, control, serve the API and metrics).
    ///
    /// Attach (or adopt what is pinned), then every tick measure each service, run its
    /// controller, write the limits and stamp the heartbeat. Serves the control socket and
    /// the metrics endpoint. SIGHUP reloads the configuration; SIGTERM stops (and detaches
    /// unless told otherwise).
    #[command(after_help = EXIT_CODES)]
    Run {
        /// Configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// On SIGTERM leave the programs attached (the fallback limits take over after the
        /// heartbeat timeout), whatever daemon.detach_on_exit says.
        #[arg(long)]
        keep_attached: bool,
    },
    /// What the daemon is doing: limits, pressure and rates per service and class.
    ///
    /// Per service and class: limit, in-flight, queue age and latency, offered / admitted /
    /// shed rates, controller mode; heartbeat age and attach mode.
    #[command(after_help = EXIT_CODES)]
    Status {
        #[command(flatten)]
        target: Target,
        /// Print the daemon's state as JSON.
        #[arg(long)]
        json: bool,
    },
    /// `status`, refreshed every second in the terminal (Ctrl-C quits).
    #[command(after_help = EXIT_CODES)]
    Top {
        #[command(flatten)]
        target: Target,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Policies: validate a file, apply it to the running daemon, show the one in force.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Manual limits: a bounded override that expires.
    Limit {
        #[command(subcommand)]
        command: LimitCommand,
    },
    /// Check that this host can run shedder, and say how to fix what is missing.
    ///
    /// Kernel, BTF, bpffs/tracefs, capabilities, interfaces and XDP modes, cgroup v2 and
    /// PSI, the daemon. Each failing check says how to fix it.
    #[command(after_help = EXIT_CODES)]
    Doctor {
        /// Also check what this configuration needs (interfaces, cgroups, the daemon).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop the daemon and detach from every interface.
    ///
    /// Through the daemon if it runs, else by removing the pins directly.
    #[command(after_help = EXIT_CODES)]
    Detach {
        #[command(flatten)]
        target: Target,
        /// Pin directory, when no daemon runs (default: /sys/fs/bpf/shedder).
        #[arg(long, default_value = kernel::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Attach without a daemon: a static limiter at the fallback limits.
    ///
    /// Load the programs, write the configured policy, attach and pin everything, then
    /// exit. The fallback limits are in force.
    #[command(after_help = EXIT_CODES)]
    Attach {
        /// Configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Interfaces to attach to (default: daemon.interfaces from the configuration).
        #[arg(long = "iface", short)]
        interfaces: Vec<String>,
        /// auto (native XDP, else generic), native, generic or tc (default: daemon.attach).
        #[arg(long)]
        mode: Option<String>,
    },
    /// The decision counters in the pinned maps (works without a daemon).
    ///
    /// Unique attempts by class, verdict and reason; then SYN retransmits (not attempts)
    /// and retries (attempts from a recently shed source, by their class before demotion).
    #[command(after_help = EXIT_CODES)]
    Counters {
        /// Configuration file (for service names and the pin directory).
        #[arg(long, short)]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Check a configuration file.
    ///
    /// Prints the first problem (file:line: field: what is wrong) and exits 2 if there is
    /// one.
    #[command(after_help = EXIT_CODES)]
    Validate { file: PathBuf },
    /// Put a configuration in force in the running daemon, without detaching.
    ///
    /// The file is validated first; if it is refused, the running policy stays. It holds
    /// until the daemon restarts or gets SIGHUP, which re-read the daemon's own file.
    #[command(after_help = EXIT_CODES)]
    Apply {
        file: PathBuf,
        #[command(flatten)]
        target: Target,
    },
    /// The configuration in force in the running daemon.
    #[command(after_help = EXIT_CODES)]
    Show {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum LimitCommand {
    /// Hold SERVICE's limit at LIMIT for a while.
    ///
    /// Inside [min_limit, max_limit], at most 4× away from the limit in force unless
    /// --force, for at most 24 h. The controller resumes from it when it expires or is
    /// cleared.
    #[command(after_help = EXIT_CODES)]
    Set {
        service: String,
        limit: u32,
        /// How long, e.g. 90s, 10m, 2h (default 10m).
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        ttl: Duration,
        /// Allow a change of more than 4×.
        #[arg(long)]
        force: bool,
        /// Why (recorded in the audit log and shown by status).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// End SERVICE's override; the controller resumes.
    #[command(after_help = EXIT_CODES)]
    Clear {
        service: String,
        #[command(flatten)]
        target: Target,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: use a number with s, m or h, e.g. 90s, 10m, 2h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("`{s}`: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

/// `1 service`, `3 services`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

fn load_config(path: &Path) -> Result<Config> {
    Config::load(path).map_err(|e| BadInput(e.to_string()).into())
}

/// The exit code for an error.
fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<BadInput>().is_some() {
        return 2;
    }
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::NotRunning(_)) => 3,
        Some(ClientError::Denied(_)) => 4,
        Some(ClientError::Api(api)) if matches!(api.status, 400 | 404) => 2,
        _ => 1,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("shedder: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Run {
            config,
            keep_attached,
        } => {
            init_logging();
            shedder::daemon::run(shedder::daemon::Options {
                config,
                keep_attached,
            })?;
        }
        Command::Status { target, json } => {
            let body = target.client()?.call("GET", "/shedding/state", b"")?;
            if json {
                println!("{body}");
            } else {
                let state: State = serde_json::from_str(&body).context("the daemon's state")?;
                print!("{}", shedder::api::state::render(&state));
            }
        }
        Command::Top {
            target,
            interval,
            iterations,
        } => top(&target, interval, iterations)?,
        Command::Policy { command } => match command {
            PolicyCommand::Validate { file } => {
                let cfg = load_config(&file)?;
                println!(
                    "{}: ok ({}, {})",
                    file.display(),
                    count(cfg.services.len(), "service"),
                    if cfg.daemon.measure_only {
                        "measure only: no interface".to_string()
                    } else {
                        count(cfg.daemon.interfaces.len(), "interface")
                    }
                );
            }
            PolicyCommand::Apply { file, target } => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| BadInput(format!("{}: cannot read: {e}", file.display())))?;
                // Validate here first: the error then names the file.
                Config::parse(&text).map_err(|mut e| {
                    e.file = Some(file.clone());
                    BadInput(e.to_string())
                })?;
                let body = target
                    .client()?
                    .call("PUT", "/shedding/policy", text.as_bytes())
                    .map_err(|e| match e {
                        ClientError::Api(mut api) if api.status == 400 => {
                            api.error = format!("{}: {}", file.display(), api.error);
                            ClientError::Api(api)
                        }
                        other => other,
                    })?;
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                println!(
                    "{}: applied ({})",
                    file.display(),
                    count(v["services"].as_u64().unwrap_or(0) as usize, "service")
                );
            }
            PolicyCommand::Show { target } => {
                print!("{}", target.client()?.call("GET", "/shedding/policy", b"")?);
            }
        },
        Command::Limit { command } => match command {
            LimitCommand::Set {
                service,
                limit,
                ttl,
                force,
                reason,
                target,
            } => {
                let request = OverrideRequest {
                    limit,
                    ttl_s: ttl.as_secs(),
                    force,
                    reason,
                };
                target.client()?.call(
                    "PUT",
                    &format!("/shedding/override/{service}"),
                    serde_json::to_string(&request)?.as_bytes(),
                )?;
                println!("{service}: limit held at {limit} for {} s", ttl.as_secs());
            }
            LimitCommand::Clear { service, target } => {
                let body = target.client()?.call(
                    "DELETE",
                    &format!("/shedding/override/{service}"),
                    b"",
                )?;
                let cleared = body.contains("true");
                println!(
                    "{service}: {}",
                    if cleared {
                        "override cleared; the controller resumes"
                    } else {
                        "no override was in force"
                    }
                );
            }
        },
        Command::Doctor { config, json } => {
            let cfg = config.as_deref().map(load_config).transpose()?;
            let checks = shedder::doctor::run(cfg.as_ref(), config.as_deref());
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                print!("{}", shedder::doctor::render(&checks));
            }
            return Ok(shedder::doctor::exit_code(&checks));
        }
        Command::Detach { target, pin_dir } => {
            match target.client()?.call("POST", "/shedding/detach", b"") {
                Ok(_) => println!("the daemon is stopping and detaching"),
                Err(ClientError::NotRunning(_)) => {
                    let pins =
                        kernel::pins::locate(&pin_dir).context("finding the bpf filesystem")?;
                    let detached = kernel::unpin_all(&pins.path)
                        .with_context(|| format!("removing pins under {}", pin_dir.display()))?;
                    if detached.is_empty() {
                        println!(
                            "nothing was attached (no links under {})",
                            pin_dir.display()
                        );
                    } else {
                        println!("detached: {}", detached.join(", "));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Command::Attach {
            config,
            interfaces,
            mode,
        } => attach(config, interfaces, mode)?,
        Command::Counters { config, json } => counters(config, json)?,
    }
    Ok(0)
}

fn top(target: &Target, interval: f64, iterations: Option<u64>) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let client = target.client()?;
    let every = Duration::from_secs_f64(interval.max(0.1));
    let clear = std::io::stdout().is_terminal();
    let mut n = 0u64;
    loop {
        let body = client.call("GET", "/shedding/state", b"")?;
        let state: State = serde_json::from_str(&body).context("the daemon's state")?;
        let mut out = std::io::stdout().lock();
        if clear {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write!(out, "{}", shedder::api::state::render(&state))?;
        out.flush()?;
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(());
        }
        std::thread::sleep(every);
    }
}

/// Structured logs on stderr; `RUST_LOG` filters (default `info`), `SHEDDER_LOG=json`
/// switches to one JSON object per line.
fn init_logging() {
    use std::io::IsTerminal;

    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if std::env::var("SHEDDER_LOG").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn attach(config: PathBuf, interfaces: Vec<String>, mode: Option<String>) -> Result<()> {
    // The choice of mode and the connections counted are logged, as by the daemon.
    init_logging();
    let cfg = load_config(&config)?;
    let mode = match mode.as_deref() {
        Some(m) => AttachMode::parse(m)
            .ok_or_else(|| BadInput(format!("--mode {m}: use auto, native, generic or tc")))?,
        None => cfg.daemon.attach,
    };
    let interfaces = if interfaces.is_empty() {
        cfg.daemon.interfaces.clone()
    } else {
        interfaces
    };
    // A validated configuration lists interfaces unless it is measure-only.
    if interfaces.is_empty() {
        bail!(BadInput(format!(
            "{}: daemon.measure_only = true attaches to no interface; give --iface to attach \
             anyway, or list daemon.interfaces instead of measure_only",
            config.display()
        )));
    }
    let pins = kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    if let kernel::pins::Durability::Private(why) = &pins.durability {
        bail!(
            "the pins under {} would die when this command exits ({why}), and the programs \
             with them: run it in the host's mount namespace (e.g. `nsenter \
             --net=/var/run/netns/NAME` instead of `ip netns exec`)",
            cfg.daemon.pin_dir.display()
        );
    }
    let pin_dir = &pins.path;
    // Modes first: a refusal leaves nothing loaded or pinned.
    let modes = interfaces
        .iter()
        .map(|iface| shedder::daemon::delivering_mode(&cfg, iface, mode))
        .collect::<Result<Vec<_>>>()?;
    let mut shedder = Shedder::load_pinned(pin_dir, false).context("loading the eBPF programs")?;
    let hz = shedder
        .calibrate_hz(Duration::from_millis(100))
        .context("reading the kernel clock")?;
    shedder
        .apply(&compile(&cfg, hz))
        .context("writing the policy into the maps")?;
    // The fallback limits bound connections in service: without tracking they would bound
    // only attempts not yet established.
    let missing = shedder
        .attach_tracking()
        .context("attaching the connection-tracking tracepoints")?;
    if let Some(note) = kernel::missing_tracepoints_note(&missing) {
        tracing::warn!("{note}");
    }
    // Its warning is logged (and there is no status to show it in).
    let _ = kernel::seed::seed_and_report(&mut shedder, &cfg);
    for (iface, mode) in interfaces.iter().zip(modes) {
        if pin_dir.join("links").join(iface).exists() {
            println!("{iface}: already attached (pinned link kept; policy updated)");
            continue;
        }
        let how = shedder
            .attach(iface, mode)
            .with_context(|| format!("attaching to {iface} ({})", mode.as_str()))?;
        println!("{iface}: attached ({})", how.as_str());
    }
    println!(
        "{} service(s) protected; policy pinned under {}",
        cfg.services.len(),
        pins.describe()
    );
    println!("no daemon is stamping the heartbeat, so each service's fallback_limit is in force");
    Ok(())
}

fn counters(config: PathBuf, json: bool) -> Result<()> {
    let cfg = load_config(&config)?;
    let pins = kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    let pin_dir = &pins.path;
    if !pin_dir.join("maps").exists() {
        bail!("nothing is attached: no maps under {}", pins.describe());
    }
    let shedder = kernel::PinnedMaps::open(pin_dir).context("opening the pinned maps")?;
    // Decisions (unique attempts), then retransmitted SYNs and retries per class; each row
    // names its counter as the metric does (`shedder_<counter>_total`).
    let mut rows = Vec::new();
    // (service, class, retransmits, retries), where either is not zero.
    let mut retry_rows = Vec::new();
    for (id, svc) in cfg.services.iter().enumerate() {
        let counters = shedder.service_counters(id as u32)?;
        let (decisions, retransmits, retries) =
            (counters.n, counters.retransmits, counters.retries);
        for class in 0..NUM_CLASSES as u32 {
            for verdict in 0..NUM_VERDICTS {
                for reason in 0..NUM_REASONS {
                    let n = decisions[decision_index(class, verdict, reason) as usize];
                    if n > 0 {
                        rows.push(serde_json::json!({
                            "service": svc.name,
                            "counter": "connection_attempts",
                            "class": CLASS_NAMES[class as usize],
                            "verdict": VERDICT_NAMES[verdict as usize],
                            "reason": REASON_NAMES[reason as usize],
                            "count": n,
                        }));
                    }
                }
            }
        }
        for (class, name) in CLASS_NAMES.iter().enumerate() {
            if retransmits[class] > 0 || retries[class] > 0 {
                retry_rows.push((&svc.name, *name, retransmits[class], retries[class]));
            }
        }
    }
    if json {
        for &(service, class, retransmits, retries) in &retry_rows {
            for (counter, n) in [("syn_retransmits", retransmits), ("retries", retries)] {
                if n > 0 {
                    rows.push(serde_json::json!({
                        "service": service,
                        "counter": counter,
                        "class": class,
                        "count": n,
                    }));
                }
            }
        }
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<20} {:<10} {:<8} {:<14} {:>12}",
        "SERVICE", "CLASS", "VERDICT", "REASON", "COUNT"
    );
    for r in rows {
        println!(
            "{:<20} {:<10} {:<8} {:<14} {:>12}",
            r["service"].as_str().unwrap_or(""),
            r["class"].as_str().unwrap_or(""),
            r["verdict"].as_str().unwrap_or(""),
            r["reason"].as_str().unwrap_or(""),
            r["count"].as_u64().unwrap_or(0)
        );
    }
    // Retransmits are not attempts (not in the table above); retries are, and are also
    // counted here by the class they had before demotion.
    println!();
    println!(
        "{:<20} {:<10} {:>12} {:>12}",
        "SERVICE", "CLASS", "RETRANSMITS", "RETRIES"
    );
    for (service, class, retransmits, retries) in retry_rows {
        println!("{service:<20} {class:<10} {retransmits:>12} {retries:>12}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command path, e.g. `["policy", "apply"]`.
    fn paths(cmd: &clap::Command, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(prefix.clone());
        for sub in cmd.get_subcommands() {
            let mut p = prefix.clone();
            p.push(sub.get_name().to_string());
            paths(sub, p, out);
        }
    }

    /// The help of every verb, as an operator reads it, must match `golden/help.txt`.
    #[test]
    fn help_texts_match_the_golden_file() {
        let mut all = Vec::new();
        paths(&Cli::command(), Vec::new(), &mut all);
        let mut text = String::new();
        for p in all {
            let mut argv = vec!["shedder".to_string()];
            argv.extend(p.iter().cloned());
            argv.push("--help".into());
            let err = match Cli::command().term_width(100).try_get_matches_from(&argv) {
                Err(e) => e,
                Ok(_) => panic!("{argv:?} did not print help"),
            };
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{argv:?}");
            text.push_str(&format!("==> {}\n{}\n", argv.join(" "), err.render()));
        }
        golden::check("help.txt", &text);
    }

    #[test]
    fn every_verb_that_talks_to_the_daemon_documents_the_exit_codes() {
        let help = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/golden/help.txt"))
            .unwrap();
        for section in help.split("==> ").skip(1) {
            let head = section.lines().next().unwrap();
            let has_subcommands = section.contains("\nCommands:");
            assert!(
                has_subcommands || section.contains("3  no daemon answers"),
                "`{head}` does not list the exit codes"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .contains("the unit must be s, m or h")
        );
        assert!(parse_duration("m").unwrap_err().contains("use a number"));
    }

    #[test]
    fn exit_codes() {
        let api = |status| {
            anyhow::Error::new(ClientError::Api(shedder::api::control::ApiError::new(
                status, "x",
            )))
        };
        assert_eq!(exit_code(&anyhow::Error::new(BadInput("x".into()))), 2);
        assert_eq!(exit_code(&api(400)), 2);
        assert_eq!(exit_code(&api(404)), 2);
        assert_eq!(exit_code(&api(500)), 1);
        assert_eq!(exit_code(&ClientError::NotRunning("x".into()).into()), 3);
        assert_eq!(exit_code(&ClientError::Denied("x".into()).into()), 4);
        assert_eq!(exit_code(&anyhow::anyhow!("kernel said no")), 1);
    }
}
