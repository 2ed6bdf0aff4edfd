//! shedder's development tasks: `cargo xtask <command>` (alias in .cargo/config.toml).
//!
//! xtask depends on nothing that builds the eBPF object, so it builds and runs on a fresh
//! machine and installs what that build needs.
//!
//! xtask's own messages go to stderr; stdout is left to the commands it runs (so
//! `cargo xtask bench xdp > bench.md` keeps just the benchmark's Markdown).

mod bench;
mod cmd;
mod dist;
mod fresh;
mod setup;
mod test;
mod upgrade;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "shedder's development tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check each dependency by using it as the build and tests do, and install only what
    /// fails: the pinned nightly with rust-src, bpf-linker on its LLVM, the Debian packages
    /// behind failing checks (xtask/src/setup.rs BUILD_DEPS, TEST_DEPS), promtool; mount
    /// bpffs. Idempotent.
    Setup {
        /// Only what building the `shedder` binary needs (the nightly, rust-src,
        /// bpf-linker, protoc): no test tools, servers or fonts.
        #[arg(long)]
        build_only: bool,
    },
    /// Setup, then build, unit tests, root-only integration tests, clippy (host crates and
    /// the eBPF crate) and rustfmt, with a summary. Non-zero exit if any step fails.
    Test,
    /// Setup, then shedder under a 0.5x -> 3x -> 0.5x overload ramp in namespaces it makes,
    /// then the same ramp unprotected, with a live table and a summary. Root only; about
    /// two minutes; Ctrl-C removes everything it made.
    Demo(bench::PassThrough),
    /// Setup, then run a benchmark.
    Bench {
        #[command(subcommand)]
        bench: bench::Bench,
    },
    /// Setup, then boot older kernels (Debian's 5.10, 6.1 and 6.12 packages) under qemu with an
    /// initramfs holding the kernel tests, run the fixture table and the network-namespace
    /// tests in each VM and natively on the host's kernel, with a table per kernel. Logs in
    /// target/vm/.
    VmTest(vm::VmTestArgs),
    /// Prove that a fresh Debian machine passes `cargo xtask test` and `cargo xtask demo`
    /// with no manual step: a cached minimal Debian root (debootstrap) under a fresh overlay
    /// per run, HEAD of this checkout cloned into it, both commands run there (chroot).
    /// Root only; not part of `cargo xtask test`. Logs in target/fresh-check/.
    FreshCheck(fresh::FreshArgs),
    /// Build the release artefacts into target/dist/ (after `setup --build-only`): a
    /// Debian package (binary, systemd unit, conffile, dashboards, completions, manual
    /// pages), a static (musl) binary tarball, and SHA256SUMS. `--check` then installs the
    /// package in a fresh Debian root and uses it there (root only).
    Dist(dist::DistArgs),
    /// Setup, then an upgrade and a rollback under load: an older revision's daemon (built
    /// from this repository's history under target/upgrade/) protects a service at its
    /// limit, this checkout's daemon takes over its pins, then the older one again, with
    /// probes at the limit throughout (tests/tests/upgrade.rs). Root only; not part of
    /// `cargo xtask test` (building the older version takes minutes).
    UpgradeCheck(upgrade::UpgradeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = cmd::cargo_bin_on_path().and_then(|()| match &cli.command {
        Command::Setup { build_only } => setup::run_scope(if *build_only {
            setup::Scope::Build
        } else {
            setup::Scope::All
        }),
        Command::Test => test::run_all(),
        Command::Demo(args) => bench::run_demo(args),
        Command::Bench { bench } => bench::run_bench(bench),
        Command::VmTest(args) => vm::run_vm_test(args),
        Command::FreshCheck(args) => fresh::run_fresh_check(args),
        Command::Dist(args) => dist::run_dist(args),
        Command::UpgradeCheck(args) => upgrade::run_upgrade_check(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
