//! The cached root: a minimal Debian with [`FRESH_PACKAGES`], made once per suite, mirror
//! and package list.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::{
    chroot::{carry_over, in_root, stop_processes_in, tee},
    host::{Host, sources_list},
    mounts::{mount_pseudo_filesystems, remove_tree, unmount_under},
};
use crate::cmd::mount;

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

/// Marks a finished cached root, with what it was built from (a change rebuilds it).
const STAMP: &str = ".shedder-fresh-root";

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
pub fn base_root(host: &Host, cache: &Path, rebuild: bool, logs: &Path) -> Result<PathBuf> {
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
