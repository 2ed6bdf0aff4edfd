//! Running things inside the root: a clean root login's environment, output to the
//! terminal and a log, Ctrl-C forwarded; what is left running stopped; what the host reaches
//! the registries with carried in.

use std::{
    fs::{self, OpenOptions},
    io::{self, Read as _, Write as _},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{host::Host, signals::interrupted};
use crate::cmd::{run, show};

/// PATH inside the root: what `~/.cargo/env` and Debian's root profile give a login shell.
const ROOT_PATH: &str =
    "/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `script` by /bin/sh inside `root`, with a clean environment: a root login's, plus the
/// host's proxies.
pub fn in_root(root: &Path, host: &Host, script: &str) -> Command {
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
pub fn tee(mut c: Command, log: &Path, append: bool) -> Result<()> {
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
pub fn stop_processes_in(root: &Path) {
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
pub fn carry_over(host: &Host, root: &Path) -> Result<()> {
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
}
