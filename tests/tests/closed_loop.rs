//! The whole loop under real overload: a backend of known capacity (4 workers × 20 ms), an
//! open-loop load generator with a 1 s deadline, and the real daemon adapting the limit.

use std::{net::IpAddr, time::Duration};

use shedder_lab::{
    load::{LoadGen, Window},
    policy::HIGH_V4,
    scenario::{Lab, LabConfig, limits_between, median},
};

const DEADLINE: Duration = Duration::from_secs(1);

/// These tests measure latency on two CPUs: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn p99_ms(w: &Window) -> f64 {
    w.all
        .p99()
        .map_or(f64::INFINITY, |d| d.as_secs_f64() * 1000.0)
}

fn critical_success(w: &Window) -> f64 {
    let c = w.class("critical").expect("critical class");
    c.ok as f64 / c.offered.max(1) as f64
}

/// At 3× capacity the limit converges, the admitted requests' p99 stays within 2× the
/// target and CRITICAL keeps succeeding; the same load unprotected does not keep its p99.
#[test]
fn overload_at_3x_converges_with_p99_within_twice_the_target() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = LabConfig {
        port: 8100,
        ..LabConfig::default()
    };
    let target_ms = cfg.target_latency_ms as f64;
    let mut lab = Lab::new("cl3x", cfg);
    let rate = 3.0 * lab.capacity;
    eprintln!("capacity {:.0}/s, offering {rate:.0}/s", lab.capacity);

    lab.protect();
    let sampler = lab.sample_limits(Duration::from_millis(200));
    let protected = lab
        .load()
        .deadline(DEADLINE)
        .phase(Duration::from_secs(16), rate)
        .run_in(&lab.pair.client, |_| {});
    let limits = sampler.finish();
    eprintln!("protected:\n{}", protected.table());
    let steady = protected.range(8..16);
    let settled = limits_between(&limits, 8.0, 16.0);
    eprintln!(
        "limits in the last 8 s: {settled:?}; p99 of admitted requests {:.1} ms",
        p99_ms(&steady)
    );

    // The same load with the kernel backlog only (after the protected run: an overloaded
    // backlog would leave minutes of abandoned work behind).
    lab.unprotect();
    let unprotected = lab
        .load()
        .deadline(DEADLINE)
        .phase(Duration::from_secs(8), rate)
        .run_in(&lab.pair.client, |_| {});
    let u = unprotected.range(4..8);
    eprintln!("unprotected, last 4 s:\n{}", unprotected.table());

    assert!(!settled.is_empty(), "the limit was sampled");
    let (lo, hi) = (
        *settled.iter().min().unwrap(),
        *settled.iter().max().unwrap(),
    );
    assert!(
        hi <= 3 * lo.max(4) && hi < 100,
        "the limit settles in a band: {lo}..{hi}"
    );
    assert!(
        p99_ms(&steady) <= 2.0 * target_ms,
        "p99 of admitted requests {:.1} ms > 2 × {target_ms} ms",
        p99_ms(&steady)
    );
    let critical = critical_success(&protected.total());
    assert!(critical >= 0.99, "critical success {:.3}", critical);
    assert!(
        steady.goodput() >= 0.8 * lab.capacity,
        "goodput {:.0}/s of {:.0}/s",
        steady.goodput(),
        lab.capacity
    );
    assert!(
        p99_ms(&u) > 2.0 * target_ms || u.goodput() < 0.5 * lab.capacity,
        "unprotected should not hold the latency: p99 {:.0} ms, goodput {:.0}/s",
        p99_ms(&u),
        u.goodput()
    );
}

/// The backend slows down 2× mid-run: the limit falls within 5 s; it recovers: the limit
/// climbs back; the overload ends: healthy within 5 s. CRITICAL succeeds throughout.
#[test]
fn the_limit_follows_capacity_down_and_up_and_recovers_after_overload() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = LabConfig {
        port: 8101,
        ..LabConfig::default()
    };
    let (service, target_ms) = (cfg.service_time, cfg.target_latency_ms as f64);
    let mut lab = Lab::new("clslow", cfg);
    let rate = 3.0 * lab.capacity;
    lab.protect();
    let sampler = lab.sample_limits(Duration::from_millis(200));
    let handle = lab
        .load()
        .deadline(DEADLINE)
        .phase(Duration::from_secs(26), rate)
        .phase(Duration::from_secs(8), 0.5 * lab.capacity)
        .start_in(&lab.pair.client);
    std::thread::sleep(Duration::from_secs(9));
    lab.backend.set_service_time(service * 2);
    std::thread::sleep(Duration::from_secs(8));
    lab.backend.set_service_time(service);
    let report = handle.wait();
    let limits = sampler.finish();
    eprintln!("{}", report.table());
    eprintln!("limits: {limits:?}");

    let before = median(limits_between(&limits, 5.0, 9.0));
    let slow = limits_between(&limits, 9.0, 14.0);
    let slowest = *slow.iter().min().expect("samples while slow");
    assert!(
        (slowest as f64) <= 0.75 * before as f64,
        "within 5 s of the slowdown the limit fell from {before} to {slowest}"
    );
    let during = median(limits_between(&limits, 13.0, 17.0));
    let after = median(limits_between(&limits, 21.0, 26.0));
    assert!(
        after > during,
        "the limit climbs back: {during} while slow, {after} after"
    );
    // Overload ends at 26 s: healthy within 5 s. At half the capacity this backend's own
    // p99 is 35-50 ms (a request now and then waits for a worker), and a Poisson burst can
    // meet a limit of ten or so for one attempt: the bounds sit above that noise and below
    // what a service still recovering shows (a queue left behind: p99 in the hundreds of
    // ms; a limit stuck low: refusals by the dozen each second).
    let calm = report.range(28..31);
    assert!(
        p99_ms(&calm) <= 1.5 * target_ms
            && calm.all.timeout == 0
            && calm.all.refused * 100 <= calm.all.offered,
        "not healthy 2-5 s after the overload: p99 {:.1} ms, {} timeouts, {} of {} refused",
        p99_ms(&calm),
        calm.all.timeout,
        calm.all.refused,
        calm.all.offered
    );
    let critical = critical_success(&report.total());
    assert!(critical >= 0.99, "critical success {:.3}", critical);
}

/// Served requests a second of `label` in `w`.
fn ok_rate(w: &Window, label: &str) -> f64 {
    w.class(label).map_or(0.0, |c| c.ok as f64) / w.seconds.max(1) as f64
}

/// At 2× capacity HIGH's demand (which fits) doubles mid-run, to more than the service has
/// for it: the split follows within a second. MEDIUM, which had what HIGH and CRITICAL left,
/// is held near its floor from the second after the shift, and HIGH is served what MEDIUM
/// gave up.
#[test]
fn the_split_follows_a_shift_of_demand_within_a_second() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = LabConfig {
        port: 8102,
        ..LabConfig::default()
    };
    let mut lab = Lab::new("clshift", cfg);
    let cap = lab.capacity;
    lab.protect();
    let (shift, end) = (8u64, 16u64);
    let base = lab
        .load()
        .deadline(DEADLINE)
        .phase(Duration::from_secs(end), 2.0 * cap)
        .start_in(&lab.pair.client);
    std::thread::sleep(Duration::from_secs(shift));
    // HIGH is 25% of the mix: as much again.
    let extra = LoadGen::new(lab.target())
        .deadline(DEADLINE)
        .phase(Duration::from_secs(end - shift), 0.5 * cap)
        .class("high", IpAddr::V4(HIGH_V4), 1.0)
        .seed(7)
        .start_in(&lab.pair.client);
    let (base, extra) = (base.wait(), extra.wait());
    eprintln!("base:\n{}\nextra HIGH:\n{}", base.table(), extra.table());
    let before = base.range(3..shift);
    let after = base.range(shift + 1..end);
    let first = base.range(shift + 1..shift + 2);
    let extra_after = extra.range(1..end - shift);
    let (medium_before, medium_after, medium_first) = (
        ok_rate(&before, "medium"),
        ok_rate(&after, "medium"),
        ok_rate(&first, "medium"),
    );
    let high_before = ok_rate(&before, "high");
    let high_after = ok_rate(&after, "high") + ok_rate(&extra_after, "high");
    eprintln!(
        "medium {medium_before:.0}/s before, {medium_first:.0}/s in the second after, \
         {medium_after:.0}/s after; high {high_before:.0}/s before, {high_after:.0}/s after"
    );
    assert!(
        medium_first <= 0.6 * medium_before.max(1.0) + 0.05 * cap,
        "a second after the shift medium still had {medium_first:.0}/s of {medium_before:.0}/s"
    );
    assert!(
        medium_after <= 0.6 * medium_before.max(1.0) + 0.05 * cap,
        "medium {medium_after:.0}/s after, {medium_before:.0}/s before"
    );
    assert!(
        high_after >= high_before + 0.5 * (medium_before - medium_after),
        "high {high_after:.0}/s after, {high_before:.0}/s before; medium gave up {:.0}/s",
        medium_before - medium_after
    );
}
