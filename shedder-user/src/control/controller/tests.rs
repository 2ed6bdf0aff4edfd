use super::*;

#[test]
fn signal_names_are_the_api_names() {
    for s in [
        Signal::QueueAge,
        Signal::Latency,
        Signal::ListenOverflow,
        Signal::CpuPressure,
        Signal::Idle,
        Signal::NoData,
        Signal::None,
        Signal::Configured,
    ] {
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            format!("\"{}\"", s.as_str())
        );
    }
    assert_eq!(
        Action::Decrease { factor: 0.8 }.to_string(),
        "decrease x0.8"
    );
}

const TARGET: Duration = Duration::from_millis(100);

fn bounds() -> Bounds {
    Bounds::new(8, 1000, 50, None, TARGET)
}

fn obs(t_ms: u64, delay_ms: f64, occupancy: u32) -> Observation {
    Observation {
        now: Duration::from_millis(t_ms),
        fresh: true,
        // The medians half the tail: most requests well inside it. The first requests'
        // wait a little less than the rest.
        queue_age_p50_ms: delay_ms / 2.5,
        queue_age_p99_ms: delay_ms * 0.8,
        latency_p50_ms: delay_ms / 2.0,
        latency_p99_ms: delay_ms,
        waiting_p50_ms: 0.0,
        waiting_p90_ms: 0.0,
        samples: 100,
        occupancy,
        overflows: Some(0),
        datagram: false,
        cpu_pressure: Some(0.0),
        shed_rate: 0.0,
        pressed_rate: 0.0,
        ceiling: None,
    }
}

#[test]
fn aimd_increases_by_one_only_when_healthy_and_saturated() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
    // Just under the target (96 of 100 ms) and saturated (90 of 100): +1.
    let d = c.update(&obs(0, 96.0, 90));
    assert_eq!(
        (d.previous, d.limit, d.action),
        (100, 101, Action::Increase)
    );
    assert_eq!(d.signal, Signal::Latency);
    // Healthy but not saturated (89 < 0.9 × 101): no growth (the near-the-limit guard).
    let d = c.update(&obs(600, 50.0, 89));
    assert_eq!(d.action, Action::Hold);
    assert_eq!(d.limit, 101);
    // Between target and 2× target: hold.
    let d = c.update(&obs(800, 150.0, 101));
    assert_eq!((d.action, d.limit), (Action::Hold, 101));
    // Healthy, occupancy low, but attempts refused for pressure: the limit is what holds
    // them back, so it grows.
    let mut o = obs(1000, 99.0, 40);
    o.pressed_rate = 20.0;
    let d = c.update(&o);
    assert_eq!((d.action, d.limit), (Action::Increase, 102));
}

#[test]
fn aimd_steps_in_proportion_to_the_headroom_under_the_target() {
    // limit × 0.25 × (target − delay) / target, at least one.
    for (delay, limit, expected) in [
        (0.0, 100, 125),
        (50.0, 100, 113),
        (80.0, 100, 105),
        (99.0, 100, 101),
        (0.0, 8, 10),
        (50.0, 8, 9),
    ] {
        let mut c = Aimd::new(bounds(), Tuning::new(TARGET), limit);
        let d = c.update(&obs(0, delay, limit));
        assert_eq!(
            (d.action, d.limit),
            (Action::Increase, expected),
            "{delay} ms at {limit}"
        );
    }
}

#[test]
fn aimd_climbs_back_to_a_queues_target_fast_and_without_overshoot() {
    // A service whose delay is its queue: 2.5 ms per connection admitted, so the target
    // (100 ms) allows 40. From a limit cut to 20 by a passing stall, the climb reaches 36
    // within ten windows (+1 a window takes sixteen) and never passes 40.
    let mut c = Aimd::new(
        Bounds::new(4, 1000, 20, None, TARGET),
        Tuning::new(TARGET),
        20,
    );
    let mut reached = None;
    for w in 0..40u64 {
        let limit = c.limit();
        let d = c.update(&obs(w * 600, 2.5 * limit as f64, limit));
        assert!(d.limit <= 40, "window {w}: {} overshoots 40", d.limit);
        if d.limit >= 36 && reached.is_none() {
            reached = Some(w + 1);
        }
    }
    let windows = reached.expect("never reached 36");
    assert!(windows <= 10, "36 after {windows} windows");
}

#[test]
fn aimd_adds_one_step_per_window_not_per_tick() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
    assert_eq!(c.update(&obs(0, 96.0, 100)).action, Action::Increase);
    // Healthy and saturated again 200 and 400 ms later: the window (600 ms) still holds
    // samples of the old limit, so the step is not judged yet.
    for t in [200, 400] {
        let d = c.update(&obs(t, 50.0, 101));
        assert_eq!((d.action, d.limit), (Action::Hold, 101), "at {t} ms");
    }
    let d = c.update(&obs(600, 96.0, 101));
    assert_eq!((d.action, d.limit), (Action::Increase, 102));
}

#[test]
fn aimd_first_cut_after_quiet_is_half_then_eighty_percent() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 200);
    let d = c.update(&obs(0, 250.0, 200));
    assert_eq!(d.action, Action::Decrease { factor: 0.5 });
    assert_eq!(d.limit, 100);
    assert_eq!(d.mode, Mode::Shedding);
    // Within the cooldown: held, not cut again on the same stale window.
    let d = c.update(&obs(200, 250.0, 100));
    assert_eq!((d.action, d.limit), (Action::Hold, 100));
    // After the cooldown but within the 250 ms the samples carry: they may still be of
    // attempts admitted before the cut, so held.
    let d = c.update(&obs(800, 250.0, 100));
    assert_eq!((d.action, d.limit), (Action::Hold, 100));
    // Cooldown plus delay: × 0.8.
    let d = c.update(&obs(850, 250.0, 100));
    assert_eq!(d.action, Action::Decrease { factor: 0.8 });
    assert_eq!(d.limit, 80);
}

#[test]
fn aimd_waits_out_a_long_delay_for_at_most_two_seconds_past_the_cooldown() {
    // A long tail (the medians within the target): the usual factors.
    let tail = |t_ms, occupancy| Observation {
        queue_age_p50_ms: 10.0,
        latency_p50_ms: 10.0,
        ..obs(t_ms, 9000.0, occupancy)
    };
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 200);
    assert_eq!(c.update(&tail(0, 200)).limit, 100);
    let d = c.update(&tail(2500, 100));
    assert_eq!((d.action, d.limit), (Action::Hold, 100));
    let d = c.update(&tail(2600, 100));
    assert_eq!((d.action, d.limit), (Action::Decrease { factor: 0.8 }, 80));
}

#[test]
fn aimd_cuts_to_what_littles_law_supports_when_most_requests_wait() {
    // A start at 256 into an overload: 256 requests in the service, the median 600 ms
    // against a 100 ms target. 256 × 100 / 600 ≈ 43 of them would take the target.
    let mut c = Aimd::new(
        Bounds::new(8, 1000, 256, None, TARGET),
        Tuning::new(TARGET),
        256,
    );
    let mut o = obs(0, 1200.0, 256);
    o.queue_age_p50_ms = 300.0;
    o.latency_p50_ms = 600.0;
    let d = c.update(&o);
    assert_eq!(d.limit, 43);
    assert!(
        matches!(d.action, Action::Decrease { factor } if (factor - 100.0 / 600.0).abs() < 1e-9)
    );
    // Never below a tenth a cut, however long the wait.
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 500);
    let mut o = obs(0, 20_000.0, 500);
    o.queue_age_p50_ms = 10_000.0;
    let d = c.update(&o);
    assert_eq!(d.limit, 50);
}

#[test]
fn requests_in_service_are_pressure_before_any_completes() {
    // Answers stopped: no completed sample in the window, but 40 requests wait, the p90
    // for 450 ms (target 100): one tick is enough to cut, and the signal says why.
    let mut o = obs(0, 0.0, 40);
    o.samples = 40;
    (o.waiting_p50_ms, o.waiting_p90_ms) = (300.0, 450.0);
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 50);
    let d = c.update(&o);
    assert_eq!(d.signal, Signal::Waiting);
    assert_eq!(d.delay_ms, Some(450.0));
    // Half of them have waited 300 ms: 40 × 100 / 300 ≈ 13 would meet the target.
    assert_eq!(d.limit, 13);
    // And a limit never grows while what waits is over the target, however healthy the
    // completed requests look (a proxy on the node answers nothing while its backend
    // queues).
    let mut o = obs(0, 20.0, 50);
    o.waiting_p90_ms = 150.0;
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 50);
    let d = c.update(&o);
    assert_ne!(d.action, Action::Increase);
    assert_eq!(d.limit, 50);
    let mut g = Gradient2::new(bounds(), Tuning::new(TARGET), 50);
    for t in 0..20 {
        let mut o = obs(t * 200, 20.0, 50);
        (o.waiting_p50_ms, o.waiting_p90_ms) = (150.0, 300.0);
        assert!(g.update(&o).limit <= 50);
    }
}

#[test]
fn aimd_listen_overflow_cuts_even_without_samples() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
    let mut o = obs(0, 10.0, 100);
    o.samples = 0;
    o.overflows = Some(3);
    let d = c.update(&o);
    assert_eq!(d.signal, Signal::ListenOverflow);
    assert_eq!(d.limit, 50);
}

#[test]
fn aimd_cuts_on_a_quic_services_receive_drops() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
    let mut o = obs(0, 10.0, 100);
    o.datagram = true;
    o.overflows = Some(12);
    let d = c.update(&o);
    assert_eq!(d.signal, Signal::ReceiveDrops);
    assert_eq!(d.limit, 50);
}

#[test]
fn aimd_idle_decay_is_one_percent_per_second() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 500);
    c.update(&obs(0, 10.0, 10));
    for s in 1..=10 {
        c.update(&obs(s * 1000, 10.0, 10));
    }
    // 500 × 0.99^10 = 452.2
    assert_eq!(c.limit(), 452);
    // Not idle while attempts are refused.
    let mut o = obs(11_000, 10.0, 10);
    o.shed_rate = 50.0;
    assert_eq!(c.update(&o).action, Action::Hold);
    assert_eq!(c.limit(), 452);
    // Never below min.
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 9);
    for s in 0..=1000 {
        c.update(&obs(s * 1000, 10.0, 0));
    }
    assert_eq!(c.limit(), 8);
}

#[test]
fn aimd_respects_the_hard_ceiling_and_littles_law() {
    // 200 rps × 0.1 s × 1.5 = 30.
    let b = Bounds::new(8, 1000, 20, Some(200.0), TARGET);
    assert_eq!(b.max, 30);
    let mut c = Aimd::new(b, Tuning::new(TARGET), 29);
    for i in 0..10 {
        c.update(&obs(i * 200, 10.0, 1000));
    }
    assert_eq!(c.limit(), 30);
}

#[test]
fn cpu_pressure_blocks_growth() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 100);
    let mut o = obs(0, 10.0, 100);
    o.cpu_pressure = Some(0.9);
    let d = c.update(&o);
    assert_eq!(
        (d.action, d.signal, d.limit),
        (Action::Hold, Signal::CpuPressure, 100)
    );
}

#[test]
fn too_few_samples_freeze_and_missing_signals_fall_back() {
    let mut c = Aimd::new(bounds(), Tuning::new(TARGET), 300);
    let mut o = obs(0, 500.0, 300);
    o.samples = 2;
    let d = c.update(&o);
    assert_eq!(
        (d.action, d.limit),
        (Action::Freeze, 300),
        "thin window: frozen, not cut"
    );
    // Signals missing from t = 1 s on; the last fresh tick was t = 0.
    let mut missing = obs(1000, 0.0, 0);
    missing.fresh = false;
    assert_eq!(c.update(&missing).action, Action::Freeze);
    missing.now = Duration::from_millis(2900);
    assert_eq!(
        c.update(&missing).action,
        Action::Freeze,
        "stale for 2.9 s < 3 s"
    );
    missing.now = Duration::from_millis(3100);
    let d = c.update(&missing);
    assert_eq!(
        (d.action, d.limit),
        (Action::Fallback, 50),
        "stale for 3.1 s"
    );
}

#[test]
fn gradient2_worked_example() {
    let g = Gradient2::new(
        Bounds::new(1, 1000, 10, None, TARGET),
        Tuning::new(TARGET),
        100,
    );
    // long-term 20 ms, current 50 ms, limit 100: gradient clamps to 0.5, target
    // 0.5 × 100 + √100 = 60, smoothed 100 × 0.8 + 60 × 0.2 = 92.
    let next = g.step(100.0, 20.0, 50.0, 100);
    assert!((next - 92.0).abs() < 1e-9, "{next}");
}

#[test]
fn gradient2_does_not_grow_when_app_limited() {
    let g = Gradient2::new(bounds(), Tuning::new(TARGET), 100);
    // Healthy (gradient 1), but only 40 of 100 in flight: no growth.
    assert_eq!(g.step(100.0, 20.0, 20.0, 40), 100.0);
    // Saturated and healthy: grows by the smoothed queue allowance.
    assert!(g.step(100.0, 20.0, 20.0, 100) > 100.0);
}

#[test]
fn gradient2_does_not_creep_up_under_modest_overload() {
    let mut c = Gradient2::new(bounds(), Tuning::new(TARGET), 100);
    // Delay 10% above its long-term level for 10 s: the limit never rises. (Unguarded,
    // gradient 20/22 ≈ 0.91 gives a target of 0.91 × 100 + √100 = 101 > 100: creep.)
    let unguarded = std::hint::black_box(20.0 / 22.0) * 100.0 + 100f64.sqrt();
    assert!(unguarded > 100.0);
    c.update(&obs(0, 20.0, 100));
    let mut last = c.limit();
    for i in 1..50u64 {
        let d = c.update(&obs(i * 200, 22.0, c.limit()));
        assert!(d.limit <= last, "tick {i}: {} > {last}", d.limit);
        last = d.limit;
    }
}

#[test]
fn gradient2_falls_under_heavy_overload_and_recovers() {
    let mut c = Gradient2::new(bounds(), Tuning::new(TARGET), 200);
    for i in 0..50u64 {
        c.update(&obs(i * 200, 20.0, c.limit()));
    }
    let healthy = c.limit();
    for i in 50..60u64 {
        c.update(&obs(i * 200, 80.0, c.limit()));
    }
    assert!(c.limit() < healthy * 3 / 4, "{} vs {healthy}", c.limit());
    let low = c.limit();
    for i in 60..200u64 {
        c.update(&obs(i * 200, 20.0, c.limit()));
    }
    assert!(c.limit() > low, "recovers");
}

#[test]
fn an_outside_cap_bounds_every_controller_and_wins_over_min() {
    let t = Tuning::new(Duration::from_millis(100));
    let b = Bounds::new(8, 100, 50, None, Duration::from_millis(100));
    let mut controllers: Vec<Box<dyn Controller>> = vec![
        Box::new(Aimd::new(b, t, 60)),
        Box::new(Gradient2::new(b, t, 60)),
        Box::new(Fixed::new(b, t, 60)),
    ];
    let capped = |t_ms, ceiling| Observation {
        ceiling,
        ..obs(t_ms, 1.0, 18)
    };
    for c in &mut controllers {
        let d = c.update(&capped(0, Some(18)));
        assert_eq!((d.limit, c.limit()), (18, 18), "{}", c.name());
        // Healthy and saturated: AIMD would grow; never past the ceiling.
        for i in 1..20 {
            let d = c.update(&capped(i * 100, Some(18)));
            assert!(d.limit <= 18, "{}: {}", c.name(), d.limit);
        }
        // Below min_limit too: the fleet's share wins.
        assert_eq!(c.update(&capped(2_000, Some(3))).limit, 3, "{}", c.name());
        assert_eq!(c.update(&capped(2_100, Some(0))).limit, 0, "{}", c.name());
        assert_eq!(c.limit(), 0, "{}", c.name());
    }
    // Lifted: the fixed limit returns at once; the adaptive ones grow from where they are.
    let mut f = Fixed::new(b, t, 60);
    assert_eq!(f.update(&capped(0, Some(9))).limit, 9);
    let d = f.update(&capped(100, None));
    assert_eq!((d.previous, d.limit, f.limit()), (9, 60, 60));
    let mut a = Aimd::new(b, t, 60);
    a.update(&capped(0, Some(9)));
    let d = a.update(&capped(700, None));
    assert_eq!(d.previous, 9);
    assert!((9..20).contains(&d.limit), "{d:?}");
    assert_eq!(b.capped(Some(20)).fallback, 20);
    assert_eq!(b.capped(None), b);
}

#[test]
fn fixed_never_moves() {
    let mut c = Fixed::new(bounds(), Tuning::new(TARGET), 64);
    for i in 0..10 {
        let d = c.update(&obs(i * 100, 10_000.0, 1000));
        assert_eq!(d.limit, 64);
    }
}

#[test]
fn modes_follow_shedding_with_hysteresis() {
    let mut c = Fixed::new(bounds(), Tuning::new(TARGET), 64);
    let at = |ms: u64, shed: f64| {
        let mut o = obs(ms, 10.0, 64);
        o.shed_rate = shed;
        o
    };
    assert_eq!(c.update(&at(0, 0.0)).mode, Mode::Normal);
    // One tick of shedding is not enough.
    assert_eq!(c.update(&at(200, 5.0)).mode, Mode::Normal);
    assert_eq!(c.update(&at(600, 5.0)).mode, Mode::Shedding);
    // A single quiet tick does not end it.
    assert_eq!(c.update(&at(800, 0.0)).mode, Mode::Shedding);
    assert_eq!(c.update(&at(1100, 0.0)).mode, Mode::Recovering);
    // Shedding again goes straight back... after the hold.
    assert_eq!(c.update(&at(1300, 3.0)).mode, Mode::Recovering);
    assert_eq!(c.update(&at(1800, 3.0)).mode, Mode::Shedding);
    // Calm for 10 s: normal.
    assert_eq!(c.update(&at(2500, 0.0)).mode, Mode::Recovering);
    assert_eq!(c.update(&at(12_000, 0.0)).mode, Mode::Normal);
}
