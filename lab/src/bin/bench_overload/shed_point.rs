//! The report of a backend run for the shed point (the CPU-bound and TLS backends): goodput by
//! overload factor up to 20×, what the generator achieved, class success, the cost of a
//! refusal and of shedder's measuring, and the targets.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use shedder_lab::plot::{Panel, Series, chart_log_x};

use super::{
    backends::Server,
    figures::SystemResult,
    params::{CAPACITY_CLIENTS_PER_WORKER, SETTLE_SECS, TIE_POINTS},
    report::{BackendRun, Report, Target, ladder_table, opt, targets_table},
};

/// Goodput at 10× a shedder system must keep, % of capacity.
const KEEP_AT_10X: f64 = 95.0;
/// Points of goodput shedder must lead every peer by at every factor from [`LEAD_FROM`].
const LEAD_POINTS: f64 = 10.0;
const LEAD_FROM: f64 = 5.0;

fn goodput_at(s: &SystemResult, f: f64) -> Option<f64> {
    s.at(f).map(|x| x.goodput_pct)
}

/// shedder's targets on this backend: goodput at 10×, and its lead over every peer at each
/// factor from 5×.
pub fn shed_point_targets(systems: &[SystemResult]) -> Vec<Target> {
    let peers: Vec<&SystemResult> = systems.iter().filter(|s| !s.kind.is_shedder()).collect();
    let mut out = Vec::new();
    for s in systems.iter().filter(|s| s.kind.is_shedder()) {
        let at10 = goodput_at(s, 10.0);
        out.push(Target {
            system: s.kind.key(),
            what: "goodput at 10×".into(),
            goal: format!("≥ {KEEP_AT_10X:.0}% of capacity"),
            measured: opt(at10, "%"),
            met: at10.is_some_and(|g| g >= KEEP_AT_10X),
        });
        for st in s.steps.iter().filter(|x| x.factor >= LEAD_FROM) {
            let best = peers
                .iter()
                .filter_map(|p| Some((goodput_at(p, st.factor)?, p.kind.key())))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let Some((best, who)) = best else { continue };
            let lead = st.goodput_pct - best;
            out.push(Target {
                system: s.kind.key(),
                what: format!("lead over every peer at {}×", st.factor),
                goal: format!("≥ {LEAD_POINTS:.0} points over {best:.0}% ({who})"),
                measured: format!("{:.0}% ({lead:+.0} points)", st.goodput_pct),
                met: lead >= LEAD_POINTS,
            });
        }
    }
    out
}

pub fn shed_point_markdown(
    md: &mut String,
    report: &Report,
    run: &BackendRun,
    images: Option<&str>,
) {
    let spec = &run.spec;
    let key = spec.key;
    let _ = writeln!(md, "## {}\n", spec.title);
    let placement = run.placement.map_or(String::new(), |p| {
        format!(
            " The node runs on CPU {} (the backend's threads, its kernel packet processing in \
             the server veth's NAPI thread, HAProxy and the shedder daemon); the load \
             generator on CPU {}, so that it does not take what it measures, and refusing \
             (by XDP, the kernel, HAProxy or the application) takes from serving.",
            p.node_cpu, p.client_cpu
        )
    });
    let runs = run
        .capacity_runs_rps
        .iter()
        .map(|c| format!("{c:.0}/s"))
        .collect::<Vec<_>>()
        .join(", ");
    let server = match (spec.server, run.nominal_capacity_rps) {
        (Server::Tls { rsa_bits }, _) => format!(
            "Debian's nginx terminates TLS with one worker process: RSA-{rsa_bits}, no session \
             cache and no tickets, so every connection costs a full handshake; it serves a \
             64-byte file. The clients are rustls with resumption off (**measured capacity \
             {:.0} handshakes and requests/s**, the median of {} closed-loop runs of {} \
             clients: {runs}; a request served costs the node about {:.1} ms of CPU).",
            run.capacity_rps,
            run.capacity_runs_rps.len(),
            spec.workers * CAPACITY_CLIENTS_PER_WORKER,
            run.cost_ms(),
        ),
        (Server::Line(_), nominal) => format!(
            "{} workers compute {:.0} ms of CPU (hashing) per request (nominal {:.0} \
             requests/s; **measured capacity {:.0}/s**, the median of {} closed-loop runs: \
             {runs}).",
            spec.workers,
            run.cost_ms(),
            nominal.unwrap_or(0.0),
            run.capacity_rps,
            run.capacity_runs_rps.len(),
        ),
    };
    let _ = writeln!(
        md,
        "{server}{placement} The same open-loop client, deadline ({:.0} ms) and class mix as \
         above; each step lasts {} s, its first {} s left out. Only the ladder runs here; \
         retries, the slow-down and recovery are measured on the I/O-bound backend.\n",
        report.deadline_ms, report.step_secs, SETTLE_SECS,
    );
    let _ = writeln!(md, "### Goodput (% of capacity) by offered load\n");
    ladder_table(md, spec.ladder, &run.systems, |st| st.goodput_pct);
    let _ = writeln!(
        md,
        "\nOffered load the generator achieved, % of what the step asked (Poisson arrivals \
         on its own core; under 100% it fell short):\n"
    );
    ladder_table(md, spec.ladder, &run.systems, |st| {
        100.0 * st.offered_rps / st.target_rps.max(1e-9)
    });
    most_served_markdown(md, run);
    h2load_markdown(md, run);
    let _ = writeln!(md, "\n### By class, p99 and the cost of a refusal\n");
    let _ = writeln!(
        md,
        "| system | load | goodput | p99 of successes | critical | high | medium | sheddable |\n\
         |---|---|---:|---:|---:|---:|---:|---:|"
    );
    for s in &run.systems {
        for &f in spec.by_class {
            let Some(st) = s.at(f) else { continue };
            let [c, h, m, sh] = st.class_success_pct;
            let _ = writeln!(
                md,
                "| {} | {f}× | {:.0}% | {} | {c:.1}% | {h:.1}% | {m:.1}% | {sh:.1}% |",
                s.title,
                st.goodput_pct,
                opt(st.p99_ms, " ms")
            );
        }
    }
    let _ = writeln!(
        md,
        "\n*r* = CPU on the reject path per rejected attempt ÷ CPU per request served ({:.0} \
         ms), at {}×:\n",
        run.cost_ms(),
        spec.cost_factor
    );
    let _ = writeln!(
        md,
        "| system | CPU per rejected attempt | r | how |\n|---|---:|---:|---|"
    );
    for s in &run.systems {
        match &s.reject_cost {
            Some(c) => {
                let _ = writeln!(
                    md,
                    "| {} | {:.2} µs | {:.5} | {} |",
                    s.title, c.cpu_us, c.r, c.how
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "| {} | n/m | n/m | {} |",
                    s.title,
                    s.reject_cost_note.unwrap_or("not measured")
                );
            }
        }
    }
    let tracking: Vec<String> = run
        .systems
        .iter()
        .filter(|s| s.kind.is_shedder())
        .filter_map(|s| {
            let st = s.at(1.0)?;
            let us = st.tracking_us_per_ok?;
            Some(format!(
                "{}: {us:.1} µs per request served at 1× ({:.2}% of its {:.0} ms)",
                s.title,
                100.0 * us / run.cost_ms() / 1e3,
                run.cost_ms()
            ))
        })
        .collect();
    if !tracking.is_empty() {
        let _ = writeln!(
            md,
            "\nWhat shedder's measuring (its tracking programs, kernel BPF statistics) takes \
             from the node: {}.",
            tracking.join("; ")
        );
    }
    let _ = writeln!(md, "\n### shedder against its targets on this backend\n");
    targets_table(md, &run.targets);
    let _ = writeln!(
        md,
        "\nGoodput within {TIE_POINTS:.0} points counts as a tie elsewhere in this report; \
         here the lead asked is {LEAD_POINTS:.0} points."
    );
    if let Some(dir) = images {
        let _ = writeln!(
            md,
            "\n![Goodput by offered load, {key} backend]({dir}/goodput-{key}.png)\n"
        );
    }
}

/// Goodput against the overload factor, log axis.
pub fn shed_point_plot(run: &BackendRun, dir: &Path) -> Result<()> {
    let series: Vec<Series> = run
        .systems
        .iter()
        .map(|s| Series {
            name: s.kind.key().into(),
            points: s.steps.iter().map(|x| (x.factor, x.goodput_pct)).collect(),
        })
        .collect();
    // Room above the highest point: on TLS the ladder served more than the closed loop
    // measured.
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(100.0f64, f64::max);
    chart_log_x(
        &dir.join(format!("goodput-{}.png", run.spec.key)),
        &format!("Goodput by offered load, {} backend", run.spec.key),
        "offered load (× measured capacity, log scale)",
        &[Panel {
            y_label: "goodput (% of capacity)".into(),
            series,
            y_max: Some((top / 10.0).ceil() * 10.0 + 10.0),
            hlines: vec![("capacity".into(), 100.0)],
        }],
    )
}

/// The confirming h2load runs, beside the project's generator at the same factor.
fn h2load_markdown(md: &mut String, run: &BackendRun) {
    let runs: Vec<&SystemResult> = run
        .systems
        .iter()
        .filter(|s| s.h2load.is_some() || s.h2load_error.is_some())
        .collect();
    let Some(first) = runs.iter().find_map(|s| s.h2load.as_ref()) else {
        for s in &runs {
            let _ = writeln!(
                md,
                "\nh2load against {} failed: {}\n",
                s.title,
                s.h2load_error.as_deref().unwrap_or("")
            );
        }
        return;
    };
    let _ = writeln!(
        md,
        "\n### A second generator: h2load at {}×\n\n\
         Debian's h2load, HTTP/1.1 over TLS, one request per connection, {} connections started \
         every 10 ms for {:.0} s, `-T1` (a connection still open 1 s after it is up is \
         closed). h2load keeps no deadline from a connection's start: a dropped SYN stalls \
         it for the kernel's retries, so it runs only against the systems that answer a \
         refusal before the TLS handshake. 2xx are counted from its per-request log, those \
         started after the first {SETTLE_SECS} s (as in the ladder's steps) and done by 1 s \
         after the last connection was due. All its connections come from one \
         address, as from behind a NAT. Beside it, the project's generator at the same \
         factor in the ladder:\n",
        first.factor,
        (first.offered_rps / 100.0).round(),
        first.seconds,
    );
    let _ = writeln!(
        md,
        "| system | h2load: offered/s | 2xx | goodput | 5xx | errored | the project's generator |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for s in runs {
        let ours = opt(s.at(first.factor).map(|x| x.goodput_pct), "%");
        match (&s.h2load, &s.h2load_error) {
            (Some(h), _) => {
                let _ = writeln!(
                    md,
                    "| {} | {:.0} | {} | {:.0}% | {} | {} | {ours} |",
                    s.title,
                    h.offered_rps,
                    h.ok,
                    h.goodput_pct,
                    h.status_5xx,
                    h.errored.map_or("stopped".to_string(), |e| e.to_string())
                );
            }
            (None, Some(e)) => {
                let _ = writeln!(md, "| {} | failed: {e} | | | | | {ours} |", s.title);
            }
            (None, None) => {}
        }
    }
}

/// The most any system served within the deadline in any step, against the closed-loop
/// capacity, and shedder's 10× as a share of it: where the ladder serves more than the
/// closed loop measured, the percentages above flatter everyone alike.
fn most_served_markdown(md: &mut String, run: &BackendRun) {
    let Some((rps, who, factor)) = run
        .systems
        .iter()
        .flat_map(|s| {
            s.steps
                .iter()
                .map(move |x| (x.goodput_rps, s.kind.key(), x.factor))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
    else {
        return;
    };
    let at10: Vec<String> = run
        .systems
        .iter()
        .filter(|s| s.kind.is_shedder())
        .filter_map(|s| {
            let x = s.at(10.0)?;
            Some(format!(
                "{} {:.0}/s ({:.0}%)",
                s.kind.key(),
                x.goodput_rps,
                100.0 * x.goodput_rps / rps
            ))
        })
        .collect();
    let _ = writeln!(
        md,
        "\nThe most served within the deadline in any step: {rps:.0}/s ({who} at {factor}×), \
         {:.0}% of the measured capacity. At 10× against that rate: {}.",
        100.0 * rps / run.capacity_rps,
        if at10.is_empty() {
            "no shedder run".to_string()
        } else {
            at10.join(", ")
        }
    );
}
