//! `cargo xtask bench <name>`: set-up, then one of the benchmark binaries of shedder-lab
//! (`lab/src/bin/bench_<name>`), in release mode, with any further arguments passed on.

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::{
    cmd::{cmd, root, run},
    setup,
};

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Per-packet cost of the XDP program on each path (BPF_PROG_TEST_RUN), as a ratio to
    /// an empty XDP program measured in the same run, and of the TC egress program beside an
    /// empty TC classifier. Root only.
    Xdp(PassThrough),
    /// Cost of the tracking tracepoint programs per event (kernel BPF stats) and the CPU of
    /// one signal-reading tick at 1, 10 and 100 services. Root only.
    Signals(PassThrough),
    /// The overload knee side by side with no protection, nftables, HAProxy, in-app
    /// shedding and nginx's limiters, on an I/O-bound, a CPU-bound and a TLS (nginx)
    /// backend: goodput, p99, CRITICAL success, cost per rejection, retries, a 2× slow-down
    /// and recovery, and h2load as a second generator. Writes a Markdown report, JSON and
    /// PNG plots to --out (default target/overload; `-- --out docs` refreshes
    /// docs/benchmarks.md). Root only; about 23 minutes (`-- --backends tls` alone: 6).
    Overload(PassThrough),
    /// Forged SYNs as fast as one thread sends them, in the default class's space and in
    /// HIGH's and CRITICAL's prefixes, beside clients of every class at 75% of capacity:
    /// their success with the kernel alone, with shedder and without the flood; then 3×
    /// overload during a flood. Root only; about 4 minutes.
    Flood(PassThrough),
    /// Load over keep-alive connections through haproxy in HTTP mode, recall off and on:
    /// HIGH's wrk clients beside SHEDDABLE's wrk (HTTP/1.1) or h2load (HTTP/2) clients;
    /// goodput within the deadline, HIGH's success, what was recalled. Root only; about 5
    /// minutes.
    Recall(PassThrough),
}

#[derive(Debug, Args)]
pub struct PassThrough {
    /// Arguments for the benchmark binary; `cargo xtask bench <name> -- --help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Bench {
    /// The binary in shedder-lab, and its arguments.
    fn target(&self) -> (&'static str, &[String]) {
        match self {
            Self::Xdp(p) => ("bench_xdp", &p.args),
            Self::Signals(p) => ("bench_signals", &p.args),
            Self::Overload(p) => ("bench_overload", &p.args),
            Self::Flood(p) => ("bench_flood", &p.args),
            Self::Recall(p) => ("bench_recall", &p.args),
        }
    }
}

pub fn run_bench(bench: &Bench) -> Result<()> {
    let (bin, args) = bench.target();
    run_release_bin(bin, args)
}

/// `cargo xtask demo`.
pub fn run_demo(args: &PassThrough) -> Result<()> {
    run_release_bin("demo", &args.args)
}

/// Setup, build the `shedder` binary (benchmarks and the demo run the real daemon), then
/// run a binary of shedder-lab in release mode.
fn run_release_bin(bin: &str, args: &[String]) -> Result<()> {
    setup::run_all()?;
    let manifest = root().join("Cargo.toml");
    run(cmd(
        "cargo",
        [
            "build",
            "--release",
            "-p",
            "shedder-user",
            "--bin",
            "shedder",
            // In the same build, so the two share one feature set and the library is
            // compiled once.
            "-p",
            "shedder-lab",
            "--bin",
            bin,
        ],
    )
    .arg("--manifest-path")
    .arg(&manifest))?;
    let mut c = cmd(
        "cargo",
        ["run", "--release", "-p", "shedder-lab", "--bin", bin],
    );
    c.arg("--manifest-path").arg(manifest).arg("--").args(args);
    // Keep the caller's directory, so relative paths among the arguments (--json FILE)
    // mean what they meant where `cargo xtask` was typed.
    c.current_dir(std::env::current_dir()?);
    run(&mut c)
}
