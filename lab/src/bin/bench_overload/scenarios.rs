//! The schedules each system is run through (the ladder of offered load, retrying clients,
//! the 2× slow-down, the drop from 3× to 0.5×) and the figures taken from them.

use std::time::{Duration, Instant};

use anyhow::Result;
use shedder_common::{CLASS_NAMES, Reason};
use shedder_lab::{
    interrupt::interrupted,
    load::{LoadReport, Outcome},
    netns::Pair,
};

use super::{
    args::Args,
    arrivals::{bins, late_ms, recovery_time},
    figures::{Recovery, RejectCost, Retries, Slowdown, SystemResult, ms, slo_goodput, step},
    h2load,
    kind::Kind,
    params::{DEADLINE, H2LOAD_FACTOR, H2LOAD_SECS, SERVICE_TIME, SETTLE_SECS},
    system::{Bed, Refusals, Sample, System, cpu_between, drive, tracking_between},
};

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn ladder(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    step_secs: u64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let ladder = sys.spec.ladder;
    let schedule = ladder
        .iter()
        .fold(sys.load(), |g, f| g.phase(secs(step_secs), f * capacity));
    let (report, samples) = drive(pair, sys, schedule, |_, _| {});
    collect_errors(&report, errors);
    let mut cpu_per_ok_1x = None;
    for (i, &factor) in ladder.iter().enumerate() {
        let start = i as u64 * step_secs + SETTLE_SECS.min(step_secs - 1);
        let end = (i as u64 + 1) * step_secs;
        let w = report.range(start..end);
        let mut st = step(&w, factor, capacity);
        st.limit = limit_spread(&samples, start as f64, end as f64);
        st.refused_by_reason = refused_between(&samples, start as f64, end as f64);
        st.tracking_us_per_ok = tracking_between(&samples, start as f64, end as f64)
            .filter(|_| w.all.ok > 0)
            .map(|t| t.as_secs_f64() * 1e6 / w.all.ok as f64);
        result.steps.push(st);
        let Some((cpu, events)) = cpu_between(&samples, start as f64, end as f64) else {
            continue;
        };
        if factor == 1.0 && w.all.ok > 0 {
            cpu_per_ok_1x = Some(cpu.as_secs_f64() / w.all.ok as f64);
        }
        if factor != sys.spec.cost_factor {
            continue;
        }
        let not_served = w.all.attempts.saturating_sub(w.all.ok);
        let rejected = match sys.kind {
            Kind::InApp => events.unwrap_or(not_served),
            _ => not_served,
        };
        if rejected == 0 {
            continue;
        }
        let (spent, how) = match sys.kind {
            Kind::Haproxy => (
                // What HAProxy spent beyond proxying the served ones (at its cost per
                // request served at 1×).
                (cpu.as_secs_f64() - w.all.ok as f64 * cpu_per_ok_1x.unwrap_or(0.0)).max(0.0),
                "HAProxy's process CPU clock (all threads) at the step minus its CPU per \
                 served request at 1× × served, per attempt not served",
            ),
            Kind::NginxConn | Kind::NginxReq => (
                (cpu.as_secs_f64() - w.all.ok as f64 * cpu_per_ok_1x.unwrap_or(0.0)).max(0.0),
                "nginx's processes' CPU clocks at the step minus their CPU per served request \
                 at 1× × served, per attempt not served (the kernel's TCP handshake is not \
                 included)",
            ),
            Kind::InApp => (
                cpu.as_secs_f64(),
                "the acceptor thread's CPU time from accept() to close() of each 503 \
                 (CLOCK_THREAD_CPUTIME_ID); the kernel's handshake is not included",
            ),
            _ => (
                cpu.as_secs_f64(),
                "XDP program run time (kernel BPF statistics) over every packet of the step, \
                 admitted connections' included, per attempt not served: an upper bound",
            ),
        };
        let per = spent / rejected as f64;
        result.reject_cost = Some(RejectCost {
            cpu_us: per * 1e6,
            factor,
            r: per / sys.spec.cost_per_request(capacity).as_secs_f64(),
            ns_per_packet: match (sys.kind.is_shedder(), events) {
                (true, Some(runs)) if runs > 0 => Some(cpu.as_secs_f64() * 1e9 / runs as f64),
                _ => None,
            },
            how,
        });
    }
}

pub fn retries(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let mut run = || {
        let (report, _) = drive(
            pair,
            sys,
            sys.load().retries(3).phase(secs(8), 3.0 * capacity),
            |_, _| {},
        );
        collect_errors(&report, errors);
        let (from, to) = (3, 8);
        let w = report.range(from..to);
        let window = Duration::from_secs(from)..Duration::from_secs(to);
        let first = report
            .records
            .iter()
            .filter(|r| window.contains(&r.start) && r.outcome == Outcome::Ok && r.attempts == 1)
            .count();
        Retries {
            amplification: w.all.attempts as f64 / w.all.offered.max(1) as f64,
            goodput_pct: 100.0 * w.goodput() / capacity,
            first_attempt_pct: 100.0 * first as f64 / w.all.offered.max(1) as f64,
            critical_pct: w.class("critical").map_or(0.0, |c| 100.0 * c.share(c.ok)),
            p99_ms: ms(w.all.p99()),
            without_demotion: None,
            without_budget: None,
        }
    };
    let mut with = run();
    if let Some(d) = &sys.daemon {
        // The same clients with retries only counted, not demoted: reload, run, restore.
        let original = std::fs::read_to_string(&d.config).unwrap_or_default();
        let reload = |config: &str, n: usize| {
            d.rewrite_config(config);
            d.hangup();
            let deadline = Instant::now() + Duration::from_secs(10);
            while d.log().matches("configuration reloaded").count() < n {
                assert!(
                    Instant::now() < deadline,
                    "the daemon did not reload:\n{}",
                    d.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let before = d.log().matches("configuration reloaded").count();
        reload(&format!("{original}demote_retries = false\n"), before + 1);
        std::thread::sleep(Duration::from_secs(2));
        with.without_demotion = Some(Box::new(run()));
        reload(&format!("{original}retry_budget = 0\n"), before + 2);
        std::thread::sleep(Duration::from_secs(2));
        with.without_budget = Some(Box::new(run()));
        reload(&original, before + 3);
    }
    result.retries = Some(with);
}

pub const SLOW_TOTAL: u64 = 20;
pub const SLOW_AT: u64 = 10;

pub fn slowdown(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let mut slowed = false;
    let (report, samples) = drive(
        pair,
        sys,
        sys.load().phase(secs(SLOW_TOTAL), 1.5 * capacity),
        |t, s| {
            if !slowed && t >= SLOW_AT as f64 {
                s.line().set_service_time(SERVICE_TIME * 2);
                slowed = true;
            }
        },
    );
    sys.line().set_service_time(SERVICE_TIME);
    collect_errors(&report, errors);
    let cap_at = |t: u64| {
        if t >= SLOW_AT {
            capacity / 2.0
        } else {
            capacity
        }
    };
    let before = report.range(SLOW_AT - 6..SLOW_AT);
    let after = report.range(SLOW_TOTAL - 6..SLOW_TOTAL);
    result.slowdown = Some(Slowdown {
        before_pct: 100.0 * before.goodput() / capacity,
        after_pct: 100.0 * after.goodput() / (capacity / 2.0),
        after_slo_pct: 100.0 * slo_goodput(&after) / (capacity / 2.0),
        after_p99_ms: ms(after.all.p99()),
        after_critical_pct: after
            .class("critical")
            .map_or(0.0, |c| 100.0 * c.share(c.ok)),
        goodput: (0..SLOW_TOTAL)
            .map(|t| {
                (
                    t as f64,
                    100.0 * report.range(t..t + 1).goodput() / cap_at(t),
                )
            })
            .collect(),
        p99: (0..SLOW_TOTAL)
            .filter_map(|t| Some((t as f64, ms(report.range(t..t + 1).all.p99())?)))
            .collect(),
        limit: limits(&samples),
    });
}

pub const RECOVERY_HIGH: u64 = 10;
pub const RECOVERY_LOW: u64 = 10;

pub fn recovery(
    pair: &Pair,
    sys: &System,
    capacity: f64,
    result: &mut SystemResult,
    errors: &mut Vec<(String, u64)>,
) {
    let (report, samples) = drive(
        pair,
        sys,
        sys.load()
            .phase(secs(RECOVERY_HIGH), 3.0 * capacity)
            .phase(secs(RECOVERY_LOW), 0.5 * capacity),
        |_, _| {},
    );
    collect_errors(&report, errors);
    let late = late_ms(&report);
    let end = Duration::from_secs(RECOVERY_HIGH + RECOVERY_LOW);
    result.recovery = Some(Recovery {
        recovery_s: recovery_time(&late, Duration::from_secs(RECOVERY_HIGH), end),
        p99: bins(&late, end)
            .into_iter()
            .map(|(t, v)| (t.as_secs_f64(), v))
            .collect(),
        limit: limits(&samples),
        failed_after_drop: report
            .records
            .iter()
            .filter(|r| r.outcome != Outcome::Ok && r.start >= Duration::from_secs(RECOVERY_HIGH))
            .map(|r| {
                (
                    r.start.as_secs_f64(),
                    report.labels.get(r.class).cloned().unwrap_or_default(),
                    format!("{:?}", r.outcome),
                )
            })
            .collect(),
    });
}

/// shedder's refusals by class and reason between `from` and `to` seconds.
pub fn refused_between(samples: &[Sample], from: f64, to: f64) -> Option<Refusals> {
    let first = samples.iter().find(|s| s.t >= from)?.refused?;
    let last = samples.iter().rev().find(|s| s.t < to)?.refused?;
    Some(std::array::from_fn(|c| {
        std::array::from_fn(|r| last[c][r].saturating_sub(first[c][r]))
    }))
}

/// The refusals counted between two readings, as "class reason" → attempts (nonzero only).
pub fn reasons(after: &Refusals, before: &Refusals) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (c, name) in CLASS_NAMES.iter().enumerate() {
        for reason in Reason::ALL {
            let r = reason as usize;
            let n = after[c][r].saturating_sub(before[c][r]);
            if n > 0 {
                out.push((format!("{name} {}", reason.name()), n));
            }
        }
    }
    out
}

/// Least, median and most of the limit read between `from` and `to` seconds.
pub fn limit_spread(samples: &[Sample], from: f64, to: f64) -> Option<[f64; 3]> {
    let mut v: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t < to)
        .filter_map(|s| s.limit)
        .collect();
    v.sort_by(f64::total_cmp);
    Some([*v.first()?, v[v.len() / 2], *v.last()?])
}

pub fn limits(samples: &[Sample]) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|s| Some((s.t, s.limit?)))
        .collect()
}

pub fn collect_errors(report: &LoadReport, errors: &mut Vec<(String, u64)>) {
    for (msg, n) in &report.errors {
        match errors.iter_mut().find(|(m, _)| m == msg) {
            Some((_, total)) => *total += n,
            None => errors.push((msg.clone(), *n)),
        }
    }
}

pub fn run_system(kind: Kind, bed: &Bed, capacity: f64, args: &Args) -> Result<SystemResult> {
    let (pair, spec) = (&bed.pair, bed.spec);
    eprintln!("== {} ({}) ==", kind.title(), spec.key);
    let sys = System::start(kind, bed, capacity)?;
    let mut result = SystemResult {
        kind,
        title: kind.title(),
        steps: Vec::new(),
        reject_cost: None,
        reject_cost_note: match kind {
            Kind::None => Some(
                "rejects nothing on purpose (SYNs beyond the full accept queue are dropped by the kernel)",
            ),
            Kind::Nft1x | Kind::Nft15x => Some("nftables keeps no CPU accounting per rule"),
            _ => None,
        },
        retries: None,
        slowdown: None,
        recovery: None,
        errors: Vec::new(),
        config: sys.config(),
        h2load: None,
        h2load_error: None,
    };
    let mut errors = Vec::new();
    let pause = || std::thread::sleep(Duration::from_secs(2));
    ladder(
        pair,
        &sys,
        capacity,
        args.step_secs,
        &mut result,
        &mut errors,
    );
    if spec.is_tls() && kind.answers_refusals() && !interrupted() {
        pause();
        eprintln!("   h2load at {H2LOAD_FACTOR}×...");
        let cpu = bed.placement.map(|p| p.client_cpu);
        let load = (capacity, H2LOAD_FACTOR);
        let before = sys.reading().1;
        match h2load::run(
            &pair.client,
            sys.target,
            load,
            (H2LOAD_SECS, SETTLE_SECS),
            DEADLINE,
            cpu,
        ) {
            Ok(mut h) => {
                let after = sys.reading().1;
                if let (Some(b), Some(a)) = (before, after) {
                    h.refused = reasons(&a, &b);
                    eprintln!("   h2load: shedder refused {:?}", h.refused);
                }
                eprintln!(
                    "   h2load: {:.0}/s offered, {} 2xx ({:.0}% of capacity), {} 5xx, {:?} errored",
                    h.offered_rps, h.ok, h.goodput_pct, h.status_5xx, h.errored
                );
                result.h2load = Some(h);
            }
            Err(e) => {
                eprintln!("   h2load failed: {e:#}");
                result.h2load_error = Some(format!("{e:#}"));
            }
        }
    }
    for &f in spec.by_class {
        let Some(s) = result.at(f) else { continue };
        let [c, h, m, sh] = s.class_success_pct;
        eprintln!(
            "   ladder: at {f}× goodput {:.0}%, p99 {} ms, success critical {c:.1}% \
             high {h:.1}% medium {m:.1}% sheddable {sh:.1}%{}",
            s.goodput_pct,
            s.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
            s.limit.map_or(String::new(), |[lo, mid, hi]| format!(
                ", limit {lo:.0}/{mid:.0}/{hi:.0}"
            )),
        );
        if let Some(r) = s.refused_by_reason {
            let high: Vec<String> = Reason::ALL
                .into_iter()
                .filter(|&k| r[1][k as usize] > 0)
                .map(|k| format!("{} {}", k.name(), r[1][k as usize]))
                .collect();
            eprintln!("      high refused: {}", high.join(", "));
        }
    }
    let scenarios = if spec.scenarios {
        &[
            (
                "retries",
                retries as fn(&Pair, &System, f64, &mut SystemResult, &mut Vec<(String, u64)>),
            ),
            ("slow-down", slowdown),
            ("recovery", recovery),
        ][..]
    } else {
        &[]
    };
    for &(name, scenario) in scenarios {
        if interrupted() {
            break;
        }
        pause();
        eprintln!("   {name}...");
        scenario(pair, &sys, capacity, &mut result, &mut errors);
    }
    result.errors = errors;
    sys.stop();
    pause();
    Ok(result)
}
