//! `cargo xtask dist`: the release artefacts in `target/dist/`.
//!
//! - `shedder_<version>_amd64.deb`: the release binary (glibc, the build machine's
//!   Debian) at /usr/bin/shedder, the systemd unit, `/etc/shedder/shedder.toml` as a
//!   conffile, the Grafana dashboard and Prometheus files under /usr/share/shedder/,
//!   completions for bash, zsh and fish, a manual page per verb, the copyright file
//!   (`dpkg-deb --build`; no debhelper). Installing it enables and starts nothing: the
//!   example configuration sheds on eth0 for made-up services, so the operator edits it
//!   and then enables the unit (the package says so when it is installed).
//! - `shedder-<version>-x86_64-linux-musl.tar.gz`: a static binary (musl; runs on any
//!   x86-64 Linux with kernel 5.8+, Debian 11 included), with the same files beside it.
//! - `shedder-<version>-oci.tar`: an OCI image archive (`podman build` of
//!   deploy/container/Containerfile: FROM scratch, the static binary and the example
//!   configuration), for deploy/kubernetes/shedder.yaml.
//! - `SHA256SUMS` of them.
//!
//! Only what building needs is installed first (`setup --build-only`), plus the musl C
//! toolchain (ring compiles C for the static binary). `--check` then installs the package
//! in a fresh Debian root and uses it there ([`check`]).

mod check;
mod deb;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    cmd::{cargo, cmd, run, stdout, target_dir},
    setup::{self, Probe, dep},
};

/// The static binary's target.
const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// What dist needs besides the build set: musl-gcc for ring's C in the static binary,
/// dpkg-deb, and binutils to strip and inspect the binaries.
const DIST_DEPS: &[setup::Dep] = &[
    dep(
        "musl-gcc",
        Probe::Runs("musl-gcc", &["--version"]),
        "musl-tools",
    ),
    dep("dpkg-deb", Probe::Runs("dpkg-deb", &["--version"]), "dpkg"),
    dep(
        "objdump",
        Probe::Runs("objdump", &["--version"]),
        "binutils",
    ),
    dep("podman", Probe::Runs("podman", &["--version"]), "podman"),
];

#[derive(Debug, Args)]
pub struct DistArgs {
    /// Then install the package in a fresh Debian root (the cached root of `cargo xtask
    /// fresh-check`) and use it there: --version, doctor, policy validate,
    /// systemd-analyze verify, and the daemon started with the unit's ExecStart refusing
    /// a connection over its limit between network namespaces. Root only.
    #[arg(long)]
    pub check: bool,
    /// Only run the check on the artefacts already in target/dist/.
    #[arg(long)]
    pub check_only: bool,
}

/// The files every artefact carries, from the checkout.
pub(crate) struct Inputs {
    pub version: String,
    /// target/release/shedder (glibc).
    pub glibc_bin: PathBuf,
    /// target/x86_64-unknown-linux-musl/release/shedder (static).
    pub static_bin: PathBuf,
}

pub fn run_dist(args: &DistArgs) -> Result<()> {
    let dist = target_dir().join("dist");
    if !args.check_only {
        build_all(&dist)?;
    }
    if args.check || args.check_only {
        check::run_check(&dist)?;
    }
    Ok(())
}

fn build_all(dist: &Path) -> Result<()> {
    setup::run_scope(setup::Scope::Build)?;
    setup::ensure(DIST_DEPS)?;
    let inputs = build_binaries()?;
    if dist.exists() {
        fs::remove_dir_all(dist).with_context(|| format!("emptying {}", dist.display()))?;
    }
    fs::create_dir_all(dist)?;
    let work = dist.join("work");
    let deb = deb::build(&inputs, &work, dist)?;
    let tarball = tarball(&inputs, &work, dist)?;
    let image = image(&inputs, &work, dist)?;
    fs::remove_dir_all(&work)?;
    let mut sums = cmd("sha256sum", [&deb, &tarball, &image]);
    sums.current_dir(dist);
    let sums = stdout(&mut sums)?;
    fs::write(dist.join("SHA256SUMS"), &sums)?;
    eprintln!("dist: in {}:\n{sums}", dist.display());
    Ok(())
}

/// `cargo build --release` for the host (glibc) and for musl (static).
fn build_binaries() -> Result<Inputs> {
    run(&mut cargo([
        "build",
        "--release",
        "--locked",
        "-p",
        "shedder-user",
    ]))?;
    // The static binary: ring's C compiled by musl-gcc, linked by rustc's own
    // self-contained musl (crt-static is the musl target's default).
    ensure_musl_target()?;
    run(cargo([
        "build",
        "--release",
        "--locked",
        "-p",
        "shedder-user",
        "--target",
        MUSL_TARGET,
    ])
    .env("CC_x86_64_unknown_linux_musl", "musl-gcc"))?;
    let target = target_dir();
    let glibc_bin = target.join("release/shedder");
    let static_bin = target.join(MUSL_TARGET).join("release/shedder");
    let version = stdout(Command::new(&glibc_bin).arg("--version"))?;
    let version = version
        .trim()
        .strip_prefix("shedder ")
        .with_context(|| format!("`shedder --version` says `{}`", version.trim()))?
        .to_string();
    check_static(&static_bin)?;
    Ok(Inputs {
        version,
        glibc_bin,
        static_bin,
    })
}

/// The host toolchain (rust-toolchain.toml's) with the musl standard library.
fn ensure_musl_target() -> Result<()> {
    let installed = stdout(&mut cmd("rustup", ["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == MUSL_TARGET) {
        return Ok(());
    }
    run(&mut cmd("rustup", ["target", "add", MUSL_TARGET]))
}

/// The shared libraries an ELF file asks for (its NEEDED entries).
pub(crate) fn needed(bin: &Path) -> Result<Vec<String>> {
    let out = stdout(Command::new("objdump").arg("-p").arg(bin))?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(|l| l.trim().to_string())
        .collect())
}

/// A static binary has no interpreter and needs no library.
fn check_static(bin: &Path) -> Result<()> {
    let needs = needed(bin)?;
    let headers = stdout(Command::new("objdump").arg("-p").arg(bin))?;
    if !needs.is_empty() || headers.contains("INTERP") {
        bail!(
            "{} is not static: it needs {needs:?}{}",
            bin.display(),
            if headers.contains("INTERP") {
                " and has an interpreter"
            } else {
                ""
            }
        );
    }
    eprintln!("dist: {} is static (no NEEDED, no INTERP)", bin.display());
    Ok(())
}

/// The files beside the binary, at their place under `root` (a package's root or the
/// tarball's directory), the paths given by `layout`.
pub(crate) struct Layout {
    pub bin: &'static str,
    pub unit: &'static str,
    pub config: &'static str,
    pub share: &'static str,
    pub bash: &'static str,
    pub zsh: &'static str,
    pub fish: &'static str,
    pub man1: &'static str,
    pub doc: &'static str,
}

/// Lay out the binary `bin` and the deploy/ files under `root`.
pub(crate) fn lay_out(bin: &Path, root: &Path, l: &Layout) -> Result<()> {
    let repo = crate::cmd::root();
    let put = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let dest = root.join(to);
        fs::create_dir_all(dest.parent().expect("a file under the root"))?;
        fs::copy(from, &dest)
            .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
        set_mode(&dest, mode)
    };
    put(bin, l.bin, 0o755)?;
    // Debug information is half the binary; the symbols stay for backtraces.
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg(root.join(l.bin)))?;
    put(&repo.join("deploy/shedder.service"), l.unit, 0o644)?;
    put(&repo.join("deploy/shedder.toml"), l.config, 0o644)?;
    for f in [
        "grafana/shedder.json",
        "prometheus/alerts.yml",
        "prometheus/scrape.yml",
    ] {
        put(
            &repo.join("deploy").join(f),
            &format!("{}/{f}", l.share),
            0o644,
        )?;
    }
    // Generated by the binary being shipped, so they match it.
    let shedder = root.join(l.bin);
    for (shell, to) in [("bash", l.bash), ("zsh", l.zsh), ("fish", l.fish)] {
        let script = stdout(Command::new(&shedder).args(["completions", shell]))?;
        let dest = root.join(to);
        fs::create_dir_all(dest.parent().expect("a file under the root"))?;
        fs::write(&dest, script)?;
        set_mode(&dest, 0o644)?;
    }
    let man = root.join(l.man1);
    fs::create_dir_all(&man)?;
    run(Command::new(&shedder).arg("manpage").arg("--dir").arg(&man))?;
    let mut pages: Vec<PathBuf> = fs::read_dir(&man)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    pages.sort();
    if pages.is_empty() {
        bail!("`shedder manpage --dir` wrote nothing");
    }
    for p in &pages {
        set_mode(p, 0o644)?;
        // -n: no name or time stamp inside, so the same page gives the same bytes.
        run(Command::new("gzip").args(["-9", "-n", "-f"]).arg(p))?;
    }
    let doc = root.join(l.doc);
    fs::create_dir_all(&doc)?;
    fs::write(doc.join("copyright"), copyright())?;
    set_mode(&doc.join("copyright"), 0o644)?;
    Ok(())
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// The copyright file (Debian's machine-readable format).
fn copyright() -> String {
    "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
     Upstream-Name: shedder\n\
     Source: https://github.com/shedder/shedder\n\
     \n\
     Files: *\n\
     Copyright: the shedder authors\n\
     License: MIT or Apache-2.0\n \
     shedder is dual-licensed under the MIT license and the Apache License,\n \
     version 2.0, at your option.\n \
     .\n \
     On Debian systems the Apache License 2.0 is in\n \
     /usr/share/common-licenses/Apache-2.0.\n\
     \n\
     Files: usr/bin/shedder\n\
     Copyright: the shedder authors and the authors of the Rust crates it is built from\n\
     License: MIT or Apache-2.0\n \
     The binary links Rust crates under MIT, Apache-2.0, BSD, ISC and similar\n \
     permissive licenses (cargo's Cargo.lock of the release lists them).\n"
        .to_string()
}

/// The static tarball: `shedder-<version>-x86_64-linux-musl/` with the binary in `bin/`.
fn tarball(inputs: &Inputs, work: &Path, dist: &Path) -> Result<PathBuf> {
    let name = format!("shedder-{}-x86_64-linux-musl", inputs.version);
    let root = work.join(&name);
    lay_out(
        &inputs.static_bin,
        &root,
        &Layout {
            bin: "bin/shedder",
            unit: "systemd/shedder.service",
            config: "shedder.toml",
            share: "share",
            bash: "completions/shedder.bash",
            zsh: "completions/_shedder",
            fish: "completions/shedder.fish",
            man1: "man/man1",
            doc: "doc",
        },
    )?;
    fs::write(
        root.join("README"),
        format!(
            "shedder {} (x86_64, static: runs on any x86-64 Linux with kernel 5.8 or later)\n\n\
             bin/shedder                the binary (install as /usr/bin/shedder: the unit runs it from there)\n\
             systemd/shedder.service    the systemd unit (/etc/systemd/system/)\n\
             shedder.toml               an example /etc/shedder/shedder.toml: set interfaces, classes, services\n\
             share/                     Grafana dashboard, Prometheus alerts and scrape job\n\
             completions/, man/         shell completions and manual pages\n\n\
             Then: shedder policy validate /etc/shedder/shedder.toml; shedder doctor;\n\
             systemctl daemon-reload; systemctl enable --now shedder\n",
            inputs.version
        ),
    )?;
    let file = format!("{name}.tar.gz");
    run(Command::new("tar")
        .args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--sort=name",
            "-czf",
        ])
        .arg(dist.join(&file))
        .arg("-C")
        .arg(work)
        .arg(&name))?;
    Ok(PathBuf::from(file))
}

/// The image's name and tag.
pub(crate) fn image_tag(version: &str) -> String {
    format!("localhost/shedder:{version}")
}

/// The OCI image: `podman build` of deploy/container/Containerfile with the static binary
/// (debug information stripped) and the example configuration as its context, saved as an
/// OCI archive.
fn image(inputs: &Inputs, work: &Path, dist: &Path) -> Result<PathBuf> {
    let context = work.join("image");
    fs::create_dir_all(&context)?;
    let bin = context.join("shedder");
    fs::copy(&inputs.static_bin, &bin)?;
    run(Command::new("strip").arg("--strip-debug").arg(&bin))?;
    fs::copy(
        crate::cmd::root().join("deploy/shedder.toml"),
        context.join("shedder.toml"),
    )?;
    let tag = image_tag(&inputs.version);
    run(Command::new("podman")
        .args(["build", "--quiet", "-t", &tag, "-f"])
        .arg(crate::cmd::root().join("deploy/container/Containerfile"))
        .arg(&context))?;
    let file = format!("shedder-{}-oci.tar", inputs.version);
    let _ = fs::remove_file(dist.join(&file));
    run(Command::new("podman")
        .args(["save", "--format", "oci-archive", "-o"])
        .arg(dist.join(&file))
        .arg(&tag))?;
    Ok(PathBuf::from(file))
}
