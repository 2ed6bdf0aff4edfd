//! What runs in each VM and on the host, and what came of it: one [`Row`] per kernel.

use std::path::PathBuf;

/// One command run in each VM (and on the host): a test executable of shedder-tests (by
/// its target name, `tests/tests/<test>.rs`) with libtest arguments, or a binary of
/// shedder-lab.
pub struct Check {
    /// Marker name: no spaces.
    pub name: &'static str,
    /// The test target of shedder-tests (or, with `bin`, the binary of shedder-lab) to run.
    pub test: &'static str,
    pub args: &'static [&'static str],
    /// A binary (`lab/src/bin/<test>.rs`) rather than a test target.
    pub bin: bool,
    /// Its assertions bound latency or start-up time: in an emulated (TCG) VM, which runs
    /// the kernel and every process many times slower, a failure is reported with its
    /// figures but not counted.
    pub timing: bool,
}

/// Run in this order, each between its markers.
pub const CHECKS: &[Check] = &[
    // The fixture table's crafted frames (147 rows) through XDP and TC with BPF_PROG_TEST_RUN.
    Check {
        name: "fixtures::fixture_table",
        test: "fixtures",
        args: &["--exact", "fixture_table", "--test-threads=1"],
        bin: false,
        timing: false,
    },
    // Real TCP over veth between two namespaces, IPv4 and IPv6, with shedder attached.
    Check {
        name: "netns::native_xdp",
        test: "netns",
        args: &["--exact", "native_xdp", "--test-threads=1"],
        bin: false,
        timing: false,
    },
    Check {
        name: "netns::generic_xdp",
        test: "netns",
        args: &["--exact", "generic_xdp", "--test-threads=1"],
        bin: false,
        timing: false,
    },
    Check {
        name: "netns::tc_ingress",
        test: "netns",
        args: &["--exact", "tc_ingress", "--test-threads=1"],
        bin: false,
        timing: false,
    },
    // The whole loop under 3× overload (tests/tests/closed_loop.rs): a backend of known
    // capacity in one namespace, the real `shedder run` daemon on its interface (attach =
    // "auto", the lab's default: tc with tcx, generic XDP before 6.6), an open-loop load
    // generator in the other; the limit must settle, the admitted requests' p99 stay
    // within twice the target, CRITICAL succeed. It bounds latency: natively that holds,
    // and it is meant to under KVM; an emulated (TCG) VM is too slow for it, so there a
    // failure shows its figures, uncounted.
    Check {
        name: "closed_loop::overload_at_3x",
        test: "closed_loop",
        args: &[
            "--exact",
            "overload_at_3x_converges_with_p99_within_twice_the_target",
            "--test-threads=1",
            "--nocapture",
        ],
        bin: false,
        timing: true,
    },
    // Every program loaded, with and without the kernel debug log: the verifier's
    // instruction counts, compared with docs/kernels.json.
    Check {
        name: "verifier",
        test: "verifier_report",
        args: &[],
        bin: true,
        timing: false,
    },
];

/// The names `--only` picked, set once before anything runs; every check when unset.
static ONLY: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Run only the checks named in `names` (an error names any unknown one).
pub fn only(names: Vec<String>) -> anyhow::Result<()> {
    for n in &names {
        if !CHECKS.iter().any(|c| c.name == n) {
            let known: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
            anyhow::bail!(
                "--only: no check named `{n}` (the checks: {})",
                known.join(", ")
            );
        }
    }
    ONLY.set(names)
        .map_err(|_| anyhow::anyhow!("--only given twice"))
}

/// The checks this run makes, in order.
pub fn selected() -> impl Iterator<Item = &'static Check> {
    CHECKS.iter().filter(|c| {
        ONLY.get()
            .is_none_or(|only| only.iter().any(|n| n == c.name))
    })
}

pub enum Outcome {
    Pass,
    Fail(i32),
    /// No result: why.
    NoResult(String),
    /// A [`Check::timing`] check failed in an emulated VM: why it is not counted.
    Emulated(String),
}

impl Outcome {
    /// Whether the run's verdict counts it.
    pub fn counted(&self) -> bool {
        !matches!(self, Self::Emulated(_))
    }
}

pub struct CheckResult {
    pub name: &'static str,
    pub outcome: Outcome,
    pub secs: Option<f64>,
    /// The check's output (for the failure excerpt).
    pub output: Vec<String>,
}

/// One kernel's results: a row of the summary.
pub struct Row {
    pub kernel: String,
    pub how: String,
    /// A VM under TCG: [`Check::timing`] failures are not counted.
    pub emulated: bool,
    pub log: Option<PathBuf>,
    /// Kernel options the checks rely on that this kernel lacks, module load failures, how
    /// the VM ended when it did not end by itself.
    pub notes: Vec<String>,
    pub results: Vec<CheckResult>,
    pub secs: f64,
}

impl Row {
    pub fn unavailable(series: &str, why: String) -> Self {
        Self {
            kernel: series.to_owned(),
            how: "not booted".into(),
            emulated: false,
            log: None,
            notes: vec![why.clone()],
            results: selected()
                .map(|c| CheckResult {
                    name: c.name,
                    outcome: Outcome::NoResult("kernel not available".into()),
                    secs: None,
                    output: Vec::new(),
                })
                .collect(),
            secs: 0.0,
        }
    }
}

/// `major.minor` of a release (`6.1.0-57-amd64` → (6, 1)).
pub fn series_of(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What a lab's panic says when its set-up failed (`SETUP_FAILED` in lab/src/scenario.rs).
const LAB_SETUP_FAILED: &str = "lab set-up failed";

/// In an emulated VM, a failed [`Check::timing`] check is reported, not counted, unless the
/// lab's set-up failed.
pub fn mark_emulated(row: &mut Row) {
    if !row.emulated {
        return;
    }
    for r in &mut row.results {
        let timing = selected().any(|c| c.name == r.name && c.timing);
        // A lab whose set-up failed (lab/src/scenario.rs) measured nothing: not timing.
        let setup = r.output.iter().any(|l| l.contains(LAB_SETUP_FAILED));
        if let (true, false, Outcome::Fail(rc)) = (timing, setup, &r.outcome) {
            r.outcome = Outcome::Emulated(format!(
                "exit status {rc} in an emulated (TCG) VM, too slow for the latency and \
                 start-up bounds this check asserts: not counted (judged under KVM and on the \
                 host)"
            ));
        }
    }
}

/// Rows and results for the tests here and in `verifier`.
#[cfg(test)]
pub mod test_rows {
    use super::*;

    pub fn row(kernel: &str, results: Vec<CheckResult>) -> Row {
        Row {
            kernel: kernel.into(),
            how: "test".into(),
            emulated: false,
            log: None,
            notes: Vec::new(),
            results,
            secs: 0.0,
        }
    }

    pub fn result(name: &'static str, outcome: Outcome, output: &[&str]) -> CheckResult {
        CheckResult {
            name,
            outcome,
            secs: Some(1.0),
            output: output.iter().map(|l| l.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{test_rows::*, *};

    #[test]
    fn kernel_series() {
        assert_eq!(series_of("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(series_of("6.12.95+deb12-amd64"), Some((6, 12)));
        assert_eq!(series_of("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(series_of("6.6"), Some((6, 6)));
    }

    #[test]
    fn timing_failures_in_an_emulated_vm_are_not_counted() {
        let failed = |name| result(name, Outcome::Fail(101), &["p99 228.6 ms > 2 × 50 ms"]);
        for emulated in [true, false] {
            let mut r = row(
                "6.12.95+deb12-amd64",
                vec![
                    failed("closed_loop::overload_at_3x"),
                    failed("netns::native_xdp"),
                ],
            );
            r.emulated = emulated;
            mark_emulated(&mut r);
            assert_eq!(r.results[0].outcome.counted(), !emulated);
            // A lab whose set-up failed counts everywhere.
            let mut setup = row(
                "6.1.0-57-amd64",
                vec![result(
                    "closed_loop::overload_at_3x",
                    Outcome::Fail(101),
                    &["panicked at lab/src/scenario.rs: lab set-up failed: egress"],
                )],
            );
            setup.emulated = emulated;
            mark_emulated(&mut setup);
            assert!(matches!(setup.results[0].outcome, Outcome::Fail(101)));
            // A check that does not bound time counts everywhere.
            assert!(matches!(r.results[1].outcome, Outcome::Fail(101)));
        }
        assert!(CHECKS.iter().filter(|c| c.timing).count() >= 1);
    }
}
