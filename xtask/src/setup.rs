//! `cargo xtask setup`: install what building, testing and benchmarking need, only where it
//! is missing. A second run installs nothing and takes well under a second.
//!
//! Two sets: what building the `shedder` binary needs ([`BUILD_DEPS`], the pinned nightly
//! with rust-src, bpf-linker; `cargo xtask setup --build-only`, and all `cargo xtask dist`
//! uses), and on top of it what the tests, benchmarks and demo need ([`TEST_DEPS`],
//! promtool, the nightly's clippy, bpffs mounted).

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{
    capture, cargo, checked, cmd, home, is_root, mount, require_root, run, show, stdout, succeeds,
};

/// How setup tells that a dependency is usable: by using it the way the build and the
/// tests do, not by a package name (a package can be installed and still lack what is used,
/// as protobuf-compiler lacks the well-known .proto files).
pub enum Probe {
    /// The program starts and exits 0 with these arguments.
    Runs(&'static str, &'static [&'static str]),
    /// The file exists.
    File(&'static str),
    /// A check of its own; the error says what failed.
    Check(fn() -> Result<(), String>),
}

/// One dependency: what uses it, how it is checked, and the Debian package providing it.
pub struct Dep {
    pub what: &'static str,
    pub probe: Probe,
    pub package: &'static str,
}

pub(crate) const fn dep(what: &'static str, probe: Probe, package: &'static str) -> Dep {
    Dep {
        what,
        probe,
        package,
    }
}

/// What building the `shedder` binary (default features) uses from Debian. A C compiler
/// (build-essential, for ring) is taken as given, as on any machine that builds Rust.
pub const BUILD_DEPS: &[Dep] = &[
    // etcd-client's build (the `fleet` feature) compiles etcd's protobuf API (prost-build
    // runs protoc) ...
    dep(
        "protoc",
        Probe::Runs("protoc", &["--version"]),
        "protobuf-compiler",
    ),
    // ... which imports protobuf's well-known types: only a Recommends of
    // protobuf-compiler.
    dep(
        "protoc's well-known types",
        Probe::Check(protoc_compiles_well_known_imports),
        "libprotobuf-dev",
    ),
];

/// What the tests, the benchmarks and the demo use from Debian besides [`BUILD_DEPS`]
/// (found by what tests/ and xtask run).
pub const TEST_DEPS: &[Dep] = &[
    // Namespaces and veth pairs (lab/src/netns.rs).
    dep("ip", Probe::Runs("ip", &["-V"]), "iproute2"),
    // The load test lists sockets inside a namespace.
    dep("ss", Probe::Runs("ss", &["-V"]), "iproute2"),
    // Inspecting veth offloads and xdp_tx_errors (doctor's hints name it).
    dep("ethtool", Probe::Runs("ethtool", &["--version"]), "ethtool"),
    // Daemons, etcd and haproxy are started inside namespaces through nsenter.
    dep(
        "nsenter",
        Probe::Runs("nsenter", &["--version"]),
        "util-linux",
    ),
    // The control-socket permission test runs the CLI as other users.
    dep(
        "setpriv",
        Probe::Runs("setpriv", &["--version"]),
        "util-linux",
    ),
    // The metrics test checks the endpoint with the reference OpenMetrics parser.
    dep(
        "python3 prometheus_client",
        Probe::Runs(
            "/usr/bin/python3",
            &["-c", "import prometheus_client.openmetrics.parser"],
        ),
        "python3-prometheus-client",
    ),
    // The overload benchmark's peers: a haproxy queue and an nftables SYN rate limit.
    dep("haproxy", Probe::Runs("haproxy", &["-v"]), "haproxy"),
    dep("nft", Probe::Runs("nft", &["--version"]), "nftables"),
    // The TLS backend of the overload benchmark and its limit_conn / limit_req peers, and
    // the real server the cost of measuring is timed against. Debian starts its default
    // site on port 80 when it installs nginx, unless the port is taken; the benchmark runs
    // its own nginx processes in a namespace and needs none of that.
    dep("nginx", Probe::Runs("nginx", &["-v"]), "nginx"),
    // The second, independent open-loop generator against the TLS backend.
    dep(
        "h2load",
        Probe::Runs("h2load", &["--version"]),
        "nghttp2-client",
    ),
    // The keep-alive and one-request-per-connection load against nginx in `bench signals`.
    dep("wrk", Probe::File("/usr/bin/wrk"), "wrk"),
    // The font the benchmark charts' text is drawn with (lab/src/plot.rs).
    dep(
        "DejaVu Sans font",
        Probe::File("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
        "fonts-dejavu-core",
    ),
    // Fleet mode's tests start a real etcd on loopback (tests/tests/fleet.rs) and set up
    // its authentication with etcdctl.
    dep(
        "etcd",
        Probe::Runs("/usr/bin/etcd", &["--version"]),
        "etcd-server",
    ),
    dep(
        "etcdctl",
        Probe::Runs("etcdctl", &["version"]),
        "etcd-client",
    ),
    // The fleet TLS test makes its CA and server certificate.
    dep("openssl", Probe::Runs("openssl", &["version"]), "openssl"),
];

/// Imports what etcd's API imports from protobuf itself.
const WELL_KNOWN_PROTO: &str = r#"syntax = "proto3";
package shedder.setup;
import "google/protobuf/descriptor.proto";
import "google/protobuf/struct.proto";
message Check {
  google.protobuf.FileDescriptorProto file = 1;
  google.protobuf.Struct value = 2;
}
"#;

/// Compile a small .proto importing descriptor.proto and struct.proto the way prost-build
/// does (the `PROTOC` it would use, else `protoc`; the well-known types from protoc's own
/// include path).
fn protoc_compiles_well_known_imports() -> Result<(), String> {
    let protoc = std::env::var_os("PROTOC")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "protoc".into());
    let dir = std::env::temp_dir().join(format!("shedder-setup-protoc-{}", std::process::id()));
    let result = (|| {
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        fs::write(dir.join("check.proto"), WELL_KNOWN_PROTO)
            .map_err(|e| format!("writing check.proto: {e}"))?;
        let mut c = Command::new(&protoc);
        c.arg("-I")
            .arg(&dir)
            .arg("--include_imports")
            .arg("--descriptor_set_out")
            .arg(dir.join("check.pb"))
            .arg(dir.join("check.proto"));
        probe_command(&mut c)
    })();
    let _ = fs::remove_dir_all(&dir);
    result
}

/// Run `c` silently; `Err` with its exit status and the last line of its error output (where
/// a Python traceback or protoc names the cause) unless it succeeds.
fn probe_command(c: &mut Command) -> Result<(), String> {
    let out = capture(c).map_err(|e| format!("{e:#}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let last = text.lines().map(str::trim).rfind(|l| !l.is_empty());
    Err(match last {
        Some(line) => format!("`{}` failed ({}): {line}", show(c), out.status),
        None => format!("`{}` failed ({})", show(c), out.status),
    })
}

impl Probe {
    /// `Ok` when the dependency is usable, else what failed.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Probe::Runs(program, args) => {
                let mut c = Command::new(program);
                c.args(*args);
                probe_command(&mut c)
            }
            Probe::File(path) => {
                if Path::new(path).is_file() {
                    Ok(())
                } else {
                    Err(format!("{path} does not exist"))
                }
            }
            Probe::Check(f) => f(),
        }
    }
}

/// Pinned: a newer bpf-linker may default to another LLVM than the nightly's.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// The nightly the eBPF object is built with: `EBPF_TOOLCHAIN` of shedder-user/build.rs
/// (a test below checks they agree). Dated, so that every machine builds the object with
/// the same compiler; `rustc +nightly-2026-05-20 --version` says
/// `1.97.0-nightly (e50aa6fba 2026-05-19)`.
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

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

/// What setup installs: what building needs, or that and what testing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Building the `shedder` binary (`cargo build`, `cargo xtask dist`).
    Build,
    /// Building, the tests, the benchmarks and the demo.
    All,
}

pub fn run_all() -> Result<()> {
    run_scope(Scope::All)
}

pub fn run_scope(scope: Scope) -> Result<()> {
    let start = Instant::now();
    ebpf_toolchain()?;
    rust_src()?;
    bpf_linker()?;
    ensure(BUILD_DEPS)?;
    if scope == Scope::All {
        ebpf_clippy()?;
        ensure(TEST_DEPS)?;
        promtool()?;
        mounts()?;
    }
    eprintln!("setup: done in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// `+nightly-YYYY-MM-DD`, for cargo and rustc.
pub fn ebpf_plus() -> String {
    format!("+{EBPF_TOOLCHAIN}")
}

/// The eBPF object is built by `cargo +EBPF_TOOLCHAIN` (shedder-user/build.rs): that
/// nightly's rustc must run. rustup installs it (minimal profile, with rust-src) if not.
fn ebpf_toolchain() -> Result<()> {
    let item = format!("{EBPF_TOOLCHAIN} toolchain");
    if probe_command(&mut cmd("rustc", [&ebpf_plus(), "--version"])).is_ok() {
        ok(&item);
        return Ok(());
    }
    installing(&item, "rustup");
    run(&mut cmd(
        "rustup",
        [
            "toolchain",
            "install",
            EBPF_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ],
    ))?;
    probe_command(&mut cmd("rustc", [&ebpf_plus(), "--version"]))
        .map_err(|why| anyhow::anyhow!("{EBPF_TOOLCHAIN} does not run after installing: {why}"))
}

/// What `-Z build-std=core` compiles: core's sources in the nightly's sysroot.
fn core_sources() -> Result<PathBuf> {
    let sysroot = stdout(&mut cmd("rustc", [&ebpf_plus(), "--print", "sysroot"]))?;
    Ok(Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core/Cargo.toml"))
}

fn rust_src() -> Result<()> {
    let item = format!("rust-src ({EBPF_TOOLCHAIN})");
    let core = core_sources()?;
    if core.is_file() {
        ok(&item);
        return Ok(());
    }
    installing(&item, &format!("no {}", core.display()));
    run(&mut cmd(
        "rustup",
        [
            "component",
            "add",
            "rust-src",
            "--toolchain",
            EBPF_TOOLCHAIN,
        ],
    ))?;
    if !core_sources()?.is_file() {
        bail!(
            "{} is still missing after `rustup component add rust-src --toolchain {EBPF_TOOLCHAIN}`",
            core.display()
        );
    }
    Ok(())
}

/// `cargo xtask test` lints the eBPF crate with the nightly's clippy.
fn ebpf_clippy() -> Result<()> {
    let item = format!("clippy ({EBPF_TOOLCHAIN})");
    if probe_command(&mut cmd("cargo", [&ebpf_plus(), "clippy", "--version"])).is_ok() {
        ok(&item);
        return Ok(());
    }
    installing(&item, "rustup");
    run(&mut cmd(
        "rustup",
        ["component", "add", "clippy", "--toolchain", EBPF_TOOLCHAIN],
    ))
}

/// The nightly toolchain's shared LLVM library.
struct NightlyLlvm {
    /// `<sysroot>/lib/libLLVM.so.<ver>-rust-<ver>-nightly`; its file name is its soname.
    lib: PathBuf,
    major: u32,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let sysroot = stdout(&mut cmd("rustc", [&ebpf_plus(), "--print", "sysroot"]))?;
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
    let version = stdout(&mut cmd("rustc", [&ebpf_plus(), "-vV"]))?;
    let major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .and_then(|v| v.trim().split('.').next()?.parse().ok())
        .with_context(|| {
            format!("`rustc +{EBPF_TOOLCHAIN} -vV` prints no `LLVM version: N.…` line")
        })?;
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

/// Check each of `deps`; install the packages of those that fail (apt-get, as root), then
/// check those again. When everything is there this only runs the checks.
pub(crate) fn ensure(deps: &[Dep]) -> Result<()> {
    let mut failing = Vec::new();
    for d in deps {
        match d.probe.check() {
            Ok(()) => ok(d.what),
            Err(why) => {
                eprintln!(
                    "setup: {:<STATUS_WIDTH$} installing {} ({why})",
                    d.what, d.package
                );
                failing.push(d);
            }
        }
    }
    if failing.is_empty() {
        return Ok(());
    }
    let packages = packages_of(&failing);
    apt_install(&packages)?;
    let still: Vec<String> = failing
        .iter()
        .filter_map(|d| {
            d.probe
                .check()
                .err()
                .map(|why| format!("check `{}` ({}): {why}", d.what, d.package))
        })
        .collect();
    if !still.is_empty() {
        bail!(
            "still failing after `apt-get install {}`: {}. The package installed but does not \
             provide what is checked: see BUILD_DEPS and TEST_DEPS in xtask/src/setup.rs",
            packages.join(" "),
            still.join("; ")
        );
    }
    Ok(())
}

/// The packages of `deps`, each once, in table order.
fn packages_of(deps: &[&Dep]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for d in deps {
        if !out.contains(&d.package) {
            out.push(d.package);
        }
    }
    out
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
    apt_install(&missing)
}

/// `apt-get args…`, noninteractive.
fn apt_get(args: &[&str]) -> Command {
    let mut c = cmd("apt-get", args);
    c.env("DEBIAN_FRONTEND", "noninteractive");
    c
}

/// `apt-get update` and `apt-get install` of `packages`, noninteractive, as root.
fn apt_install(packages: &[&str]) -> Result<()> {
    require_root(&format!("installing {}", packages.join(" ")))?;
    // A fresh machine may have no package lists yet.
    run(&mut apt_get(&["update"]))?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(packages);
    run(&mut apt_get(&install))
}

/// Run `f`; if it fails and we are root, `apt-get update` and run it once more (a fresh
/// machine may have no or stale package lists). `who` prefixes the message.
pub(crate) fn with_apt_update<T>(who: &str, f: impl Fn() -> Result<T>) -> Result<T> {
    match f() {
        Ok(v) => Ok(v),
        Err(first) if is_root() => {
            eprintln!("{who}: {first:#}; updating the package lists and trying again");
            run(&mut apt_get(&["update"]))?;
            f()
        }
        Err(first) => Err(first),
    }
}

/// `promtool` checks the alert rules and runs their unit tests. Debian ships it only inside
/// the `prometheus` package, whose installation would also create a user and (under
/// systemd) start a Prometheus server, so the package is downloaded and only `promtool` is
/// unpacked from it.
fn promtool() -> Result<()> {
    let item = "promtool (from Debian's prometheus)";
    let dest = home()?.join(PROMTOOL);
    let works = |p: &Path| succeeds(Command::new(p).arg("--version"));
    if works(&dest) {
        ok(item);
        return Ok(());
    }
    installing(item, "apt-get download");
    let work = std::env::temp_dir().join(format!("shedder-promtool-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    with_apt_update("setup", || {
        let mut c = cmd("apt-get", ["download", "prometheus"]);
        c.current_dir(&work);
        checked(&mut c).map(drop)
    })
    .with_context(|| format!("apt-get download prometheus failed (in {})", work.display()))?;
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
        mount(&["-t", fstype, fstype], Path::new(point))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_come_once_in_table_order() {
        let a = dep("a", Probe::File("/"), "iproute2");
        let b = dep("b", Probe::File("/"), "haproxy");
        let c = dep("c", Probe::File("/"), "iproute2");
        assert_eq!(packages_of(&[&a, &b, &c]), ["iproute2", "haproxy"]);
        assert!(packages_of(&[]).is_empty());
    }

    #[test]
    fn probes_report_what_failed() {
        assert_eq!(Probe::Runs("true", &[]).check(), Ok(()));
        let err = Probe::Runs("sh", &["-c", "echo Traceback >&2; echo nope >&2; exit 3"])
            .check()
            .unwrap_err();
        assert!(
            err.contains("exit status: 3") && err.ends_with("nope"),
            "{err}"
        );
        let err = Probe::Runs("shedder-no-such-program", &[])
            .check()
            .unwrap_err();
        assert!(err.contains("starting `shedder-no-such-program`"), "{err}");
        assert_eq!(Probe::File("/proc/self/status").check(), Ok(()));
        assert!(Probe::File("/nonexistent").check().is_err());
        assert_eq!(
            Probe::Check(|| Err("why".into())).check(),
            Err("why".into())
        );
    }

    #[test]
    fn the_ebpf_toolchain_is_the_one_build_rs_uses() {
        let build_rs = fs::read_to_string(crate::cmd::root().join("shedder-user/build.rs"))
            .expect("reading shedder-user/build.rs");
        let line = format!("const EBPF_TOOLCHAIN: &str = \"{EBPF_TOOLCHAIN}\";");
        assert!(
            build_rs.contains(&line),
            "shedder-user/build.rs must say `{line}`"
        );
        assert!(build_rs.contains("Toolchain::Custom(EBPF_TOOLCHAIN)"));
    }

    #[test]
    fn every_dependency_names_one_package_and_a_unique_use() {
        let deps: Vec<&Dep> = BUILD_DEPS.iter().chain(TEST_DEPS).collect();
        for (i, d) in deps.iter().enumerate() {
            assert!(
                !d.package.is_empty() && !d.package.contains(char::is_whitespace),
                "{}",
                d.what
            );
            assert!(d.what.len() <= STATUS_WIDTH, "{} is too long", d.what);
            assert!(
                deps[..i].iter().all(|e| e.what != d.what),
                "{} twice",
                d.what
            );
        }
    }

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
