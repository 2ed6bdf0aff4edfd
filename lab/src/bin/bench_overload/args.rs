//! The benchmark's command line.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "shedder against no protection, nftables, HAProxy and in-app shedding, \
                   under the same open-loop overload"
)]
pub struct Args {
    /// Where to write benchmarks.md, benchmarks/overload.json and benchmarks/*.png
    /// (`--out docs` refreshes the committed report).
    #[arg(long, default_value = "target/overload")]
    pub out: PathBuf,
    /// Seconds per step of the offered-load ladder.
    #[arg(long, default_value_t = 6)]
    pub step_secs: u64,
    /// Only these systems (comma-separated keys: none, nft-1x, nft-1.5x, haproxy, in-app,
    /// nginx-limit-conn, nginx-limit-req, shedder-drop, shedder-rst); each backend runs those
    /// that fit it (in-app on the line backends, nginx's limiters on the TLS one).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Only these backends (comma-separated keys: io, cpu, tls).
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<String>,
}

/// The items of `all` named by `keys` (all of them when none is given).
pub fn pick<T: Copy>(
    keys: &[String],
    all: &[T],
    key: fn(&T) -> &'static str,
    flag: &str,
) -> Result<Vec<T>> {
    if keys.is_empty() {
        return Ok(all.to_vec());
    }
    keys.iter()
        .map(|k| {
            all.iter().copied().find(|s| key(s) == k).with_context(|| {
                let known: Vec<&str> = all.iter().map(key).collect();
                format!("{flag}: unknown {k:?}; known: {}", known.join(", "))
            })
        })
        .collect()
}
