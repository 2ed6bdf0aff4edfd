//! The report of the I/O-bound backend's run: the ladder, success by class, 3×, retries,
//! the slow-down and the recovery, the targets, plots and configurations.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use shedder_lab::plot::{Panel, Series, chart};

use super::{
    figures::SystemResult,
    params::{BY_CLASS, LADDER, RECOVERY_HOLD, SETTLE_SECS, TARGET_LATENCY, TIE_POINTS},
    report::{BackendRun, Report, Target, ladder_table, opt, targets_table},
    scenarios::{RECOVERY_HIGH, RECOVERY_LOW, SLOW_AT, SLOW_TOTAL},
};

pub fn targets(systems: &[SystemResult]) -> Vec<Target> {
    let peers: Vec<&SystemResult> = systems.iter().filter(|s| !s.kind.is_shedder()).collect();
    let best_peer = |f: &dyn Fn(&SystemResult) -> Option<f64>| {
        peers
            .iter()
            .filter_map(|p| Some((f(p)?, p.kind.key())))
            .max_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal))
    };
    let target_ms = TARGET_LATENCY.as_secs_f64() * 1e3;
    let mut out = Vec::new();
    for s in systems.iter().filter(|s| s.kind.is_shedder()) {
        let name = s.kind.key();
        let mut t = |what: &str, goal: String, measured: String, met: bool| {
            out.push(Target {
                system: name,
                what: what.into(),
                goal,
                measured,
                met,
            })
        };
        let at3 = s.at(3.0);
        let good = at3.map(|x| x.goodput_pct);
        t(
            "goodput at 3×",
            "≥ 90% of capacity (stretch 95%)".into(),
            opt(good, "%"),
            good.is_some_and(|g| g >= 90.0),
        );
        let p = at3.and_then(|x| x.p99_ms);
        t(
            "p99 of successes at 3×",
            format!("≤ {:.0} ms (2× target)", 2.0 * target_ms),
            opt(p, " ms"),
            p.is_some_and(|p| p <= 2.0 * target_ms),
        );
        let c = at3.map(|x| x.critical_pct);
        t(
            "CRITICAL success at 3×",
            "≥ 99%".into(),
            c.map_or("–".into(), |c| format!("{c:.1}%")),
            c.is_some_and(|c| c >= 99.0),
        );
        let r = s.reject_cost.as_ref().map(|r| r.r);
        t(
            "r (reject CPU / serving cost)",
            "≤ 0.01".into(),
            r.map_or("–".into(), |r| format!("{r:.5}")),
            r.is_some_and(|r| r <= 0.01),
        );
        let rec = s.recovery.as_ref().and_then(|r| r.recovery_s);
        t(
            "recovery after 3× → 0.5×",
            "≤ 2 s".into(),
            rec.map_or("never".into(), |v| format!("{v:.2} s")),
            rec.is_some_and(|v| v <= 2.0),
        );
        let mut ahead =
            |what: &str, mine: Option<f64>, f: &dyn Fn(&SystemResult) -> Option<f64>| {
                if let Some((best, who)) = best_peer(f) {
                    let mine_v = mine.unwrap_or(0.0);
                    let verdict = if mine_v > best + TIE_POINTS {
                        "ahead"
                    } else if mine_v >= best - TIE_POINTS {
                        "tied"
                    } else {
                        "behind"
                    };
                    t(
                        what,
                        format!("more than {best:.0}% + {TIE_POINTS:.0} ({who})"),
                        format!("{} ({verdict})", opt(mine, "%")),
                        verdict == "ahead",
                    );
                }
            };
        ahead("ahead of every peer on goodput at 3×", good, &|p| {
            p.at(3.0).map(|x| x.goodput_pct)
        });
        ahead(
            "ahead of every peer on goodput within 2× target at 3×",
            at3.map(|x| x.slo_goodput_pct),
            &|p| p.at(3.0).map(|x| x.slo_goodput_pct),
        );
        ahead(
            "ahead of every peer on goodput after the 2× slow-down",
            s.slowdown.as_ref().map(|x| x.after_pct),
            &|p| p.slowdown.as_ref().map(|x| x.after_pct),
        );
        ahead(
            "ahead of every peer on goodput within 2× target after the slow-down",
            s.slowdown.as_ref().map(|x| x.after_slo_pct),
            &|p| p.slowdown.as_ref().map(|x| x.after_slo_pct),
        );
    }
    out
}

/// The I/O-bound backend's report: the ladder, success by class, 3×, retries, slow-down,
/// recovery, targets, plots and configurations.
pub fn io_markdown(md: &mut String, report: &Report, run: &BackendRun, images: Option<&str>) {
    let _ = writeln!(md, "## {}\n", run.spec.title);
    let _ = writeln!(
        md,
        "One backend of {} workers × {:.0} ms (nominal {:.0} requests/s; **measured capacity \
         {:.0}/s**, closed loop) in a server namespace behind a veth. An open-loop client \
         (Poisson arrivals) in another namespace sends one request per connection with a \
         {:.0} ms deadline from four class prefixes: critical 5%, high 25%, medium 50%, \
         sheddable 20%. *Goodput* = responses completed within the deadline. Each ladder step \
         lasts {} s; its first {} s are left out. shedder and the in-app limiter get a {:.0} ms \
         latency target and no capacity figure; nftables is given the measured capacity.\n",
        run.spec.workers,
        run.cost_ms(),
        run.nominal_capacity_rps.unwrap_or(0.0),
        run.capacity_rps,
        report.deadline_ms,
        report.step_secs,
        SETTLE_SECS,
        report.target_latency_ms,
    );
    let _ = writeln!(md, "## Goodput (% of capacity) by offered load\n");
    ladder_table(md, &LADDER, &run.systems, |st| st.goodput_pct);
    let _ = writeln!(md, "\n## Success by class\n");
    let _ = writeln!(
        md,
        "% of each class's requests answered within the deadline. Offered by class: \
         critical 5%, high 25%, medium 50%, sheddable 20% of the total; shedder's classes: \
         critical never shed by pressure (ceiling 5% of `max_limit`), high floor 60%, \
         medium floor 5%, sheddable no floor. At 2× and 3× high's demand fits in the \
         capacity less critical's and medium's floor, so it should be served in full and \
         the classes below it held to what is left; at 5× it does not, and high gets what \
         critical and medium's floor leave.\n"
    );
    let _ = writeln!(
        md,
        "| system | load | critical | high | medium | sheddable | goodput |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for s in &run.systems {
        for f in BY_CLASS {
            let Some(st) = s.at(f) else { continue };
            let [c, h, m, sh] = st.class_success_pct;
            let _ = writeln!(
                md,
                "| {} | {f}× | {c:.1}% | {h:.1}% | {m:.1}% | {sh:.1}% | {:.0}% |",
                s.title, st.goodput_pct
            );
        }
    }
    let _ = writeln!(md, "\n## At 3× capacity\n");
    let _ = writeln!(
        md,
        "| system | goodput | within 2× target | p99 of successes | CRITICAL success | all success | timeouts / refused / reset / 503 | CPU per rejected attempt | r |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let Some(st) = s.at(3.0) else { continue };
        let (cpu, r) = match &s.reject_cost {
            Some(c) => (format!("{:.2} µs", c.cpu_us), format!("{:.5}", c.r)),
            None => ("n/m".into(), "n/m".into()),
        };
        let _ = writeln!(
            md,
            "| {} | {:.0}% | {:.0}% | {} | {:.1}% | {:.0}% | {} / {} / {} / {} | {cpu} | {r} |",
            s.title,
            st.goodput_pct,
            st.slo_goodput_pct,
            opt(st.p99_ms, " ms"),
            st.critical_pct,
            st.success_pct,
            st.timeouts,
            st.refused,
            st.reset,
            st.busy,
        );
    }
    let _ = writeln!(
        md,
        "\n*Goodput* can read a point or two above 100%: capacity is measured with a closed \
         loop, which leaves a worker idle for a moment between requests. *Within 2× target* = \
         responses within {:.0} ms, the objective a {:.0} ms target implies. \
         *r* = CPU on the reject path per rejected attempt ÷ the cost of serving one request \
         ({:.0} ms of a worker, the backend's saturated resource). The backend holds its \
         workers by sleeping, so a reject path that does not occupy a worker (the in-app \
         acceptor, HAProxy) costs this backend nothing it needs; on a CPU-bound service the \
         same microseconds would come out of serving. n/m = not measurable:",
        2.0 * report.target_latency_ms,
        report.target_latency_ms,
        run.cost_ms()
    );
    for s in &run.systems {
        if let Some(note) = s.reject_cost_note {
            let _ = writeln!(md, "- {}: {note}.", s.title);
        }
        if let Some(c) = &s.reject_cost {
            let per_packet = c.ns_per_packet.map_or(String::new(), |ns| {
                format!(" (the program's mean run time was {ns:.0} ns per packet)")
            });
            let _ = writeln!(md, "- {}: {}{per_packet}.", s.title, c.how);
        }
    }
    let _ = writeln!(md, "\n## Clients retrying three times at once, at 3×\n");
    let _ = writeln!(
        md,
        "Each failed attempt (refused, reset, 503) is retried at once, up to three times, \
         while the deadline allows; a dropped SYN is not seen as a failure before the \
         deadline, so drop-based systems see no retries. Every client class spreads over a \
         range of addresses (126–254 clients each). shedder takes a new attempt for a \
         retry when its address holds a credit from a refusal in the last 10 s and is over \
         its fair share, decides it one class lower, and while the class is refused holds \
         admitted retries to 10% of admitted first attempts; the second and third shedder \
         rows are the same run with `demote_retries = false` and with `retry_budget = 0`.\n"
    );
    let _ = writeln!(
        md,
        "| system | attempts per request | goodput | answered at the first attempt | CRITICAL success | p99 of successes |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let Some(r) = &s.retries else { continue };
        let rows = std::iter::once((s.title.to_string(), r))
            .chain(
                r.without_demotion
                    .as_deref()
                    .map(|w| (format!("{}, retries not demoted", s.title), w)),
            )
            .chain(
                r.without_budget
                    .as_deref()
                    .map(|w| (format!("{}, no retry budget", s.title), w)),
            );
        for (title, r) in rows {
            let _ = writeln!(
                md,
                "| {title} | {:.2} | {:.0}% | {:.0}% | {:.1}% | {} |",
                r.amplification,
                r.goodput_pct,
                r.first_attempt_pct,
                r.critical_pct,
                opt(r.p99_ms, " ms"),
            );
        }
    }
    let _ = writeln!(md, "\n## Dynamic scenarios\n");
    let _ = writeln!(
        md,
        "*Slow-down*: offered load 1.5× capacity for {SLOW_TOTAL} s; at {SLOW_AT} s the \
         backend's service time doubles (capacity halves, so the load becomes 3× and any \
         static limit is now twice too high). *Recovery*: 3× for {RECOVERY_HIGH} s, then 0.5× \
         for {RECOVERY_LOW} s; recovered when p99 of every 1 s window of arrivals (a failure \
         counting as late) is within {:.0} ms, and stays so for {} s. *Failed after* = \
         requests arriving after the drop that were not answered in time.\n",
        report.target_latency_ms,
        RECOVERY_HOLD.as_secs(),
    );
    let _ = writeln!(
        md,
        "| system | goodput before slow-down | goodput after (% of new capacity) | within 2× target after | p99 after | CRITICAL after | recovery 3× → 0.5× | failed after the drop |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for s in &run.systems {
        let (b, a, slo, p, c) = s.slowdown.as_ref().map_or(
            ("–".into(), "–".into(), "–".into(), "–".into(), "–".into()),
            |x| {
                (
                    format!("{:.0}%", x.before_pct),
                    format!("{:.0}%", x.after_pct),
                    format!("{:.0}%", x.after_slo_pct),
                    opt(x.after_p99_ms, " ms"),
                    format!("{:.1}%", x.after_critical_pct),
                )
            },
        );
        let (rec, failed) = s.recovery.as_ref().map_or(("–".into(), "–".into()), |r| {
            (
                r.recovery_s
                    .map_or("not within 10 s".into(), |v| format!("{v:.2} s")),
                r.failed_after_drop.len().to_string(),
            )
        });
        let _ = writeln!(
            md,
            "| {} | {b} | {a} | {slo} | {p} | {c} | {rec} | {failed} |",
            s.title
        );
    }
    let _ = writeln!(md, "\n## shedder against its targets\n");
    targets_table(md, &run.targets);
    let errors: Vec<String> = run
        .systems
        .iter()
        .flat_map(|s| {
            s.errors
                .iter()
                .map(move |(m, n)| format!("{}: {n} × {m}", s.kind.key()))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(md, "\nClient-side errors (neither ok nor a rejection):\n");
        for e in errors {
            let _ = writeln!(md, "- {e}");
        }
    }
    if let Some(dir) = images {
        let _ = writeln!(md, "\n## Plots\n");
        for (file, what) in [
            ("goodput.png", "Goodput and p99 by offered load"),
            ("slowdown.png", "The backend slows 2× at 10 s"),
            ("recovery.png", "Load drops from 3× to 0.5× at 10 s"),
        ] {
            let _ = writeln!(md, "![{what}]({dir}/{file})\n");
        }
    }
    let configs: Vec<&SystemResult> = run.systems.iter().filter(|s| s.config.is_some()).collect();
    if !configs.is_empty() {
        let _ = writeln!(md, "\n## Configurations\n");
        for s in configs {
            let _ = writeln!(
                md,
                "{}:\n\n```\n{}\n```\n",
                s.title,
                s.config.as_deref().unwrap_or_default().trim()
            );
        }
    }
}

/// The I/O-bound backend's plots: goodput and p99 by load, the slow-down, the recovery.
pub fn io_plots(report: &Report, run: &BackendRun, dir: &Path) -> Result<()> {
    let systems = &run.systems;
    let series = |f: &dyn Fn(&SystemResult) -> Vec<(f64, f64)>| -> Vec<Series> {
        systems
            .iter()
            .map(|s| Series {
                name: s.kind.key().into(),
                points: f(s),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let target_ms = report.target_latency_ms;
    chart(
        &dir.join("goodput.png"),
        "Goodput and latency by offered load",
        "offered load (× measured capacity)",
        &[
            Panel {
                y_label: "goodput (% of capacity)".into(),
                series: series(&|s| s.steps.iter().map(|x| (x.factor, x.goodput_pct)).collect()),
                y_max: Some(110.0),
                hlines: vec![("capacity".into(), 100.0)],
            },
            Panel {
                y_label: "p99 of successes (ms)".into(),
                series: series(&|s| {
                    s.steps
                        .iter()
                        .filter_map(|x| Some((x.factor, x.p99_ms?)))
                        .collect()
                }),
                y_max: Some(report.deadline_ms),
                hlines: vec![("2× target".into(), 2.0 * target_ms)],
            },
        ],
    )?;
    let limit_panel = |f: &dyn Fn(&SystemResult) -> Vec<(f64, f64)>| Panel {
        y_label: "admission limit (connections)".into(),
        series: series(f),
        y_max: None,
        hlines: Vec::new(),
    };
    chart(
        &dir.join("slowdown.png"),
        "Backend slows 2× at 10 s (offered 1.5× → 3× of capacity)",
        "time (s)",
        &[
            Panel {
                y_label: "goodput (% of capacity now)".into(),
                series: series(&|s| {
                    s.slowdown
                        .as_ref()
                        .map_or(Vec::new(), |x| x.goodput.clone())
                }),
                y_max: Some(120.0),
                hlines: vec![("capacity".into(), 100.0)],
            },
            Panel {
                y_label: "p99 of successes (ms)".into(),
                series: series(&|s| s.slowdown.as_ref().map_or(Vec::new(), |x| x.p99.clone())),
                y_max: Some(report.deadline_ms),
                hlines: vec![("target".into(), target_ms)],
            },
            limit_panel(&|s| s.slowdown.as_ref().map_or(Vec::new(), |x| x.limit.clone())),
        ],
    )?;
    chart(
        &dir.join("recovery.png"),
        "Load drops from 3× to 0.5× at 10 s",
        "time (s)",
        &[
            Panel {
                y_label: "p99, failures as deadline (ms)".into(),
                series: series(&|s| s.recovery.as_ref().map_or(Vec::new(), |x| x.p99.clone())),
                y_max: Some(report.deadline_ms * 1.05),
                hlines: vec![("target".into(), target_ms)],
            },
            limit_panel(&|s| s.recovery.as_ref().map_or(Vec::new(), |x| x.limit.clone())),
        ],
    )?;
    Ok(())
}
