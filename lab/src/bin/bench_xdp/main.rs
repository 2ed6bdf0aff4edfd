//! `cargo xtask bench xdp`: the per-packet cost of shedder's XDP program on each of its
//! paths, measured with BPF_PROG_TEST_RUN beside an empty XDP program in the same run, and
//! reported as Markdown (the ratios are what the targets are about).
//!
//! Method. Most paths leave the frame as it was, so one BPF_PROG_TEST_RUN call with a large
//! repeat runs the program many times on the same frame; the kernel reports the mean time
//! per run (whole nanoseconds). Rounds interleave every program and path, and the median
//! of the rounds is reported. The RST path rewrites the frame into its RST|ACK, so with a
//! repeat > 1 every run after the first would see that RST instead of a SYN: it is measured
//! with repeat = 1 over many calls (median of the per-call times), beside the empty program
//! measured the same way, and its ratio is to that single-shot baseline. A single-shot
//! time includes the kernel's fixed per-call timing overhead, which both sides share.
//!
//! Every measured call is checked to return the action its path claims, the frame each
//! path leaves is compared with the expected one, and afterwards the decision counters must
//! show exactly the runs made (admissions for SYN-admit, drops for SYN-drop, resets for
//! SYN-RST, none at all for the paths that take no decision).
//!
//! Proof (see docs/design.md, *Proof of a handshake*): every row but the floods sends from
//! a source with standing, given 255 tokens before each call (an admission spends one, and
//! no handshake completes here to earn it back), so those rows run 255 times a call (their
//! per-run mean rounds down to whole ns over fewer runs than the baselines'); the flood
//! rows' sources have none, as forged sources have not, and take the unproven path.
//!
//! TC egress. The egress program (a TC classifier, which every segment a host sends
//! passes) is measured the same way beside an empty TC classifier, with skb test runs
//! (repeated: it leaves every frame as it was). Its rows are reported in a table of their
//! own, without targets: a server segment of an unprotected port, a response of a
//! protected port on a connection that is not tracked and on one that is (made beforehand
//! through its handshake: the SYN-ACK through the egress program, the client's ACK through
//! the XDP program), and a SYN-ACK. Each is checked to return TCX_NEXT and leave its frame
//! unchanged, and afterwards the tracking must be as the row claims.
//!
//! One connection. Every frame of a whole request/response connection, through the ingress
//! and egress programs and through the empty ones, once each, so that what shedder adds to
//! a connection is stated per connection, as its cost targets are (see `connection`).
//!
//! Layout: `args` (the command line), `programs` (the programs and how one is run), `paths`
//! and `egress` (the rows of each program, with their frames), `measure` (the rounds),
//! `report` (the figures against their baselines), `markdown` (the tables), `connection`
//! (one whole connection); this file runs them in order.

mod args;
mod connection;
mod egress;
mod markdown;
mod measure;
mod paths;
mod programs;
mod report;

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail, ensure};
use args::Args;
use clap::Parser;
use markdown::markdown;
use measure::measure;
use report::{Report, estimate_rst, rows};
use shedder::kernel::Shedder;
use shedder_lab::machine::machine;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("bench_xdp: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// True if every target is met.
fn run() -> Result<bool> {
    let args = Args::parse();
    ensure!(
        args.repeat > 0 && args.rounds > 0,
        "--repeat and --rounds must be positive"
    );
    if !shedder_lab::is_root() {
        bail!(
            "needs root (it loads BPF programs and runs them with BPF_PROG_TEST_RUN): \
             run `cargo xtask bench xdp` as root"
        );
    }
    let machine = machine();
    eprintln!(
        "bench_xdp: repeat {} × {} rounds, {} single-shot calls",
        args.repeat, args.rounds, args.single_calls
    );
    let insns = |s: Shedder| -> Vec<(String, Option<u32>)> {
        s.verified_insns()
            .into_iter()
            .map(|(name, n)| (name.to_string(), n))
            .collect()
    };
    let verified_insns = insns(Shedder::load().context("loading shedder")?);
    let verified_insns_logging = insns(
        Shedder::load_with_kernel_log().context("loading shedder with the kernel debug log")?,
    )
    .into_iter()
    .filter(|(name, _)| name == "shedder_xdp" || name == "shedder_tc")
    .collect();
    let subjects = measure(&args)?;
    let rows = rows(&subjects);
    let connection = connection::measure(args.connection_rounds, args.connections)?;
    let report = Report {
        verified_insns,
        verified_insns_logging,
        machine,
        repeat: args.repeat,
        rounds: args.rounds,
        single_calls: args.single_calls,
        rst_estimate: estimate_rst(&rows),
        rows,
        connection,
    };
    print!("{}", markdown(&report));
    print!("{}", connection::markdown(&report.connection));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench_xdp: figures written to {}", path.display());
    }
    let failed = report.rows.iter().filter(|r| r.pass == Some(false)).count()
        + report.connection.ports.iter().filter(|p| !p.pass).count();
    if failed > 0 {
        eprintln!("bench_xdp: {failed} target(s) missed");
    }
    Ok(failed == 0)
}
