//! Fair shares across the sources of one class, under real overload: the lab's backend of
//! known capacity (4 workers × 20 ms), open-loop clients with a 1 s deadline, the real
//! daemon with its defaults (fair shares on, retries recognised, a 10% retry budget).

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use aya::maps::{Array, MapData};
use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{CLASS_MEDIUM, fair::SourceSet};
use shedder_lab::{
    load::{LoadGen, Window, add_local_range},
    policy::CLIENT_V4,
    scenario::{Lab, LabConfig},
};

const DEADLINE: Duration = Duration::from_secs(1);
/// Attempts a warm-up client makes before the test gives up (2.4 s of backing off).
const WARM_UP_TRIES: u32 = 40;
/// Seconds at the start of a run left out while the daemon adapts.
const SETTLE: u64 = 3;

fn success(w: &Window, label: &str) -> f64 {
    let c = w.class(label).unwrap_or_else(|| panic!("class {label}"));
    c.ok as f64 / c.offered.max(1) as f64
}

/// The part of a run of `secs` seconds that is judged, from its start.
fn window(secs: u64) -> std::ops::Range<Duration> {
    Duration::from_secs(SETTLE)..Duration::from_secs(secs)
}

/// The backend stayed busy: goodput at least the 95% of capacity the design asks, where
/// capacity is what the backend could serve at the pace the machine let it keep
/// ([`Lab::judged_capacity`]).
fn assert_busy(w: &Window, judged: f64, what: &str) {
    assert!(
        w.goodput() >= 0.95 * judged,
        "{what}goodput {:.0}/s of {judged:.0}/s",
        w.goodput()
    );
}

/// A lab whose default class's sources are single addresses (`source_prefix_v4 = 32`):
/// these tests are about how a class is shared among the sources it has, which per
/// address puts many of them on the client namespace's few prefixes.
fn lab(tag: &str, port: u16) -> Lab {
    let mut lab = Lab::new(
        tag,
        LabConfig {
            port,
            medium_source_prefix: Some(32),
            ..LabConfig::default()
        },
    );
    lab.protect();
    lab
}

/// One source at 2.5× the capacity and eight at 5% of it each, all in the default class
/// (MEDIUM): 500/s and 10/s against a 200/s backend. Each light source is served (at least
/// the 90% the design asks; measured 98–100%), the heavy one gets the rest, and the backend
/// stays busy (measured 99–100% of capacity). Before fair shares, light sources got 9%;
/// with a quota counted per epoch and preemption bounded by counts, 86–98%.
#[test]
fn a_heavy_source_gets_only_what_the_light_ones_leave() {
    let lab = lab("fair", 8210);
    add_local_range(&lab.pair.client, "198.18.50.0/24");
    let cap = lab.capacity;
    let (heavy, light) = (2.5 * cap, 0.05 * cap);
    let total = heavy + 8.0 * light;
    let secs = 14;
    let mut g = LoadGen::new(lab.target())
        .deadline(DEADLINE)
        .phase(Duration::from_secs(secs), total)
        .class("heavy", IpAddr::V4(CLIENT_V4), heavy / total);
    let labels: Vec<String> = (0..8).map(|i| format!("light{i}")).collect();
    for (i, l) in labels.iter().enumerate() {
        let src = Ipv4Addr::new(198, 18, 50, 1 + i as u8);
        g = g.class(l, IpAddr::V4(src), light / total);
    }
    let sampler = lab.sample_limits(Duration::from_millis(500));
    let (report, judged) = lab.judged_capacity(window(secs), || g.run_in(&lab.pair.client, |_| {}));
    let limits: Vec<u32> = sampler.finish().into_iter().map(|(_, l)| l).collect();
    eprintln!(
        "capacity {cap:.0}/s ({judged:.0}/s at the backend's pace), limits {limits:?}\n{}",
        report.table()
    );
    let w = report.range(SETTLE..secs);
    let lights: Vec<f64> = labels.iter().map(|l| success(&w, l)).collect();
    eprintln!(
        "light sources: {:?}; heavy {:.1}%; goodput {:.0}% of capacity",
        lights
            .iter()
            .map(|s| (s * 1000.0).round() / 10.0)
            .collect::<Vec<_>>(),
        100.0 * success(&w, "heavy"),
        100.0 * w.goodput() / cap
    );
    for (l, s) in labels.iter().zip(&lights) {
        assert!(*s >= 0.90, "{l}: {:.1}% of its requests served", 100.0 * s);
    }
    assert_busy(&w, judged, "");
}

/// Every client behind one address (a NAT, a proxy): the whole class is one source, so
/// fair shares and retry recognition must not starve it. At 3× and 10× the backend stays
/// busy: at least the 95% of capacity the issue asks (this case got 10% of capacity
/// before the fixes; measured 97–102% in six runs, one earlier run 92%, one CI run 94% of
/// the capacity measured before the run, when the served requests' latency rose as their
/// rate fell: a slowed backend, not an idle one; hence [`Lab::judged_capacity`]).
#[test]
fn one_address_keeps_the_backend_busy_at_3x_and_10x() {
    let lab = lab("fnat", 8220);
    let cap = lab.capacity;
    for factor in [3.0, 10.0] {
        let secs = 10;
        // The limits over the run, so that a shortfall shows whether the limit sat low.
        let sampler = lab.sample_limits(Duration::from_millis(500));
        let (report, judged) = lab.judged_capacity(window(secs), || {
            LoadGen::new(lab.target())
                .deadline(DEADLINE)
                .phase(Duration::from_secs(secs), factor * cap)
                .class("nat", IpAddr::V4(CLIENT_V4), 1.0)
                .run_in(&lab.pair.client, |_| {})
        });
        let limits: Vec<u32> = sampler.finish().into_iter().map(|(_, l)| l).collect();
        let w = report.range(SETTLE..secs);
        eprintln!(
            "{factor}×: goodput {:.0}% of {cap:.0}/s ({judged:.0}/s at the backend's pace), \
             limits {limits:?}\n{}",
            100.0 * w.goodput() / cap,
            report.table()
        );
        assert_busy(&w, judged, &format!("{factor}×: "));
        // Let the backlog of the run drain before the next.
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// 2,000 sources at 5× capacity (the generator's most, about 950 attempts a second): the
/// packet path holds more than 1,000 sources at once in its fixed-size table (no map grows;
/// a full set replaces the source seen longest ago), counts its active sources per epoch,
/// and the backend stays busy. The clients are returning ones: each connected once before
/// the overload, so each has standing (a source of a class's fair share is a proven one;
/// see docs/design.md, *Proof of a handshake*).
#[test]
fn a_thousand_sources_in_fixed_memory() {
    let lab = lab("fmany", 8230);
    add_local_range(&lab.pair.client, "198.18.64.0/21");
    // 2,000 clients on the veth's link would be 2,000 neighbours of the server, above the
    // kernel's default neighbour table (gc_thresh3 = 1024, for the whole host), past which
    // SYN-ACKs to new clients are never sent. A load balancer's clients are behind a
    // gateway: so are these, the client namespace's address.
    lab.pair.server.ip(&[
        "route",
        "add",
        "198.18.64.0/21",
        "via",
        &CLIENT_V4.to_string(),
    ]);
    let cap = lab.capacity;
    // Each client connects once and leaves (the backend reads end-of-file at once), a few
    // at a time, as returning clients did before the overload: one refused (the service
    // briefly full) tries again.
    let target = lab.target();
    lab.pair.client.run(|| {
        std::thread::scope(|s| {
            for t in 0..4u32 {
                s.spawn(move || {
                    for k in (t..2000).step_by(4) {
                        let src = IpAddr::V4(Ipv4Addr::from(
                            u32::from(Ipv4Addr::new(198, 18, 64, 1)) + k,
                        ));
                        // Backing off as a client's own SYN retries do (20 ms, growing
                        // to 100): a few attempts at once from new addresses may wait
                        // for the unproven ones' room, which a held attempt keeps for the
                        // handshake hold.
                        let mut last = String::new();
                        let connected = (0..WARM_UP_TRIES).any(|i| {
                            let a = shedder_lab::tcp::connect_from(
                                src,
                                target.ip(),
                                target.port(),
                                Duration::from_secs(3),
                            );
                            match a.result {
                                Ok(_) => true,
                                Err(e) => {
                                    last = e.to_string();
                                    let pause = 20 * (1 + u64::from(i) / 8).min(5);
                                    std::thread::sleep(Duration::from_millis(pause));
                                    false
                                }
                            }
                        });
                        assert!(
                            connected,
                            "the warm-up connection from {src} failed {WARM_UP_TRIES} times \
                             (last: {last})"
                        );
                    }
                });
            }
        })
    });
    let secs = 10;
    let maps = PinnedMaps::open(&lab.pins).expect("the daemon's maps");
    // The service's limit over the run, printed with the table: a low goodput is a
    // limit held low, or room taken by something else, and the two read differently.
    let sampler = lab.sample_limits(Duration::from_millis(500));
    let ((report, most), judged) = lab.judged_capacity(window(secs), || {
        let handle = LoadGen::new(lab.target())
            .deadline(DEADLINE)
            .phase(Duration::from_secs(secs), 5.0 * cap)
            .class_hosts("many", IpAddr::V4(Ipv4Addr::new(198, 18, 64, 1)), 2000, 1.0)
            .start_in(&lab.pair.client);
        let mut most = 0;
        for _ in 0..(2 * secs) {
            std::thread::sleep(Duration::from_millis(500));
            if let Ok(f) = maps.fairness(0) {
                let seen = f
                    .slots
                    .iter()
                    .map(|s| s.class[CLASS_MEDIUM as usize].sources);
                most = most.max(seen.max().unwrap_or(0));
            }
        }
        (handle.wait(), most)
    });
    let table: Array<&MapData, SourceSet> = Array::try_from(
        maps.map_named(shedder_common::maps::SOURCES)
            .expect("the table"),
    )
    .expect("an array of sets");
    let held: usize = table
        .iter()
        .filter_map(Result::ok)
        .map(|set| set.slot.iter().filter(|s| s.tag != 0).count())
        .sum();
    let w = report.range(SETTLE..secs);
    let limits: Vec<String> = sampler
        .finish_with_busy()
        .iter()
        .map(|(t, l, b)| format!("{:.1}s {l} ({b} busy)", t.as_secs_f64()))
        .collect();
    eprintln!(
        "{held} sources held, at most {most} active in one epoch; offered {:.0}/s, goodput \
         {:.0}% of {cap:.0}/s ({judged:.0}/s at the backend's pace)\n{}limit: {}\n\
         refused since the lab started: {}",
        w.offered_rate(),
        100.0 * w.goodput() / cap,
        report.table(),
        limits.join(", "),
        shedder_lab::scenario::refusals_by_reason(&lab.pins)
    );
    assert!(held >= 1000, "only {held} sources in the table");
    assert!(most >= 500, "only {most} sources counted in an epoch");
    assert_busy(&w, judged, "");
}
