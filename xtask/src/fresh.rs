//! `cargo xtask fresh-check`: the README's two commands on a fresh Debian machine.
//!
//! A minimal Debian root of the host's own suite, from the host's mirror (debootstrap
//! `--variant=minbase`), plus only what a fresh machine of this kind already has
//! ([`FRESH_PACKAGES`]), is cached under `~/.cache/shedder/fresh-root/<suite>`. Each run
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

use std::{
    fs::{self, OpenOptions},
    io::{self, Read as _, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::{fs::symlink, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};

use crate::{
    cmd::{capture, cmd, home, mount, require_root, root, run, show, stdout, target_dir},
    setup::{self, Probe, dep},
    test::{Outcome, Record, summarize, timed},
};

/// What a fresh machine of this kind has besides a minimal Debian. Nothing more: the rest
/// must come from `cargo xtask setup`. Installed without Recommends, the stricter case.
const FRESH_PACKAGES: &[&str] = &[
    "build-essential",
    "git",
    "ca-certificates",
    "curl",
    "iproute2",
    "python3",
    "python3-pip",
];

const HOST_DEPS: &[setup::Dep] = &[dep(
    "debootstrap",
    Probe::Runs("debootstrap", &["--version"]),
    "debootstrap",
)];

/// The registries (crates.io, Debian) are reached through these where they are set.
const PROXY_VARS: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// rustup's proxies: links to the `rustup` binary, which acts by the name it is run as.
const RUSTUP_PROXIES: &[&str] = &[
    "cargo",
    "rustc",
    "rustdoc",
    "cargo-clippy",
    "clippy-driver",
    "cargo-fmt",
    "rustfmt",
];

/// PATH inside the root: what `~/.cargo/env` and Debian's root profile give a login shell.
const ROOT_PATH: &str =
    "/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The clone of this checkout, inside the root.
const CLONE: &str = "/root/shedder";

/// Marks a finished cached root, with what it was built from (a change rebuilds it).
const STAMP: &str = ".shedder-fresh-root";

/// How many lines of a failed step's log the summary repeats.
const TAIL_LINES: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Readme {
    Test,
    Demo,
}

impl Readme {
    fn step(self) -> &'static str {
        match self {
            Self::Test => "cargo xtask test (in the root)",
            Self::Demo => "cargo xtask demo (in the root)",
        }
    }

    fn script(self) -> String {
        let sub = match self {
            Self::Test => "test",
            Self::Demo => "demo",
        };
        format!("cd {CLONE} && exec cargo xtask {sub}")
    }

    fn log(self) -> &'static str {
        match self {
            Self::Test => "test.log",
            Self::Demo => "demo.log",
        }
    }
    /// The line that starts the command's own summary in its output.
    fn summary_marker(self) -> &'static str {
        match self {
            Self::Test => "=== summary",
            Self::Demo => "== Summary",
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

// ---------------------------------------------------------------------------------------
// Ctrl-C: noted, forwarded to the running step, then everything is unmounted.

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------
// The host: its suite, mirror, proxies.

/// One suite of a `deb` source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AptSource {
    uri: String,
    suite: String,
    components: Vec<String>,
}

/// `VERSION_CODENAME` of an os-release file.
fn os_codename(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| {
        let v = l.strip_prefix("VERSION_CODENAME=")?;
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_owned())
    })
}

/// The `deb` lines of a one-line-style sources.list.
fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = words.collect();
        // `[arch=amd64 signed-by=…]` options may hold spaces.
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']'));
            rest.drain(..=end.unwrap_or(rest.len() - 1));
        }
        if let [uri, suite, components @ ..] = rest.as_slice() {
            out.push(AptSource {
                uri: uri.to_string(),
                suite: suite.to_string(),
                components: components.iter().map(|c| c.to_string()).collect(),
            });
        }
    }
    out
}

/// The `deb` suites of a deb822-style .sources file.
fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| -> Vec<String> {
            stanza
                .lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.split_whitespace().map(str::to_owned).collect())
                })
                .unwrap_or_default()
        };
        if !field("Types").iter().any(|t| t == "deb")
            || field("Enabled").first().is_some_and(|e| e == "no")
        {
            continue;
        }
        let components = field("Components");
        for uri in field("URIs") {
            for suite in field("Suites") {
                out.push(AptSource {
                    uri: uri.clone(),
                    suite,
                    components: components.clone(),
                });
            }
        }
    }
    out
}

/// The sources of the release `codename` (`bookworm`, `bookworm-updates`, …).
fn release_sources(all: &[AptSource], codename: &str) -> Vec<AptSource> {
    all.iter()
        .filter(|s| {
            s.suite == codename
                || s.suite
                    .strip_prefix(codename)
                    .is_some_and(|r| r.starts_with('-'))
        })
        .cloned()
        .collect()
}

fn sources_list(sources: &[AptSource]) -> String {
    sources
        .iter()
        .map(|s| format!("deb {} {} {}\n", s.uri, s.suite, s.components.join(" ")))
        .collect()
}

/// An apt configuration file that sets a proxy (`Acquire::http::Proxy "…";` and kin).
fn sets_proxy(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
        .any(|l| l.to_ascii_lowercase().contains("proxy"))
}

struct Host {
    suite: String,
    /// debootstrap's mirror: the URI of the host's source for `suite`.
    mirror: String,
    /// The host's sources of its release, for the root's sources.list.
    sources: Vec<AptSource>,
    /// Proxy variables, passed into the root.
    proxy_env: Vec<(String, String)>,
    /// apt configuration files that set a proxy, copied into the root.
    apt_proxy_files: Vec<PathBuf>,
    rustup_home: PathBuf,
    rustup: PathBuf,
}

fn read_host() -> Result<Host> {
    let os = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    let suite = os_codename(&os)
        .context("/etc/os-release has no VERSION_CODENAME: fresh-check needs a Debian host")?;
    let mut all = Vec::new();
    if let Ok(text) = fs::read_to_string("/etc/apt/sources.list") {
        all.extend(parse_one_line(&text));
    }
    let mut parts: Vec<PathBuf> = fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    parts.sort();
    for p in parts {
        // apt reads only these two kinds; others (e.g. `.disabled`) are not sources.
        let parse = match p.extension().and_then(|x| x.to_str()) {
            Some("list") => parse_one_line,
            Some("sources") => parse_deb822,
            _ => continue,
        };
        if let Ok(text) = fs::read_to_string(&p) {
            all.extend(parse(&text));
        }
    }
    let sources = release_sources(&all, &suite);
    let mirror = sources
        .iter()
        .find(|s| s.suite == suite)
        .map(|s| s.uri.clone())
        .with_context(|| {
            format!("no `deb` source for {suite} in /etc/apt/sources.list{{,.d/}}: no mirror")
        })?;
    let proxy_env = PROXY_VARS
        .iter()
        .filter_map(|&k| {
            let v = std::env::var(k).ok().filter(|v| !v.is_empty())?;
            Some((k.to_owned(), v))
        })
        .collect();
    let mut apt_files = vec![PathBuf::from("/etc/apt/apt.conf")];
    if let Ok(d) = fs::read_dir("/etc/apt/apt.conf.d") {
        apt_files.extend(d.filter_map(|e| e.ok().map(|e| e.path())));
    }
    let apt_proxy_files = apt_files
        .into_iter()
        .filter(|p| fs::read_to_string(p).is_ok_and(|t| sets_proxy(&t)))
        .collect();
    let rustup_home = match std::env::var_os("RUSTUP_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => home()?.join(".rustup"),
    };
    let rustup_home = fs::canonicalize(&rustup_home)
        .with_context(|| format!("the rustup home {} is missing", rustup_home.display()))?;
    let rustup = which::which("rustup")
        .context("`rustup` is not on PATH: fresh-check lends the host's rustup toolchains")?;
    Ok(Host {
        suite,
        mirror,
        sources,
        proxy_env,
        apt_proxy_files,
        rustup_home,
        rustup,
    })
}

// ---------------------------------------------------------------------------------------
// Mounts.

/// `\040` and the other octal escapes of /proc/self/mountinfo.
fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir`, in mountinfo order (a mount after the ones it sits on).
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn mounted_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    Ok(mounts_under(&info, dir))
}

/// Unmount everything under `dir`, the last mounted first; what resists is detached
/// lazily. An error if anything is still mounted there after that.
fn unmount_under(dir: &Path) -> Result<()> {
    for lazy in [false, true] {
        for point in mounted_under(dir)?.iter().rev() {
            let mut c = Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(point);
            let out = capture(&mut c)?;
            if !out.status.success() && lazy {
                eprintln!(
                    "fresh-check: `{}`: {}",
                    show(&c),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
    let left = mounted_under(dir)?;
    if !left.is_empty() {
        bail!(
            "still mounted under {}: {left:?} (see /proc/self/mountinfo)",
            dir.display()
        );
    }
    Ok(())
}

/// Delete `dir`, but only when nothing is mounted under it (a bind mount of /dev or of the
/// toolchains would otherwise be emptied through it).
fn remove_tree(dir: &Path) -> Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    let mounts = mounted_under(dir)?;
    if !mounts.is_empty() {
        bail!(
            "not deleting {}: still mounted under it: {mounts:?}",
            dir.display()
        );
    }
    fs::remove_dir_all(dir).with_context(|| format!("deleting {}", dir.display()))
}

/// What a chroot needs to run the tests: `/proc`, `/sys` (with the cgroup mounts below
/// it), `/dev` (with `/dev/pts` and `/dev/shm`), and a bpffs and tracefs of its own.
fn mount_pseudo_filesystems(root: &Path) -> Result<()> {
    mount(&["-t", "proc", "proc"], &root.join("proc"))?;
    mount(&["--rbind", "/sys"], &root.join("sys"))?;
    mount(&["--rbind", "/dev"], &root.join("dev"))?;
    // A bpffs instance of its own: pins made inside die with the run.
    mount(&["-t", "bpf", "bpf"], &root.join("sys/fs/bpf"))?;
    // sysfs automounts tracefs there on access (also in a bind of /sys), so a mount may
    // find one already there (EBUSY): that one does.
    let tracing = root.join("sys/kernel/tracing");
    if fs_magic(&tracing) == Some(TRACEFS_MAGIC) {
        return Ok(());
    }
    let mut c = Command::new("mount");
    c.args(["-t", "tracefs", "tracefs"]).arg(&tracing);
    let out = capture(&mut c)?;
    let magic = fs_magic(&tracing);
    if !out.status.success() && magic != Some(TRACEFS_MAGIC) {
        bail!(
            "`{}` failed ({}), and {} is not tracefs (f_type {magic:x?}): {}",
            show(&c),
            out.status,
            tracing.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

const TRACEFS_MAGIC: i64 = 0x74726163;

/// The type of the filesystem `path` is on (statfs's f_type).
fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a zeroed statfs is a valid out-parameter; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    (rc == 0).then_some(st.f_type as i64)
}

/// An overlay of `upper` over `lower` at `target`. `redirect_dir=on`: without it, renaming a
/// directory of the lower layer fails with EXDEV (rustup moves a component's directories
/// aside to remove it).
fn overlay(lower: &Path, upper: &str, work: &str, target: &Path) -> Result<()> {
    let options = format!(
        "lowerdir={},upperdir={upper},workdir={work},redirect_dir=on",
        lower.display()
    );
    mount(&["-t", "overlay", "overlay", "-o", &options], target)
}

/// This process's mounts from here on are its own: invisible to the host and gone when it
/// ends, whatever way it ends.
fn private_mount_namespace() -> Result<()> {
    // SAFETY: no other thread exists yet (unshare(CLONE_NEWNS) needs a single thread).
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        bail!(
            "unshare(CLONE_NEWNS): {} (fresh-check needs root with CAP_SYS_ADMIN)",
            io::Error::last_os_error()
        );
    }
    run(&mut cmd("mount", ["--make-rprivate", "/"]))
}

// ---------------------------------------------------------------------------------------
// Running things inside the root.

/// `script` by /bin/sh inside `root`, with a clean environment: a root login's, plus the
/// host's proxies.
fn in_root(root: &Path, host: &Host, script: &str) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root).args(["/bin/sh", "-c", script]).env_clear();
    let term = std::env::var("TERM").unwrap_or_else(|_| "dumb".into());
    for (k, v) in [
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("PATH", ROOT_PATH),
        ("LANG", "C.UTF-8"),
        ("TERM", &term),
    ] {
        c.env(k, v);
    }
    c.envs(host.proxy_env.iter().map(|(k, v)| (k, v)));
    c
}

/// How long output is still read after the command exited: processes it left behind may
/// hold the pipe open (they are stopped when the root is unmounted).
const LINGER: Duration = Duration::from_secs(10);

/// Forward Ctrl-C to process group `group`, then SIGKILL it if it is still there a minute
/// later. `asked` is when SIGINT was sent.
fn forward_interrupt(group: libc::pid_t, asked: &mut Option<Instant>, shown: &str) {
    if !interrupted() {
        return;
    }
    match asked {
        None => {
            eprintln!("fresh-check: interrupted; stopping `{shown}`");
            // SAFETY: signals the process group `tee` created for its command.
            unsafe { libc::kill(-group, libc::SIGINT) };
            *asked = Some(Instant::now());
        }
        Some(t) if t.elapsed() > Duration::from_secs(60) => {
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        Some(_) => {}
    }
}

/// Run `c` with its output going both to the terminal and to `log`. It gets a process
/// group of its own, to which Ctrl-C is forwarded, so this process lives on to unmount.
fn tee(mut c: Command, log: &Path, append: bool) -> Result<()> {
    let shown = show(&c);
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(file, "==> {shown}")?;
    eprintln!("==> {shown}\n    (output also in {})", log.display());
    let (mut reader, writer) = io::pipe()?;
    c.stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .process_group(0);
    let mut child = c.spawn().with_context(|| format!("starting `{shown}`"))?;
    // The command holds the pipe's write end: drop it, or the reader never sees the end.
    drop(c);
    let group = child.id() as libc::pid_t;
    let mut asked = None;
    let mut status = None;
    let mut exited: Option<Instant> = None;
    let mut buf = [0u8; 16 * 1024];
    loop {
        forward_interrupt(group, &mut asked, &shown);
        if status.is_none()
            && let Some(s) = child.try_wait()?
        {
            status = Some(s);
            exited = Some(Instant::now());
        }
        if exited.is_some_and(|t| t.elapsed() > LINGER) {
            eprintln!(
                "fresh-check: `{shown}` exited; processes it left behind still hold its output"
            );
            break;
        }
        // Wait for output at most 200 ms, to look at Ctrl-C and the child in between.
        let mut pfd = libc::pollfd {
            fd: reader.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
            continue;
        }
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let _ = file.write_all(&buf[..n]);
                let _ = io::stderr().write_all(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("fresh-check: reading the output of `{shown}`: {e}");
                break;
            }
        }
    }
    let status = loop {
        if let Some(s) = status {
            break s;
        }
        forward_interrupt(group, &mut asked, &shown);
        status = child.try_wait()?;
        thread::sleep(Duration::from_millis(100));
    };
    if interrupted() {
        bail!("interrupted");
    }
    if !status.success() {
        bail!("`{shown}` failed ({status}); log: {}", log.display());
    }
    Ok(())
}

/// Processes whose root is `root` (/proc/PID/root reads as that path): what a step left
/// running there.
fn processes_in(root: &Path) -> Vec<libc::pid_t> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == root))
        .collect()
}

/// Stop what a step left running inside `root` (SIGTERM, then SIGKILL), before unmounting.
fn stop_processes_in(root: &Path) {
    for (signal, wait) in [(libc::SIGTERM, 3), (libc::SIGKILL, 2)] {
        let pids = processes_in(root);
        if pids.is_empty() {
            return;
        }
        eprintln!(
            "fresh-check: {} process(es) still running in {}: {pids:?}; sending signal {signal}",
            pids.len(),
            root.display()
        );
        for &pid in &pids {
            // SAFETY: plain kill(2) of a process running inside this run's root.
            unsafe { libc::kill(pid, signal) };
        }
        let deadline = Instant::now() + Duration::from_secs(wait);
        while Instant::now() < deadline && !processes_in(root).is_empty() {
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Copy what the host reaches the registries with into `root`: DNS, the trust store (the
/// CAs a proxy may need, also where update-ca-certificates reads them) and apt's proxy.
fn carry_over(host: &Host, root: &Path) -> Result<()> {
    for f in ["/etc/resolv.conf", "/etc/hosts"] {
        let dest = root.join(&f[1..]);
        // Copy the content: a host link (e.g. to systemd-resolved's file) means nothing
        // inside.
        let text = fs::read(f).with_context(|| format!("reading {f}"))?;
        let _ = fs::remove_file(&dest);
        fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
    }
    for dir in ["/usr/local/share/ca-certificates", "/etc/ssl/certs"] {
        if !Path::new(dir).is_dir() {
            continue;
        }
        let dest = root.join(&dir[1..]);
        fs::create_dir_all(&dest)?;
        run(Command::new("cp")
            .args(["-a", "--remove-destination"])
            .arg(format!("{dir}/."))
            .arg(&dest))?;
    }
    for f in &host.apt_proxy_files {
        let dest = root.join(f.strip_prefix("/").unwrap_or(f));
        fs::copy(f, &dest).with_context(|| format!("copying {}", f.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The cached root.

fn stamp(host: &Host) -> String {
    format!(
        "suite {}\nmirror {}\nsources {:?}\npackages {}\n",
        host.suite,
        host.mirror,
        host.sources,
        FRESH_PACKAGES.join(" ")
    )
}

/// The cached minimal root with [`FRESH_PACKAGES`], built (debootstrap, then apt-get in
/// it) unless one built from the same suite, mirror and packages is there.
fn base_root(host: &Host, cache: &Path, rebuild: bool, logs: &Path) -> Result<PathBuf> {
    let roots = cache.join("fresh-root");
    let dir = roots.join(&host.suite);
    let want = stamp(host);
    if !rebuild && fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == want) {
        eprintln!(
            "fresh-check: using the cached root {} (--rebuild makes it again)",
            dir.display()
        );
        return Ok(dir);
    }
    fs::create_dir_all(&roots).with_context(|| format!("creating {}", roots.display()))?;
    let partial = roots.join(format!("{}.partial", host.suite));
    remove_tree(&partial)?;
    let log = logs.join("root.log");
    let mut debootstrap = Command::new("debootstrap");
    debootstrap
        .args(["--variant=minbase", &host.suite])
        .arg(&partial)
        .arg(&host.mirror);
    tee(debootstrap, &log, false)?;
    let installed = (|| {
        // `ip netns` inside needs "/" to be a mount point (mount --make-rslave /).
        mount(&["--bind", &partial.display().to_string()], &partial)?;
        mount_pseudo_filesystems(&partial)?;
        carry_over(host, &partial)?;
        fs::write(
            partial.join("etc/apt/sources.list"),
            sources_list(&host.sources),
        )?;
        let script = format!(
            "export DEBIAN_FRONTEND=noninteractive && apt-get update && \
             apt-get install -y --no-install-recommends {} && apt-get clean",
            FRESH_PACKAGES.join(" ")
        );
        tee(in_root(&partial, host, &script), &log, true)
    })();
    stop_processes_in(&partial);
    unmount_under(&partial)?;
    installed?;
    fs::write(partial.join(STAMP), want)?;
    remove_tree(&dir)?;
    fs::rename(&partial, &dir)
        .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------
// One run: an overlay over the cached root.

/// This run's directory: the overlays' upper and work layers and the merged root.
/// Dropping it stops what is left running inside, unmounts and deletes it.
struct RunRoot {
    dir: PathBuf,
    merged: PathBuf,
    keep: bool,
    finished: bool,
}

impl RunRoot {
    fn new(cache: &Path, keep: bool) -> Result<Self> {
        let runs = cache.join("fresh-runs");
        // Runs whose process is gone: their mounts went with its namespace.
        if let Ok(entries) = fs::read_dir(&runs) {
            for e in entries.flatten() {
                let gone = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if gone {
                    eprintln!(
                        "fresh-check: deleting {} of an earlier run",
                        e.path().display()
                    );
                    remove_tree(&e.path())?;
                }
            }
        }
        let dir = runs.join(std::process::id().to_string());
        remove_tree(&dir)?;
        for sub in ["upper", "work", "merged", "rustup-upper", "rustup-work"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        Ok(Self {
            merged: dir.join("merged"),
            dir,
            keep,
            finished: false,
        })
    }

    fn prepare(&self, base: &Path, host: &Host) -> Result<()> {
        let d = |s: &str| self.dir.join(s).display().to_string();
        // The overlay is a mount point itself, as `ip netns exec` needs of "/" (mount
        // --make-rslave /); no bind of the root onto itself is needed here.
        overlay(base, &d("upper"), &d("work"), &self.merged)?;
        mount_pseudo_filesystems(&self.merged)?;
        // The host's toolchains, read-only underneath: what rustup changes (rust-src
        // below, then setup's own install) lands in this run's layer.
        let rustup_home = self.merged.join("root/.rustup");
        overlay(
            &host.rustup_home,
            &d("rustup-upper"),
            &d("rustup-work"),
            &rustup_home,
        )?;
        // A fresh CARGO_HOME: only rustup and its proxies, so bpf-linker and every crate
        // come the way they come on a new machine.
        let bin = self.merged.join("root/.cargo/bin");
        fs::create_dir_all(&bin)?;
        fs::copy(&host.rustup, bin.join("rustup"))
            .with_context(|| format!("copying {}", host.rustup.display()))?;
        for name in RUSTUP_PROXIES {
            symlink("rustup", bin.join(name))?;
        }
        carry_over(host, &self.merged)?;
        self.without_rust_src(host)?;
        self.clone_head()
    }

    /// A nightly installed the usual way has no rust-src; setup must add it.
    fn without_rust_src(&self, host: &Host) -> Result<()> {
        let toolchains = self.merged.join("root/.rustup/toolchains");
        let has_src = fs::read_dir(&toolchains)
            .with_context(|| format!("listing {}", toolchains.display()))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("nightly"))
            .any(|e| {
                e.path()
                    .join("lib/rustlib/src/rust/library/core/Cargo.toml")
                    .is_file()
            });
        if !has_src {
            return Ok(());
        }
        eprintln!(
            "fresh-check: the host's nightly has rust-src; removing it in this run's layer \
             (a fresh machine's nightly may have none, and setup must add it)"
        );
        run(&mut in_root(
            &self.merged,
            host,
            "rustup component remove rust-src --toolchain nightly",
        ))
    }

    /// `git clone` of this checkout at HEAD: committed state only.
    fn clone_head(&self) -> Result<()> {
        let head = stdout(&mut cmd("git", ["rev-parse", "HEAD"]))?;
        let head = head.trim();
        let dirty = stdout(&mut cmd("git", ["status", "--porcelain"]))?;
        if !dirty.trim().is_empty() {
            eprintln!(
                "fresh-check: warning: uncommitted changes in {} are not part of this run \
                 (it clones HEAD {head})",
                root().display()
            );
        }
        let dest = self.merged.join(&CLONE[1..]);
        run(Command::new("git")
            .args(["clone", "--quiet", "--no-hardlinks", "--no-checkout"])
            .arg(root())
            .arg(&dest))?;
        run(Command::new("git")
            .arg("-C")
            .arg(&dest)
            .args(["checkout", "--quiet", "--detach", head]))
    }

    /// Stop what is left inside, unmount everything under the run, delete it (unless
    /// `keep`).
    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        stop_processes_in(&self.merged);
        unmount_under(&self.dir)?;
        if self.keep {
            eprintln!(
                "fresh-check: kept this run's layers in {}",
                self.dir.display()
            );
            return Ok(());
        }
        remove_tree(&self.dir)
    }
}

impl Drop for RunRoot {
    fn drop(&mut self) {
        if !self.finished
            && let Err(e) = self.finish()
        {
            eprintln!("fresh-check: cleaning up: {e:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------

fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
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
        let text = fs::read(logs.join(which.log()))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
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
    fn tee_keeps_both_streams_and_the_exit_status() {
        let log = std::env::temp_dir().join(format!("shedder-tee-{}.log", std::process::id()));
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo out; echo err >&2"]);
        tee(ok, &log, false).unwrap();
        let mut bad = Command::new("sh");
        bad.args(["-c", "echo second; exit 3"]);
        let err = tee(bad, &log, true).unwrap_err().to_string();
        assert!(err.contains("exit status: 3"), "{err}");
        let text = fs::read_to_string(&log).unwrap();
        let _ = fs::remove_file(&log);
        for line in ["out", "err", "second"] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
    }

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

    #[test]
    fn codename_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(os_codename(text).as_deref(), Some("bookworm"));
        assert_eq!(
            os_codename("VERSION_CODENAME=\"trixie\"\n").as_deref(),
            Some("trixie")
        );
        assert_eq!(os_codename("ID=debian\nVERSION_CODENAME=\n"), None);
    }

    fn src(uri: &str, suite: &str, components: &[&str]) -> AptSource {
        AptSource {
            uri: uri.into(),
            suite: suite.into(),
            components: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn one_line_sources() {
        let text = "# comment\n\
            deb http://deb.debian.org/debian bookworm main contrib # trailing\n\
            deb-src http://deb.debian.org/debian bookworm main\n\
            deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://m.example/debian bookworm-updates main\n\
            deb [trusted=yes] http://local/ ./\n";
        assert_eq!(
            parse_one_line(text),
            [
                src(
                    "http://deb.debian.org/debian",
                    "bookworm",
                    &["main", "contrib"]
                ),
                src("https://m.example/debian", "bookworm-updates", &["main"]),
                src("http://local/", "./", &[]),
            ]
        );
    }

    #[test]
    fn deb822_sources() {
        let text = "Types: deb\n\
            # http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
            URIs: http://deb.debian.org/debian\n\
            Suites: bookworm bookworm-updates\n\
            Components: main\n\
            Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
            \n\
            Types: deb-src\n\
            URIs: http://deb.debian.org/debian\n\
            Suites: bookworm\n\
            Components: main\n\
            \n\
            Types: deb\n\
            URIs: http://off.example/\n\
            Suites: bookworm\n\
            Components: main\n\
            Enabled: no\n";
        assert_eq!(
            parse_deb822(text),
            [
                src("http://deb.debian.org/debian", "bookworm", &["main"]),
                src(
                    "http://deb.debian.org/debian",
                    "bookworm-updates",
                    &["main"]
                ),
            ]
        );
    }

    #[test]
    fn sources_of_the_release_only() {
        let all = [
            src("http://d/debian", "bookworm", &["main"]),
            src("http://d/debian", "bookworm-updates", &["main"]),
            src("http://d/debian-security", "bookworm-security", &["main"]),
            src("https://other/apt", "cloud-sdk-bookworm", &["main"]),
            src("http://d/debian", "bookwormish", &["main"]),
            src(
                "https://deb.nodesource.com/node_20.x",
                "nodistro",
                &["main"],
            ),
        ];
        let mine = release_sources(&all, "bookworm");
        assert_eq!(mine, all[..3]);
        assert_eq!(
            sources_list(&mine[..1]),
            "deb http://d/debian bookworm main\n"
        );
    }

    #[test]
    fn apt_proxy_configuration() {
        assert!(sets_proxy("Acquire::http::Proxy \"http://p:3128\";\n"));
        assert!(sets_proxy("Acquire { https { proxy \"http://p\"; }; };"));
        assert!(!sets_proxy("Acquire::Check-Valid-Until \"false\";\n"));
        assert!(!sets_proxy("// Acquire::http::Proxy \"http://p\";\n"));
    }

    #[test]
    fn mounts_below_a_directory() {
        let info = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
90 27 0:50 / /root/.cache/run/merged rw - overlay overlay rw
91 90 0:21 / /root/.cache/run/merged/proc rw - proc proc rw
92 90 0:22 / /root/.cache/run/merged/sys rw - sysfs sysfs rw
93 92 0:39 / /root/.cache/run/merged/sys/fs/bpf rw - bpf bpf rw
94 90 0:51 / /root/.cache/run/merged/tmp/a\\040b rw - tmpfs tmpfs rw
95 27 0:52 / /root/.cache/run-other rw - tmpfs tmpfs rw
";
        let dir = Path::new("/root/.cache/run");
        let points: Vec<String> = mounts_under(info, dir)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            points,
            [
                "/root/.cache/run/merged",
                "/root/.cache/run/merged/proc",
                "/root/.cache/run/merged/sys",
                "/root/.cache/run/merged/sys/fs/bpf",
                "/root/.cache/run/merged/tmp/a b",
            ]
        );
        assert!(mounts_under(info, Path::new("/srv")).is_empty());
        assert_eq!(unescape_mountinfo("a\\011b\\134"), "a\tb\\");
    }
}
