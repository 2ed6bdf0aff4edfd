//! The summary: the results per kernel on the terminal and, with `--out`, as Markdown beside
//! the verifier figures.

use std::{fs, path::Path, time::Duration};

use anyhow::{Context as _, Result};

use super::{
    boot::{VM_CPUS, VM_MEMORY_MB},
    checks::{Outcome, Row, selected},
    verifier::{VERIFIER_BASELINE, VERIFIER_REGRESSION, VerifierTable},
};
use crate::cmd::{cmd, stdout};

/// The part of a failed check's output that says why: the panic message's first lines, and
/// for each distinct verifier rejection (a log ends with `processed N insns …`) the program,
/// the failing instruction and the message, with how often it occurred; without either,
/// libtest's failure section or the last lines. Very long lines are shortened.
fn excerpt(output: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(i) = output.iter().position(|l| l.contains("panicked at")) {
        out.extend(output[i..output.len().min(i + 3)].iter().cloned());
    }
    // A verifier log inside a Debug-printed error is one line with `\n` escapes.
    let lines: Vec<&str> = output.iter().flat_map(|l| l.split("\\n")).collect();
    let mut rejections: Vec<(String, usize)> = Vec::new();
    let mut program = String::new();
    for (i, &line) in lines.iter().enumerate() {
        if let Some(rest) = line.split("verifier rejected ").nth(1) {
            program = rest.split(':').next().unwrap_or(rest).to_owned();
        } else if let Some(rest) = line.split("Verifier { program: ").nth(1) {
            program = rest.split(',').next().unwrap_or(rest).to_owned();
        }
        if !(line.starts_with("processed ") && line.contains(" insns ")) {
            continue;
        }
        let mut end = i;
        while end > 0
            && (lines[end - 1].starts_with("verification time")
                || lines[end - 1].starts_with("stack depth"))
        {
            end -= 1;
        }
        // The failing instruction and the message: the two lines before the statistics,
        // less the error's own header where the log is shorter (a program refused before
        // verification, e.g. 5.10's "BPF_STX uses reserved fields", logs one line).
        let context: Vec<&str> = lines[end.saturating_sub(2)..end]
            .iter()
            .copied()
            .filter(|l| !l.contains("verifier rejected ") && !l.contains("Verifier { program: "))
            .collect();
        let message = format!("{program}: {}", context.join("  /  "));
        match rejections.iter_mut().find(|(m, _)| *m == message) {
            Some((_, n)) => *n += 1,
            None => rejections.push((message, 1)),
        }
    }
    for (message, n) in &rejections {
        out.push(format!("verifier ({n}x): {message}"));
    }
    if out.is_empty() {
        let from = output
            .iter()
            .position(|l| l.starts_with("---- "))
            .unwrap_or(output.len().saturating_sub(25));
        out.extend(output[from..].iter().take(40).cloned());
    }
    out.into_iter()
        .map(|l| {
            let chars: Vec<char> = l.chars().collect();
            if chars.len() <= 1000 {
                l
            } else {
                let head: String = chars[..300].iter().collect();
                let tail: String = chars[chars.len() - 600..].iter().collect();
                format!("{head} [… {} characters …] {tail}", chars.len() - 900)
            }
        })
        .collect()
}

/// A result's state and reason, as printed.
fn state(outcome: &Outcome) -> (String, String) {
    match outcome {
        Outcome::Pass => ("pass".to_owned(), String::new()),
        Outcome::Fail(rc) => ("FAIL".to_owned(), format!("exit status {rc}")),
        Outcome::NoResult(why) => ("NO RESULT".to_owned(), why.clone()),
        Outcome::Emulated(why) => ("n/a".to_owned(), why.clone()),
    }
}

/// `DIR/kernels.md` and `DIR/kernels.json`.
pub fn write_docs(
    dir: &Path,
    rows: &[Row],
    verifier: &VerifierTable,
    total: Duration,
) -> Result<()> {
    let date = stdout(&mut cmd("date", ["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    let mut md = format!(
        "Latest `cargo xtask vm-test --out docs` run: {}, in {:.0} min, on {}. \
         VMs: Debian kernel packages under `qemu-system-x86_64` ({}), {} MiB, {} vCPUs, an \
         initramfs built by the xtask; the host row runs natively. The minimum kernel \
         documented above is the oldest row where every counted check passes.\n\n",
        date.trim(),
        total.as_secs_f64() / 60.0,
        stdout(&mut cmd("uname", ["-srm"]))?.trim(),
        rows.first().map_or("", |r| r.how.as_str()),
        VM_MEMORY_MB,
        VM_CPUS,
    );
    md.push_str("| kernel | how |");
    for c in selected() {
        md.push_str(&format!(" {} |", c.name));
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(selected().count()));
    md.push('\n');
    for row in rows {
        md.push_str(&format!("| {} | {} |", row.kernel, row.how));
        for c in selected() {
            let cell = row.results.iter().find(|r| r.name == c.name).map_or_else(
                || "—".to_owned(),
                |r| {
                    let (state, why) = state(&r.outcome);
                    let secs = r.secs.map_or(String::new(), |s| format!(" ({s:.0} s)"));
                    if why.is_empty() {
                        format!("{state}{secs}")
                    } else {
                        format!("{state}{secs}: {why}")
                    }
                },
            );
            md.push_str(&format!(" {} |", cell.replace('|', "\\|")));
        }
        md.push('\n');
    }
    md.push_str(&format!(
        "\n*n/a* = a check that bounds latency failed in an emulated (TCG) VM, too slow to \
         judge it, which is said in its cell.\n\n## Verifier complexity\n\nInstructions the verifier processed \
         per program (`+log`: built with `daemon.kernel_debug_log`), against the previous \
         committed run ({VERIFIER_BASELINE}); a program over {VERIFIER_REGRESSION}× its \
         baseline fails the run.\n\n{}",
        verifier.markdown
    ));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let md_path = dir.join("kernels.md");
    // The document's prose around the results stays; a directory without it gets the
    // results alone.
    let text = match fs::read_to_string(&md_path) {
        Ok(doc) => splice_generated(&doc, &md).unwrap_or(md),
        Err(_) => format!("# Kernels\n\n{md}"),
    };
    fs::write(&md_path, text).with_context(|| format!("writing {}", md_path.display()))?;
    let json = serde_json::json!({ "date": date.trim(), "verified_insns": verifier.figures });
    let json_path = dir.join("kernels.json");
    fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    eprintln!(
        "vm-test: wrote {} and {}",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}

/// The results per kernel on the terminal, then why each failed check failed.
pub fn report(rows: &[Row], total: Duration) {
    let name_width = selected().map(|c| c.name.len()).max().unwrap_or(0);
    eprintln!("\n=== vm-test results");
    for row in rows {
        eprintln!("\n{} ({}) {:.1} s", row.kernel, row.how, row.secs);
        for r in &row.results {
            let (state, why) = state(&r.outcome);
            let secs = r
                .secs
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"));
            let line = format!("  {:<name_width$}  {state:<9} {secs:>8}  {why}", r.name);
            eprintln!("{}", line.trim_end());
        }
        for note in &row.notes {
            eprintln!("  note: {note}");
        }
        if let Some(log) = &row.log {
            eprintln!("  log: {}", log.display());
        }
    }
    for row in rows {
        for r in &row.results {
            let counted = match r.outcome {
                Outcome::Fail(_) => "",
                Outcome::Emulated(_) => " (not counted: emulated VM)",
                _ => continue,
            };
            if !r.output.is_empty() {
                eprintln!("\n--- {} on {}{counted}:", r.name, row.kernel);
                for line in excerpt(&r.output) {
                    eprintln!("    {line}");
                }
            }
        }
    }
    eprintln!("\nvm-test: total wall time {:.1} s", total.as_secs_f64());
}

/// `doc` with the text between its generated-results markers replaced by `results`; `None`
/// without markers.
fn splice_generated(doc: &str, results: &str) -> Option<String> {
    const END: &str = "<!-- END generated -->";
    let begin = doc.find("<!-- BEGIN generated")?;
    let body = begin + doc[begin..].find('\n')? + 1;
    let end = body + doc[body..].find(END)?;
    let results = results.trim_end();
    Some(format!("{}{results}\n{}", &doc[..body], &doc[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_replace_only_the_generated_part_of_the_document() {
        let doc =
            "# Kernels\n\nWhy.\n\n<!-- BEGIN generated by x -->\nold\n<!-- END generated -->\n";
        assert_eq!(
            splice_generated(doc, "new\n\n").unwrap(),
            "# Kernels\n\nWhy.\n\n<!-- BEGIN generated by x -->\nnew\n<!-- END generated -->\n"
        );
        assert_eq!(splice_generated("no markers", "x"), None);
    }

    #[test]
    fn excerpt_names_each_verifier_rejection_once() {
        let output: Vec<String> = [
            "thread 't' panicked at tests/tests/x.rs:1:5:",
            "2 of 2 runs failed:",
            "[Tc] a:",
            "    loading: the kernel verifier rejected `shedder_xdp`: Invalid argument",
            "3482: (0f) r0 += r9",
            "value -9 makes map_value pointer be out of bounds",
            "verification time 52253 usec",
            "stack depth 272+0",
            "processed 622 insns (limit 1000000) max_states_per_insn 1",
            r#"load: Verifier { program: "shedder_tc", source: Os, log: "0: R1=ctx\n3482: (0f) r0 += r9\nvalue -9 makes map_value pointer be out of bounds\nprocessed 622 insns (limit 1000000)\n" }"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let e = excerpt(&output);
        assert_eq!(e[0], output[0]);
        assert_eq!(
            e[3],
            "verifier (1x): `shedder_xdp`: 3482: (0f) r0 += r9  /  value -9 makes map_value \
             pointer be out of bounds"
        );
        assert!(
            e[4].starts_with("verifier (1x): \"shedder_tc\": 3482"),
            "{e:?}"
        );
    }

    #[test]
    fn excerpt_of_a_program_refused_before_verification() {
        // Linux 5.10: one line of log, printed on stderr and again in the JSON report.
        let report = r#"@@VERIFIER {"kernel":"5.10.0-46-amd64","programs":[],"error":"the kernel verifier rejected `shedder_xdp`: BPF_STX uses reserved fields (Invalid argument (os error 22)); shedder is validated on Linux 6.1 and later. The verifier's log:\nBPF_STX uses reserved fields\nverification time 2476 usec\nstack depth 0+0\nprocessed 0 insns (limit 1000000) max_states_per_insn 0\n"}"#;
        let output: Vec<String> = [
            "verifier_report: the kernel verifier rejected `shedder_xdp`: BPF_STX uses reserved \
             fields (Invalid argument (os error 22)); shedder is validated on Linux 6.1 and \
             later. The verifier's log:",
            "BPF_STX uses reserved fields",
            "verification time 2476 usec",
            "stack depth 0+0",
            "processed 0 insns (limit 1000000) max_states_per_insn 0",
            report,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            excerpt(&output),
            ["verifier (2x): `shedder_xdp`: BPF_STX uses reserved fields"]
        );
    }
}
