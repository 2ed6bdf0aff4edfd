//! `cargo xtask upgrade-check`: an upgrade and a rollback under load between a version
//! from the repository's history and this checkout (tests/tests/upgrade.rs).
//!
//! The older revision's sources come from `git archive` into `target/upgrade/<rev>/src/`,
//! and its `shedder` is built there with a target directory of its own
//! (`target/upgrade/<rev>/target/`: the first check of a revision builds everything, about
//! five minutes on 2 cores; a second one nothing). Not part of `cargo xtask test`.

use std::fs;

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::cmd::{cargo, cmd, require_root, run, stdout, target_dir};

/// The newest revision whose pins carry no layout marker: its maps are layout 1, as this
/// version's are, so the check is an adoption both ways. A revision of another layout
/// makes it a replacement on the way up.
pub const PREVIOUS_RELEASE: &str = "3bf9c6a";

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The older revision (any git revision of this repository).
    #[arg(long, default_value = PREVIOUS_RELEASE)]
    from: String,
}

pub fn run_upgrade_check(args: &UpgradeArgs) -> Result<()> {
    require_root("upgrade-check loads BPF programs and creates network namespaces")?;
    crate::setup::run_all()?;
    let rev = stdout(&mut cmd(
        "git",
        ["rev-parse", "--short", &format!("{}^{{commit}}", args.from)],
    ))
    .with_context(|| format!("{} is not a revision of this repository", args.from))?
    .trim()
    .to_string();
    let base = target_dir().join("upgrade").join(&rev);
    let src = base.join("src");
    if !src.join("Cargo.toml").is_file() {
        fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
        let unpack = format!(
            "git archive --format=tar {rev} | tar -x -C '{}'",
            src.display()
        );
        if let Err(e) = run(&mut cmd("sh", ["-c", unpack.as_str()])) {
            let _ = fs::remove_dir_all(&src);
            return Err(e.context(format!("unpacking {rev}")));
        }
    }
    // A target directory per revision: cargo names a workspace member's artifacts by its
    // path inside the workspace, and git archive dates the files at the commit, so one
    // shared directory would take an older revision's sources for built already.
    let older_target = base.join("target");
    let mut build = cmd("cargo", ["build", "-p", "shedder-user", "--bin", "shedder"]);
    build
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &older_target);
    run(&mut build).with_context(|| format!("building shedder at {rev}"))?;
    let older = older_target.join("debug").join("shedder");
    if !older.is_file() {
        bail!("the build of {rev} left no {}", older.display());
    }
    run(&mut cargo(["build", "-p", "shedder-user"]))?;
    let mut test = cargo([
        "test",
        "-p",
        "shedder-tests",
        "--test",
        "upgrade",
        "--",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    test.env("SHEDDER_UPGRADE_FROM", &older)
        .env("SHEDDER_UPGRADE_REV", &rev);
    run(&mut test)?;
    eprintln!("upgrade-check: {rev} -> this checkout -> {rev} under load: passed");
    Ok(())
}
