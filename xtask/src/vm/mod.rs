//! `cargo xtask vm-test`: the kernel-facing tests under other kernels than the host's.
//!
//! Every row of [`kernels::KERNELS`] is a Debian kernel package: downloaded once into
//! `target/vm/cache/`, unpacked into `target/vm/kernels/<release>/`, and booted under
//! `qemu-system-x86_64` (KVM when /dev/kvm works, TCG otherwise) with an initramfs written
//! here (a `newc` cpio, so no root-owned files and no `cpio` program): busybox, `/init`, the
//! modules the tests need, `ip` and `nsenter`, the test executables and `shedder` at their
//! host paths, and every shared library those load. `/init` runs [`checks::CHECKS`] one at a
//! time between `@@VM-BEGIN <name>` / `@@VM-END <name> rc=<n>` markers on the serial
//! console, which is kept in `target/vm/<release>.log`, and powers off. The host's own kernel
//! runs the same checks natively (unless `--skip-host`). A summary table follows.
//!
//! The files, each using only those above it:
//! - `cpio`: the `newc` writer;
//! - `packages`: fetching a kernel .deb (apt, or a Debian archive, verified);
//! - `modules`: the modules a kernel package needs loaded, with their dependencies;
//! - `checks`: what runs in each VM, and the results;
//! - `kernels`: the kernels booted, and preparing one (package, unpack, options, modules);
//! - `artifacts`: building the executables that run inside;
//! - `initramfs`: the image (`/init`, executables, libraries, modules);
//! - `console`: reading the serial console (markers, terminal echo);
//! - `boot`: qemu;
//! - `host`: the same checks on the host's kernel;
//! - `verifier`: the verifier figures against the committed baseline;
//! - `summary`: the tables on the terminal and in `--out`.

mod artifacts;
mod boot;
mod checks;
mod console;
mod cpio;
mod host;
mod initramfs;
mod kernels;
mod modules;
mod packages;
mod summary;
mod verifier;

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    cmd::{require_root, target_dir},
    setup,
};
use artifacts::build;
use boot::{Accel, boot_and_check};
use checks::{Outcome, Row, mark_emulated};
use host::host_row;
use initramfs::common_entries;
use kernels::{prepare_kernel, select_kernels};
use packages::KEYRING;
use summary::{report, write_docs};
use verifier::{VERIFIER_BASELINE, VERIFIER_REGRESSION, read_baseline, verifier_table};

/// Debian packages this command uses on the host: (package, program that must then exist).
const HOST_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "qemu-system-x86_64"),
    ("busybox-static", "busybox"),
    ("iproute2", "ip"),
    ("util-linux", "nsenter"),
    ("curl", "curl"),
    ("xz-utils", "xz"),
    ("gpgv", "gpgv"),
    ("debian-archive-keyring", ""),
];

#[derive(Debug, Args)]
pub struct VmTestArgs {
    /// Kernel series to boot, comma-separated (default: every row of KERNELS in
    /// xtask/src/vm/kernels.rs, i.e. 5.10,6.1,6.12).
    #[arg(long, value_delimiter = ',', value_name = "SERIES")]
    kernels: Option<Vec<String>>,
    /// Leave out the native run on the host's own kernel (which needs root).
    #[arg(long)]
    skip_host: bool,
    /// Stop a VM (and a host check) after this many seconds [default: 900 under KVM and
    /// on the host, 3600 under TCG, where the fixture table alone takes 14 to 19 minutes].
    #[arg(long, value_name = "N")]
    timeout_secs: Option<u64>,
    /// Keep the initramfs images (target/vm/initramfs/), removed after each boot otherwise.
    /// The downloaded packages and unpacked kernels are always kept.
    #[arg(long)]
    keep: bool,
    /// Also write DIR/kernels.md (the result tables) and DIR/kernels.json (the verifier
    /// figures, the next runs' baseline once committed): `--out docs`.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run only these checks, comma-separated (e.g. `verifier,netns::native_xdp`: a quick
    /// look at whether the programs still load and attach). Not with `--out`, whose tables
    /// need every check.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "CHECKS",
        conflicts_with = "out"
    )]
    only: Option<Vec<String>>,
}

pub fn run_vm_test(args: &VmTestArgs) -> Result<()> {
    if let Some(only) = &args.only {
        checks::only(only.clone())?;
    }
    let start = Instant::now();
    let kernels = select_kernels(args.kernels.as_deref())?;
    if !args.skip_host {
        require_root(
            "the host row of vm-test (the checks load BPF programs and create network \
             namespaces; pass --skip-host to leave it out)",
        )?;
    }
    setup::run_all()?;
    host_tools()?;
    let built = build()?;

    let vm_dir = target_dir().join("vm");
    let cache = vm_dir.join("cache");
    let kernels_dir = vm_dir.join("kernels");
    let images = vm_dir.join("initramfs");
    for d in [&cache, &kernels_dir, &images] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let accel = Accel::detect();
    let vm_timeout = Duration::from_secs(args.timeout_secs.unwrap_or(accel.default_timeout()));
    let host_timeout =
        Duration::from_secs(args.timeout_secs.unwrap_or(Accel::Kvm.default_timeout()));
    let common = common_entries(&built)?;

    let mut rows = Vec::new();
    for kernel in kernels {
        eprintln!("\n=== kernel {}", kernel.series);
        let row = match prepare_kernel(kernel, &cache, &kernels_dir) {
            Ok(prepared) => boot_and_check(
                &prepared, &common, &images, &vm_dir, accel, vm_timeout, args.keep,
            )?,
            Err(e) => {
                eprintln!("vm-test: kernel {}: {e:#}", kernel.series);
                Row::unavailable(kernel.series, format!("{e:#}"))
            }
        };
        rows.push(row);
    }
    if !args.skip_host {
        eprintln!("\n=== host kernel (native)");
        rows.push(host_row(&built, &vm_dir, host_timeout)?);
    }

    for row in &mut rows {
        mark_emulated(row);
    }
    let baseline = read_baseline()?;
    let verifier = verifier_table(&rows, &baseline);
    report(&rows, start.elapsed());
    eprintln!("\n{}", verifier.markdown);
    if let Some(dir) = &args.out {
        write_docs(dir, &rows, &verifier, start.elapsed())?;
    }
    let counted = rows
        .iter()
        .flat_map(|r| &r.results)
        .filter(|r| r.outcome.counted());
    let total = counted.clone().count();
    let passed = counted
        .filter(|r| matches!(r.outcome, Outcome::Pass))
        .count();
    if passed != total {
        bail!(
            "{} of {total} checks did not pass (serial logs in {})",
            total - passed,
            vm_dir.display()
        );
    }
    if !verifier.regressions.is_empty() {
        bail!(
            "verifier complexity grew more than {VERIFIER_REGRESSION}× over {VERIFIER_BASELINE}: {}",
            verifier.regressions.join("; ")
        );
    }
    eprintln!("vm-test: all {total} checks passed, no verifier regression");
    Ok(())
}

fn host_tools() -> Result<()> {
    let missing: Vec<&str> = HOST_PACKAGES
        .iter()
        .map(|&(_, program)| program)
        .filter(|p| !p.is_empty() && which::which(p).is_err())
        .collect();
    let packages: Vec<&str> = HOST_PACKAGES.iter().map(|&(p, _)| p).collect();
    if let Err(e) = setup::install_debian_packages(&packages) {
        if missing.is_empty() {
            return Err(e);
        }
        bail!(
            "{} not found and could not be installed: {e:#}",
            missing.join(", ")
        );
    }
    for &(package, program) in HOST_PACKAGES {
        if !program.is_empty() && which::which(program).is_err() {
            bail!("{program} not found although package {package} is installed");
        }
    }
    if !Path::new(KEYRING).is_file() {
        bail!("{KEYRING} is missing although debian-archive-keyring is installed");
    }
    Ok(())
}
