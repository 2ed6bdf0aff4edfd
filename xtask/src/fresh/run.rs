//! One run: an overlay over the cached root, the host's toolchains lent through another,
//! HEAD of this checkout cloned in.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::{
    chroot::{carry_over, in_root, stop_processes_in},
    host::Host,
    mounts::{mount_pseudo_filesystems, overlay, remove_tree, unmount_under},
};
use crate::{
    cmd::{cmd, root, run, stdout},
    setup,
};

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

/// The clone of this checkout, inside the root.
pub const CLONE: &str = "/root/shedder";

/// This run's directory: the overlays' upper and work layers and the merged root.
/// Dropping it stops what is left running inside, unmounts and deletes it.
pub struct RunRoot {
    dir: PathBuf,
    pub merged: PathBuf,
    keep: bool,
    finished: bool,
}

impl RunRoot {
    pub fn new(cache: &Path, keep: bool) -> Result<Self> {
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

    pub fn prepare(&self, base: &Path, host: &Host) -> Result<()> {
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

    /// The overlay and the pseudo-filesystems only, with what the host reaches the
    /// registries with: a fresh machine with no Rust and no checkout, for installing what
    /// `cargo xtask dist` built.
    pub fn prepare_plain(&self, base: &Path, host: &Host) -> Result<()> {
        let d = |s: &str| self.dir.join(s).display().to_string();
        overlay(base, &d("upper"), &d("work"), &self.merged)?;
        mount_pseudo_filesystems(&self.merged)?;
        carry_over(host, &self.merged)
    }

    /// A nightly installed the usual way has no rust-src; setup must add it.
    fn without_rust_src(&self, host: &Host) -> Result<()> {
        let toolchains = self.merged.join("root/.rustup/toolchains");
        let has_src = fs::read_dir(&toolchains)
            .with_context(|| format!("listing {}", toolchains.display()))?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(setup::EBPF_TOOLCHAIN)
            })
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
            &format!(
                "rustup component remove rust-src --toolchain {}",
                setup::EBPF_TOOLCHAIN
            ),
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
    pub fn finish(&mut self) -> Result<()> {
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
