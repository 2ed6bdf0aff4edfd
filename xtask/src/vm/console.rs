//! The serial console: its lines made printable, how much of it the terminal sees, and the
//! results in the markers `/init` writes.

use super::checks::{Check, CheckResult, Outcome};

/// How much of the console goes to the terminal: everything up to [`Echo::LIMIT`] lines per
/// check (a rejected program's verifier log runs to thousands), then only the markers and
/// libtest's summary lines; the log keeps everything.
#[derive(Default)]
pub struct Echo {
    lines: usize,
}

impl Echo {
    const LIMIT: usize = 60;

    pub fn line(&mut self, tag: &str, line: &str) {
        if line.contains("@@VM-BEGIN ") {
            self.lines = 0;
        }
        self.lines += 1;
        let summary = line.contains("@@VM") || line.starts_with("test ");
        if self.lines <= Self::LIMIT || summary {
            eprintln!("{tag} {line}");
        } else if self.lines == Self::LIMIT + 1 {
            eprintln!("{tag} [… more output in the log; only markers and results from here]");
        }
    }
}

/// A console line without its line end and terminal control sequences (SeaBIOS clears the
/// screen, which would clear the terminal of whoever runs this).
pub fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            // An escape sequence: CSI (`ESC [`, parameters, a final byte in @..~), else
            // two characters (e.g. `ESC c`, a reset).
            '\x1b' => {
                if chars.next() == Some('[') {
                    while chars.next().is_some_and(|c| !('@'..='~').contains(&c)) {}
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A check's result from the serial console's markers.
pub fn parse_check(check: &Check, lines: &[String], ended: &str) -> CheckResult {
    let begin = format!("@@VM-BEGIN {}", check.name);
    let end = format!("@@VM-END {} ", check.name);
    let Some(first) = lines.iter().position(|l| l.ends_with(&begin)) else {
        return CheckResult {
            name: check.name,
            outcome: Outcome::NoResult(format!("never started; {ended}")),
            secs: None,
            output: Vec::new(),
        };
    };
    let rest = &lines[first + 1..];
    let Some(last) = rest.iter().position(|l| l.contains(&end)) else {
        return CheckResult {
            name: check.name,
            outcome: Outcome::NoResult(format!("did not finish; {ended}")),
            secs: None,
            output: rest.to_vec(),
        };
    };
    let marker = &rest[last];
    let field = |key: &str| {
        marker
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_owned)
    };
    let rc: Option<i32> = field("rc=").and_then(|v| v.parse().ok());
    let secs = match (field("start="), field("end=")) {
        (Some(s), Some(e)) => e
            .parse::<f64>()
            .ok()
            .zip(s.parse::<f64>().ok())
            .map(|(e, s)| e - s),
        _ => None,
    };
    CheckResult {
        name: check.name,
        outcome: match rc {
            Some(0) => Outcome::Pass,
            Some(rc) => Outcome::Fail(rc),
            None => Outcome::NoResult(format!("unreadable end marker `{marker}`")),
        },
        secs,
        output: rest[..last].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::checks::CHECKS;

    #[test]
    fn markers_give_outcome_and_duration() {
        let lines: Vec<String> = [
            "boot noise",
            "@@VM-BEGIN fixtures::fixture_table",
            "running 1 test",
            "@@VM-END fixtures::fixture_table rc=0 start=1.50 end=4.00",
            "@@VM-BEGIN netns::native_xdp",
            "---- native_xdp stdout ----",
            "@@VM-END netns::native_xdp rc=101 start=4.10 end=5.10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = parse_check(&CHECKS[0], &lines, "");
        assert!(matches!(r.outcome, Outcome::Pass));
        assert!((r.secs.unwrap() - 2.5).abs() < 1e-9);
        let r = parse_check(&CHECKS[1], &lines, "");
        assert!(matches!(r.outcome, Outcome::Fail(101)));
        assert_eq!(r.output, ["---- native_xdp stdout ----"]);
        let r = parse_check(&CHECKS[2], &lines, "timed out");
        assert!(matches!(r.outcome, Outcome::NoResult(_)));
    }

    #[test]
    fn console_lines_lose_control_sequences() {
        assert_eq!(
            printable("\x1bc\x1b[?7l\x1b[2J@@VM-KERNEL 6.1\r\n"),
            "@@VM-KERNEL 6.1"
        );
        assert_eq!(printable("a\tb\x1b[0mc"), "a\tbc");
    }
}
