//! Loads every shedder program into the running kernel, with and without the kernel debug
//! log compiled in, and prints the instructions the verifier processed for each as one line
//! of JSON after the marker `@@VERIFIER ` (what `cargo xtask vm-test` collects per kernel).
//! A program the kernel refuses is reported with the verifier's own words and exit status 1.
//! Needs root.

use std::process::ExitCode;

use serde::Serialize;
use shedder::kernel::Shedder;

#[derive(Serialize)]
struct Report {
    kernel: String,
    /// Instructions processed per program (`None`: the kernel does not report it, < 5.16).
    programs: Vec<(String, Option<u32>)>,
    /// The same with `daemon.kernel_debug_log` (the packet-path programs only).
    programs_with_kernel_log: Vec<(String, Option<u32>)>,
    /// Why loading failed, if it did.
    error: Option<String>,
    /// Why the programs did not load with the kernel debug log, when they load without it
    /// and the verifier found them too complex with it: a documented limit of older
    /// kernels (the daemon then runs without the log), not a failure.
    kernel_log_error: Option<String>,
    /// Why the QUIC programs did not load, on a kernel older than the one they are
    /// documented to need (`QUIC_KERNEL`): a documented limit (the daemon runs TCP only and
    /// refuses a QUIC service), not a failure. On a newer kernel it is an `error`.
    quic_error: Option<String>,
}

fn counts(s: &Shedder, only: Option<&[&str]>) -> Vec<(String, Option<u32>)> {
    s.verified_insns()
        .into_iter()
        .filter(|(name, _)| only.is_none_or(|o| o.contains(name)))
        .map(|(name, n)| (name.to_string(), n))
        .collect()
}

/// The error with a long verifier log cut to its head and tail, where the reason is.
fn summarise(e: &shedder::kernel::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 40 {
        return text;
    }
    let mut out = lines[..10].join("\n");
    out.push_str(&format!("\n... {} lines ...\n", lines.len() - 30));
    out.push_str(&lines[lines.len() - 20..].join("\n"));
    out
}

fn main() -> ExitCode {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut report = Report {
        kernel,
        programs: Vec::new(),
        programs_with_kernel_log: Vec::new(),
        error: None,
        kernel_log_error: None,
        quic_error: None,
    };
    let before_quic = shedder::kernel::version::running_kernel()
        .is_some_and(|v| v < shedder::kernel::version::QUIC_KERNEL);
    match Shedder::load() {
        Ok(s) => {
            report.programs = counts(&s, None);
            // The daemon runs without them (TCP only); from the kernel they are documented
            // to need, a refusal is a failure to look into.
            if let Some(why) = s.quic_unavailable() {
                let why = format!("the QUIC programs did not load: {why}");
                if before_quic {
                    report.quic_error = Some(why.lines().next().unwrap_or("").into());
                } else {
                    report.error = Some(why);
                }
            }
        }
        Err(e) => report.error = Some(summarise(&e)),
    }
    if report.error.is_none() {
        match Shedder::load_with_kernel_log() {
            Ok(s) => {
                report.programs_with_kernel_log = counts(
                    &s,
                    Some(&[shedder_common::programs::XDP, shedder_common::programs::TC]),
                )
            }
            Err(e) if e.too_complex() => {
                report.kernel_log_error = Some(e.to_string().lines().next().unwrap_or("").into())
            }
            Err(e) => report.error = Some(format!("with the kernel debug log: {}", summarise(&e))),
        }
    }
    if let Some(e) = &report.error {
        eprintln!("verifier_report: {e}");
    }
    if let Some(e) = &report.quic_error {
        eprintln!("verifier_report: {e} (documented: QUIC needs a newer kernel)");
    }
    if let Some(e) = &report.kernel_log_error {
        eprintln!("verifier_report: with the kernel debug log (the daemon runs without it): {e}");
    }
    println!(
        "@@VERIFIER {}",
        serde_json::to_string(&report).expect("serialisable")
    );
    if report.error.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
