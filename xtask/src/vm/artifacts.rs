//! Building what runs inside: `shedder` and the test executables of [`super::checks::CHECKS`], located
//! through cargo's JSON messages.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::Stdio,
};

use anyhow::{Context as _, Result, bail};

use super::checks::selected;
use crate::cmd::{cargo, show};

/// The executables that run inside (and on the host).
pub struct Built {
    pub shedder: PathBuf,
    /// Test target name → executable.
    pub tests: BTreeMap<String, PathBuf>,
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

pub fn build() -> Result<Built> {
    let bins = executables(
        &cargo_artifacts(&["build", "-p", "shedder-user", "--bin", "shedder"])?,
        "bin",
    );
    let shedder = bins
        .get("shedder")
        .cloned()
        .context("cargo build -p shedder-user reported no `shedder` executable")?;
    let mut args = vec!["test", "-p", "shedder-tests", "--no-run"];
    let names: BTreeSet<&str> = selected().filter(|c| !c.bin).map(|c| c.test).collect();
    for name in &names {
        args.extend(["--test", name]);
    }
    // Without a `--test`, `cargo test --no-run` builds every test target, which the
    // initramfs would then carry (`--only verifier` made a 569 MiB image).
    let mut tests = if names.is_empty() {
        BTreeMap::new()
    } else {
        executables(&cargo_artifacts(&args)?, "test")
    };
    let mut args = vec!["build", "-p", "shedder-lab"];
    for c in selected().filter(|c| c.bin) {
        args.extend(["--bin", c.test]);
    }
    // Likewise `cargo build` without a `--bin` builds every binary.
    if selected().any(|c| c.bin) {
        tests.extend(executables(&cargo_artifacts(&args)?, "bin"));
    }
    for name in selected().map(|c| c.test) {
        if !tests.contains_key(name) {
            bail!(
                "cargo reported no executable for `{name}` (a test of shedder-tests or a binary of shedder-lab)"
            );
        }
    }
    Ok(Built { shedder, tests })
}
