//! `cargo xtask vm-test`: the kernel-facing tests under other kernels than the host's.
//!
//! Every row of [`KERNELS`] is a Debian kernel package: downloaded once into
//! `target/vm/cache/`, unpacked into `target/vm/kernels/<release>/`, and booted under
//! `qemu-system-x86_64` (KVM when /dev/kvm works, TCG otherwise) with an initramfs written
//! here (a `newc` cpio, so no root-owned files and no `cpio` program): busybox, `/init`, the
//! modules the tests need, `ip` and `nsenter`, the test executables and `shedder` at their
//! host paths, and every shared library those load. `/init` runs [`CHECKS`] one at a time
//! between `@@VM-BEGIN <name>` / `@@VM-END <name> rc=<n>` markers on the serial console,
//! which is kept in `target/vm/<release>.log`, and powers off. The host's own kernel runs
//! the same checks natively (unless `--skip-host`). A summary table follows.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs::{self, File, OpenOptions},
    io::{self, BufRead as _, BufReader, BufWriter, Read as _, Seek as _, SeekFrom, Write},
    os::{fd::AsRawFd as _, unix::fs::PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    cmd::{
        capture, cargo, checked, cmd, require_root, root, run, show, stdout, succeeds, target_dir,
        wait_until,
    },
    setup::{self, with_apt_update},
};

/// Where a kernel package comes from.
enum Source {
    /// The package the metapackage `meta` depends on, from the configured apt sources
    /// (`apt-get download`, so apt checks its signature).
    Apt { meta: &'static str },
    /// The newest generic-flavour `linux-image-<series>.*-amd64` of a dist on a Debian
    /// archive, read from the dist's `InRelease` (checked with gpgv against
    /// debian-archive-keyring) and its `main/binary-amd64/Packages.xz` (checked by SHA256);
    /// the .deb is checked against the index's SHA256 too.
    Dist {
        archive: &'static str,
        dist: &'static str,
    },
}

struct Kernel {
    /// `major.minor`: what `--kernels` names, and the prefix the release must have.
    series: &'static str,
    source: Source,
}

/// The kernels booted by default, oldest first. Adding one is adding a line.
const KERNELS: &[Kernel] = &[
    Kernel {
        series: "6.1",
        source: Source::Apt {
            meta: "linux-image-amd64",
        },
    },
    Kernel {
        series: "6.12",
        source: Source::Dist {
            archive: "http://deb.debian.org/debian",
            dist: "bookworm-backports",
        },
    },
];

/// One command run in each VM (and on the host): a test executable of shedder-tests (by
/// its target name, `tests/tests/<test>.rs`) with libtest arguments.
struct Check {
    /// Marker name: no spaces.
    name: &'static str,
    /// The test target (or, with `bin`, the binary) of shedder-tests to run.
    test: &'static str,
    args: &'static [&'static str],
    /// A binary (`tests/src/bin/<test>.rs`) rather than a test target.
    bin: bool,
    /// The kernel series the checked feature needs, what it is, and the words shedder's
    /// refusal uses: on older kernels a failure whose output holds those words is reported
    /// as "needs …", not counted; any other failure counts.
    since: Option<(&'static str, &'static str, &'static str)>,
}

const CHECKS: &[Check] = &[
    // 119 crafted frames through XDP and TC with BPF_PROG_TEST_RUN.
    Check {
        name: "fixtures::fixture_table",
        test: "fixtures",
        args: &["--exact", "fixture_table", "--test-threads=1"],
        bin: false,
        since: None,
    },
    // Real TCP over veth between two namespaces, IPv4 and IPv6, with shedder attached.
    Check {
        name: "netns::native_xdp",
        test: "netns",
        args: &["--exact", "native_xdp", "--test-threads=1"],
        bin: false,
        since: None,
    },
    Check {
        name: "netns::generic_xdp",
        test: "netns",
        args: &["--exact", "generic_xdp", "--test-threads=1"],
        bin: false,
        since: None,
    },
    Check {
        name: "netns::tc_ingress",
        test: "netns",
        args: &["--exact", "tc_ingress", "--test-threads=1"],
        bin: false,
        since: Some((
            "6.6",
            "tcx bpf links for attach = \"tc\"",
            "this kernel has no tcx",
        )),
    },
    // Every program loaded, with and without the kernel debug log: the verifier's
    // instruction counts, compared with docs/kernels.json.
    Check {
        name: "verifier",
        test: "verifier_report",
        args: &[],
        bin: true,
        since: None,
    },
];

/// A program's verifier instruction count may grow to this multiple of the figure in
/// docs/kernels.json for the same kernel series before the run fails.
const VERIFIER_REGRESSION: f64 = 1.5;
/// The verifier figures of the latest committed run, per kernel series: the baseline.
const VERIFIER_BASELINE: &str = "docs/kernels.json";

/// Kernel options the checks rely on, with the module that provides each where Debian may
/// build it as one. Modules are loaded (with what they depend on) before the checks run; an
/// option that is not set is reported.
const OPTIONS: &[(&str, Option<&str>)] = &[
    ("CONFIG_BPF_SYSCALL", None),
    ("CONFIG_BPF_JIT", None),
    ("CONFIG_BPF_EVENTS", None),
    ("CONFIG_DEBUG_INFO_BTF", None),
    ("CONFIG_NET_NS", None),
    ("CONFIG_IPV6", Some("ipv6")),
    ("CONFIG_VETH", Some("veth")),
    ("CONFIG_NET_SCH_INGRESS", Some("sch_ingress")),
    ("CONFIG_NET_CLS_BPF", Some("cls_bpf")),
    ("CONFIG_NET_CLS_ACT", None),
    ("CONFIG_DEVTMPFS", None),
    ("CONFIG_TMPFS", None),
];

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

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Where the programs the tests call go inside the VM (first on its PATH).
const VM_IP: &str = "/usr/sbin/ip";
const VM_NSENTER: &str = "/usr/bin/nsenter";
const VM_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Memory and CPUs of each VM.
const VM_MEMORY_MB: u32 = 2048;
const VM_CPUS: u32 = 2;
/// The kernel command line: serial console, leave qemu on a panic (with -no-reboot).
const VM_APPEND: &str = "console=ttyS0 panic=-1 quiet";

#[derive(Debug, Args)]
pub struct VmTestArgs {
    /// Kernel series to boot, comma-separated (default: every row of KERNELS in
    /// xtask/src/vm.rs, i.e. 6.1,6.12).
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
}

pub fn run_vm_test(args: &VmTestArgs) -> Result<()> {
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
        mark_needs_newer(row);
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
        .filter(|r| !matches!(r.outcome, Outcome::NeedsNewer(_)));
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

fn select_kernels(names: Option<&[String]>) -> Result<Vec<&'static Kernel>> {
    let Some(names) = names else {
        return Ok(KERNELS.iter().collect());
    };
    let known = || {
        KERNELS
            .iter()
            .map(|k| k.series)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let kernel = KERNELS.iter().find(|k| k.series == name).with_context(|| {
            format!(
                "no kernel {name} in the table (xtask/src/vm.rs KERNELS has: {})",
                known()
            )
        })?;
        if !out.iter().any(|k: &&Kernel| k.series == kernel.series) {
            out.push(kernel);
        }
    }
    Ok(out)
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

// ---------------------------------------------------------------------------------------
// Building what runs inside.

struct Built {
    shedder: PathBuf,
    /// Test target name → executable.
    tests: BTreeMap<String, PathBuf>,
}

/// `cargo <args> --message-format=json`, progress on stderr; the compiler-artifact records.
fn cargo_artifacts(args: &[&str]) -> Result<Vec<serde_json::Value>> {
    let mut c = cargo(args.iter().copied().chain(["--message-format=json"]));
    c.stdin(Stdio::null()).stderr(Stdio::inherit());
    eprintln!("==> {}", show(&c));
    let out = c
        .output()
        .with_context(|| format!("starting `{}`", show(&c)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", show(&c), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .collect())
}

/// Executables of the given target kind: target name → path.
fn executables(artifacts: &[serde_json::Value], kind: &str) -> BTreeMap<String, PathBuf> {
    artifacts
        .iter()
        .filter(|a| {
            a["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
        .filter_map(|a| {
            Some((
                a["target"]["name"].as_str()?.to_owned(),
                PathBuf::from(a["executable"].as_str()?),
            ))
        })
        .collect()
}

fn build() -> Result<Built> {
    let bins = executables(
        &cargo_artifacts(&["build", "-p", "shedder-user", "--bin", "shedder"])?,
        "bin",
    );
    let shedder = bins
        .get("shedder")
        .cloned()
        .context("cargo build -p shedder-user reported no `shedder` executable")?;
    let mut args = vec!["test", "-p", "shedder-tests", "--no-run"];
    let names: BTreeSet<&str> = CHECKS.iter().filter(|c| !c.bin).map(|c| c.test).collect();
    for name in &names {
        args.extend(["--test", name]);
    }
    let mut tests = executables(&cargo_artifacts(&args)?, "test");
    let mut args = vec!["build", "-p", "shedder-tests"];
    for c in CHECKS.iter().filter(|c| c.bin) {
        args.extend(["--bin", c.test]);
    }
    tests.extend(executables(&cargo_artifacts(&args)?, "bin"));
    for name in CHECKS.iter().map(|c| c.test) {
        if !tests.contains_key(name) {
            bail!("cargo reported no executable for the shedder-tests target `{name}`");
        }
    }
    Ok(Built { shedder, tests })
}

// ---------------------------------------------------------------------------------------
// Kernel packages.

struct Prepared {
    series: &'static str,
    /// `uname -r` of the kernel, e.g. `6.1.0-52-amd64`.
    release: String,
    package: String,
    vmlinuz: PathBuf,
    /// Modules to load in this order: (name, uncompressed contents).
    modules: Vec<(String, Vec<u8>)>,
    /// Options from [`OPTIONS`] the kernel does not have.
    missing_options: Vec<&'static str>,
}

fn prepare_kernel(kernel: &Kernel, cache: &Path, kernels_dir: &Path) -> Result<Prepared> {
    let (package, deb) = match kernel.source {
        Source::Apt { meta } => apt_kernel(kernel.series, meta, cache)?,
        Source::Dist { archive, dist } => dist_kernel(kernel.series, archive, dist, cache)?,
    };
    let release = package
        .strip_prefix("linux-image-")
        .with_context(|| format!("{package} is not a linux-image package"))?
        .to_owned();
    let dir = kernels_dir.join(&release);
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    if vmlinuz.is_file() {
        eprintln!("vm-test: {release} already unpacked in {}", dir.display());
    } else {
        let part = kernels_dir.join(format!("{release}.part"));
        for d in [&part, &dir] {
            if d.exists() {
                fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
            }
        }
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&part))?;
        fs::rename(&part, &dir).with_context(|| format!("renaming {}", part.display()))?;
        if !vmlinuz.is_file() {
            bail!("{} has no boot/vmlinuz-{release}", deb.display());
        }
    }
    let config_path = dir.join("boot").join(format!("config-{release}"));
    let config = kernel_config(&config_path)?;
    let modules_dir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| dir.join(m).join(&release))
        .find(|d| d.is_dir())
        .with_context(|| format!("no lib/modules/{release} in {}", dir.display()))?;
    let mut wanted = Vec::new();
    let mut missing_options = Vec::new();
    for &(option, module) in OPTIONS {
        let value = config.get(option).map(String::as_str);
        match (value, module) {
            (Some("y"), _) => {}
            (Some("m"), Some(module)) => wanted.push(module),
            (Some("m"), None) => bail!(
                "{option}=m in {}: add its module to OPTIONS",
                config_path.display()
            ),
            _ => missing_options.push(option),
        }
    }
    eprintln!(
        "vm-test: {release}: modules to load: {}",
        if wanted.is_empty() {
            "none".to_owned()
        } else {
            wanted.join(", ")
        }
    );
    if !missing_options.is_empty() {
        eprintln!(
            "vm-test: {release}: not set: {}",
            missing_options.join(", ")
        );
    }
    let modules = resolve_modules(&wanted, &modules_dir)?;
    Ok(Prepared {
        series: kernel.series,
        release,
        package,
        vmlinuz,
        modules,
        missing_options,
    })
}

/// `CONFIG_X` → value, for the options that are set.
fn kernel_config(path: &Path) -> Result<HashMap<String, String>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// The kernel `meta` depends on in the configured apt sources, downloaded into `cache`.
fn apt_kernel(series: &str, meta: &str, cache: &Path) -> Result<(String, PathBuf)> {
    let (package, version) = with_apt_update("vm-test", || {
        let deps = stdout(&mut cmd("apt-cache", ["depends", meta]))?;
        let package = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends:"))
            .map(str::trim)
            .find(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("`apt-cache depends {meta}` names no linux-image package"))?
            .to_owned();
        let policy = stdout(&mut cmd("apt-cache", ["policy", &package]))?;
        let version = policy
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .find(|v| *v != "(none)")
            .with_context(|| format!("{package} has no candidate version in the apt sources"))?
            .to_owned();
        Ok((package, version))
    })?;
    if !package.starts_with(&format!("linux-image-{series}.")) {
        bail!(
            "kernel {series} package not found in the configured apt sources: {meta} depends on \
             {package}"
        );
    }
    let deb = cache.join(format!(
        "{package}_{}_amd64.deb",
        version.replace(':', "%3a")
    ));
    if deb.is_file() {
        eprintln!("vm-test: {} already downloaded", deb.display());
        return Ok((package, deb));
    }
    eprintln!("vm-test: kernel {series}: {package} {version} from the apt sources");
    let spec = format!("{package}={version}");
    with_apt_update("vm-test", || {
        let mut c = cmd("apt-get", ["download", &spec]);
        c.current_dir(cache);
        run(&mut c)
    })?;
    if !deb.is_file() {
        bail!("`apt-get download {spec}` did not leave {}", deb.display());
    }
    Ok((package, deb))
}

/// curl `url` to `dest` (through `dest.part`).
fn download(url: &str, dest: &Path) -> Result<()> {
    let part = PathBuf::from(format!("{}.part", dest.display()));
    run(Command::new("curl")
        .args(["-fsSL", "--retry", "2", "--connect-timeout", "20", "-o"])
        .arg(&part)
        .arg(url))
    .with_context(|| format!("downloading {url}"))?;
    fs::rename(&part, dest).with_context(|| format!("renaming {}", part.display()))
}

fn sha256(path: &Path) -> Result<String> {
    let out = stdout(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .with_context(|| format!("no hash from sha256sum {}", path.display()))
}

/// One stanza of a Packages index, as field → value (first line of each field).
fn stanzas(text: &str) -> Vec<HashMap<&str, &str>> {
    text.split("\n\n")
        .map(|s| {
            s.lines()
                .filter(|l| !l.starts_with(' '))
                .filter_map(|l| l.split_once(": "))
                .collect()
        })
        .filter(|m: &HashMap<&str, &str>| !m.is_empty())
        .collect()
}

/// The dist's binary-amd64 index, verified: InRelease by gpgv, Packages.xz by its hash there.
/// If the archive cannot be reached, the copy verified by an earlier run (with a warning).
fn dist_index(archive: &str, dist: &str, cache: &Path) -> Result<String> {
    let saved = cache.join(format!("{dist}_main_binary-amd64_Packages"));
    let fresh = || -> Result<String> {
        let inrelease = cache.join(format!("{dist}_InRelease"));
        download(&format!("{archive}/dists/{dist}/InRelease"), &inrelease)?;
        let release = cache.join(format!("{dist}_Release"));
        let _ = fs::remove_file(&release);
        checked(
            Command::new("gpgv")
                .args(["--keyring", KEYRING, "--output"])
                .arg(&release)
                .arg(&inrelease),
        )
        .with_context(|| format!("gpgv does not accept {}", inrelease.display()))?;
        let release_text = fs::read_to_string(&release)?;
        let path = "main/binary-amd64/Packages.xz";
        let want = release_text
            .split("\nSHA256:")
            .nth(1)
            .and_then(|s| {
                s.lines()
                    .skip(1)
                    .take_while(|l| l.starts_with(' '))
                    .map(|l| l.split_whitespace().collect::<Vec<_>>())
                    .find(|f| f.len() == 3 && f[2] == path)
                    .map(|f| f[0].to_owned())
            })
            .with_context(|| format!("{dist}'s InRelease lists no SHA256 of {path}"))?;
        let xz = cache.join(format!("{dist}_main_binary-amd64_Packages.xz"));
        download(&format!("{archive}/dists/{dist}/{path}"), &xz)?;
        let got = sha256(&xz)?;
        if got != want {
            bail!("{} has SHA256 {got}, InRelease says {want}", xz.display());
        }
        let text = stdout(Command::new("xz").arg("-dc").arg(&xz))?;
        fs::write(&saved, &text)?;
        Ok(text)
    };
    match fresh() {
        Ok(text) => Ok(text),
        Err(e) if saved.is_file() => {
            eprintln!(
                "vm-test: warning: {e:#}; using the index verified earlier ({})",
                saved.display()
            );
            Ok(fs::read_to_string(&saved)?)
        }
        Err(e) => Err(e),
    }
}

/// `a` is a greater Debian version than `b`.
fn version_gt(a: &str, b: &str) -> bool {
    succeeds(Command::new("dpkg").args(["--compare-versions", a, "gt", b]))
}

/// The newest generic `linux-image-<series>.*-amd64` of `dist`, downloaded into `cache`.
fn dist_kernel(series: &str, archive: &str, dist: &str, cache: &Path) -> Result<(String, PathBuf)> {
    let index_url = format!("{archive}/dists/{dist}/main/binary-amd64/Packages.xz");
    let text = dist_index(archive, dist, cache)?;
    let prefix = format!("linux-image-{series}.");
    let mut best: Option<HashMap<&str, &str>> = None;
    for s in stanzas(&text) {
        let Some(&name) = s.get("Package") else {
            continue;
        };
        let generic = name.starts_with(&prefix)
            && name.ends_with("-amd64")
            && !name.ends_with("-cloud-amd64")
            && !name.ends_with("-rt-amd64");
        if !generic || !s.contains_key("Filename") || !s.contains_key("SHA256") {
            continue;
        }
        let newer = match &best {
            None => true,
            Some(b) => version_gt(s["Version"], b["Version"]),
        };
        if newer {
            best = Some(s);
        }
    }
    let best = best.with_context(|| format!("kernel {series} package not found in {index_url}"))?;
    let package = best["Package"].to_owned();
    let filename = best["Filename"];
    let base = Path::new(filename)
        .file_name()
        .with_context(|| format!("bad Filename {filename}"))?;
    let deb = cache.join(base);
    if deb.is_file() {
        eprintln!("vm-test: {} already downloaded", deb.display());
        return Ok((package, deb));
    }
    eprintln!(
        "vm-test: kernel {series}: {package} {} from {dist}",
        best["Version"]
    );
    let url = format!("{archive}/{filename}");
    let part = cache.join(format!("{}.download", base.to_string_lossy()));
    download(&url, &part)?;
    let got = sha256(&part)?;
    if got != best["SHA256"] {
        let _ = fs::remove_file(&part);
        bail!("{url} has SHA256 {got}, the index says {}", best["SHA256"]);
    }
    fs::rename(&part, &deb)?;
    Ok((package, deb))
}

// ---------------------------------------------------------------------------------------
// Modules.

/// A module's name as the kernel knows it: `-` and `_` are the same.
fn module_key(name: &str) -> String {
    name.replace('-', "_")
}

/// Module name → file, for every module under `dir`.
fn module_index(dir: &Path, index: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            module_index(&path, index)?;
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
            .iter()
            .find_map(|ext| name.strip_suffix(ext));
        if let Some(stem) = stem {
            index.insert(module_key(stem), path.clone());
        }
    }
    Ok(())
}

/// A module file's contents, decompressed.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    let Some(tool) = tool else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    Ok(checked(Command::new(tool).arg("-dc").arg(path))?.stdout)
}

/// The values of `key` in an ELF64 little-endian module's `.modinfo` section.
fn modinfo(module: &[u8], key: &str) -> Option<Vec<String>> {
    let bytes = |at: usize, n: usize| module.get(at..at.checked_add(n)?);
    let u16_at = |at| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?) as usize);
    let u32_at = |at| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?) as usize);
    let u64_at = |at| Some(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?) as usize);
    if bytes(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    // (name offset, file offset, size) of section i.
    let section = |i: usize| {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((u32_at(h)?, u64_at(h + 0x18)?, u64_at(h + 0x20)?))
    };
    let (_, strtab, _) = section(shstrndx)?;
    for i in 0..shnum {
        let (name, offset, size) = section(i)?;
        let name_bytes = module.get(strtab.checked_add(name)?..)?;
        let end = name_bytes.iter().position(|&b| b == 0)?;
        if &name_bytes[..end] != b".modinfo" {
            continue;
        }
        let prefix = format!("{key}=");
        return Some(
            bytes(offset, size)?
                .split(|&b| b == 0)
                .filter_map(|e| std::str::from_utf8(e).ok()?.strip_prefix(&prefix))
                .map(str::to_owned)
                .collect(),
        );
    }
    None
}

/// `wanted` and everything they depend on, each after its dependencies.
fn resolve_modules(wanted: &[&str], dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut index = HashMap::new();
    module_index(dir, &mut index)?;
    fn visit(
        name: &str,
        index: &HashMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        let key = module_key(name);
        if !seen.insert(key.clone()) {
            return Ok(());
        }
        let path = index
            .get(&key)
            .with_context(|| format!("module {name} not found in the kernel package"))?;
        let data = read_module(path)?;
        let depends = modinfo(&data, "depends")
            .with_context(|| format!("{} has no readable .modinfo", path.display()))?;
        for dep in depends
            .iter()
            .flat_map(|d| d.split(','))
            .filter(|d| !d.is_empty())
        {
            visit(dep, index, seen, out)?;
        }
        out.push((key, data));
        Ok(())
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for name in wanted {
        visit(name, &index, &mut seen, &mut out)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The initramfs.

enum Body {
    Dir,
    /// Contents read from this host file (following symlinks), with its permissions.
    Host(PathBuf),
    Data {
        bytes: Vec<u8>,
        mode: u32,
    },
    Symlink(String),
    CharDev {
        major: u32,
        minor: u32,
    },
}

/// A path inside the image (absolute) and what is there.
struct Entry {
    path: String,
    body: Body,
}

fn data(path: &str, mode: u32, bytes: impl Into<Vec<u8>>) -> Entry {
    Entry {
        path: path.to_owned(),
        body: Body::Data {
            bytes: bytes.into(),
            mode,
        },
    }
}

/// `/init`: mounts, modules, loopback, then each line of /etc/vm/commands
/// (`<name> <command…>`) between markers, then power off.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=@PATH@ HOME=/root RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /run/netns
echo "@@VM-KERNEL $(uname -r) cpus=$(nproc)"
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/vm/$m.ko" || echo "@@VM-MODULE-FAILED $m"
done < /etc/vm/modules
ip link set lo up
while IFS= read -r line; do
    [ -n "$line" ] || continue
    name=${line%% *}
    command=${line#* }
    start=$(cut -d' ' -f1 /proc/uptime)
    echo "@@VM-BEGIN $name"
    sh -c "$command" < /dev/null 2>&1
    rc=$?
    end=$(cut -d' ' -f1 /proc/uptime)
    echo "@@VM-END $name rc=$rc start=$start end=$end"
done < /etc/vm/commands
echo "@@VM-DONE"
sync
poweroff -f
"#;

/// Shared libraries `exe` loads (the dynamic loader included), from ldd; none if static.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>> {
    let out = capture(Command::new("ldd").arg(exe))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable"
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("ldd {}: {line}", exe.display());
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// Everything but the kernel's modules: busybox, /init, ip, nsenter, the executables, their
/// libraries, the command list.
fn common_entries(built: &Built) -> Result<Vec<Entry>> {
    let host = |name: &str| -> Result<PathBuf> {
        let p = which::which(name).with_context(|| format!("{name} not found on PATH"))?;
        fs::canonicalize(&p).with_context(|| format!("resolving {}", p.display()))
    };
    let busybox = host("busybox")?;
    let mut executables: Vec<(String, PathBuf)> = vec![
        ("/bin/busybox".into(), busybox),
        (VM_IP.into(), host("ip")?),
        (VM_NSENTER.into(), host("nsenter")?),
    ];
    // The executables at their host paths: tests find `shedder` beside their own directory.
    for path in std::iter::once(&built.shedder).chain(built.tests.values()) {
        let abs =
            fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
        executables.push((abs.to_string_lossy().into_owned(), abs));
    }
    let mut entries = vec![
        Entry {
            path: "/dev/console".into(),
            body: Body::CharDev { major: 5, minor: 1 },
        },
        Entry {
            path: "/dev/null".into(),
            body: Body::CharDev { major: 1, minor: 3 },
        },
    ];
    for d in [
        "/proc",
        "/sys",
        "/run",
        "/tmp",
        "/root",
        "/dev",
        "/var",
        "/etc",
        "/lib/modules/vm",
    ] {
        entries.push(Entry {
            path: d.into(),
            body: Body::Dir,
        });
    }
    entries.push(Entry {
        path: "/var/run".into(),
        body: Body::Symlink("../run".into()),
    });
    entries.push(data("/init", 0o755, INIT.replace("@PATH@", VM_PATH)));
    entries.push(data(
        "/etc/passwd",
        0o644,
        "root:x:0:0:root:/root:/bin/sh\n",
    ));
    entries.push(data("/etc/group", 0o644, "root:x:0:\n"));
    let mut libraries = BTreeSet::new();
    for (_, exe) in &executables {
        libraries.extend(shared_libraries(exe)?);
    }
    for (path, exe) in executables {
        entries.push(Entry {
            path,
            body: Body::Host(exe),
        });
    }
    for lib in libraries {
        entries.push(Entry {
            path: lib.to_string_lossy().into_owned(),
            body: Body::Host(lib),
        });
    }
    let mut commands = String::new();
    for check in CHECKS {
        let exe = fs::canonicalize(&built.tests[check.test])?;
        commands.push_str(&format!(
            "{} {} {}\n",
            check.name,
            exe.display(),
            check.args.join(" ")
        ));
    }
    entries.push(data("/etc/vm/commands", 0o644, commands));
    Ok(entries)
}

/// A `newc` cpio archive being written: every entry owned by root, parents made on the way.
struct Cpio<W: Write> {
    out: W,
    written: u64,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl<W: Write> Cpio<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            ino: 0,
            dirs: BTreeSet::new(),
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }

    /// One record; `name` is relative (no leading `/`).
    fn record(&mut self, name: &str, mode: u32, rdev: (u32, u32), body: &[u8]) -> io::Result<()> {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            body.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        let mut header = String::from("070701");
        for f in fields {
            header.push_str(&format!("{f:08X}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(body)?;
        self.pad()
    }

    /// The directories above `path`, where not yet written.
    fn parents(&mut self, path: &str) -> io::Result<()> {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.dirs.insert(prefix.clone()) {
                let name = prefix.clone();
                self.record(&name, 0o040755, (0, 0), &[])?;
            }
        }
        Ok(())
    }

    fn entry(&mut self, entry: &Entry) -> Result<()> {
        let name = entry.path.trim_start_matches('/').to_owned();
        self.parents(&entry.path)?;
        match &entry.body {
            Body::Dir => {
                if self.dirs.insert(name.clone()) {
                    self.record(&name, 0o040755, (0, 0), &[])?;
                }
            }
            Body::Host(path) => {
                let bytes =
                    fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let perm = fs::metadata(path)?.permissions().mode() & 0o7777;
                self.record(&name, 0o100000 | perm, (0, 0), &bytes)?;
            }
            Body::Data { bytes, mode } => self.record(&name, 0o100000 | mode, (0, 0), bytes)?,
            Body::Symlink(target) => self.record(&name, 0o120777, (0, 0), target.as_bytes())?,
            Body::CharDev { major, minor } => {
                self.record(&name, 0o020600, (*major, *minor), &[])?
            }
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<W> {
        self.record("TRAILER!!!", 0, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

fn write_initramfs(path: &Path, common: &[Entry], kernel: &Prepared) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut cpio = Cpio::new(BufWriter::new(file));
    for entry in common {
        cpio.entry(entry)
            .with_context(|| format!("adding {} to {}", entry.path, path.display()))?;
    }
    let mut order = String::new();
    for (name, bytes) in &kernel.modules {
        cpio.entry(&data(
            &format!("/lib/modules/vm/{name}.ko"),
            0o644,
            bytes.clone(),
        ))?;
        order.push_str(name);
        order.push('\n');
    }
    cpio.entry(&data("/etc/vm/modules", 0o644, order))?;
    cpio.finish()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Booting.

#[derive(Clone, Copy, PartialEq)]
enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// KVM if /dev/kvm opens read-write, answers KVM_GET_API_VERSION with 12, and the CPU
    /// has hardware virtualization (VMX or SVM). Without it, a /dev/kvm can still exist
    /// (e.g. kvm_pvm, which runs only kernels built as PVM guests), but a stock kernel
    /// cannot boot on it.
    fn detect() -> Self {
        const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
        let api = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            // SAFETY: an ioctl without arguments on a file descriptor we own.
            .is_ok_and(|f| unsafe { libc::ioctl(f.as_raw_fd(), KVM_GET_API_VERSION, 0) } == 12);
        let hardware = fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
            c.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        });
        let why = match (api, hardware) {
            (true, true) => {
                eprintln!("vm-test: /dev/kvm is usable: VMs run with -enable-kvm -cpu host");
                return Self::Kvm;
            }
            (false, _) => "/dev/kvm is missing or does not answer KVM_GET_API_VERSION",
            (true, false) => {
                "/dev/kvm exists but the CPU has no VMX/SVM (a paravirtual KVM such as kvm_pvm \
                 cannot boot stock kernels)"
            }
        };
        eprintln!("vm-test: {why}: VMs run with -accel tcg, emulated (much slower)");
        Self::Tcg
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Kvm => &["-enable-kvm", "-cpu", "host"],
            Self::Tcg => &["-accel", "tcg", "-cpu", "max"],
        }
    }

    /// Seconds a VM may take by default.
    fn default_timeout(self) -> u64 {
        match self {
            Self::Kvm => 900,
            Self::Tcg => 3600,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            Self::Tcg => "TCG",
        }
    }
}

enum Outcome {
    Pass,
    Fail(i32),
    /// No result: why.
    NoResult(String),
    /// Failed on a kernel older than the feature needs (see [`Check::since`]): what it needs.
    NeedsNewer(String),
}

struct CheckResult {
    name: &'static str,
    outcome: Outcome,
    secs: Option<f64>,
    /// The check's output (for the failure excerpt).
    output: Vec<String>,
}

struct Row {
    kernel: String,
    how: String,
    log: Option<PathBuf>,
    /// Kernel options the checks rely on that this kernel lacks, module load failures, how
    /// the VM ended when it did not end by itself.
    notes: Vec<String>,
    results: Vec<CheckResult>,
    secs: f64,
}

impl Row {
    fn unavailable(series: &str, why: String) -> Self {
        Self {
            kernel: series.to_owned(),
            how: "not booted".into(),
            log: None,
            notes: vec![why.clone()],
            results: CHECKS
                .iter()
                .map(|c| CheckResult {
                    name: c.name,
                    outcome: Outcome::NoResult("kernel not available".into()),
                    secs: None,
                    output: Vec::new(),
                })
                .collect(),
            secs: 0.0,
        }
    }
}

fn boot_and_check(
    kernel: &Prepared,
    common: &[Entry],
    images: &Path,
    vm_dir: &Path,
    accel: Accel,
    timeout: Duration,
    keep: bool,
) -> Result<Row> {
    let start = Instant::now();
    let image = images.join(format!("{}.cpio", kernel.release));
    write_initramfs(&image, common, kernel)?;
    let size = fs::metadata(&image)?.len();
    eprintln!(
        "vm-test: {} ({:.0} MiB, {} modules)",
        image.display(),
        size as f64 / (1 << 20) as f64,
        kernel.modules.len()
    );
    let log_path = vm_dir.join(format!("{}.log", kernel.release));
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;

    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(accel.args())
        .args([
            "-m",
            &VM_MEMORY_MB.to_string(),
            "-smp",
            &VM_CPUS.to_string(),
        ])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&image)
        .args(["-append", VM_APPEND])
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("==> {}", show(&qemu));
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting `{}`", show(&qemu)))?;

    // Serial console and qemu's own messages, line by line, to the log and the terminal.
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<thread::JoinHandle<()>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                if tx.send(printable(&String::from_utf8_lossy(&buf))).is_err() {
                    break;
                }
                buf.clear();
            }
        })
    })
    .collect();
    drop(tx);

    let tag = format!("[{}]", kernel.series);
    let deadline = start + timeout;
    let mut lines = Vec::new();
    let mut timed_out = false;
    let mut echo = Echo::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                echo.line(&tag, &line);
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    let status = wait_until(
        &mut child,
        if timed_out { Instant::now() } else { deadline },
    )?;
    for r in readers {
        let _ = r.join();
    }
    // Whatever was still buffered.
    for line in rx.try_iter() {
        writeln!(log, "{line}")?;
        lines.push(line);
    }
    log.flush()?;
    if !keep {
        let _ = fs::remove_file(&image);
    }

    let mut notes: Vec<String> = kernel
        .missing_options
        .iter()
        .map(|o| format!("{o} is not set"))
        .collect();
    for line in &lines {
        if let Some(m) = line.split("@@VM-MODULE-FAILED ").nth(1) {
            notes.push(format!("insmod {m} failed"));
        }
    }
    let done = lines.iter().any(|l| l.contains("@@VM-DONE"));
    let ended = if timed_out {
        format!("timed out after {} s (qemu killed)", timeout.as_secs())
    } else if done {
        String::new()
    } else {
        format!(
            "the VM stopped before running every check (qemu {}; see the log for a panic)",
            status.map_or_else(|| "killed".to_owned(), |s| s.to_string())
        )
    };
    if !ended.is_empty() {
        notes.push(ended.clone());
    }
    let results = CHECKS
        .iter()
        .map(|c| parse_check(c, &lines, &ended))
        .collect();
    Ok(Row {
        kernel: kernel.release.clone(),
        how: format!("VM, {}, {}", accel.name(), kernel.package),
        log: Some(log_path),
        notes,
        results,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// How much of the console goes to the terminal: everything up to [`Echo::LIMIT`] lines per
/// check (a rejected program's verifier log runs to thousands), then only the markers and
/// libtest's summary lines; the log keeps everything.
#[derive(Default)]
struct Echo {
    lines: usize,
}

impl Echo {
    const LIMIT: usize = 60;

    fn line(&mut self, tag: &str, line: &str) {
        if line.contains("@@VM-BEGIN ") {
            self.lines = 0;
        }
        self.lines += 1;
        let summary = line.contains("@@VM") || line.starts_with("test ");
        if self.lines <= Self::LIMIT || summary {
            eprintln!("{tag} {line}");
        } else if self.lines == Self::LIMIT + 1 {
            eprintln!("{tag} [… more output in the log; only markers and results from here]");
        }
    }
}

/// A console line without its line end and terminal control sequences (SeaBIOS clears the
/// screen, which would clear the terminal of whoever runs this).
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            // An escape sequence: CSI (`ESC [`, parameters, a final byte in @..~), else
            // two characters (e.g. `ESC c`, a reset).
            '\x1b' => {
                if chars.next() == Some('[') {
                    while chars.next().is_some_and(|c| !('@'..='~').contains(&c)) {}
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A check's result from the serial console's markers.
fn parse_check(check: &Check, lines: &[String], ended: &str) -> CheckResult {
    let begin = format!("@@VM-BEGIN {}", check.name);
    let end = format!("@@VM-END {} ", check.name);
    let Some(first) = lines.iter().position(|l| l.ends_with(&begin)) else {
        return CheckResult {
            name: check.name,
            outcome: Outcome::NoResult(format!("never started; {ended}")),
            secs: None,
            output: Vec::new(),
        };
    };
    let rest = &lines[first + 1..];
    let Some(last) = rest.iter().position(|l| l.contains(&end)) else {
        return CheckResult {
            name: check.name,
            outcome: Outcome::NoResult(format!("did not finish; {ended}")),
            secs: None,
            output: rest.to_vec(),
        };
    };
    let marker = &rest[last];
    let field = |key: &str| {
        marker
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_owned)
    };
    let rc: Option<i32> = field("rc=").and_then(|v| v.parse().ok());
    let secs = match (field("start="), field("end=")) {
        (Some(s), Some(e)) => e
            .parse::<f64>()
            .ok()
            .zip(s.parse::<f64>().ok())
            .map(|(e, s)| e - s),
        _ => None,
    };
    CheckResult {
        name: check.name,
        outcome: match rc {
            Some(0) => Outcome::Pass,
            Some(rc) => Outcome::Fail(rc),
            None => Outcome::NoResult(format!("unreadable end marker `{marker}`")),
        },
        secs,
        output: rest[..last].to_vec(),
    }
}

// ---------------------------------------------------------------------------------------
// The host's own kernel.

fn host_row(built: &Built, vm_dir: &Path, timeout: Duration) -> Result<Row> {
    let start = Instant::now();
    let release = stdout(&mut cmd("uname", ["-r"]))?.trim().to_owned();
    let log_path = vm_dir.join(format!("host-{release}.log"));
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut results = Vec::new();
    for check in CHECKS {
        let exe = &built.tests[check.test];
        writeln!(log, "@@HOST-BEGIN {}", check.name)?;
        log.flush()?;
        let from = log.stream_position()?;
        let mut c = Command::new(exe);
        c.args(check.args)
            .current_dir(root())
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?);
        eprintln!("==> {}", show(&c));
        let t = Instant::now();
        let mut child = c
            .spawn()
            .with_context(|| format!("starting `{}`", show(&c)))?;
        let status = wait_until(&mut child, t + timeout)?;
        let secs = t.elapsed().as_secs_f64();
        log.seek(SeekFrom::End(0))?;
        let to = log.stream_position()?;
        let outcome = match status {
            Some(s) if s.success() => Outcome::Pass,
            Some(s) => Outcome::Fail(s.code().unwrap_or(-1)),
            None => Outcome::NoResult(format!("timed out after {} s (killed)", timeout.as_secs())),
        };
        let rc = match &outcome {
            Outcome::Pass => "0".to_owned(),
            Outcome::Fail(rc) => rc.to_string(),
            Outcome::NoResult(_) | Outcome::NeedsNewer(_) => "timeout".to_owned(),
        };
        writeln!(log, "@@HOST-END {} rc={rc} secs={secs:.2}", check.name)?;
        let mut output = String::new();
        let mut reader = File::open(&log_path)?;
        reader.seek(SeekFrom::Start(from))?;
        reader.take(to - from).read_to_string(&mut output)?;
        eprintln!(
            "[host] {} {} ({secs:.1} s)",
            check.name,
            if matches!(outcome, Outcome::Pass) {
                "passed"
            } else {
                "FAILED"
            }
        );
        results.push(CheckResult {
            name: check.name,
            outcome,
            secs: Some(secs),
            output: output.lines().map(str::to_owned).collect(),
        });
    }
    Ok(Row {
        kernel: release,
        how: "host, native".into(),
        log: Some(log_path),
        notes: Vec::new(),
        results,
        secs: start.elapsed().as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------------------
// The report.

/// The part of a failed check's output that says why: the panic message's first lines, and
/// for each distinct verifier rejection (a log ends with `processed N insns …`) the program,
/// the failing instruction and the message, with how often it occurred; without either,
/// libtest's failure section or the last lines. Very long lines are shortened.
fn excerpt(output: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(i) = output.iter().position(|l| l.contains("panicked at")) {
        out.extend(output[i..output.len().min(i + 3)].iter().cloned());
    }
    // A verifier log inside a Debug-printed error is one line with `\n` escapes.
    let lines: Vec<&str> = output.iter().flat_map(|l| l.split("\\n")).collect();
    let mut rejections: Vec<(String, usize)> = Vec::new();
    let mut program = String::new();
    for (i, &line) in lines.iter().enumerate() {
        if let Some(rest) = line.split("verifier rejected ").nth(1) {
            program = rest.split(':').next().unwrap_or(rest).to_owned();
        } else if let Some(rest) = line.split("Verifier { program: ").nth(1) {
            program = rest.split(',').next().unwrap_or(rest).to_owned();
        }
        if !(line.starts_with("processed ") && line.contains(" insns ")) {
            continue;
        }
        let mut end = i;
        while end > 0
            && (lines[end - 1].starts_with("verification time")
                || lines[end - 1].starts_with("stack depth"))
        {
            end -= 1;
        }
        let message = format!(
            "{program}: {}",
            lines[end.saturating_sub(2)..end].join("  /  ")
        );
        match rejections.iter_mut().find(|(m, _)| *m == message) {
            Some((_, n)) => *n += 1,
            None => rejections.push((message, 1)),
        }
    }
    for (message, n) in &rejections {
        out.push(format!("verifier ({n}x): {message}"));
    }
    if out.is_empty() {
        let from = output
            .iter()
            .position(|l| l.starts_with("---- "))
            .unwrap_or(output.len().saturating_sub(25));
        out.extend(output[from..].iter().take(40).cloned());
    }
    out.into_iter()
        .map(|l| {
            let chars: Vec<char> = l.chars().collect();
            if chars.len() <= 1000 {
                l
            } else {
                let head: String = chars[..300].iter().collect();
                let tail: String = chars[chars.len() - 600..].iter().collect();
                format!("{head} [… {} characters …] {tail}", chars.len() - 900)
            }
        })
        .collect()
}

/// A result's state and reason, as printed.
fn state(outcome: &Outcome) -> (String, String) {
    match outcome {
        Outcome::Pass => ("pass".to_owned(), String::new()),
        Outcome::Fail(rc) => ("FAIL".to_owned(), format!("exit status {rc}")),
        Outcome::NoResult(why) => ("NO RESULT".to_owned(), why.clone()),
        Outcome::NeedsNewer(what) => ("n/a".to_owned(), what.clone()),
    }
}

/// `major.minor` of a release (`6.1.0-57-amd64` → (6, 1)).
fn series_of(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// A failed check on a kernel older than its feature needs becomes "needs …".
fn mark_needs_newer(row: &mut Row) {
    let Some(kernel) = series_of(&row.kernel) else {
        return;
    };
    for r in &mut row.results {
        let Some(check) = CHECKS.iter().find(|c| c.name == r.name) else {
            continue;
        };
        if let Some((since, what, refusal)) = check.since
            && series_of(since).is_some_and(|s| kernel < s)
            && matches!(r.outcome, Outcome::Fail(_))
            && r.output.iter().any(|l| l.contains(refusal))
        {
            r.outcome = Outcome::NeedsNewer(format!("needs Linux {since}: {what}"));
        }
    }
}

/// Verifier figures per kernel series: program (`+log` with the kernel debug log) → count.
type Figures = BTreeMap<String, BTreeMap<String, u64>>;

fn read_baseline() -> Result<Figures> {
    let path = root().join(VERIFIER_BASELINE);
    if !path.exists() {
        return Ok(Figures::new());
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    serde_json::from_value(v["verified_insns"].clone())
        .with_context(|| format!("{}: no `verified_insns` object", path.display()))
}

/// The `@@VERIFIER` report of a row's verifier check: program → count, or why none.
fn verifier_figures(row: &Row) -> std::result::Result<BTreeMap<String, u64>, String> {
    let r = row
        .results
        .iter()
        .find(|r| r.name == "verifier")
        .ok_or("no verifier check")?;
    let line = r
        .output
        .iter()
        .find_map(|l| l.split("@@VERIFIER ").nth(1))
        .ok_or("no @@VERIFIER line")?;
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("unreadable report: {e}"))?;
    let mut out = BTreeMap::new();
    for (key, suffix) in [("programs", ""), ("programs_with_kernel_log", "+log")] {
        for p in v[key].as_array().into_iter().flatten() {
            if let (Some(name), Some(n)) = (p[0].as_str(), p[1].as_u64()) {
                out.insert(format!("{name}{suffix}"), n);
            }
        }
    }
    if let Some(e) = v["kernel_log_error"].as_str() {
        let reason = e.lines().next().unwrap_or(e);
        out.insert(format!("note: with the kernel debug log: {reason}"), 0);
    }
    if let Some(e) = v["error"].as_str() {
        let reason = e.lines().next().unwrap_or(e);
        if out.is_empty() {
            return Err(reason.to_owned());
        }
        out.insert(format!("error: {reason}"), 0);
    }
    Ok(out)
}

struct VerifierTable {
    markdown: String,
    figures: Figures,
    regressions: Vec<String>,
}

fn verifier_table(rows: &[Row], baseline: &Figures) -> VerifierTable {
    let mut figures = Figures::new();
    let mut regressions = Vec::new();
    let mut md = String::from(
        "| kernel | program | instructions processed | baseline | × baseline |\n|---|---|---:|---:|---:|\n",
    );
    for row in rows {
        let series =
            series_of(&row.kernel).map_or_else(|| row.kernel.clone(), |(a, b)| format!("{a}.{b}"));
        match verifier_figures(row) {
            Err(why) => md.push_str(&format!("| {} | — | {why} | | |\n", row.kernel)),
            Ok(found) => {
                for (program, &n) in &found {
                    if program.starts_with("error: ") || program.starts_with("note: ") {
                        md.push_str(&format!("| {} | {program} | | | |\n", row.kernel));
                        continue;
                    }
                    let base = baseline.get(&series).and_then(|b| b.get(program)).copied();
                    let ratio = base.filter(|&b| b > 0).map(|b| n as f64 / b as f64);
                    if let (Some(r), Some(b)) = (ratio, base)
                        && r > VERIFIER_REGRESSION
                    {
                        regressions.push(format!("{program} on {series}: {n} vs {b}"));
                    }
                    md.push_str(&format!(
                        "| {} | {program} | {n} | {} | {} |\n",
                        row.kernel,
                        base.map_or("—".into(), |b| b.to_string()),
                        ratio.map_or("—".into(), |r| format!("{r:.2}×"))
                    ));
                }
                let kept = found
                    .into_iter()
                    .filter(|(p, _)| !p.starts_with("error: ") && !p.starts_with("note: "))
                    .collect();
                figures.insert(series, kept);
            }
        }
    }
    VerifierTable {
        markdown: md,
        figures,
        regressions,
    }
}

/// `DIR/kernels.md` and `DIR/kernels.json`.
fn write_docs(dir: &Path, rows: &[Row], verifier: &VerifierTable, total: Duration) -> Result<()> {
    let date = stdout(&mut cmd("date", ["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    let mut md = format!(
        "# Kernels\n\nLatest `cargo xtask vm-test --out docs` run: {}, in {:.0} min, on {}. \
         VMs: Debian kernel packages under `qemu-system-x86_64` ({}), {} MiB, {} vCPUs, an \
         initramfs built by the xtask; the host row runs natively. The minimum kernel \
         documented in the README is the oldest row where every counted check passes.\n\n",
        date.trim(),
        total.as_secs_f64() / 60.0,
        stdout(&mut cmd("uname", ["-srm"]))?.trim(),
        rows.first().map_or("", |r| r.how.as_str()),
        VM_MEMORY_MB,
        VM_CPUS,
    );
    md.push_str("| kernel | how |");
    for c in CHECKS {
        md.push_str(&format!(" {} |", c.name));
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(CHECKS.len()));
    md.push('\n');
    for row in rows {
        md.push_str(&format!("| {} | {} |", row.kernel, row.how));
        for c in CHECKS {
            let cell = row.results.iter().find(|r| r.name == c.name).map_or_else(
                || "—".to_owned(),
                |r| {
                    let (state, why) = state(&r.outcome);
                    let secs = r.secs.map_or(String::new(), |s| format!(" ({s:.0} s)"));
                    if why.is_empty() {
                        format!("{state}{secs}")
                    } else {
                        format!("{state}{secs}: {why}")
                    }
                },
            );
            md.push_str(&format!(" {} |", cell.replace('|', "\\|")));
        }
        md.push('\n');
    }
    md.push_str(&format!(
        "\n*n/a* = the check failed on a kernel older than its feature needs, as expected: \
         shedder refuses that feature there with a message saying so (see the README's \
         Kernels section).\n\n## Verifier complexity\n\nInstructions the verifier processed \
         per program (`+log`: built with `daemon.kernel_debug_log`), against the previous \
         committed run ({VERIFIER_BASELINE}); a program over {VERIFIER_REGRESSION}× its \
         baseline fails the run.\n\n{}",
        verifier.markdown
    ));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let md_path = dir.join("kernels.md");
    fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let json = serde_json::json!({ "date": date.trim(), "verified_insns": verifier.figures });
    let json_path = dir.join("kernels.json");
    fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    eprintln!(
        "vm-test: wrote {} and {}",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}

fn report(rows: &[Row], total: Duration) {
    let name_width = CHECKS.iter().map(|c| c.name.len()).max().unwrap_or(0);
    eprintln!("\n=== vm-test results");
    for row in rows {
        eprintln!("\n{} ({}) {:.1} s", row.kernel, row.how, row.secs);
        for r in &row.results {
            let (state, why) = state(&r.outcome);
            let secs = r
                .secs
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"));
            let line = format!("  {:<name_width$}  {state:<9} {secs:>8}  {why}", r.name);
            eprintln!("{}", line.trim_end());
        }
        for note in &row.notes {
            eprintln!("  note: {note}");
        }
        if let Some(log) = &row.log {
            eprintln!("  log: {}", log.display());
        }
    }
    for row in rows {
        for r in &row.results {
            if matches!(r.outcome, Outcome::Fail(_)) && !r.output.is_empty() {
                eprintln!("\n--- {} on {}:", r.name, row.kernel);
                for line in excerpt(&r.output) {
                    eprintln!("    {line}");
                }
            }
        }
    }
    eprintln!("\nvm-test: total wall time {:.1} s", total.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_records_are_aligned_and_parents_come_first() {
        let mut cpio = Cpio::new(Vec::new());
        cpio.entry(&data("/a/b/c", 0o644, b"hello".to_vec()))
            .unwrap();
        let out = cpio.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        let text = String::from_utf8_lossy(&out);
        let a = text.find("a\0").unwrap();
        let ab = text.find("a/b\0").unwrap();
        let abc = text.find("a/b/c\0").unwrap();
        assert!(a < ab && ab < abc);
        assert!(text.contains("hello"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!\0"));
        // The file record: mode 0100644, size 5, name size 6.
        let header = &text[abc - 110..abc];
        assert!(header.starts_with("070701"));
        assert_eq!(&header[14..22], "000081A4");
        assert_eq!(&header[54..62], "00000005");
        assert_eq!(&header[94..102], "00000006");
    }

    #[test]
    fn markers_give_outcome_and_duration() {
        let lines: Vec<String> = [
            "boot noise",
            "@@VM-BEGIN fixtures::fixture_table",
            "running 1 test",
            "@@VM-END fixtures::fixture_table rc=0 start=1.50 end=4.00",
            "@@VM-BEGIN netns::native_xdp",
            "---- native_xdp stdout ----",
            "@@VM-END netns::native_xdp rc=101 start=4.10 end=5.10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = parse_check(&CHECKS[0], &lines, "");
        assert!(matches!(r.outcome, Outcome::Pass));
        assert!((r.secs.unwrap() - 2.5).abs() < 1e-9);
        let r = parse_check(&CHECKS[1], &lines, "");
        assert!(matches!(r.outcome, Outcome::Fail(101)));
        assert_eq!(r.output, ["---- native_xdp stdout ----"]);
        let r = parse_check(&CHECKS[2], &lines, "timed out");
        assert!(matches!(r.outcome, Outcome::NoResult(_)));
    }

    #[test]
    fn console_lines_lose_control_sequences() {
        assert_eq!(
            printable("\x1bc\x1b[?7l\x1b[2J@@VM-KERNEL 6.1\r\n"),
            "@@VM-KERNEL 6.1"
        );
        assert_eq!(printable("a\tb\x1b[0mc"), "a\tbc");
    }

    #[test]
    fn excerpt_names_each_verifier_rejection_once() {
        let output: Vec<String> = [
            "thread 't' panicked at tests/tests/x.rs:1:5:",
            "2 of 2 runs failed:",
            "[Tc] a:",
            "    loading: the kernel verifier rejected `shedder_xdp`: Invalid argument",
            "3482: (0f) r0 += r9",
            "value -9 makes map_value pointer be out of bounds",
            "verification time 52253 usec",
            "stack depth 272+0",
            "processed 622 insns (limit 1000000) max_states_per_insn 1",
            r#"load: Verifier { program: "shedder_tc", source: Os, log: "0: R1=ctx\n3482: (0f) r0 += r9\nvalue -9 makes map_value pointer be out of bounds\nprocessed 622 insns (limit 1000000)\n" }"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let e = excerpt(&output);
        assert_eq!(e[0], output[0]);
        assert_eq!(
            e[3],
            "verifier (1x): `shedder_xdp`: 3482: (0f) r0 += r9  /  value -9 makes map_value \
             pointer be out of bounds"
        );
        assert!(
            e[4].starts_with("verifier (1x): \"shedder_tc\": 3482"),
            "{e:?}"
        );
    }

    #[test]
    fn packages_index_stanzas() {
        let text = "Package: a\nVersion: 1\nDescription: x\n more\n\nPackage: b\nVersion: 2\n";
        let s = stanzas(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1]["Version"], "2");
    }

    fn row(kernel: &str, results: Vec<CheckResult>) -> Row {
        Row {
            kernel: kernel.into(),
            how: "test".into(),
            log: None,
            notes: Vec::new(),
            results,
            secs: 0.0,
        }
    }

    fn result(name: &'static str, outcome: Outcome, output: &[&str]) -> CheckResult {
        CheckResult {
            name,
            outcome,
            secs: Some(1.0),
            output: output.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn series_and_features_that_need_a_newer_kernel() {
        assert_eq!(series_of("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(series_of("6.12.95+deb12-amd64"), Some((6, 12)));
        assert_eq!(series_of("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(series_of("6.6"), Some((6, 6)));
        // tc_ingress failing on 6.1 is "needs 6.6"; on 6.12 a failure counts.
        for (kernel, expect_na) in [("6.1.0-57-amd64", true), ("6.12.95+deb12-amd64", false)] {
            let mut r = row(
                kernel,
                vec![
                    result(
                        "netns::tc_ingress",
                        Outcome::Fail(101),
                        &["attach Tc: pinning under veth0: this kernel has no tcx (Linux 6.6)"],
                    ),
                    result(
                        "netns::tc_ingress",
                        Outcome::Fail(101),
                        &["some other fault"],
                    ),
                    result("netns::native_xdp", Outcome::Fail(101), &[]),
                ],
            );
            mark_needs_newer(&mut r);
            assert_eq!(
                matches!(r.results[0].outcome, Outcome::NeedsNewer(_)),
                expect_na,
                "{kernel}"
            );
            // A failure that is not shedder's refusal counts, also on an old kernel.
            assert!(matches!(r.results[1].outcome, Outcome::Fail(101)));
            assert!(matches!(r.results[2].outcome, Outcome::Fail(101)));
        }
    }

    #[test]
    fn verifier_figures_and_regressions() {
        let line = r#"@@VERIFIER {"kernel":"6.1.0-57-amd64","programs":[["shedder_xdp",132435],["shedder_tc",120968]],"programs_with_kernel_log":[],"error":"with the kernel debug log: the kernel verifier rejected `shedder_xdp`: too complex"}"#;
        let r = row(
            "6.1.0-57-amd64",
            vec![result("verifier", Outcome::Fail(1), &["noise", line])],
        );
        let found = verifier_figures(&r).unwrap();
        assert_eq!(found["shedder_xdp"], 132435);
        assert!(
            found
                .keys()
                .any(|k| k.starts_with("error: with the kernel debug log"))
        );
        let mut baseline = Figures::new();
        baseline.insert(
            "6.1".into(),
            [
                ("shedder_xdp".to_string(), 80000),
                ("shedder_tc".to_string(), 120000),
            ]
            .into(),
        );
        let t = verifier_table(&[r], &baseline);
        // 132,435 / 80,000 = 1.66 > 1.5: a regression; 120,968 / 120,000 is not.
        assert_eq!(t.regressions.len(), 1, "{:?}", t.regressions);
        assert!(t.regressions[0].starts_with("shedder_xdp on 6.1"));
        assert!(!t.figures["6.1"].keys().any(|k| k.starts_with("error")));
        // A debug log too complex for the kernel is a note, not a figure.
        let line = r#"@@VERIFIER {"kernel":"6.1.0","programs":[["shedder_xdp",132435]],"programs_with_kernel_log":[],"error":null,"kernel_log_error":"too complex"}"#;
        let r = row("6.1.0", vec![result("verifier", Outcome::Pass, &[line])]);
        let t = verifier_table(&[r], &Figures::new());
        assert_eq!(t.figures["6.1"].len(), 1);
        assert!(
            t.markdown
                .contains("note: with the kernel debug log: too complex")
        );
        // No report at all is said, not guessed.
        let none = row(
            "6.12.95",
            vec![result("verifier", Outcome::Fail(1), &["boom"])],
        );
        assert!(verifier_figures(&none).is_err());
    }
}
