//! The host's own kernel: the same checks run natively, one after the other, into one log.

use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    artifacts::Built,
    checks::{CheckResult, Outcome, Row, selected},
};
use crate::cmd::{cmd, root, show, stdout, wait_until};

pub fn host_row(built: &Built, vm_dir: &Path, timeout: Duration) -> Result<Row> {
    let start = Instant::now();
    let release = stdout(&mut cmd("uname", ["-r"]))?.trim().to_owned();
    let log_path = vm_dir.join(format!("host-{release}.log"));
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut results = Vec::new();
    for check in selected() {
        let exe = &built.tests[check.test];
        writeln!(log, "@@HOST-BEGIN {}", check.name)?;
        log.flush()?;
        let from = log.stream_position()?;
        let mut c = Command::new(exe);
        c.args(check.args)
            .current_dir(root())
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?);
        eprintln!("==> {}", show(&c));
        let t = Instant::now();
        let mut child = c
            .spawn()
            .with_context(|| format!("starting `{}`", show(&c)))?;
        let status = wait_until(&mut child, t + timeout)?;
        let secs = t.elapsed().as_secs_f64();
        log.seek(SeekFrom::End(0))?;
        let to = log.stream_position()?;
        let outcome = match status {
            Some(s) if s.success() => Outcome::Pass,
            Some(s) => Outcome::Fail(s.code().unwrap_or(-1)),
            None => Outcome::NoResult(format!("timed out after {} s (killed)", timeout.as_secs())),
        };
        let rc = match &outcome {
            Outcome::Pass => "0".to_owned(),
            Outcome::Fail(rc) => rc.to_string(),
            Outcome::NoResult(_) | Outcome::Emulated(_) => "timeout".to_owned(),
        };
        writeln!(log, "@@HOST-END {} rc={rc} secs={secs:.2}", check.name)?;
        let mut output = String::new();
        let mut reader = File::open(&log_path)?;
        reader.seek(SeekFrom::Start(from))?;
        reader.take(to - from).read_to_string(&mut output)?;
        eprintln!(
            "[host] {} {} ({secs:.1} s)",
            check.name,
            if matches!(outcome, Outcome::Pass) {
                "passed"
            } else {
                "FAILED"
            }
        );
        results.push(CheckResult {
            name: check.name,
            outcome,
            secs: Some(secs),
            output: output.lines().map(str::to_owned).collect(),
        });
    }
    Ok(Row {
        kernel: release,
        how: "host, native".into(),
        emulated: false,
        log: Some(log_path),
        notes: Vec::new(),
        results,
        secs: start.elapsed().as_secs_f64(),
    })
}
