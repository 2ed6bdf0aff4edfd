//! Running child processes: from the workspace root, echoed, with their failures as errors.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (the parent of this crate).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/` in the workspace root),
/// where commands keep their logs.
pub fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| root().join(d))
        .unwrap_or_else(|| root().join("target"))
}

/// `program args…`, to run in the workspace root.
pub fn cmd<S: AsRef<std::ffi::OsStr>>(program: &str, args: impl IntoIterator<Item = S>) -> Command {
    let mut c = Command::new(program);
    c.args(args).current_dir(root());
    c
}

/// `cargo args…` in the workspace root.
pub fn cargo<'a>(args: impl IntoIterator<Item = &'a str>) -> Command {
    cmd("cargo", args)
}

/// The command line, for messages.
pub fn show(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run with inherited stdio (echoing the command first); an error unless it succeeds.
pub fn run(c: &mut Command) -> Result<()> {
    eprintln!("==> {}", show(c));
    let status = c
        .status()
        .with_context(|| format!("starting `{}`", show(c)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(c));
    }
    Ok(())
}

/// Run silently and return the output whatever the exit status; an error only if the
/// program cannot be started.
pub fn capture(c: &mut Command) -> Result<Output> {
    c.stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{}`", show(c)))
}

/// Run silently and return the output; an error, with what it wrote to stderr, unless it
/// succeeds.
pub fn checked(c: &mut Command) -> Result<Output> {
    let out = capture(c)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(c),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Run silently and return its stdout; an error unless it succeeds.
pub fn stdout(c: &mut Command) -> Result<String> {
    let out = checked(c)?;
    String::from_utf8(out.stdout).with_context(|| format!("non-UTF-8 output of `{}`", show(c)))
}

/// Run silently: whether it started and succeeded (for probes, where failing is an answer).
pub fn succeeds(c: &mut Command) -> bool {
    capture(c).is_ok_and(|o| o.status.success())
}

/// Wait for `child` up to `deadline`; kill it (it is ours) when the deadline passes. `None`
/// when it was killed.
pub fn wait_until(child: &mut Child, deadline: Instant) -> Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// `mount args… target`, the mount point made first.
pub fn mount(args: &[&str], target: &Path) -> Result<()> {
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    run(Command::new("mount").args(args).arg(target))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// An error naming what needs root unless we are root.
pub fn require_root(what: &str) -> Result<()> {
    if !is_root() {
        bail!("{what} needs root: run this command as root (e.g. with sudo)");
    }
    Ok(())
}

pub fn home() -> Result<PathBuf> {
    env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set")
}

/// Put cargo's bin directory (where `cargo install` puts bpf-linker) first on PATH, for this
/// process and every child. Call before any thread is started.
pub fn cargo_bin_on_path() -> Result<()> {
    let cargo_home = match env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => home()?.join(".cargo"),
    };
    let bin = cargo_home.join("bin");
    let old = env::var_os("PATH").unwrap_or_default();
    if env::split_paths(&old).any(|p| p == bin) {
        return Ok(());
    }
    let new: OsString = env::join_paths(std::iter::once(bin).chain(env::split_paths(&old)))
        .context("joining PATH")?;
    // SAFETY: called at the start of main, before any other thread exists.
    unsafe { env::set_var("PATH", new) };
    Ok(())
}
