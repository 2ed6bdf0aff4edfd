//! The `shedder` command line: the verbs and their arguments here, each verb's work in a
//! file of its own.

mod attach;
mod completions;
mod counters;
mod detach;
mod doctor;
mod limit;
mod manpage;
mod mode;
mod paths;
mod policy;
mod status;

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use shedder::{
    BadInput,
    api::control::{Client, ClientError},
    config::Attach,
    kernel::{self},
};

/// The golden-file check, shared with the library's tests (test builds only).
#[cfg(test)]
#[path = "../golden.rs"]
mod golden;

const EXIT_CODES: &str = "Exit codes:
  0  success
  1  the operation failed (kernel, I/O, the daemon answered with an error)
  2  bad input: command line, configuration or policy; nothing was changed
  3  no daemon answers on the control socket
  4  permission denied (the control socket is for root and daemon.control_group)";

/// The top level's help: the exit codes, then where the files are.
const EXIT_CODES_AND_ENVIRONMENT: &str = "Exit codes:
  0  success
  1  the operation failed (kernel, I/O, the daemon answered with an error)
  2  bad input: command line, configuration or policy; nothing was changed
  3  no daemon answers on the control socket
  4  permission denied (the control socket is for root and daemon.control_group)

Environment (a flag wins over the environment, which wins over the default):
  SHEDDER_CONFIG  the configuration (default /etc/shedder/shedder.toml)
  SHEDDER_SOCKET  the control socket (else daemon.control_socket of the configuration,
                  else /run/shedder/shedder.sock)
  RUST_LOG        the daemon's log filter (default info); SHEDDER_LOG=json logs JSON";

#[derive(Parser)]
#[command(
    name = "shedder",
    version,
    about = "Kernel-edge load shedder: refuses new TCP connections and QUIC Initials per \
             service and class with XDP/TC",
    after_help = EXIT_CODES_AND_ENVIRONMENT
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the daemon's control socket is.
#[derive(Args, Clone)]
struct Target {
    /// The control socket [default: $SHEDDER_SOCKET, else daemon.control_socket of the
    /// configuration, else /run/shedder/shedder.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The configuration to read daemon.control_socket from [default: $SHEDDER_CONFIG, else
    /// /etc/shedder/shedder.toml if it exists].
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl Target {
    fn client(&self) -> Result<Client> {
        let socket = paths::socket(
            self.socket.as_deref(),
            self.config.as_deref(),
            &paths::process_env,
        )?;
        Ok(Client::new(socket))
    }
}

/// Which services a read verb shows.
#[derive(Args, Clone, Default)]
struct Services {
    /// Only this service (repeat for more); an unknown name is bad input.
    #[arg(long = "service", short = 's', value_name = "NAME")]
    names: Vec<String>,
}

impl Services {
    /// Whether `name` is shown.
    fn shows(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.iter().any(|n| n == name)
    }

    /// Refuse a name that is none of `known`, naming those there are.
    fn check<'a>(&self, known: impl IntoIterator<Item = &'a str> + Clone) -> Result<()> {
        for n in &self.names {
            if !known.clone().into_iter().any(|k| k == n) {
                let known: Vec<&str> = known.into_iter().collect();
                return Err(BadInput(format!(
                    "--service {n}: no such service (there are: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ))
                .into());
            }
        }
        Ok(())
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
        /// Configuration file [default: $SHEDDER_CONFIG, else /etc/shedder/shedder.toml].
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
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
        #[command(flatten)]
        services: Services,
        /// Print the daemon's state as JSON.
        #[arg(long)]
        json: bool,
    },
    /// `status`, refreshed every second in the terminal (Ctrl-C quits).
    #[command(after_help = EXIT_CODES)]
    Top {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        services: Services,
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
    /// Switch a service to enforce, dry-run or off at run time, or clear the switch.
    ///
    /// dry-run decides and counts what would be refused but refuses nothing; off passes
    /// everything, counted as passed. The switch holds through SIGHUP and `policy apply`
    /// (it wins over the file's `mode`) until `clear`, its --ttl, or the daemon's stop; it
    /// is logged with who set it, and shown by status.
    #[command(after_help = EXIT_CODES)]
    Mode {
        /// The service, by its name in the configuration.
        #[arg(value_name = "SERVICE")]
        service: String,
        /// enforce, dry-run, off, or clear (back to the file's mode).
        #[arg(value_name = "MODE", value_parser = ["enforce", "dry-run", "off", "clear"])]
        mode: String,
        /// How long, e.g. 90s, 10m, 2h (default: until cleared).
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
        /// Why (recorded in the audit log and shown by status).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Check that this host can run shedder, and say how to fix what is missing.
    ///
    /// Kernel, BTF, bpffs/tracefs, capabilities, interfaces and XDP modes, cgroup v2 and
    /// PSI, the daemon. Each failing check says how to fix it.
    #[command(after_help = EXIT_CODES)]
    Doctor {
        /// Also check what this configuration needs (interfaces, cgroups, the daemon)
        /// [default: $SHEDDER_CONFIG, else /etc/shedder/shedder.toml if it exists].
        #[arg(long, short, value_name = "FILE")]
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
        /// Configuration file [default: $SHEDDER_CONFIG, else /etc/shedder/shedder.toml].
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Interfaces to attach to (default: daemon.interfaces from the configuration).
        #[arg(long = "iface", short)]
        interfaces: Vec<String>,
        /// auto (native XDP, else generic), native, generic or tc (default: daemon.attach).
        #[arg(long, value_parser = attach_mode)]
        mode: Option<Attach>,
    },
    /// The decision counters in the pinned maps (works without a daemon).
    ///
    /// Unique attempts by class, verdict and reason; then SYN retransmits (not attempts)
    /// and retries (attempts from a recently shed source, by their class before demotion).
    #[command(after_help = EXIT_CODES)]
    Counters {
        /// Configuration file, for service names and the pin directory [default:
        /// $SHEDDER_CONFIG, else /etc/shedder/shedder.toml].
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        services: Services,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (e.g. `shedder completions bash >
    /// /etc/bash_completion.d/shedder`).
    #[command(after_help = EXIT_CODES)]
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: completions::Shell,
    },
    /// Print the manual page, in roff (e.g. `shedder manpage | man -l -`).
    ///
    /// shedder(1) names a page per verb (shedder-run(1), …): --dir writes them all, to
    /// install under e.g. /usr/share/man/man1.
    #[command(after_help = EXIT_CODES)]
    Manpage {
        /// Write shedder.1 and a page per verb into this directory instead of printing
        /// shedder(1).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Check a configuration file.
    ///
    /// Prints every problem, one a line (file:line:column: field: what is wrong), and
    /// exits 2 if there is one. A TOML syntax error stops at the first.
    #[command(after_help = EXIT_CODES)]
    Validate {
        /// The configuration file to check; `-` reads standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Print the verdict as JSON (every problem with its line, column and field).
        #[arg(long)]
        json: bool,
    },
    /// Put a configuration in force in the running daemon, without detaching.
    ///
    /// The file is validated first; if it is refused, the running policy stays. It holds
    /// until the daemon restarts or gets SIGHUP, which re-read the daemon's own file.
    #[command(after_help = EXIT_CODES)]
    Apply {
        /// The configuration to put in force; `-` reads standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        target: Target,
    },
    /// The configuration in force in the running daemon.
    #[command(after_help = EXIT_CODES)]
    Show {
        #[command(flatten)]
        target: Target,
        /// Print the configuration as a JSON document (its TOML's tables and values) instead
        /// of the TOML text.
        #[arg(long)]
        json: bool,
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
        /// The service, by its name in the configuration.
        #[arg(value_name = "SERVICE")]
        service: String,
        /// The concurrency limit to hold, in connections.
        #[arg(value_name = "LIMIT")]
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
        /// The service, by its name in the configuration.
        #[arg(value_name = "SERVICE")]
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

/// `--mode`, spelled as `daemon.attach` is (the configuration's own names).
fn attach_mode(s: &str) -> Result<Attach, String> {
    use serde::Deserialize as _;
    let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s);
    Attach::deserialize(de).map_err(|_| "use auto, native, generic or tc".to_string())
}

/// `1 service`, `3 services`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// The exit code for an error.
pub fn exit_code(e: &anyhow::Error) -> u8 {
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

/// Run the command line; the exit code on success.
pub fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Run {
            config,
            keep_attached,
        } => {
            init_logging();
            shedder::daemon::run(shedder::daemon::Options {
                config: paths::required_config(config.as_deref(), &paths::process_env),
                keep_attached,
            })?;
        }
        Command::Status {
            target,
            services,
            json,
        } => status::status(&target, &services, json)?,
        Command::Top {
            target,
            services,
            interval,
            iterations,
        } => status::top(&target, &services, interval, iterations)?,
        Command::Policy { command } => return policy::run(command),
        Command::Limit { command } => limit::run(command)?,
        Command::Mode {
            service,
            mode,
            ttl,
            reason,
            target,
        } => mode::run(&service, &mode, ttl, reason, &target)?,
        Command::Doctor { config, json } => {
            let config = paths::optional_config(config.as_deref(), &paths::process_env);
            return doctor::run(config.as_deref(), json);
        }
        Command::Detach { target, pin_dir } => detach::run(&target, &pin_dir)?,
        Command::Attach {
            config,
            interfaces,
            mode,
        } => attach::run(
            paths::required_config(config.as_deref(), &paths::process_env),
            interfaces,
            mode,
        )?,
        Command::Counters {
            config,
            services,
            json,
        } => counters::run(
            &paths::required_config(config.as_deref(), &paths::process_env),
            &services,
            json,
        )?,
        Command::Completions { shell } => completions::run(shell),
        Command::Manpage { dir } => manpage::run(dir.as_deref())?,
    }
    Ok(0)
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

    /// A positional argument shows in `--help` only as its name: it must say what it is.
    #[test]
    fn every_positional_argument_is_described() {
        let mut all = Vec::new();
        paths(&Cli::command(), Vec::new(), &mut all);
        for p in all {
            let mut cmd = Cli::command();
            for name in &p {
                cmd = cmd.find_subcommand(name).unwrap().clone();
            }
            for arg in cmd.get_positionals() {
                assert!(
                    arg.get_help()
                        .is_some_and(|h| !h.to_string().trim().is_empty()),
                    "`shedder {}`: <{}> has no description",
                    p.join(" "),
                    arg.get_id()
                );
            }
        }
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
