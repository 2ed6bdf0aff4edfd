//! The spoofed-flood experiment shared by the flood tests and `cargo xtask bench flood`:
//! clients of every class offering 75% of the backend's capacity beside forged SYNs in one
//! class's space, with the kernel alone (SYN cookies) or with the real daemon, each run on
//! a fresh lab (a flood leaves the kernel slower for the next run in the same namespaces,
//! which would favour whichever ran first); and a real overload during a flood.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::{NUM_CLASSES, ServiceCounters};

use crate::{
    flood::{Flood, FloodConfig, Prefix, route_replies},
    load::{LoadGen, Window},
    policy::{CLIENT_V4, CRITICAL_V4, HIGH_V4, SERVER_V4},
    scenario::{Lab, LabConfig, limits_between, median},
};

/// The classes' clients: (label, source, requests per second): 75% of a 200/s backend.
pub const CLIENTS: [(&str, Ipv4Addr, f64); 3] = [
    ("critical", CRITICAL_V4, 10.0),
    ("high", HIGH_V4, 40.0),
    ("medium", CLIENT_V4, 100.0),
];

/// The spaces forged: the default class's (no rule covers 198.19.0.0/16), HIGH's prefix,
/// CRITICAL's prefix (which holds the CRITICAL client's own address: one forged SYN in 128
/// carries it).
pub const SPACES: [(&str, Prefix); 3] = [
    ("default", Prefix::new(Ipv4Addr::new(198, 19, 0, 0), 16)),
    ("high", Prefix::new(Ipv4Addr::new(198, 18, 20, 0), 24)),
    ("critical", Prefix::new(Ipv4Addr::new(198, 18, 10, 0), 25)),
];

/// Forged SYNs a second: the floor, paced so that the generator, the node and the
/// clients share the two cores without one starving the others (`cargo xtask bench flood`
/// floods as fast as the machine can).
pub const FLOOD_RATE: f64 = 100_000.0;
/// The seconds judged: after 2 s of warm-up, 10 s.
pub const JUDGED: std::ops::Range<u64> = 2..12;

/// The clients' traffic before the flood starts. A client with no standing when a flood
/// fills its class's unproven cap is a new client during a flood, which this experiment does
/// not judge (docs/design.md, *Proof of a handshake*, says what such a client gets); without
/// this, whether the medium client's first handshake beat 100,000 forged SYNs a second to
/// the cap decided the run (its success 0.80-1.00 in the same build).
pub const WARM_UP: Duration = Duration::from_secs(1);

/// One run's outcome.
pub struct Run {
    /// Success per class, in `CLIENTS` order.
    pub success: [f64; 3],
    /// The service limit's median over the judged seconds (protected runs).
    pub limit: Option<u32>,
    /// Proven attempts offered per class over the judged seconds, less those their source
    /// disowned, as the daemon counts demand (protected runs).
    pub offered: Option<[u64; NUM_CLASSES]>,
    /// Forged SYNs sent a second.
    pub flood_rate: f64,
    /// The 99th percentile of the successes' latency.
    pub p99: Option<Duration>,
}

pub fn success(w: &Window, label: &str) -> f64 {
    let c = w.class(label).expect("class");
    c.ok as f64 / c.offered.max(1) as f64
}

/// A lab whose node routes the replies to every forged space back to a client address
/// that drops them.
pub fn lab(tag: &str) -> Lab {
    let lab = Lab::new(tag, LabConfig::default());
    route_replies(
        &lab.pair.server,
        &SPACES.map(|s| s.1),
        Ipv4Addr::new(198, 18, 0, 1),
    );
    lab
}

fn clients(lab: &Lab, rate: f64, secs: u64) -> LoadGen {
    let total: f64 = CLIENTS.iter().map(|c| c.2).sum();
    CLIENTS
        .iter()
        .fold(LoadGen::new(lab.target()), |g, (label, src, r)| {
            g.class(label, IpAddr::V4(*src), r / total)
        })
        .deadline(Duration::from_secs(1))
        .phase(Duration::from_secs(secs), rate)
}

pub fn flood(lab: &Lab, space: Prefix, rate: Option<f64>) -> Flood {
    Flood::start_in(
        &lab.pair.client,
        FloodConfig {
            target: SocketAddrV4::new(SERVER_V4, lab.cfg.port),
            sources: vec![space],
            rate,
            cpu: Some(1),
            seed: 7,
        },
    )
}

fn counters(lab: &Lab) -> ServiceCounters {
    PinnedMaps::open(&lab.pins)
        .and_then(|m| m.service_counters(0))
        .expect("the service's counters")
}

/// One run on a fresh lab: the clients for 12 s beside a flood from `space` (none: no
/// flood) of `rate` forged SYNs a second (none: as fast as one thread sends), protected or
/// not.
pub fn run(tag: &str, space: Option<(&str, Prefix)>, protect: bool, rate: Option<f64>) -> Run {
    let mut lab = lab(tag);
    if protect {
        lab.protect();
    }
    // The clients were using the service before the flood began, as on a running node:
    // one second of their traffic gives each of them standing (see `WARM_UP`).
    clients(&lab, CLIENTS.iter().map(|c| c.2).sum(), WARM_UP.as_secs())
        .run_in(&lab.pair.client, |_| {});
    let f = space.map(|(_, s)| flood(&lab, s, rate));
    let sampler = protect.then(|| lab.sample_limits(Duration::from_millis(200)));
    let total: f64 = CLIENTS.iter().map(|c| c.2).sum();
    let before = std::sync::Mutex::new(None);
    let report = std::thread::scope(|s| {
        let snap = protect.then(|| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_secs(JUDGED.start));
                *before.lock().unwrap() = Some(counters(&lab));
                std::thread::sleep(Duration::from_secs(JUDGED.end - JUDGED.start));
                counters(&lab)
            })
        });
        let report = clients(&lab, total, JUDGED.end).run_in(&lab.pair.client, |_| {});
        (report, snap.map(|h| h.join().expect("counter sampler")))
    });
    let (report, after) = report;
    let stats = f.map(|f| f.stop());
    let limits = sampler.map(|s| s.finish());
    let w = report.range(JUDGED);
    if let (Some(after), Some(before)) = (after.as_ref(), before.lock().unwrap().as_ref()) {
        // Where each class's attempts went, for a failure's message: proven refusals by
        // reason, unproven attempts admitted and refused.
        for c in 0..3u32 {
            let d = |k: &[u64], v: u32, r: u32| {
                let i = shedder_common::decision_index(c, v, r) as usize;
                k[i]
            };
            let diff = |pick: fn(&ServiceCounters) -> &[u64], v: u32, r: u32| {
                d(pick(after), v, r) - d(pick(before), v, r)
            };
            fn proven(k: &ServiceCounters) -> &[u64] {
                &k.n
            }
            fn unproven(k: &ServiceCounters) -> &[u64] {
                &k.unproven
            }
            let mut refused = Vec::new();
            let (mut u_pass, mut u_refused) = (0, 0);
            for reason in shedder_common::Reason::ALL {
                let r = reason as u32;
                u_pass += diff(unproven, shedder_common::VERDICT_PASS, r);
                for v in [shedder_common::VERDICT_DROP, shedder_common::VERDICT_RST] {
                    u_refused += diff(unproven, v, r);
                    let n = diff(proven, v, r);
                    if n > 0 {
                        refused.push(format!("{} {n}", reason.name()));
                    }
                }
            }
            eprintln!(
                "{tag} class {c}: proven refused [{}], disowned {}; unproven admitted {u_pass} refused {u_refused}, completed {}",
                refused.join(", "),
                after.disowned[c as usize] - before.disowned[c as usize],
                after.completed_unproven[c as usize] - before.completed_unproven[c as usize],
            );
        }
    }
    let offered = after.map(|after| {
        let before = before
            .lock()
            .unwrap()
            .take()
            .expect("counters at the start");
        std::array::from_fn(|c| {
            let sum = |k: &ServiceCounters| -> u64 {
                (0..shedder_common::NUM_VERDICTS)
                    .flat_map(|v| {
                        (0..shedder_common::REASON_SLOTS)
                            .map(move |r| shedder_common::decision_index(c as u32, v, r))
                    })
                    .map(|i| k.n[i as usize])
                    .sum()
            };
            // As the daemon counts demand: proven attempts less those their source
            // disowned (forged in its name).
            (sum(&after) - sum(&before)).saturating_sub(after.disowned[c] - before.disowned[c])
        })
    });
    let out = Run {
        success: [
            success(&w, "critical"),
            success(&w, "high"),
            success(&w, "medium"),
        ],
        limit: limits.map(|l| median(limits_between(&l, JUDGED.start as f64, JUDGED.end as f64))),
        offered,
        flood_rate: stats.map_or(0.0, |s| s.rate()),
        p99: w.all.p99(),
    };
    eprintln!(
        "{tag} ({}; {}): forged {:.0}/s; success critical {:.3} high {:.3} medium {:.3}; p99 {:?}; limit {:?}; proven offered {:?}",
        space.map_or("no flood", |s| s.0),
        if protect { "shedder" } else { "kernel alone" },
        out.flood_rate,
        out.success[0],
        out.success[1],
        out.success[2],
        out.p99,
        out.limit,
        out.offered
    );
    out
}

/// A real overload during a flood: clients with standing of the standard mix at `factor`
/// times the capacity for 14 s beside forged SYNs in `space`, protected. Returns the window
/// judged (4..14 s), the capacity to judge its goodput by, and the forged SYNs a second.
pub fn overload(tag: &str, space: Prefix, factor: f64, rate: Option<f64>) -> (Window, f64, f64) {
    let mut lab = lab(tag);
    lab.protect();
    // Standing first, as in `run`.
    lab.load()
        .phase(WARM_UP, 0.5 * lab.capacity)
        .run_in(&lab.pair.client, |_| {});
    let f = flood(&lab, space, rate);
    let offered = factor * lab.capacity;
    let (report, capacity) =
        lab.judged_capacity(Duration::from_secs(4)..Duration::from_secs(14), || {
            lab.load()
                .deadline(Duration::from_secs(1))
                .phase(Duration::from_secs(14), offered)
                .run_in(&lab.pair.client, |_| {})
        });
    let stats = f.stop();
    eprintln!("{}", report.table());
    (report.range(4..14), capacity, stats.rate())
}
