//! Where the pins go, so that the attachment outlives the process (fail-static).
//!
//! A pin lives in a bpf filesystem, and a bpf filesystem lives as long as some mount
//! namespace has it mounted. `ip netns exec` runs its command in a private mount namespace
//! with a fresh `/sys`, and a container may have a mount namespace of its own: a bpffs the
//! daemon mounted there, with every pin in it, dies with the process, and the programs
//! detach. So the daemon pins into the bpffs of the *host's* mount namespace (that of pid 1,
//! or, where pid 1 cannot be inspected, of the nearest ancestor outside the daemon's own
//! mount namespace: where it was started from), reaching it
//! through that process's root (`/proc/<pid>/root`) when its own namespace is another one,
//! and mounting one there when there is none. Only when no such namespace can be reached
//! do the pins die with the process, and then the daemon refuses to enforce unless the
//! configuration says that fail-static is off.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, IntoRawFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use crate::kernel::sysfs::{BPF_FS_MAGIC, BPFFS, fs_magic};

/// How long pins outlive the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// In the bpffs of the host's mount namespace, which this process shares: they stay
    /// until removed.
    Host,
    /// In the bpffs of the host's mount namespace, reached through the root of process
    /// `pid` because this process runs in a mount namespace of its own.
    Through { pid: u32 },
    /// In a bpffs of this process's own mount namespace (not the host's), which process
    /// `pid` shares too: they outlive the daemon as long as that namespace lives (a
    /// container's, say).
    Namespace { pid: u32 },
    /// In a bpffs that only this process's mount namespace has: they die with it (why).
    Private(String),
}

/// The pin directory as configured and the path every pin operation uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinDir {
    pub configured: PathBuf,
    pub path: PathBuf,
    pub durability: Durability,
}

impl PinDir {
    /// The configured directory used as it is (tests and tools on the host).
    pub fn plain(dir: &Path) -> Self {
        Self {
            configured: dir.to_path_buf(),
            path: dir.to_path_buf(),
            durability: Durability::Host,
        }
    }

    /// How the pins outlive the process, in a sentence.
    pub fn describe(&self) -> String {
        let dir = self.configured.display();
        match &self.durability {
            Durability::Host => format!("{dir}, in the host's bpf filesystem"),
            Durability::Through { pid } => format!(
                "{dir} of the host's bpf filesystem, reached through /proc/{pid}/root (this \
                 process runs in a mount namespace of its own)"
            ),
            Durability::Namespace { pid } => format!(
                "{dir}, in the bpf filesystem of this mount namespace (shared with pid {pid}; \
                 not the host's)"
            ),
            Durability::Private(why) => {
                format!("{dir}, in a bpf filesystem that dies with this process: {why}")
            }
        }
    }
}

/// The bpffs mount point a pin directory is on: `/sys/fs/bpf` for the usual places, else
/// the directory's parent.
fn mount_point(pin_dir: &Path) -> PathBuf {
    if pin_dir.starts_with(BPFFS) {
        PathBuf::from(BPFFS)
    } else {
        pin_dir
            .parent()
            .map_or_else(|| PathBuf::from(BPFFS), Path::to_path_buf)
    }
}

/// The inode of a process's mount namespace, if it can be read.
fn mount_ns(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| m.ino())
}

fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
}

/// The process whose mount namespace is the host's, as far as this process can see: pid 1
/// when it can be inspected; else the nearest ancestor in another mount namespace than
/// ours (the one the daemon was started from, as by `ip netns exec`), or, when every
/// readable ancestor shares ours, the outermost of them. `None` when this process is pid 1
/// or sees no other.
fn host_process() -> Option<(u32, u64)> {
    let me = std::process::id();
    if me != 1
        && let Some(ns) = mount_ns("1")
    {
        return Some((1, ns));
    }
    let own = mount_ns("self");
    let mut found = None;
    let mut pid = parent_of(me)?;
    // Bounded: a chain of parents ends at pid 1 or at a process we cannot read.
    for _ in 0..1024 {
        if pid == 0 || pid == me {
            break;
        }
        match mount_ns(&pid.to_string()) {
            Some(ns) if Some(ns) != own => return Some((pid, ns)),
            Some(ns) => found = Some((pid, ns)),
            None => break,
        }
        match parent_of(pid) {
            Some(p) if p != pid => pid = p,
            _ => break,
        }
    }
    found
}

/// Another process in the mount namespace `ns`, if there is one: a namespace that does not
/// end with this process.
fn sharer(ns: u64) -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        (pid != me && mount_ns(&pid.to_string()) == Some(ns)).then_some(pid)
    })
}

/// Whether this process's bpffs at `point` is bind-mounted from elsewhere (a propagation
/// peer or master in mountinfo), as a container runtime does with the host's.
fn propagated(point: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            return false;
        };
        f.get(4).is_some_and(|p| Path::new(p) == point)
            && f.get(sep + 1) == Some(&"bpf")
            && f[6..sep]
                .iter()
                .any(|o| o.starts_with("shared:") || o.starts_with("master:"))
    })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// mount(2) of a bpffs at `target`: only the system call, so that a forked child may make
/// it. Returns its result (0, or -1 with errno set).
fn mount_bpf_at(target: &CString) -> libc::c_int {
    // SAFETY: valid NUL-terminated strings; no data argument.
    unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    }
}

fn mount_bpffs(point: &Path) -> io::Result<()> {
    std::fs::create_dir_all(point)?;
    if mount_bpf_at(&c_path(point)?) != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mount a bpffs at `point` in the mount namespace of process `pid`: a child process
/// enters that namespace (a multi-threaded process cannot) and mounts it there.
fn mount_bpffs_in(pid: u32, point: &Path) -> io::Result<()> {
    let ns = File::open(format!("/proc/{pid}/ns/mnt"))?;
    let target = c_path(point)?;
    // SAFETY: the child only makes system calls (setns, mount, _exit) before it exits,
    // which is what is allowed after fork in a multi-threaded process.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: the forked child only calls async-signal-safe functions, then exits.
        unsafe {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                libc::_exit(10 + *libc::__errno_location());
            }
            if mount_bpf_at(&target) != 0 {
                libc::_exit(100 + *libc::__errno_location());
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(0) => Ok(()),
        Some(c @ 10..100) => Err(io::Error::other(format!(
            "entering its mount namespace: {}",
            io::Error::from_raw_os_error(c - 10)
        ))),
        Some(c @ 100..) => Err(io::Error::other(format!(
            "mounting: {}",
            io::Error::from_raw_os_error(c - 100)
        ))),
        _ => Err(io::Error::other(format!(
            "child ended with status {status}"
        ))),
    }
}

/// Find (and where needed mount) the bpffs that `pin_dir` should be in, so that pins
/// outlive this process; see the module's documentation.
pub fn locate(pin_dir: &Path) -> io::Result<PinDir> {
    find(pin_dir, true)
}

/// What [`locate`] would find, without mounting anything (for `shedder doctor`). A bpffs
/// [`locate`] would mount is taken as mounted.
pub fn inspect(pin_dir: &Path) -> io::Result<PinDir> {
    find(pin_dir, false)
}

fn find(pin_dir: &Path, act: bool) -> io::Result<PinDir> {
    let point = mount_point(pin_dir);
    let ours_bpf = fs_magic(&point).ok() == Some(BPF_FS_MAGIC);
    let me = std::process::id();
    // Our own namespace's bpffs, mounted where absent (when acting).
    let ensure_ours = || -> io::Result<()> {
        if act && !ours_bpf {
            mount_bpffs(&point).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("mount -t bpf bpf {}: {e}", point.display()),
                )
            })?;
        }
        Ok(())
    };
    let private = |why: String| -> io::Result<PinDir> {
        ensure_ours()?;
        Ok(PinDir {
            configured: pin_dir.to_path_buf(),
            path: pin_dir.to_path_buf(),
            durability: Durability::Private(why),
        })
    };
    let shared = |durability| PinDir {
        configured: pin_dir.to_path_buf(),
        path: pin_dir.to_path_buf(),
        durability,
    };
    let own_ns = mount_ns("self");
    let Some((host, host_ns)) = host_process() else {
        if ours_bpf && propagated(&point) {
            return Ok(shared(Durability::Host));
        }
        return private(if me == 1 {
            "this process is pid 1 of its namespace (a container's entry point?), and its \
             bpf filesystem is not the host's (not bind-mounted into it)"
                .into()
        } else {
            "no other process's mount namespace can be inspected".into()
        });
    };
    if own_ns == Some(host_ns) {
        ensure_ours()?;
        return Ok(shared(Durability::Host));
    }
    // A mount namespace of our own that already has a bpffs and that other processes share
    // (a container's, a test harness's): the pins live there, where the tools of this
    // namespace look for them, and outlive the daemon with the namespace.
    if ours_bpf && let Some(pid) = own_ns.and_then(sharer) {
        return Ok(shared(Durability::Namespace { pid }));
    }
    // Another mount namespace: the host's bpffs, seen through the host process's root.
    let rel = point.strip_prefix("/").unwrap_or(&point);
    let theirs = Path::new(&format!("/proc/{host}/root")).join(rel);
    let theirs_bpf = fs_magic(&theirs).ok() == Some(BPF_FS_MAGIC);
    if !act {
        return Ok(PinDir {
            configured: pin_dir.to_path_buf(),
            path: theirs.join(pin_dir.strip_prefix(&point).unwrap_or(Path::new(""))),
            durability: Durability::Through { pid: host },
        });
    }
    if !theirs_bpf && let Err(e) = mount_bpffs_in(host, &point) {
        return private(format!(
            "it runs in a mount namespace of its own (as under `ip netns exec`), and no bpf \
             filesystem could be mounted in the host's (that of pid {host}): {e}"
        ));
    }
    let same_fs = ours_bpf
        && match (std::fs::metadata(&point), std::fs::metadata(&theirs)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev(),
            _ => false,
        };
    if same_fs {
        // Our namespace holds the very same bpffs (a copy of the host's mounts).
        return Ok(shared(Durability::Host));
    }
    // Hold the host's bpffs open for the life of the process, so that its path stays
    // valid even if the process it was reached through exits.
    let dir = File::open(&theirs)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", theirs.display())))?;
    let fd = dir.into_raw_fd();
    let below = pin_dir.strip_prefix(&point).unwrap_or(Path::new(""));
    Ok(PinDir {
        configured: pin_dir.to_path_buf(),
        path: Path::new(&format!("/proc/self/fd/{fd}")).join(below),
        durability: Durability::Through { pid: host },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_under_sys_fs_bpf_are_on_its_mount() {
        assert_eq!(
            mount_point(Path::new("/sys/fs/bpf/shedder")),
            Path::new("/sys/fs/bpf")
        );
        assert_eq!(
            mount_point(Path::new("/sys/fs/bpf/a/b")),
            Path::new("/sys/fs/bpf")
        );
        assert_eq!(
            mount_point(Path::new("/run/bpf/shedder")),
            Path::new("/run/bpf")
        );
    }

    #[test]
    fn descriptions_say_how_long_pins_live() {
        let p = |durability| PinDir {
            configured: "/sys/fs/bpf/shedder".into(),
            path: "/sys/fs/bpf/shedder".into(),
            durability,
        };
        assert_eq!(
            p(Durability::Host).describe(),
            "/sys/fs/bpf/shedder, in the host's bpf filesystem"
        );
        assert!(
            p(Durability::Through { pid: 7 })
                .describe()
                .contains("reached through /proc/7/root")
        );
        assert!(
            p(Durability::Private("why".into()))
                .describe()
                .ends_with("dies with this process: why")
        );
    }
}
