//! Network namespaces: every one on the host (a process is in it, or `ip netns` names it),
//! and running a function inside one. The tracking counts a protected port's connections in
//! every namespace, so what reads or closes them (seeding, recall) looks in every one.

use std::{
    collections::HashSet,
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::PathBuf,
};

/// A network namespace to visit: a path that names it and the open file that keeps it.
pub struct Namespace {
    pub path: PathBuf,
    file: File,
}

/// Every network namespace a process is in, or that `ip netns` names, once each.
pub fn namespaces() -> Vec<Namespace> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut add = |path: PathBuf| {
        let Ok(file) = File::open(&path) else {
            return;
        };
        let Ok(meta) = file.metadata() else {
            return;
        };
        if seen.insert((meta.dev(), meta.ino())) {
            out.push(Namespace { path, file });
        }
    };
    // Our own first: it is where the daemon's services usually are.
    add(PathBuf::from("/proc/thread-self/ns/net"));
    for dir in ["/run/netns", "/var/run/netns"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                add(e.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            {
                add(e.path().join("ns/net"));
            }
        }
    }
    out
}

/// Run `f` on a thread that has entered the network namespace `ns`.
pub fn in_namespace<T: Send>(
    ns: &Namespace,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a valid fd of a network namespace; only this thread switches.
            if unsafe { libc::setns(ns.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}
