//! `cargo xtask fresh-check`: the README's two commands on a fresh Debian machine.
//!
//! A minimal Debian root of the host's own suite, from the host's mirror (debootstrap
//! `--variant=minbase`), plus only what a fresh machine of this kind already has
//! ([`base::FRESH_PACKAGES`]), is cached under `~/.cache/shedder/fresh-root/<suite>`. Each run
//! mounts an overlay with that root as its lower layer (so every run starts pristine and
//! the cache is never written), mounts the pseudo-filesystems into it, lends it the host's
//! Rust toolchains through a second overlay (rustup's own changes, rust-src and the like,
//! stay in the run) with an empty CARGO_HOME, carries over the host's trust store, DNS and
//! proxy settings, clones HEAD of this checkout into it and runs `cargo xtask test` and
//! `cargo xtask demo` there as root (chroot). Everything else the two commands need must
//! come from the project's own setup. Logs: `target/fresh-check/`.
//!
//! All mounts are made in a private mount namespace of this process, so none is visible
//! outside it and none outlives it; they are still unmounted at the end (also on error and
//! after Ctrl-C), and a directory is deleted only once /proc/self/mountinfo shows nothing
//! mounted under it.
//!
//! The files, each using only those above it:
//! - `signals`: Ctrl-C;
//! - `host`: the host's suite, mirror, sources, proxies and rustup;
//! - `mounts`: mounting, unmounting, deleting what nothing is mounted under;
//! - `chroot`: running things inside a root, and what it needs of the host;
//! - `base`: the cached minimal root;
//! - `run`: one run's overlay over it.

pub(crate) mod base;
pub(crate) mod chroot;
pub(crate) mod host;
pub(crate) mod mounts;
pub(crate) mod run;
pub(crate) mod signals;

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};

use crate::{
    cmd::{home, require_root, target_dir},
    setup::{self, Probe, dep},
    test::{Outcome, Record, summarize, timed},
};
use base::base_root;
use chroot::{in_root, tee};
use host::read_host;
use mounts::private_mount_namespace;
use run::{CLONE, RunRoot};
use signals::{catch_signals, interrupted};

pub(crate) const HOST_DEPS: &[setup::Dep] = &[dep(
    "debootstrap",
    Probe::Runs("debootstrap", &["--version"]),
    "debootstrap",
)];

/// How many lines of a failed step's log the summary repeats.
const TAIL_LINES: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Readme {
    Test,
    Demo,
    /// `cargo xtask setup --build-only`, then `cargo build -p shedder-user`: the build set
    /// alone is enough, and it installs none of the test set's packages.
    Build,
}

/// Packages only the tests, benchmarks and demo need: `setup --build-only` must install
/// none of them.
const TEST_ONLY_PACKAGES: &[&str] = &[
    "haproxy",
    "nginx",
    "etcd-server",
    "wrk",
    "fonts-dejavu-core",
    "nghttp2-client",
    "python3-prometheus-client",
];

impl Readme {
    fn step(self) -> &'static str {
        match self {
            Self::Test => "cargo xtask test (in the root)",
            Self::Demo => "cargo xtask demo (in the root)",
            Self::Build => "setup --build-only, cargo build (in the root)",
        }
    }

    fn script(self) -> String {
        let sub = match self {
            Self::Test => "test",
            Self::Demo => "demo",
            Self::Build => {
                return format!(
                    "cd {CLONE} && cargo xtask setup --build-only && \
                     cargo build -p shedder-user && ./target/debug/shedder --version && \
                     for p in {}; do \
                       if dpkg-query -W -f='${{Status}}' $p 2>/dev/null | grep -q 'ok installed'; then \
                         echo \"setup --build-only installed $p\"; exit 1; fi; done && \
                     echo '=== build set: built, and no test package installed'",
                    TEST_ONLY_PACKAGES.join(" ")
                );
            }
        };
        format!("cd {CLONE} && exec cargo xtask {sub}")
    }

    fn log(self) -> &'static str {
        match self {
            Self::Test => "test.log",
            Self::Demo => "demo.log",
            Self::Build => "build.log",
        }
    }
    /// The line that starts the command's own summary in its output.
    fn summary_marker(self) -> &'static str {
        match self {
            Self::Test => "=== summary",
            Self::Demo => "== Summary",
            Self::Build => "=== build set",
        }
    }
}

#[derive(Debug, Args)]
pub struct FreshArgs {
    /// Build the cached Debian root again, even if the cached one matches.
    #[arg(long)]
    rebuild: bool,
    /// Which of the README's commands to run, in order.
    #[arg(long, value_delimiter = ',', default_values = ["test", "demo"])]
    only: Vec<Readme>,
    /// Leave this run's layer (unmounted) under ~/.cache/shedder/fresh-runs/ to inspect.
    #[arg(long)]
    keep: bool,
}

/// A log's text, whatever bytes a step wrote; empty if there is none.
fn log_text(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn tail(path: &Path, n: usize) -> String {
    let text = log_text(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The text from the last line starting with `marker` to the end, if there is one.
fn last_block<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let at = text
        .match_indices(marker)
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
        .last()?;
    Some(text[at..].trim_end())
}

fn skipped(name: &'static str) -> Record {
    Record {
        name,
        outcome: Outcome::Skipped,
        secs: 0.0,
    }
}

pub fn run_fresh_check(args: &FreshArgs) -> Result<()> {
    require_root("fresh-check (debootstrap, mounts, chroot)")?;
    let start = Instant::now();
    let logs = target_dir().join("fresh-check");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let cache = home()?.join(".cache/shedder");

    let mut records = vec![timed("debootstrap on the host", || {
        setup::ensure(HOST_DEPS)
    })];
    let mut logs_of: Vec<(&'static str, PathBuf)> = Vec::new();
    let host = if records[0].failed() {
        None
    } else {
        private_mount_namespace()?;
        catch_signals();
        Some(read_host()?)
    };

    let mut base = None;
    let base_step = "minimal Debian root (cached)";
    match &host {
        Some(host) => {
            records.push(timed(base_step, || {
                base = Some(base_root(host, &cache, args.rebuild, &logs)?);
                Ok(())
            }));
            logs_of.push((base_step, logs.join("root.log")));
        }
        None => records.push(skipped(base_step)),
    }

    let prepare_step = "the run's root (overlay, mounts, clone)";
    let cleanup_step = "unmount and delete the run's root";
    let mut run_root = None;
    match (&host, &base) {
        (Some(host), Some(base)) if !interrupted() => {
            records.push(timed(prepare_step, || {
                let r = RunRoot::new(&cache, args.keep)?;
                let r = run_root.insert(r);
                r.prepare(base, host)
            }));
        }
        _ => records.push(skipped(prepare_step)),
    }
    let ready = records
        .last()
        .is_some_and(|r| !r.failed() && run_root.is_some());
    for &which in &args.only {
        let name = which.step();
        match (&host, &run_root) {
            (Some(host), Some(r)) if ready && !interrupted() => {
                let log = logs.join(which.log());
                records.push(timed(name, || {
                    tee(in_root(&r.merged, host, &which.script()), &log, false)
                }));
                logs_of.push((name, log));
            }
            _ => records.push(skipped(name)),
        }
    }
    match run_root.as_mut() {
        Some(r) => records.push(timed(cleanup_step, || r.finish())),
        None => records.push(skipped(cleanup_step)),
    }

    for &which in &args.only {
        let text = log_text(&logs.join(which.log()));
        if let Some(block) = last_block(&text, which.summary_marker()) {
            eprintln!("\n=== {}: its own summary\n{block}", which.step());
        }
    }
    for r in &records {
        if let Some((_, log)) = logs_of.iter().find(|(n, _)| *n == r.name)
            && r.failed()
        {
            eprintln!(
                "\n=== {}: the last {TAIL_LINES} lines of {}",
                r.name,
                log.display()
            );
            eprintln!("{}", tail(log, TAIL_LINES));
        }
    }
    eprintln!(
        "\nfresh-check: {:.1} min in all; logs in {}",
        start.elapsed().as_secs_f64() / 60.0,
        logs.display()
    );
    summarize(&records)?;
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_summary_block() {
        let text = "x\n=== summary\nold\n=== setup\n=== summary\nbuild ok\nall steps passed\n";
        assert_eq!(
            last_block(text, "=== summary"),
            Some("=== summary\nbuild ok\nall steps passed")
        );
        assert_eq!(last_block("a === summary\n", "=== summary"), None);
        assert_eq!(last_block("", "== Summary"), None);
    }
}
