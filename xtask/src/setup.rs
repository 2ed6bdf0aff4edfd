//! `cargo xtask setup`: install what building, testing and benchmarking need, only where it
//! is missing. A second run installs nothing and takes well under a second.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{capture, cargo, cmd, home, require_root, run, stdout};

/// Debian packages the tests and benchmarks use.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",
    "ethtool",
    "util-linux",
    // The metrics test checks the endpoint with the reference OpenMetrics parser.
    "python3-prometheus-client",
    // The overload benchmark's peers: a haproxy queue and an nftables SYN rate limit.
    "haproxy",
    "nftables",
    // The font the benchmark charts' text is drawn with (tests/src/plot.rs).
    "fonts-dejavu-core",
    // etcd-client's build compiles etcd's protobuf API (prost-build runs protoc).
    "protobuf-compiler",
    // protoc's well-known types (google/protobuf/descriptor.proto), which etcd's API
    // imports: only a Recommends of protobuf-compiler, so named here.
    "libprotobuf-dev",
    // Fleet mode's tests start a real etcd on loopback (tests/tests/fleet.rs).
    "etcd-server",
    "etcd-client",
    // The fleet TLS test makes its CA and server certificate.
    "openssl",
];

/// Pinned: a newer bpf-linker may default to another LLVM than the nightly's.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where `promtool` is unpacked, relative to $HOME (tests/tests/deploy.rs looks here).
pub const PROMTOOL: &str = ".local/share/shedder/tools/promtool";

/// Pseudo-filesystems to mount where absent: (mount point, filesystem type).
const MOUNTS: &[(&str, &str)] = &[("/sys/fs/bpf", "bpf")];

/// Where bpf-linker is told to find LLVM (`LLVM_PREFIX`), relative to $HOME.
const LLVM_PREFIX: &str = ".local/share/shedder/llvm-nightly";

const STATUS_WIDTH: usize = 44;

fn ok(item: &str) {
    eprintln!("setup: {item:<STATUS_WIDTH$} ok");
}

fn installing(item: &str, why: &str) {
    eprintln!("setup: {item:<STATUS_WIDTH$} installing ({why})");
}

pub fn run_all() -> Result<()> {
    let start = Instant::now();
    nightly_toolchain()?;
    rust_src()?;
    bpf_linker()?;
    debian_packages()?;
    promtool()?;
    mounts()?;
    eprintln!("setup: done in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

fn nightly_toolchain() -> Result<()> {
    let list = stdout(&mut cmd("rustup", ["toolchain", "list"]))?;
    let present = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| name == "nightly" || name.starts_with("nightly-"));
    if !present {
        bail!(
            "the `nightly` Rust toolchain is not installed (`rustup toolchain list`), and it cannot \
             be downloaded on this machine. The eBPF object is built with nightly (1.97, \
             -Z build-std=core): install it (`rustup toolchain install nightly`) where a \
             download is possible, or copy it into $RUSTUP_HOME/toolchains"
        );
    }
    ok("nightly toolchain");
    Ok(())
}

fn rust_src() -> Result<()> {
    let item = "rust-src (nightly)";
    let installed = stdout(&mut cmd(
        "rustup",
        ["component", "list", "--toolchain", "nightly", "--installed"],
    ))?;
    if installed.lines().any(|l| l.trim() == "rust-src") {
        ok(item);
        return Ok(());
    }
    installing(item, "rustup component add");
    run(&mut cmd(
        "rustup",
        ["component", "add", "rust-src", "--toolchain", "nightly"],
    ))
}

/// The nightly toolchain's shared LLVM library.
struct NightlyLlvm {
    /// `<sysroot>/lib/libLLVM.so.<ver>-rust-<ver>-nightly`; its file name is its soname.
    lib: PathBuf,
    major: u32,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let sysroot = stdout(&mut cmd("rustc", ["+nightly", "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let mut libs: Vec<PathBuf> = fs::read_dir(&lib_dir)
        .with_context(|| format!("listing {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libLLVM.so.") && n.contains("-rust-") && n.ends_with("-nightly")
            })
        })
        .collect();
    let lib = match libs.len() {
        1 => libs.remove(0),
        0 => bail!("no libLLVM.so.*-rust-*-nightly in {}", lib_dir.display()),
        _ => bail!(
            "several libLLVM.so.*-rust-*-nightly in {}: {libs:?}",
            lib_dir.display()
        ),
    };
    let version = stdout(&mut cmd("rustc", ["+nightly", "-vV"]))?;
    let major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .and_then(|v| v.trim().split('.').next()?.parse().ok())
        .context("`rustc +nightly -vV` prints no `LLVM version: N.…` line")?;
    Ok(NightlyLlvm { lib, major })
}

/// `link` → `target`, replacing whatever `link` was.
fn ensure_symlink(link: &Path, target: &Path) -> Result<()> {
    if fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    if fs::symlink_metadata(link).is_ok() {
        fs::remove_file(link).with_context(|| format!("removing {}", link.display()))?;
    }
    symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

/// The `LLVM_PREFIX` for bpf-linker: `lib/libLLVM.so` (what llvm-sys links against) and
/// `lib/<soname>` (what the installed binary loads, through the RUNPATH bpf-linker's build
/// sets to `$LLVM_PREFIX/lib`) both lead to the nightly's own libLLVM.
fn llvm_prefix(llvm: &NightlyLlvm) -> Result<PathBuf> {
    let prefix = home()?.join(LLVM_PREFIX);
    let lib_dir = prefix.join("lib");
    fs::create_dir_all(&lib_dir).with_context(|| format!("creating {}", lib_dir.display()))?;
    let soname = llvm
        .lib
        .file_name()
        .context("libLLVM path has no file name")?;
    for name in [Path::new("libLLVM.so"), Path::new(soname)] {
        ensure_symlink(&lib_dir.join(name), &llvm.lib)?;
    }
    Ok(prefix)
}

/// Why the installed bpf-linker does not do, or `None` if it does: it must be the pinned
/// version and load the nightly's libLLVM by itself (no LD_LIBRARY_PATH).
fn bpf_linker_problem(llvm: &NightlyLlvm) -> Result<Option<String>> {
    let Ok(path) = which::which("bpf-linker") else {
        return Ok(Some("not installed".into()));
    };
    let standalone = |c: &mut Command| {
        c.env_remove("LD_LIBRARY_PATH");
    };
    let mut ldd = cmd("ldd", [&path]);
    standalone(&mut ldd);
    let ldd = String::from_utf8_lossy(&capture(&mut ldd)?.stdout).into_owned();
    let Some(line) = ldd.lines().find(|l| l.contains("libLLVM")) else {
        return Ok(Some("not linked against a shared libLLVM".into()));
    };
    let resolved = line
        .split_once("=>")
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or("not");
    if resolved == "not" {
        return Ok(Some(format!("ldd: `{}`", line.trim())));
    }
    let same = fs::canonicalize(resolved).ok() == fs::canonicalize(&llvm.lib).ok();
    if !same {
        return Ok(Some(format!(
            "loads {resolved}, not the nightly's {}",
            llvm.lib.display()
        )));
    }
    let mut version = Command::new(&path);
    version.arg("--version");
    standalone(&mut version);
    let out = capture(&mut version)?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.split_whitespace().nth(1) != Some(BPF_LINKER_VERSION) {
        return Ok(Some(format!(
            "`bpf-linker --version` says `{}`",
            text.trim()
        )));
    }
    Ok(None)
}

fn bpf_linker() -> Result<()> {
    let llvm = nightly_llvm()?;
    let item = format!(
        "bpf-linker {BPF_LINKER_VERSION} (nightly's LLVM {})",
        llvm.major
    );
    let prefix = llvm_prefix(&llvm)?;
    let Some(problem) = bpf_linker_problem(&llvm)? else {
        ok(&item);
        return Ok(());
    };
    installing(&item, &problem);
    let features = format!("llvm-{}", llvm.major);
    run(cargo([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
        &features,
        "--force",
    ])
    .env("LLVM_PREFIX", &prefix))?;
    if let Some(problem) = bpf_linker_problem(&llvm)? {
        bail!("bpf-linker still unusable after installing it: {problem}");
    }
    Ok(())
}

fn debian_package_installed(pkg: &str) -> Result<bool> {
    let out = capture(&mut cmd("dpkg-query", ["-W", "-f=${Status}", pkg]))
        .context("setup installs packages with dpkg/apt (Debian or Ubuntu)")?;
    Ok(out.status.success()
        && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}

fn debian_packages() -> Result<()> {
    install_debian_packages(DEBIAN_PACKAGES)
}

/// Install those of `packages` that are missing (apt-get, root), reporting each one's state.
pub(crate) fn install_debian_packages(packages: &[&str]) -> Result<()> {
    let mut missing = Vec::new();
    for &pkg in packages {
        let item = format!("package {pkg}");
        if debian_package_installed(pkg)? {
            ok(&item);
        } else {
            installing(&item, "apt-get");
            missing.push(pkg);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    require_root("installing Debian packages")?;
    let apt = |args: &[&str]| {
        let mut c = cmd("apt-get", args);
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run(&mut apt(&["update"]))?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&missing);
    run(&mut apt(&install))
}

/// `promtool` checks the alert rules and runs their unit tests. Debian ships it only inside
/// the `prometheus` package, whose installation would also create a user and (under
/// systemd) start a Prometheus server, so the package is downloaded and only `promtool` is
/// unpacked from it.
fn promtool() -> Result<()> {
    let item = "promtool (from Debian's prometheus)";
    let dest = home()?.join(PROMTOOL);
    let works =
        |p: &Path| capture(Command::new(p).arg("--version")).is_ok_and(|o| o.status.success());
    if works(&dest) {
        ok(item);
        return Ok(());
    }
    installing(item, "apt-get download");
    let work = std::env::temp_dir().join(format!("shedder-promtool-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    let download = || {
        let mut c = cmd("apt-get", ["download", "prometheus"]);
        c.current_dir(&work);
        capture(&mut c).is_ok_and(|o| o.status.success())
    };
    if !download() {
        // Fresh machines may have no package lists yet.
        require_root("updating the package lists")?;
        run(&mut cmd("apt-get", ["update"]))?;
        if !download() {
            bail!("apt-get download prometheus failed (in {})", work.display());
        }
    }
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let tree = work.join("tree");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    fs::create_dir_all(dest.parent().expect("tools directory"))?;
    fs::copy(tree.join("usr/bin/promtool"), &dest)
        .with_context(|| format!("copying promtool to {}", dest.display()))?;
    let _ = fs::remove_dir_all(&work);
    if !works(&dest) {
        bail!("{} does not run", dest.display());
    }
    Ok(())
}

fn mounted(mounts: &str, point: &str, fstype: &str) -> bool {
    mounts.lines().any(|l| {
        let mut f = l.split_whitespace().skip(1);
        f.next() == Some(point) && f.next() == Some(fstype)
    })
}

fn mounts() -> Result<()> {
    let table = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    for &(point, fstype) in MOUNTS {
        let item = format!("{fstype} filesystem at {point}");
        if mounted(&table, point, fstype) {
            ok(&item);
            continue;
        }
        installing(&item, "mount");
        require_root(&format!("mounting {fstype} at {point}"))?;
        fs::create_dir_all(point).with_context(|| format!("creating {point}"))?;
        run(&mut cmd("mount", ["-t", fstype, fstype, point]))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mounts_by_point_and_type() {
        let table = "sysfs /sys sysfs rw 0 0\nbpf /sys/fs/bpf bpf rw,relatime 0 0\n";
        assert!(mounted(table, "/sys/fs/bpf", "bpf"));
        assert!(!mounted(table, "/sys/kernel/tracing", "tracefs"));
        assert!(!mounted(
            "none /sys/fs/bpf tmpfs rw 0 0\n",
            "/sys/fs/bpf",
            "bpf"
        ));
    }
}
