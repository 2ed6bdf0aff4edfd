//! `cargo xtask test`: set-up, build, unit tests, the root-only integration tests, clippy on
//! the host crates and on the eBPF crate for its target, and rustfmt; then a summary.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::{
    cmd::{cargo, is_root, run},
    setup,
};

/// One step of the run. A failed `required` step skips every later step (nothing else can
/// work without the build); other failures are recorded and the run goes on.
struct Step {
    name: &'static str,
    required: bool,
    run: fn() -> Result<()>,
}

/// The eBPF crate only builds for bpfel-unknown-none (through shedder-user/build.rs), so the
/// host-side workspace commands leave it out.
const HOST: [&str; 3] = ["--workspace", "--exclude", "shedder-ebpf"];

fn cargo_host(subcommand: &str, extra: &[&str]) -> Result<()> {
    let args = std::iter::once(subcommand)
        .chain(HOST)
        .chain(extra.iter().copied());
    run(&mut cargo(args))
}

const STEPS: &[Step] = &[
    Step {
        name: "build (with the eBPF object)",
        required: true,
        run: || cargo_host("build", &[]),
    },
    Step {
        name: "unit tests",
        required: false,
        run: || cargo_host("test", &["--lib", "--bins"]),
    },
    Step {
        name: "integration tests (root)",
        required: false,
        run: || {
            if !is_root() {
                bail!(
                    "the integration tests need root (they load BPF programs and create \
                     network namespaces): run `cargo xtask test` as root"
                );
            }
            remove_stale_namespaces();
            // The debug profile reuses the build step's artifacts (the eBPF object is
            // always built in release); a release build here would compile everything again.
            run(&mut cargo([
                "test",
                "-p",
                "shedder-tests",
                "--tests",
                "--",
                "--test-threads=1",
            ]))
        },
    },
    Step {
        name: "clippy (host crates)",
        required: false,
        run: || cargo_host("clippy", &["--all-targets", "--", "-D", "warnings"]),
    },
    Step {
        name: "clippy (eBPF crate, bpfel-unknown-none)",
        required: false,
        run: || {
            run(&mut cargo([
                &setup::ebpf_plus(),
                "clippy",
                "-p",
                "shedder-ebpf",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--release",
                "--",
                "-D",
                "warnings",
            ]))
        },
    },
    Step {
        name: "rustfmt",
        required: false,
        run: || run(&mut cargo(["fmt", "--all", "--", "--check"])),
    },
];

/// Test namespaces are named `shd-<tag>-<pid>-<n>` and removed by the test that made them,
/// also on panic; a test process killed outright (SIGKILL, a timeout) cannot. Remove the
/// ones whose process is gone, so they cannot disturb this run.
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("shd-") else {
            continue;
        };
        let pid = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            eprintln!("xtask: removing network namespace {name} left by a killed test run");
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &name])
                .status();
        }
    }
}

pub(crate) enum Outcome {
    Ok,
    Failed(String),
    Skipped,
}

/// A step's result, for the summary.
pub(crate) struct Record {
    pub name: &'static str,
    pub outcome: Outcome,
    pub secs: f64,
}

impl Record {
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_))
    }
}

/// Run one step under a heading, timing it.
pub(crate) fn timed(name: &'static str, f: impl FnOnce() -> Result<()>) -> Record {
    eprintln!("\n=== {name}");
    let start = Instant::now();
    let outcome = match f() {
        Ok(()) => Outcome::Ok,
        Err(e) => {
            eprintln!("xtask: {name} failed: {e:#}");
            Outcome::Failed(format!("{e:#}"))
        }
    };
    Record {
        name,
        outcome,
        secs: start.elapsed().as_secs_f64(),
    }
}

pub fn run_all() -> Result<()> {
    let mut records = vec![timed("setup", setup::run_all)];
    let mut blocked = records[0].failed();
    for step in STEPS {
        if blocked {
            records.push(Record {
                name: step.name,
                outcome: Outcome::Skipped,
                secs: 0.0,
            });
            continue;
        }
        let record = timed(step.name, step.run);
        blocked = step.required && record.failed();
        records.push(record);
    }

    summarize(&records)
}

/// Print each step's state and duration; an error naming the steps that did not pass.
pub(crate) fn summarize(records: &[Record]) -> Result<()> {
    eprintln!("\n=== summary");
    let width = records.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in records {
        let (state, detail) = match &r.outcome {
            Outcome::Ok => ("ok", ""),
            Outcome::Failed(why) => ("FAILED", why.lines().next().unwrap_or("")),
            Outcome::Skipped => ("skipped", ""),
        };
        let line = format!("{:<width$}  {state:<7} {:>7.1} s  {detail}", r.name, r.secs);
        eprintln!("{}", line.trim_end());
    }
    let failed: Vec<&str> = records
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Ok))
        .map(|r| r.name)
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} step(s) did not pass: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    eprintln!("all steps passed");
    Ok(())
}
