//! The verifier check's instruction counts, per kernel series and program, against the
//! committed baseline: a table, the figures for the next baseline, and the regressions.

use std::{collections::BTreeMap, fs};

use anyhow::{Context as _, Result};

use super::checks::{Row, series_of};
use crate::cmd::root;

/// A program's verifier instruction count may grow to this multiple of the figure in
/// docs/kernels.json for the same kernel series before the run fails.
pub const VERIFIER_REGRESSION: f64 = 1.5;
/// The verifier figures of the latest committed run, per kernel series: the baseline.
pub const VERIFIER_BASELINE: &str = "docs/kernels.json";

/// The first kernel series that reports a loaded program's verified instructions
/// (`bpf_prog_info.verified_insns`).
const VERIFIED_INSNS_SINCE: &str = "5.16";

/// Verifier figures per kernel series: program (`+log` with the kernel debug log) → count.
pub type Figures = BTreeMap<String, BTreeMap<String, u64>>;

/// The figures of [`VERIFIER_BASELINE`]; none where it does not exist yet.
pub fn read_baseline() -> Result<Figures> {
    let path = root().join(VERIFIER_BASELINE);
    if !path.exists() {
        return Ok(Figures::new());
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    serde_json::from_value(v["verified_insns"].clone())
        .with_context(|| format!("{}: no `verified_insns` object", path.display()))
}

/// The `@@VERIFIER` report of a row's verifier check: program → count, or why none.
fn verifier_figures(row: &Row) -> std::result::Result<BTreeMap<String, u64>, String> {
    let r = row
        .results
        .iter()
        .find(|r| r.name == "verifier")
        .ok_or("no verifier check")?;
    let line = r
        .output
        .iter()
        .find_map(|l| l.split("@@VERIFIER ").nth(1))
        .ok_or("no @@VERIFIER line")?;
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("unreadable report: {e}"))?;
    let mut out = BTreeMap::new();
    // Loaded, but the kernel does not say how many instructions it verified (before 5.16).
    let mut uncounted = 0;
    for (key, suffix) in [("programs", ""), ("programs_with_kernel_log", "+log")] {
        for p in v[key].as_array().into_iter().flatten() {
            match (p[0].as_str(), p[1].as_u64()) {
                (Some(name), Some(n)) => {
                    out.insert(format!("{name}{suffix}"), n);
                }
                (Some(_), None) => uncounted += 1,
                _ => {}
            }
        }
    }
    if uncounted > 0 {
        out.insert(
            format!(
                "note: {uncounted} programs loaded; this kernel does not report the \
                 instructions verified (Linux {VERIFIED_INSNS_SINCE})"
            ),
            0,
        );
    }
    if let Some(e) = v["kernel_log_error"].as_str() {
        let reason = e.lines().next().unwrap_or(e);
        out.insert(format!("note: with the kernel debug log: {reason}"), 0);
    }
    if let Some(e) = v["error"].as_str() {
        let reason = e.lines().next().unwrap_or(e);
        if out.is_empty() {
            return Err(reason.to_owned());
        }
        out.insert(format!("error: {reason}"), 0);
    }
    Ok(out)
}

/// The verifier figures of a run: as Markdown, as the next baseline, and what grew too much.
pub struct VerifierTable {
    pub markdown: String,
    pub figures: Figures,
    pub regressions: Vec<String>,
}

pub fn verifier_table(rows: &[Row], baseline: &Figures) -> VerifierTable {
    let mut figures = Figures::new();
    let mut regressions = Vec::new();
    let mut md = String::from(
        "| kernel | program | instructions processed | baseline | × baseline |\n|---|---|---:|---:|---:|\n",
    );
    for row in rows {
        let series =
            series_of(&row.kernel).map_or_else(|| row.kernel.clone(), |(a, b)| format!("{a}.{b}"));
        match verifier_figures(row) {
            Err(why) => md.push_str(&format!("| {} | — | {why} | | |\n", row.kernel)),
            Ok(found) => {
                for (program, &n) in &found {
                    if program.starts_with("error: ") || program.starts_with("note: ") {
                        md.push_str(&format!("| {} | {program} | | | |\n", row.kernel));
                        continue;
                    }
                    let base = baseline.get(&series).and_then(|b| b.get(program)).copied();
                    let ratio = base.filter(|&b| b > 0).map(|b| n as f64 / b as f64);
                    if let (Some(r), Some(b)) = (ratio, base)
                        && r > VERIFIER_REGRESSION
                    {
                        regressions.push(format!("{program} on {series}: {n} vs {b}"));
                    }
                    md.push_str(&format!(
                        "| {} | {program} | {n} | {} | {} |\n",
                        row.kernel,
                        base.map_or("—".into(), |b| b.to_string()),
                        ratio.map_or("—".into(), |r| format!("{r:.2}×"))
                    ));
                }
                let kept: BTreeMap<String, u64> = found
                    .into_iter()
                    .filter(|(p, _)| !p.starts_with("error: ") && !p.starts_with("note: "))
                    .collect();
                // A kernel with no figures (none reported) has no baseline either.
                if !kept.is_empty() {
                    figures.insert(series, kept);
                }
            }
        }
    }
    VerifierTable {
        markdown: md,
        figures,
        regressions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::checks::{
        Outcome,
        test_rows::{result, row},
    };

    #[test]
    fn verifier_figures_and_regressions() {
        let line = r#"@@VERIFIER {"kernel":"6.1.0-57-amd64","programs":[["shedder_xdp",132435],["shedder_tc",120968]],"programs_with_kernel_log":[],"error":"with the kernel debug log: the kernel verifier rejected `shedder_xdp`: too complex"}"#;
        let r = row(
            "6.1.0-57-amd64",
            vec![result("verifier", Outcome::Fail(1), &["noise", line])],
        );
        let found = verifier_figures(&r).unwrap();
        assert_eq!(found["shedder_xdp"], 132435);
        assert!(
            found
                .keys()
                .any(|k| k.starts_with("error: with the kernel debug log"))
        );
        let mut baseline = Figures::new();
        baseline.insert(
            "6.1".into(),
            [
                ("shedder_xdp".to_string(), 80000),
                ("shedder_tc".to_string(), 120000),
            ]
            .into(),
        );
        let t = verifier_table(&[r], &baseline);
        // 132,435 / 80,000 = 1.66 > 1.5: a regression; 120,968 / 120,000 is not.
        assert_eq!(t.regressions.len(), 1, "{:?}", t.regressions);
        assert!(t.regressions[0].starts_with("shedder_xdp on 6.1"));
        assert!(!t.figures["6.1"].keys().any(|k| k.starts_with("error")));
        // A debug log too complex for the kernel is a note, not a figure.
        let line = r#"@@VERIFIER {"kernel":"6.1.0","programs":[["shedder_xdp",132435]],"programs_with_kernel_log":[],"error":null,"kernel_log_error":"too complex"}"#;
        let r = row("6.1.0", vec![result("verifier", Outcome::Pass, &[line])]);
        let t = verifier_table(&[r], &Figures::new());
        assert_eq!(t.figures["6.1"].len(), 1);
        assert!(
            t.markdown
                .contains("note: with the kernel debug log: too complex")
        );
        // A kernel before 5.16 loads the programs and reports no counts: a note, and no
        // (empty) baseline for its series.
        let line = r#"@@VERIFIER {"kernel":"5.10.0-46-amd64","programs":[["shedder_xdp",null],["shedder_tc",null]],"programs_with_kernel_log":[["shedder_xdp",null]],"error":null,"kernel_log_error":null}"#;
        let r = row(
            "5.10.0-46-amd64",
            vec![result("verifier", Outcome::Pass, &[line])],
        );
        let t = verifier_table(&[r], &baseline);
        assert!(t.figures.is_empty(), "{:?}", t.figures);
        assert!(t.regressions.is_empty());
        assert!(
            t.markdown
                .contains("note: 3 programs loaded; this kernel does not report"),
            "{}",
            t.markdown
        );
        // Rejected there: the error, with no figures.
        let line = r#"@@VERIFIER {"kernel":"5.10.0-46-amd64","programs":[],"programs_with_kernel_log":[],"error":"the kernel verifier rejected `shedder_xdp`: BPF_STX uses reserved fields","kernel_log_error":null}"#;
        let r = row(
            "5.10.0-46-amd64",
            vec![result("verifier", Outcome::Fail(1), &[line])],
        );
        assert!(
            verifier_figures(&r)
                .unwrap_err()
                .contains("BPF_STX uses reserved")
        );
        let t = verifier_table(&[r], &baseline);
        assert!(t.figures.is_empty());
        // No report at all is said, not guessed.
        let none = row(
            "6.12.95",
            vec![result("verifier", Outcome::Fail(1), &["boom"])],
        );
        assert!(verifier_figures(&none).is_err());
    }
}
