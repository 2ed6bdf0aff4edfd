//! `shedder counters`: the decision counters in the pinned maps, without a daemon.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use shedder::kernel::{self, MapReader as _};
use shedder_common::{
    CLASS_NAMES, NUM_CLASSES, NUM_VERDICTS, Reason, ServiceCounters, VERDICT_NAMES, decision_index,
};

use super::{Services, paths::load_config};

/// One counter of one service and class, named as the metric is (`shedder_<counter>_total`).
/// `counters --json` prints a list of them; a counter at zero is left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Row {
    service: String,
    /// `connection_attempts`, `syn_retransmits` or `retries`.
    counter: &'static str,
    class: &'static str,
    /// For `connection_attempts` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<&'static str>,
    /// For `connection_attempts` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    count: u64,
}

pub fn run(config: &Path, services: &Services, json: bool) -> Result<()> {
    let cfg = load_config(config)?;
    services.check(cfg.services.iter().map(|s| s.name.as_str()))?;
    let pins = kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    let pin_dir = &pins.path;
    if !pin_dir.join("maps").exists() {
        bail!("nothing is attached: no maps under {}", pins.describe());
    }
    let shedder = kernel::PinnedMaps::open(pin_dir).context("opening the pinned maps")?;
    let mut read = Vec::new();
    for (id, svc) in cfg.services.iter().enumerate() {
        if services.shows(&svc.name) {
            read.push((svc.name.as_str(), shedder.service_counters(id as u32)?));
        }
    }
    let rows = rows(&read);
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", render(&rows));
    }
    Ok(())
}

/// Decisions (unique attempts) of every service first, then its retransmitted SYNs and
/// retries per class.
fn rows(services: &[(&str, ServiceCounters)]) -> Vec<Row> {
    let mut decisions = Vec::new();
    let mut repeats = Vec::new();
    for (name, counters) in services {
        for class in 0..NUM_CLASSES as u32 {
            for verdict in 0..NUM_VERDICTS {
                for reason in Reason::ALL {
                    let n = counters.n[decision_index(class, verdict, reason as u32) as usize];
                    if n > 0 {
                        decisions.push(Row {
                            service: name.to_string(),
                            counter: "connection_attempts",
                            class: CLASS_NAMES[class as usize],
                            verdict: Some(VERDICT_NAMES[verdict as usize]),
                            reason: Some(reason.name()),
                            count: n,
                        });
                    }
                }
            }
        }
        for (class, name_of_class) in CLASS_NAMES.iter().enumerate() {
            for (counter, n) in [
                ("syn_retransmits", counters.retransmits[class]),
                ("retries", counters.retries[class]),
            ] {
                if n > 0 {
                    repeats.push(Row {
                        service: name.to_string(),
                        counter,
                        class: name_of_class,
                        verdict: None,
                        reason: None,
                        count: n,
                    });
                }
            }
        }
    }
    decisions.extend(repeats);
    decisions
}

/// Two tables: the decisions, then retransmits and retries. Retransmits are not attempts
/// (not in the first table); retries are, and are also counted in the second by the class
/// they had before demotion.
fn render(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:<10} {:<8} {:<14} {:>12}",
        "SERVICE", "CLASS", "VERDICT", "REASON", "COUNT"
    );
    for r in rows.iter().filter(|r| r.verdict.is_some()) {
        let _ = writeln!(
            out,
            "{:<20} {:<10} {:<8} {:<14} {:>12}",
            r.service,
            r.class,
            r.verdict.unwrap_or(""),
            r.reason.unwrap_or(""),
            r.count
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<20} {:<10} {:>12} {:>12}",
        "SERVICE", "CLASS", "RETRANSMITS", "RETRIES"
    );
    // One line per service and class, both counts side by side.
    let mut pairs: Vec<(&str, &str, u64, u64)> = Vec::new();
    for r in rows.iter().filter(|r| r.verdict.is_none()) {
        let i = match pairs
            .iter()
            .position(|p| p.0 == r.service && p.1 == r.class)
        {
            Some(i) => i,
            None => {
                pairs.push((&r.service, r.class, 0, 0));
                pairs.len() - 1
            }
        };
        match r.counter {
            "syn_retransmits" => pairs[i].2 = r.count,
            _ => pairs[i].3 = r.count,
        }
    }
    for (service, class, retransmits, retries) in pairs {
        let _ = writeln!(
            out,
            "{service:<20} {class:<10} {retransmits:>12} {retries:>12}"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use shedder_common::{
        CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE, Reason, VERDICT_PASS, VERDICT_RST,
    };

    use super::*;

    fn sample() -> Vec<(&'static str, ServiceCounters)> {
        let mut web = ServiceCounters::default();
        web.n[decision_index(CLASS_MEDIUM, VERDICT_PASS, Reason::UnderLimit as u32) as usize] = 120;
        web.n[decision_index(CLASS_SHEDDABLE, VERDICT_RST, Reason::ServiceLimit as u32) as usize] =
            7;
        web.retransmits[CLASS_SHEDDABLE as usize] = 3;
        web.retries[CLASS_SHEDDABLE as usize] = 2;
        let mut api = ServiceCounters::default();
        api.retries[CLASS_HIGH as usize] = 1;
        vec![("web", web), ("api", api)]
    }

    /// What `counters --json` prints, and the tables, as a script and an operator read them.
    #[test]
    fn counters_json_and_table_match_the_golden_files() {
        let rows = rows(&sample());
        let json = serde_json::to_string_pretty(&rows).unwrap();
        super::super::golden::check("counters.json", &format!("{json}\n"));
        super::super::golden::check("counters.txt", &render(&rows));
        // Decisions carry a verdict and a reason; retransmits and retries do not.
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for row in v.as_array().unwrap() {
            let decision = row["counter"] == "connection_attempts";
            assert_eq!(row.get("verdict").is_some(), decision, "{row}");
            assert_eq!(row.get("reason").is_some(), decision, "{row}");
        }
    }
}
