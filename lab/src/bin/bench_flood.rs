//! `cargo xtask bench flood`: forged SYNs as fast as one thread sends them (or at
//! `--rate`), from random addresses, ports and sequence numbers in the default class's
//! space, HIGH's prefix and CRITICAL's prefix, beside clients of every class at 75% of the
//! backend's capacity: their success with the kernel alone (SYN cookies), with shedder, and
//! with shedder and no flood, each on a fresh lab; then a real overload of 3× during a flood.
//! Prints a Markdown report (and writes it to `--out`). Root only; about 4 minutes.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Result, bail};
use clap::Parser;
use shedder_lab::{
    flood_lab::{CLIENTS, Run, SPACES, overload, run, success},
    machine::machine,
};

#[derive(Debug, Parser)]
#[command(name = "bench_flood")]
struct Args {
    /// Forged SYNs a second (default: as fast as one sending thread can).
    #[arg(long)]
    rate: Option<f64>,
    /// Also write the report to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

fn pct(v: f64) -> String {
    format!("{:.1}%", 100.0 * v)
}

fn main() -> ExitCode {
    match bench() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("bench_flood: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// True if every target is met.
fn bench() -> Result<bool> {
    let args = Args::parse();
    if !shedder_lab::is_root() {
        bail!("needs root (network namespaces, BPF): run `cargo xtask bench flood` as root");
    }
    let m = machine();
    let calm = run("bfcalm", None, true, None);
    let mut md = format!(
        "### Spoofed SYN flood\n\nMachine: Linux {} {}, {}, {} CPU(s). Clients at 75% of a \
         backend of 4 workers × 20 ms: CRITICAL 10/s, HIGH 40/s, MEDIUM 100/s, each request \
         with a 1 s deadline; success over seconds 2–12 of each run, each run on a fresh lab. \
         Forged SYNs {} from one sending thread.\n\n",
        m.kernel,
        m.arch,
        m.cpu,
        m.nproc,
        args.rate
            .map_or("as fast as it can".to_string(), |r| format!("at {r:.0}/s"))
    );
    md.push_str(
        "| forged space | forged/s (kernel alone, shedder) | class | kernel alone | shedder | shedder, no flood | shedder ≥ 95% of no flood and ≥ kernel alone |\n\
         |---|---|---|---:|---:|---:|---|\n",
    );
    let mut met = true;
    let mut limits = Vec::new();
    for space in SPACES {
        let kernel: Run = run(
            &format!("bfk{}", &space.0[..2]),
            Some(space),
            false,
            args.rate,
        );
        let shed: Run = run(
            &format!("bfs{}", &space.0[..2]),
            Some(space),
            true,
            args.rate,
        );
        for (i, (class, _, _)) in CLIENTS.iter().enumerate() {
            let ok = shed.success[i] >= 0.95 * calm.success[i]
                && shed.success[i] + 0.02 >= kernel.success[i]
                && (i != 0 || shed.success[0] >= 1.0);
            met &= ok;
            md.push_str(&format!(
                "| {} | {:.0}, {:.0} | {class} | {} | {} | {} | {} |\n",
                space.0,
                kernel.flood_rate,
                shed.flood_rate,
                pct(kernel.success[i]),
                pct(shed.success[i]),
                pct(calm.success[i]),
                if ok { "met" } else { "**not met**" }
            ));
        }
        limits.push((space.0, shed.limit, shed.offered));
    }
    md.push_str(&format!(
        "\nThe limit's median over the judged seconds, and the proven attempts offered per \
         class (CRITICAL, HIGH, MEDIUM, SHEDDABLE): without the flood {:?}, {:?}",
        calm.limit, calm.offered
    ));
    for (space, limit, offered) in &limits {
        md.push_str(&format!("; {space} forged {limit:?}, {offered:?}"));
    }
    md.push_str(".\n");
    let (w, capacity, forged) = overload("bfover", SPACES[0].1, 3.0, args.rate);
    let s = |c| success(&w, c);
    let ok = w.goodput() >= 0.85 * capacity
        && s("critical") >= s("high")
        && s("high") >= s("medium")
        && s("medium") >= s("sheddable");
    met &= ok;
    md.push_str(&format!(
        "\nAn overload of 3× from clients with standing (the standard mix) during {forged:.0} \
         forged SYNs a second in the default space: goodput {:.0}/s of {capacity:.0}/s \
         ({}); success CRITICAL {}, HIGH {}, MEDIUM {}, SHEDDABLE {} (targets ≥ 85% goodput, \
         priority order: {}).\n",
        w.goodput(),
        pct(w.goodput() / capacity),
        pct(s("critical")),
        pct(s("high")),
        pct(s("medium")),
        pct(s("sheddable")),
        if ok { "met" } else { "**not met**" }
    ));
    print!("{md}");
    if let Some(path) = &args.out {
        std::fs::write(path, &md)?;
        eprintln!("bench_flood: report written to {}", path.display());
    }
    Ok(met)
}
