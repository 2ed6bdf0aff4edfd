//! Mounts, all in this process's private mount namespace, and deleting only what nothing
//! is mounted under.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{capture, cmd, mount, run, show};

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
pub fn unmount_under(dir: &Path) -> Result<()> {
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
pub fn remove_tree(dir: &Path) -> Result<()> {
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
pub fn mount_pseudo_filesystems(root: &Path) -> Result<()> {
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
    // SAFETY: as above; `st` is valid and writable.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    (rc == 0).then_some(st.f_type as i64)
}

/// An overlay of `upper` over `lower` at `target`. `redirect_dir=on`: without it, renaming a
/// directory of the lower layer fails with EXDEV (rustup moves a component's directories
/// aside to remove it).
pub fn overlay(lower: &Path, upper: &str, work: &str, target: &Path) -> Result<()> {
    let options = format!(
        "lowerdir={},upperdir={upper},workdir={work},redirect_dir=on",
        lower.display()
    );
    mount(&["-t", "overlay", "overlay", "-o", &options], target)
}

/// This process's mounts from here on are its own: invisible to the host and gone when it
/// ends, whatever way it ends.
pub fn private_mount_namespace() -> Result<()> {
    // SAFETY: no other thread exists yet (unshare(CLONE_NEWNS) needs a single thread).
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        bail!(
            "unshare(CLONE_NEWNS): {} (fresh-check needs root with CAP_SYS_ADMIN)",
            io::Error::last_os_error()
        );
    }
    run(&mut cmd("mount", ["--make-rprivate", "/"]))
}

#[cfg(test)]
mod tests {
    use super::*;

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
