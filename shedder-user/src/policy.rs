//! From a validated configuration to the values the packet path reads: per-class limits
//! from a service limit (floors, ceilings, priority), token buckets, class rules, globals.

use std::net::IpAddr;

use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_CRITICAL, ClassPolicy, Globals, MODE_DRY_RUN, MODE_ENFORCE,
    NUM_CLASSES, POLICY_CONFIGURED, ServicePolicy, gcra::BucketParams,
};

use crate::{
    config::{Action, Config, Mode, Prefix, Service},
    ebpf::{epoch_shift_for, ms_to_jiffies},
};

/// Per-class concurrency bounds derived from one service limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassLimits {
    /// Occupancy at which the class is shed.
    pub share: u32,
    /// Occupancy below which the class is admitted whatever the pressure.
    pub floor: u32,
    /// Occupancy the class may never exceed.
    pub ceiling: u32,
}

/// Class fractions from the `[classes]` section: floors of the service limit, ceilings of
/// the service's hard maximum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ladder {
    pub floor: [f64; NUM_CLASSES],
    pub ceiling: [f64; NUM_CLASSES],
}

impl Ladder {
    pub fn from_config(cfg: &Config) -> Self {
        let classes = cfg.classes.by_id();
        let mut floor = [0.0; NUM_CLASSES];
        let mut ceiling = [1.0; NUM_CLASSES];
        for (id, c) in classes.into_iter().enumerate() {
            if id != CLASS_CRITICAL as usize {
                floor[id] = c.floor.unwrap_or(0.0);
            }
            ceiling[id] = c.ceiling.unwrap_or(1.0);
        }
        Self { floor, ceiling }
    }
}

/// Split a service limit `total` among the classes (the static part of the allocation):
///
/// - CRITICAL is bounded only by its ceiling (a fraction of `max_limit`): never shed by
///   pressure, never unbounded;
/// - every other class keeps `floor × total` (at least one connection when its floor is
///   above zero, so a class with a floor is never starved to zero);
/// - a class may grow to `total` minus the floors of the classes above it, so as the
///   service fills up SHEDDABLE is refused first, then MEDIUM, then HIGH.
pub fn allocate(total: u32, max_limit: u32, ladder: &Ladder) -> [ClassLimits; NUM_CLASSES] {
    let mut out = [ClassLimits::default(); NUM_CLASSES];
    let mut reserved_above: u32 = 0;
    for (id, limits) in out.iter_mut().enumerate() {
        // At least one connection, except under a ceiling of 0 (a fleet node waiting for
        // its share), where nothing is admitted.
        let ceiling = ((ladder.ceiling[id] * max_limit as f64).ceil() as u32)
            .max(1)
            .min(max_limit);
        if id == CLASS_CRITICAL as usize {
            *limits = ClassLimits {
                share: ceiling,
                floor: 0,
                ceiling,
            };
            continue;
        }
        let mut floor = (ladder.floor[id] * total as f64).floor() as u32;
        if ladder.floor[id] > 0.0 && total > 0 {
            floor = floor.max(1);
        }
        let floor = floor.min(ceiling);
        let share = total.saturating_sub(reserved_above).max(floor).min(ceiling);
        *limits = ClassLimits {
            share,
            floor,
            ceiling,
        };
        reserved_above = reserved_above.saturating_add(floor);
    }
    out
}

/// Split a service limit `total` among the classes by demand (the daemon's allocation):
///
/// - CRITICAL is bounded only by its ceiling;
/// - every other class first gets what it wants of its floor (`floor × total`, at least one
///   connection when its floor is above zero);
/// - what is left goes by priority — HIGH, then MEDIUM, then SHEDDABLE — each class taking
///   what it wants, up to its ceiling; so under overload SHEDDABLE is refused first;
/// - a class's share is the total less what the classes above it are given and the part
///   of their floors the classes below it use: capacity is only ever held back from a
///   class for a class of higher priority or for a reservation in use. A lower class that
///   wants more than is left (or whose demand is unknown) is squeezed; it never takes the
///   headroom of a class above it. (Handing all spare capacity to whichever class reported
///   unbounded demand, which an allocation that gives every class "its demand plus what
///   nobody wants" does, caps the classes above at their last measured occupancy, and a
///   higher class is then refused as soon as its concurrency rises between two ticks.)
/// - a class's share never drops below its floor: a reservation lent to others is taken
///   back as soon as its class wants it (the packet path admits a class below its floor
///   whatever the total), so a class with a floor is never starved.
///
/// `demand[c]` is the concurrency class `c` would use if none of it were shed
/// (`f64::INFINITY` when unknown but unsatisfied). Seed 003: a 4,000-unit capacity with
/// premium reserved 60% and free 40%, premium wanting 3,000 and free 6,000, gives 2,400 and
/// 1,600; when premium wants only 1,200, free borrows the slack (2,800).
pub fn allocate_for_demand(
    total: u32,
    max_limit: u32,
    ladder: &Ladder,
    demand: &[f64; NUM_CLASSES],
) -> [ClassLimits; NUM_CLASSES] {
    let base = allocate(total, max_limit, ladder);
    let mut reserved = [0f64; NUM_CLASSES];
    let mut avail = total as f64;
    for c in 1..NUM_CLASSES {
        reserved[c] = demand[c].max(0.0).min(base[c].floor as f64);
        avail -= reserved[c];
    }
    avail = avail.max(0.0);
    let mut give = reserved;
    for c in 1..NUM_CLASSES {
        let room = (base[c].ceiling as f64 - give[c]).max(0.0);
        let extra = (demand[c].max(0.0) - give[c]).max(0.0).min(avail).min(room);
        give[c] += extra;
        avail -= extra;
    }
    let mut out = base;
    for c in 1..NUM_CLASSES {
        let above: f64 = give[1..c].iter().sum();
        let below: f64 = reserved[c + 1..].iter().sum();
        let share = (total as f64 - above - below).max(0.0).floor() as u32;
        out[c].share = share.max(base[c].floor).min(base[c].ceiling);
    }
    out
}

/// The concurrency a class would use if none of it were shed, by Little's law at the
/// class's current connection duration: occupancy scaled by offered / admitted. Unknown
/// (infinite) when everything offered is being shed; the occupancy when nothing is offered.
pub fn class_demand(occupancy: u32, offered: f64, admitted: f64) -> f64 {
    if offered <= 0.0 {
        occupancy as f64
    } else if admitted <= 0.0 {
        f64::INFINITY
    } else {
        occupancy as f64 * (offered / admitted).max(1.0)
    }
}

/// The kernel's view of one configured service.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledService {
    pub id: u32,
    pub name: String,
    pub ports: Vec<u16>,
    pub addresses: Vec<IpAddr>,
    pub policy: ServicePolicy,
}

/// Everything to write into the maps for a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub services: Vec<CompiledService>,
    pub class_rules: Vec<(Prefix, u32)>,
    pub globals: Globals,
}

/// A service's retry window in jiffies at `hz` (rounded up; 0 keeps retry recognition off).
/// Configuration bounds it far below `u32::MAX` at any real HZ; a wildly wrong calibration
/// saturates instead of wrapping to a short window.
pub fn retry_window_jiffies(s: &Service, hz: u32) -> u32 {
    ms_to_jiffies(s.retry_window_ms, hz).min(u32::MAX as u64) as u32
}

/// Build the service policy for `total` (the adaptive limit), split by `demand` when known
/// (see [`allocate_for_demand`]), else statically (see [`allocate`]); the fallback limits
/// are always split statically. `hz` converts the retry window to jiffies. The daemon
/// rebuilds every service's policy with this function each tick, so everything configured
/// (retry window and demotion included) is written with every limit change.
pub fn service_policy(
    s: &Service,
    ladder: &Ladder,
    total: u32,
    demand: Option<&[f64; NUM_CLASSES]>,
    hz: u32,
) -> ServicePolicy {
    let total = total.clamp(s.min_limit, s.max_limit);
    let live = match demand {
        Some(d) => allocate_for_demand(total, s.max_limit, ladder, d),
        None => allocate(total, s.max_limit, ladder),
    };
    let fallback = allocate(s.fallback_limit, s.max_limit, ladder);
    let mut classes = [ClassPolicy::default(); NUM_CLASSES];
    for (id, c) in classes.iter_mut().enumerate() {
        let bucket = shedder_common::CLASS_NAMES
            .get(id)
            .and_then(|name| s.rate.get(*name))
            .and_then(|r| BucketParams::new(r.per_second, r.burst));
        *c = ClassPolicy {
            limit: live[id].share,
            fallback_limit: fallback[id].share,
            floor: live[id].floor,
            fallback_floor: fallback[id].floor,
            ceiling: live[id].ceiling,
            _pad: 0,
            rate_interval_ns: bucket.map_or(0, |b| b.interval_ns),
            burst_ns: bucket.map_or(0, |b| b.burst_ns),
        };
    }
    ServicePolicy {
        classes,
        total_limit: total,
        fallback_total: s.fallback_limit,
        action: match s.action {
            Action::Drop => ACTION_DROP,
            Action::Rst => ACTION_RST,
        },
        mode: match s.mode {
            Mode::Enforce => MODE_ENFORCE,
            Mode::DryRun => MODE_DRY_RUN,
        },
        default_class: s.default_class.id() as u8,
        configured: POLICY_CONFIGURED,
        retry_window_jiffies: retry_window_jiffies(s, hz),
        demote_retries: u32::from(s.demotes_retries()),
        ..Default::default()
    }
}

/// Compile a validated configuration. Services start at their fallback limit until a
/// controller moves them. `hz` converts the heartbeat timeout, the SYN retransmit window and
/// the services' retry windows to jiffies.
pub fn compile(cfg: &Config, hz: u32) -> Compiled {
    let ladder = Ladder::from_config(cfg);
    let services = cfg
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| CompiledService {
            id: i as u32,
            name: s.name.clone(),
            ports: s.ports.clone(),
            addresses: s.addresses.clone(),
            policy: service_policy(s, &ladder, s.fallback_limit, None, hz),
        })
        .collect();
    let mut class_rules = Vec::new();
    for (id, class) in cfg.classes.by_id().into_iter().enumerate() {
        for src in &class.sources {
            // Validated already; a parse failure here would be a bug in validate().
            let p = Prefix::parse(src).expect("validated prefix");
            class_rules.push((p, id as u32));
        }
    }
    Compiled {
        services,
        class_rules,
        globals: Globals {
            heartbeat_jiffies: 0,
            heartbeat_timeout_jiffies: ms_to_jiffies(cfg.daemon.heartbeat_timeout_ms, hz),
            clock_jiffies: 0,
            pending_epoch_shift: epoch_shift_for(hz),
            hz,
            generation: 0,
            retransmit_window_jiffies: ms_to_jiffies(cfg.daemon.syn_retransmit_window_ms, hz),
            // Chosen when the policy is written (`Shedder::apply`): kept while the maps live.
            table_seed: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_000_ladder() -> Ladder {
        // critical never shed (ceiling 5%), paid (high) floor 60%, free (medium) floor 5%,
        // batch (sheddable) no floor: seed 000 §7.
        Ladder {
            floor: [0.0, 0.60, 0.05, 0.0],
            ceiling: [0.05, 1.0, 1.0, 1.0],
        }
    }

    #[test]
    fn seed_000_table() {
        let a = allocate(100, 1000, &seed_000_ladder());
        assert_eq!(
            a[0],
            ClassLimits {
                share: 50,
                floor: 0,
                ceiling: 50
            },
            "critical: ceiling only"
        );
        assert_eq!(
            a[1],
            ClassLimits {
                share: 100,
                floor: 60,
                ceiling: 1000
            },
            "paid: floor 60%"
        );
        assert_eq!(
            a[2],
            ClassLimits {
                share: 40,
                floor: 5,
                ceiling: 1000
            },
            "free: floor 5%"
        );
        assert_eq!(
            a[3],
            ClassLimits {
                share: 35,
                floor: 0,
                ceiling: 1000
            },
            "batch goes first"
        );
        // Batch is refused first as the service fills: its share is the smallest.
        assert!(a[3].share < a[2].share && a[2].share < a[1].share);
    }

    #[test]
    fn seed_003_premium_and_free_reservations() {
        // Capacity 4,000 units; premium (high) reserved 60%, free (medium) 40%.
        let ladder = Ladder {
            floor: [0.0, 0.60, 0.40, 0.0],
            ceiling: [0.05, 1.0, 1.0, 1.0],
        };
        // Premium 1,000 req/s × 3 units, free 6,000 req/s × 1 unit: 9,000 offered.
        let a = allocate_for_demand(4000, 4000, &ladder, &[0.0, 3000.0, 6000.0, 0.0]);
        assert_eq!((a[1].share, a[2].share), (2400, 1600));
        // 2,400 units of premium is 800 req/s; free gets 1,600 req/s.
        assert_eq!(a[1].share / 3, 800);
        // Premium wanting only 1,200: free borrows the slack, premium keeps its floor.
        let a = allocate_for_demand(4000, 4000, &ladder, &[0.0, 1200.0, 6000.0, 0.0]);
        assert_eq!((a[1].floor, a[1].share, a[2].share), (2400, 2400, 2800));
    }

    #[test]
    fn seed_000_table_under_overload() {
        // Every class wants more than the service has.
        let inf = f64::INFINITY;
        let a = allocate_for_demand(100, 1000, &seed_000_ladder(), &[inf; 4]);
        assert_eq!(
            a[0].ceiling, 50,
            "critical: never shed by pressure, bounded by its ceiling"
        );
        assert_eq!(
            (a[1].floor, a[1].share),
            (60, 95),
            "paid: its floor, then the surplus"
        );
        assert_eq!(
            (a[2].floor, a[2].share),
            (5, 5),
            "free: kept at its floor, not starved"
        );
        assert_eq!((a[3].floor, a[3].share), (0, 0), "batch: shed first");
        // Batch alone wants capacity: it gets what the others leave.
        let a = allocate_for_demand(100, 1000, &seed_000_ladder(), &[0.0, 10.0, 3.0, inf]);
        assert_eq!(a[3].share, 87, "100 - 10 - 3");
        // Little demand: headroom for everybody, less what the classes above want and
        // the reservations in use below.
        let a = allocate_for_demand(100, 1000, &seed_000_ladder(), &[0.0, 10.0, 3.0, 2.0]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (97, 90, 87));
    }

    #[test]
    fn unbounded_demand_below_never_caps_a_class_above() {
        // Light load (a limit of 10, a few connections per class) while one SHEDDABLE
        // attempt was refused in the last tick and none admitted: its demand is unknown.
        // HIGH and MEDIUM keep room to grow past their last occupancy; only SHEDDABLE is
        // held to what they leave.
        let inf = f64::INFINITY;
        let a = allocate_for_demand(10, 64, &seed_000_ladder(), &[0.0, 1.3, 1.2, inf]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (9, 8, 7));
        // Unknown MEDIUM demand squeezes SHEDDABLE, not HIGH.
        let a = allocate_for_demand(10, 64, &seed_000_ladder(), &[0.0, 1.3, inf, 2.0]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (9, 8, 0));
    }

    #[test]
    fn demand_estimate() {
        assert_eq!(class_demand(10, 0.0, 0.0), 10.0);
        assert_eq!(class_demand(10, 300.0, 100.0), 30.0);
        assert_eq!(class_demand(0, 50.0, 0.0), f64::INFINITY);
        assert_eq!(class_demand(10, 100.0, 100.0), 10.0);
    }

    #[test]
    fn a_class_with_a_floor_is_never_starved() {
        let a = allocate(8, 4000, &seed_000_ladder());
        // 5% of 8 rounds down to 0, but a class with a floor keeps one connection.
        assert_eq!(a[2].floor, 1);
        assert!(a.iter().skip(1).all(|c| c.share >= c.floor));
    }

    #[test]
    fn floors_are_capped_by_ceilings() {
        let ladder = Ladder {
            floor: [0.0, 0.5, 0.0, 0.0],
            ceiling: [0.05, 0.1, 1.0, 1.0],
        };
        let a = allocate(1000, 1000, &ladder);
        assert_eq!(
            a[1],
            ClassLimits {
                share: 100,
                floor: 100,
                ceiling: 100
            }
        );
    }

    #[test]
    fn compile_example() {
        let cfg = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n\
             [classes]\ncritical = { sources = [\"198.18.10.0/24\"], ceiling = 0.05 }\n\
             high = { floor = 0.6 }\n\
             [[service]]\nname = \"checkout\"\nports = [8080, 8443]\nmax_limit = 1000\n\
             fallback_limit = 200\naction = \"drop\"\n\
             rate = { sheddable = { per_second = 200, burst = 400 } }\n",
        )
        .unwrap();
        let c = compile(&cfg, 250);
        assert_eq!(c.globals.heartbeat_timeout_jiffies, 750);
        assert_eq!(c.globals.pending_epoch_shift, 8);
        assert_eq!(c.class_rules.len(), 1);
        let s = &c.services[0];
        assert_eq!(s.ports, [8080, 8443]);
        let p = &s.policy;
        assert_eq!(
            (p.total_limit, p.fallback_total, p.action),
            (200, 200, ACTION_DROP)
        );
        assert_eq!(p.classes[0].ceiling, 50);
        assert_eq!(p.classes[1].floor, 120);
        assert_eq!(p.classes[3].rate_interval_ns, 5_000_000);
        assert_eq!(p.classes[3].burst_ns, 2_000_000_000);
        assert_eq!(p.classes[2].rate_interval_ns, 0);
        // The defaults: retransmits within 30 s, retries within 10 s, demoted.
        assert_eq!(c.globals.retransmit_window_jiffies, 7_500);
        assert_eq!((p.retry_window_jiffies, p.demote_retries), (2_500, 1));
    }

    #[test]
    fn windows_are_converted_to_jiffies_at_the_calibrated_hz() {
        let cfg = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\nsyn_retransmit_window_ms = 1500\n\
             [[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 2001\n\
             [[service]]\nname = \"b\"\nports = [81]\nretry_window_ms = 0\n\
             [[service]]\nname = \"c\"\nports = [82]\ndemote_retries = false\n",
        )
        .unwrap();
        for (hz, retransmit, retry_a, retry_c) in [
            (100, 150, 201, 1_000), // 2001 ms is 200.1 jiffies: rounded up
            (250, 375, 501, 2_500),
            (300, 450, 601, 3_000),
            (1000, 1_500, 2_001, 10_000),
        ] {
            let c = compile(&cfg, hz);
            assert_eq!(c.globals.retransmit_window_jiffies, retransmit, "HZ {hz}");
            let p = |i: usize| c.services[i].policy;
            assert_eq!(
                (p(0).retry_window_jiffies, p(0).demote_retries),
                (retry_a, 1),
                "HZ {hz}"
            );
            assert_eq!(
                (p(1).retry_window_jiffies, p(1).demote_retries),
                (0, 0),
                "a zero window recognises no retry and so demotes none"
            );
            assert_eq!(
                (p(2).retry_window_jiffies, p(2).demote_retries),
                (retry_c, 0),
                "counted, not demoted"
            );
        }
        // Zero windows disable recognition on both sides.
        let off = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\nsyn_retransmit_window_ms = 0\n[[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 0\n",
        )
        .unwrap();
        let c = compile(&off, 1000);
        assert_eq!(c.globals.retransmit_window_jiffies, 0);
        assert_eq!(c.services[0].policy.retry_window_jiffies, 0);
        // The longest window fits 32 bits with room at any HZ, and a wild calibration
        // saturates rather than wrapping to a short window.
        let long = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n\
             [[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 3600000\n",
        )
        .unwrap();
        assert_eq!(
            compile(&long, 1000).services[0].policy.retry_window_jiffies,
            3_600_000
        );
        assert_eq!(retry_window_jiffies(&long.services[0], u32::MAX), u32::MAX);
    }

    /// The daemon rewrites each service's policy every tick from `service_policy` with the
    /// controller's limit and the measured demand: the retry settings must survive that
    /// rewrite, whatever the limit and the split.
    #[test]
    fn the_per_tick_rewrite_keeps_the_retry_settings() {
        let cfg = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n\
             [classes]\nhigh = { floor = 0.5 }\n\
             [[service]]\nname = \"a\"\nports = [80]\nmax_limit = 1000\nretry_window_ms = 4000\n",
        )
        .unwrap();
        let ladder = Ladder::from_config(&cfg);
        let s = &cfg.services[0];
        let compiled = compile(&cfg, 250).services[0].policy;
        let inf = f64::INFINITY;
        for (limit, demand) in [
            (8, None),
            (300, None),
            (1000, Some([0.0, 10.0, inf, inf])),
            (50, Some([1.0, 2.0, 3.0, 4.0])),
        ] {
            let p = service_policy(s, &ladder, limit, demand.as_ref(), 250);
            assert_eq!(p.total_limit, limit);
            assert_eq!(
                (p.retry_window_jiffies, p.demote_retries),
                (1_000, 1),
                "limit {limit}"
            );
            assert_eq!(
                (p.retry_window_jiffies, p.demote_retries),
                (compiled.retry_window_jiffies, compiled.demote_retries)
            );
        }
    }
}
