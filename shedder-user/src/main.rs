//! The `shedder` command.
//!
//! Exit codes: 0 success; 1 the operation failed (kernel, permissions, I/O); 2 bad input
//! (command line or configuration) — nothing was changed.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use shedder::{
    BadInput,
    config::{Attach, Config},
    ebpf::{self, AttachMode, MapReader, Shedder},
    policy::compile,
};
use shedder_common::{
    CLASS_NAMES, NUM_CLASSES, NUM_REASONS, NUM_VERDICTS, REASON_NAMES, VERDICT_NAMES,
};

#[derive(Parser)]
#[command(
    name = "shedder",
    version,
    about = "Kernel-edge load shedder: refuses new TCP connections per service and class with XDP/TC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: attach (or adopt what is pinned), then every tick measure each
    /// service, run its controller, write the limits and stamp the heartbeat. SIGHUP reloads
    /// the configuration; SIGTERM stops (and detaches unless told otherwise).
    Run {
        /// Configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// On SIGTERM leave the programs attached (the fallback limits take over after the
        /// heartbeat timeout), whatever daemon.detach_on_exit says.
        #[arg(long)]
        keep_attached: bool,
    },
    /// Load the programs, write the configured policy, attach to the interfaces and pin
    /// everything under the pin directory, then exit. Without the daemon the fallback
    /// limits are in force.
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
    /// Detach from every interface and remove the pinned maps.
    Detach {
        /// Pin directory (default: /sys/fs/bpf/shedder).
        #[arg(long, default_value = ebpf::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Show the decision counters of the attached programs.
    Counters {
        /// Configuration file (for service names).
        #[arg(long, short)]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Policy files.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Check a configuration file; prints the first problem and exits 2 if there is one.
    Validate { file: PathBuf },
}

fn load_config(path: &std::path::Path) -> Result<Config> {
    Config::load(path).map_err(|e| BadInput(e.to_string()).into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shedder: {e:#}");
            if e.downcast_ref::<BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run {
            config,
            keep_attached,
        } => {
            init_logging();
            shedder::daemon::run(shedder::daemon::Options {
                config,
                keep_attached,
            })
        }
        Command::Attach {
            config,
            interfaces,
            mode,
        } => attach(config, interfaces, mode),
        Command::Detach { pin_dir } => {
            let detached = ebpf::unpin_all(&pin_dir)
                .with_context(|| format!("removing pins under {}", pin_dir.display()))?;
            if detached.is_empty() {
                println!(
                    "nothing was attached (no links under {})",
                    pin_dir.display()
                );
            } else {
                println!("detached from {}", detached.join(", "));
            }
            Ok(())
        }
        Command::Counters { config, json } => counters(config, json),
        Command::Policy {
            command: PolicyCommand::Validate { file },
        } => {
            let cfg = load_config(&file)?;
            println!(
                "{}: ok ({} services, {} interfaces)",
                file.display(),
                cfg.services.len(),
                cfg.daemon.interfaces.len()
            );
            Ok(())
        }
    }
}

/// Structured logs on stderr; `RUST_LOG` filters (default `info`), `SHEDDER_LOG=json`
/// switches to one JSON object per line.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
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
    let cfg = load_config(&config)?;
    let mode = match mode.as_deref() {
        Some(m) => AttachMode::parse(m)
            .ok_or_else(|| BadInput(format!("--mode {m}: use auto, native, generic or tc")))?,
        None => match cfg.daemon.attach {
            Attach::Auto => AttachMode::Auto,
            Attach::Native => AttachMode::Native,
            Attach::Generic => AttachMode::Generic,
            Attach::Tc => AttachMode::Tc,
        },
    };
    let interfaces = if interfaces.is_empty() {
        cfg.daemon.interfaces.clone()
    } else {
        interfaces
    };
    if interfaces.is_empty() {
        bail!(BadInput(
            "no interface: give --iface or set daemon.interfaces in the configuration".into()
        ));
    }
    shedder::sysfs::ensure_bpffs().context("mounting bpffs")?;
    let pin_dir = &cfg.daemon.pin_dir;
    let mut shedder = Shedder::load_pinned(pin_dir).context("loading the eBPF programs")?;
    let hz = shedder
        .calibrate_hz(std::time::Duration::from_millis(100))
        .context("reading the kernel clock")?;
    shedder
        .apply(&compile(&cfg, hz))
        .context("writing the policy into the maps")?;
    for iface in &interfaces {
        if pin_dir.join("links").join(iface).exists() {
            println!("{iface}: already attached (pinned link kept; policy updated)");
            continue;
        }
        let how = shedder
            .attach(iface, mode)
            .with_context(|| format!("attaching to {iface}"))?;
        println!("{iface}: attached ({})", how.as_str());
    }
    println!(
        "{} service(s) protected; policy pinned under {}",
        cfg.services.len(),
        pin_dir.display()
    );
    println!("no daemon is stamping the heartbeat, so each service's fallback_limit is in force");
    Ok(())
}

fn counters(config: PathBuf, json: bool) -> Result<()> {
    let cfg = load_config(&config)?;
    let pin_dir = &cfg.daemon.pin_dir;
    if !pin_dir.join("maps").exists() {
        bail!(
            "nothing is attached: no maps under {}",
            pin_dir.join("maps").display()
        );
    }
    let shedder = ebpf::PinnedMaps::open(pin_dir).context("opening the pinned maps")?;
    let mut rows = Vec::new();
    for (id, svc) in cfg.services.iter().enumerate() {
        for class in 0..NUM_CLASSES as u32 {
            for verdict in 0..NUM_VERDICTS {
                for reason in 0..NUM_REASONS {
                    let n = shedder.counter(id as u32, class, verdict, reason)?;
                    if n > 0 {
                        rows.push((svc.name.as_str(), class, verdict, reason, n));
                    }
                }
            }
        }
    }
    if json {
        let items: Vec<String> = rows
            .iter()
            .map(|(s, c, v, r, n)| {
                format!(
                    "{{\"service\":\"{s}\",\"class\":\"{}\",\"verdict\":\"{}\",\"reason\":\"{}\",\"count\":{n}}}",
                    CLASS_NAMES[*c as usize], VERDICT_NAMES[*v as usize], REASON_NAMES[*r as usize]
                )
            })
            .collect();
        println!("[{}]", items.join(","));
        return Ok(());
    }
    println!(
        "{:<20} {:<10} {:<8} {:<14} {:>12}",
        "SERVICE", "CLASS", "VERDICT", "REASON", "COUNT"
    );
    for (s, c, v, r, n) in rows {
        println!(
            "{:<20} {:<10} {:<8} {:<14} {:>12}",
            s, CLASS_NAMES[c as usize], VERDICT_NAMES[v as usize], REASON_NAMES[r as usize], n
        );
    }
    Ok(())
}
