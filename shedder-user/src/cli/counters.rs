//! `shedder counters`: the decision counters in the pinned maps, without a daemon.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use shedder::kernel::{self, MapReader as _};
use shedder_common::{
    CLASS_NAMES, NUM_CLASSES, NUM_REASONS, NUM_VERDICTS, REASON_NAMES, VERDICT_NAMES,
    decision_index,
};

use super::load_config;

pub fn run(config: PathBuf, json: bool) -> Result<()> {
    let cfg = load_config(&config)?;
    let pins = kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    let pin_dir = &pins.path;
    if !pin_dir.join("maps").exists() {
        bail!("nothing is attached: no maps under {}", pins.describe());
    }
    let shedder = kernel::PinnedMaps::open(pin_dir).context("opening the pinned maps")?;
    // Decisions (unique attempts), then retransmitted SYNs and retries per class; each row
    // names its counter as the metric does (`shedder_<counter>_total`).
    let mut rows = Vec::new();
    // (service, class, retransmits, retries), where either is not zero.
    let mut retry_rows = Vec::new();
    for (id, svc) in cfg.services.iter().enumerate() {
        let counters = shedder.service_counters(id as u32)?;
        let (decisions, retransmits, retries) =
            (counters.n, counters.retransmits, counters.retries);
        for class in 0..NUM_CLASSES as u32 {
            for verdict in 0..NUM_VERDICTS {
                for reason in 0..NUM_REASONS {
                    let n = decisions[decision_index(class, verdict, reason) as usize];
                    if n > 0 {
                        rows.push(serde_json::json!({
                            "service": svc.name,
                            "counter": "connection_attempts",
                            "class": CLASS_NAMES[class as usize],
                            "verdict": VERDICT_NAMES[verdict as usize],
                            "reason": REASON_NAMES[reason as usize],
                            "count": n,
                        }));
                    }
                }
            }
        }
        for (class, name) in CLASS_NAMES.iter().enumerate() {
            if retransmits[class] > 0 || retries[class] > 0 {
                retry_rows.push((&svc.name, *name, retransmits[class], retries[class]));
            }
        }
    }
    if json {
        for &(service, class, retransmits, retries) in &retry_rows {
            for (counter, n) in [("syn_retransmits", retransmits), ("retries", retries)] {
                if n > 0 {
                    rows.push(serde_json::json!({
                        "service": service,
                        "counter": counter,
                        "class": class,
                        "count": n,
                    }));
                }
            }
        }
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<20} {:<10} {:<8} {:<14} {:>12}",
        "SERVICE", "CLASS", "VERDICT", "REASON", "COUNT"
    );
    for r in rows {
        println!(
            "{:<20} {:<10} {:<8} {:<14} {:>12}",
            r["service"].as_str().unwrap_or(""),
            r["class"].as_str().unwrap_or(""),
            r["verdict"].as_str().unwrap_or(""),
            r["reason"].as_str().unwrap_or(""),
            r["count"].as_u64().unwrap_or(0)
        );
    }
    // Retransmits are not attempts (not in the table above); retries are, and are also
    // counted here by the class they had before demotion.
    println!();
    println!(
        "{:<20} {:<10} {:>12} {:>12}",
        "SERVICE", "CLASS", "RETRANSMITS", "RETRIES"
    );
    for (service, class, retransmits, retries) in retry_rows {
        println!("{service:<20} {class:<10} {retransmits:>12} {retries:>12}");
    }
    Ok(())
}
