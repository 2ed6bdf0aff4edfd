//! The benchmark's command line.

use std::path::PathBuf;

use clap::Parser;

/// Per-packet cost of shedder's XDP program by BPF_PROG_TEST_RUN, as ratios to an empty
/// XDP program measured in the same run, and of its TC egress program beside an empty TC
/// classifier. Needs root.
#[derive(Debug, Parser)]
#[command(name = "bench_xdp")]
pub struct Args {
    /// Runs per BPF_PROG_TEST_RUN call for the repeated paths (at most 255 for a source
    /// with standing: its tokens last that long).
    #[arg(long, default_value_t = 60_000)]
    pub repeat: u32,
    /// Rounds, interleaved across all programs and paths.
    #[arg(long, default_value_t = 101)]
    pub rounds: usize,
    /// Calls with repeat = 1 for each single-shot path (RST, and drop for comparison) and
    /// for their baseline.
    #[arg(long, default_value_t = 200_000)]
    pub single_calls: usize,
    /// Connections per round of the section on one whole connection.
    #[arg(long, default_value_t = 1000)]
    pub connections: u32,
    /// Rounds of that section (after one to warm up).
    #[arg(long, default_value_t = 21)]
    pub connection_rounds: usize,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}
