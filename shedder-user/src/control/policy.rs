//! From a validated configuration to the values the packet path reads: per-class limits
//! from a service limit (floors, ceilings, priority), token buckets, class rules, globals.
//! What is written, and how, is `kernel/`'s concern ([`Compiled`]).

use shedder_common::{
    ACTION_DROP, ACTION_RST, ClassPolicy, Globals, MODE_DRY_RUN, MODE_ENFORCE, NUM_CLASSES,
    POLICY_CONFIGURED, ServicePolicy, fair::BUDGET_ONE, gcra::BucketParams,
};

pub use crate::kernel::policy::{Compiled, CompiledService};
use crate::{
    config::{Action, Config, Mode, Prefix, Protocol, Service},
    control::{
        classes::{Ladder, Maxima, allocate_for_demand_in, allocate_in},
        clock::{DEFAULT_HOLD_US, epoch_shift_for, hold_bits_for, ms_to_jiffies},
    },
};

/// The class rules of a validated configuration: each source prefix and its class.
pub fn class_rules(cfg: &Config) -> Vec<(Prefix, u32)> {
    let mut rules = Vec::new();
    for (id, class) in cfg.classes.by_id().into_iter().enumerate() {
        for src in &class.sources {
            // Validated already; a parse failure here would be a bug in validate().
            let p = Prefix::parse(src).expect("validated prefix");
            rules.push((p, id as u32));
        }
    }
    rules
}

/// A service's retry window in jiffies at `hz` (rounded up; 0 keeps retry recognition off).
/// Configuration bounds it far below `u32::MAX` at any real HZ; a wildly wrong calibration
/// saturates instead of wrapping to a short window.
pub fn retry_window_jiffies(s: &Service, hz: u32) -> u32 {
    ms_to_jiffies(s.retry_window_ms, hz).min(u32::MAX as u64) as u32
}

/// The most a class lets attempts from sources without standing hold (its bounded
/// unproven part, see `shedder_common::proof`), out of `base`, what the class may hold (its
/// share, or CRITICAL's ceiling). Without a flood (`flood` `None`) all of it: unproven
/// attempts are decided against every connection and attempt in handshake, and new clients
/// (a browser's six parallel connections, a crowd after a launch) are not refused for
/// being new. In a flood (`Some(need)`), `unproven_share` of it plus twice `need`, the
/// unproven handshakes that do complete in a hold (their completions per second times the
/// hold: what new clients need, which forged SYNs cannot raise); at least one, at most
/// `base`. Sources with standing never see either.
pub fn unproven_cap(base: u32, unproven_share: f64, flood: Option<f64>) -> u32 {
    let Some(need) = flood else {
        return base.max(1);
    };
    let part = (base as f64 * unproven_share).ceil() + (2.0 * need.max(0.0)).ceil();
    (part.min(u32::MAX as f64) as u32).clamp(1, base.max(1))
}

/// The limits a service's policy is built within: as configured, or under an outside
/// ceiling (fleet mode's [`super::capped::Capped::limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub min: u32,
    pub max: u32,
    /// The kernel's fallback limit.
    pub fallback: u32,
    /// What CRITICAL's ceiling is a fraction of: the node's own bound, which an outside
    /// ceiling never lowers.
    pub critical_max: u32,
}

impl Limits {
    /// As `s` configures them.
    pub fn configured(s: &Service) -> Self {
        Self {
            min: s.min_limit,
            max: s.max_limit,
            fallback: s.fallback_limit,
            critical_max: s.max_limit,
        }
    }
}

/// Build the service policy for `total` (the adaptive limit) within `limits`, split by
/// `demand` when known (see [`allocate_for_demand_in`]), else statically (see
/// [`allocate_in`]); the fallback limits are always split statically. `flood` says, per class, whether it is under a flood of unproven attempts and
/// then what its new clients need of its unproven part ([`unproven_cap`]). `hz` converts
/// the retry window to jiffies. The daemon rebuilds every service's policy with this
/// function each tick, so everything configured (retry window and demotion included) is
/// written with every limit change.
pub fn service_policy(
    s: &Service,
    limits: Limits,
    ladder: &Ladder,
    total: u32,
    demand: Option<&[f64; NUM_CLASSES]>,
    flood: &[Option<f64>; NUM_CLASSES],
    hz: u32,
) -> ServicePolicy {
    let total = total.clamp(limits.min, limits.max);
    let max = Maxima {
        service: limits.max,
        critical: limits.critical_max,
    };
    let live = match demand {
        Some(d) => allocate_for_demand_in(total, max, ladder, d),
        None => allocate_in(total, max, ladder),
    };
    let fallback = allocate_in(limits.fallback, max, ladder);
    let pace = quic_pace(s, total);
    let mut classes = [ClassPolicy::default(); NUM_CLASSES];
    for (id, c) in classes.iter_mut().enumerate() {
        let configured = shedder_common::CLASS_NAMES
            .get(id)
            .and_then(|name| s.rate.get(*name))
            .and_then(|r| BucketParams::new(r.per_second, r.burst));
        // CRITICAL is bounded by its ceiling, never paced.
        let paced = pace.filter(|_| id != shedder_common::CLASS_CRITICAL as usize);
        let bucket = match (configured, paced) {
            (Some(a), Some(b)) => Some(stricter(a, b)),
            (a, b) => a.or(b),
        };
        *c = ClassPolicy {
            limit: live[id].share,
            fallback_limit: fallback[id].share,
            floor: live[id].floor,
            fallback_floor: fallback[id].floor,
            ceiling: live[id].ceiling,
            // The packet path shares the class equally among the sources of the last epoch.
            source_quota: 0,
            rate_interval_ns: bucket.map_or(0, |b| b.interval_ns),
            burst_ns: bucket.map_or(0, |b| b.burst_ns),
            source_mask_v4: prefix_mask(ladder.source_prefix[id].0, 32)[0],
            source_mask_v6: prefix_mask(ladder.source_prefix[id].1, 128),
            floor_share: (ladder.floor[id] * BUDGET_ONE as f64).round() as u32,
            reserve: live[id].reserve,
            unproven_cap: unproven_cap(
                if id == shedder_common::CLASS_CRITICAL as usize {
                    live[id].ceiling
                } else {
                    live[id].share
                },
                s.unproven_share,
                flood[id],
            ),
        };
    }
    ServicePolicy {
        classes,
        total_limit: total,
        fallback_total: limits.fallback,
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
        fair_share: u32::from(s.fair_share),
        retry_budget: if s.retry_window_ms > 0 {
            (s.retry_budget * BUDGET_ONE as f64).round() as u32
        } else {
            0
        },
        retry_budget_min: s.retry_budget_min,
        max_connections: s.max_connections,
        _pad: 0,
    }
}

/// A reply budget of `per_s` a second as a token bucket's interval (0: no bound).
fn reply_interval_ns(per_s: u64) -> u64 {
    match per_s {
        0 => 0,
        n => (1_000_000_000 / n).max(1),
    }
}

/// Its burst: a tenth of a second's replies, at least 10, in nanoseconds.
fn reply_burst_ns(per_s: u64) -> u64 {
    reply_interval_ns(per_s).saturating_mul((per_s / 10).max(10))
}

/// A QUIC service's pacing of new connections: its limit spread evenly over its active
/// window, with room for a sixteenth of the limit at once. A QUIC service's in-flight count
/// is of connections seen within the window (the packet path cannot see one close), so room
/// under the limit opens when connections go quiet, a window after they were served, and
/// at three times the capacity any room fills at once: the admissions of a moment would
/// leave the window together a window later and come back as another burst. Paced, they
/// reach the server as evenly as they are admitted.
fn quic_pace(s: &Service, total: u32) -> Option<BucketParams> {
    if s.protocol != Protocol::Quic {
        return None;
    }
    let window_ns = s.active_window_ms().saturating_mul(1_000_000);
    let interval_ns = (window_ns / u64::from(total.max(1))).max(1);
    Some(BucketParams {
        interval_ns,
        burst_ns: interval_ns.saturating_mul(u64::from((total / 16).max(1))),
    })
}

/// The stricter of two token buckets: the slower rate, and the fewer tokens of room (at
/// least one) at that rate.
fn stricter(a: BucketParams, b: BucketParams) -> BucketParams {
    let tokens = |p: BucketParams| (p.burst_ns / p.interval_ns.max(1)).max(1);
    let interval_ns = a.interval_ns.max(b.interval_ns);
    BucketParams {
        interval_ns,
        burst_ns: interval_ns.saturating_mul(tokens(a).min(tokens(b))),
    }
}

/// The mask of a prefix of `len` bits (at most `bits`, 32 or 128), as words in network
/// byte order, the order the packet path reads the address in.
fn prefix_mask(len: u8, bits: u8) -> [u32; 4] {
    let len = len.min(bits) as u32;
    std::array::from_fn(|i| {
        let take = len.saturating_sub(32 * i as u32).min(32);
        let host = if take == 0 {
            0
        } else {
            u32::MAX << (32 - take)
        };
        host.to_be()
    })
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
            protocol: s.protocol,
            ports: s.ports.clone(),
            addresses: s.addresses.clone(),
            policy: service_policy(
                s,
                Limits::configured(s),
                &ladder,
                s.fallback_limit,
                None,
                &[None; NUM_CLASSES],
                hz,
            ),
        })
        .collect();
    Compiled {
        services,
        class_rules: class_rules(cfg),
        globals: Globals {
            heartbeat_jiffies: 0,
            heartbeat_timeout_jiffies: ms_to_jiffies(cfg.daemon.heartbeat_timeout_ms, hz),
            clock_jiffies: 0,
            epoch_bits: epoch_shift_for(hz),
            hz,
            generation: 0,
            retransmit_window_jiffies: ms_to_jiffies(cfg.daemon.syn_retransmit_window_ms, hz),
            // Chosen when the policy is written (`Shedder::apply`): kept while the maps live.
            table_seed: 0,
            // Configured, or the default until the daemon has measured round trips.
            hold_bits: hold_bits_for(
                match cfg.daemon.handshake_hold_ms {
                    0 => DEFAULT_HOLD_US,
                    ms => ms * 1000,
                },
                hz,
            ),
            standing_window: u32::from(shedder_common::proof::window_units(ms_to_jiffies(
                cfg.daemon.standing_window_s.saturating_mul(1000),
                hz,
            ))),
            reply_interval_ns: [
                reply_interval_ns(cfg.daemon.max_replies_proven_per_s),
                reply_interval_ns(cfg.daemon.max_replies_unproven_per_s),
            ],
            reply_burst_ns: [
                reply_burst_ns(cfg.daemon.max_replies_proven_per_s),
                reply_burst_ns(cfg.daemon.max_replies_unproven_per_s),
            ],
        },
        decap: cfg.daemon.decapsulate.entries(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shedder_common::tunnel;

    /// The first service's policy at a limit of 64, as configured, at HZ 1000.
    fn at_64(c: &Config, ladder: &Ladder) -> ServicePolicy {
        let s = &c.services[0];
        service_policy(
            s,
            Limits::configured(s),
            ladder,
            64,
            None,
            &[None; NUM_CLASSES],
            1000,
        )
    }

    #[test]
    fn a_quic_service_is_paced_at_its_limit_per_window_and_a_configured_rate_still_binds() {
        let cfg = |extra: &str| {
            Config::parse(&format!(
                "[daemon]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"h3\"\nprotocol = \"quic\"\nports = [443]\n{extra}"
            ))
            .expect("valid")
        };
        let c = cfg("");
        let ladder = Ladder::from_config(&c);
        // 64 connections per 250 ms window: one every 3.9 ms, four at once.
        let p = at_64(&c, &ladder);
        let medium = p.classes[shedder_common::CLASS_MEDIUM as usize];
        assert_eq!(medium.rate_interval_ns, 3_906_250);
        assert_eq!(medium.burst_ns, 4 * 3_906_250);
        assert_eq!(
            p.classes[shedder_common::CLASS_CRITICAL as usize].rate_interval_ns,
            0
        );
        // A configured 1/s with a burst of 2 is slower: it binds, with its own room.
        let c = cfg("rate = { medium = { per_second = 1, burst = 2 } }\n");
        let p = at_64(&c, &ladder);
        let medium = p.classes[shedder_common::CLASS_MEDIUM as usize];
        assert_eq!(medium.rate_interval_ns, 1_000_000_000);
        assert_eq!(medium.burst_ns, 2_000_000_000);
        // A TCP service is not paced.
        let c = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"a\"\nports = [80]\n",
        )
        .expect("valid");
        let p = at_64(&c, &ladder);
        assert!(p.classes.iter().all(|c| c.rate_interval_ns == 0));
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
        assert_eq!(c.globals.epoch_bits, 8);
        // Before any round trip is measured, attempts are held 64 to 128 jiffies.
        assert_eq!(c.globals.hold_bits, 6);
        // Ten minutes of standing: 147 units of 1,024 jiffies at HZ 250.
        assert_eq!(c.globals.standing_window, 147);
        assert_eq!(c.globals.reply_interval_ns, [100_000, 1_000_000]);
        assert_eq!(c.globals.reply_burst_ns, [100_000_000, 100_000_000]);
        assert_eq!(c.class_rules.len(), 1);
        assert!(c.decap.is_empty(), "no tunnel is terminated by default");
        let mut tunnels = cfg.clone();
        tunnels.daemon.decapsulate.gre = true;
        tunnels.daemon.decapsulate.vxlan_ports = vec![4789];
        assert_eq!(
            compile(&tunnels, 250).decap,
            [
                (
                    tunnel::protocol_index(tunnel::IPPROTO_GRE),
                    tunnel::TUNNEL_GRE
                ),
                (tunnel::port_index(4789), tunnel::TUNNEL_VXLAN),
            ]
        );
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
        // Fair shares by /24 and /64, a 10% retry budget.
        assert_eq!(
            (p.fair_share, p.retry_budget, p.retry_budget_min),
            (1, 102, 0)
        );
        assert_eq!(p.classes[1].source_mask_v4, prefix_mask(24, 32)[0]);
        assert_eq!(p.classes[1].source_mask_v6, prefix_mask(64, 128));
        // Without a flood, unproven attempts may hold the class's whole share.
        assert_eq!(p.classes[1].unproven_cap, p.classes[1].limit.max(1));
    }

    #[test]
    fn source_prefixes_become_masks_in_network_order() {
        let be = |b: [u8; 4]| u32::from_ne_bytes(b);
        assert_eq!(prefix_mask(24, 32)[0], be([255, 255, 255, 0]));
        assert_eq!(prefix_mask(0, 32), [0; 4]);
        assert_eq!(prefix_mask(32, 32)[0], u32::MAX);
        assert_eq!(
            prefix_mask(56, 128),
            [u32::MAX, be([255, 255, 255, 0]), 0, 0]
        );
        assert_eq!(prefix_mask(128, 128), [u32::MAX; 4]);
        // Longer than the family: the whole address.
        assert_eq!(prefix_mask(40, 32)[0], u32::MAX);
        let cfg = Config::parse(
            "[daemon]\nmeasure_only = true\n\
             [classes]\nmedium = { source_prefix_v4 = 24, source_prefix_v6 = 64 }\n\
             [[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 0\nfair_share = false\n",
        )
        .unwrap();
        let p = compile(&cfg, 250).services[0].policy;
        assert_eq!(p.classes[2].source_mask_v4, be([255, 255, 255, 0]));
        assert_eq!(p.classes[2].source_mask_v6, [u32::MAX, u32::MAX, 0, 0]);
        // No retry recognition: no budget either.
        assert_eq!((p.fair_share, p.retry_budget), (0, 0));
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
            let p = service_policy(
                s,
                Limits::configured(s),
                &ladder,
                limit,
                demand.as_ref(),
                &[None; NUM_CLASSES],
                250,
            );
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

    #[test]
    fn the_unproven_part_is_a_share_plus_what_new_clients_need_within_the_class() {
        // No flood: the class's whole share.
        assert_eq!(unproven_cap(40, 0.1, None), 40);
        assert_eq!(unproven_cap(0, 0.1, None), 1);
        // In a flood, a tenth of a share of 40, nothing measured: 4.
        assert_eq!(unproven_cap(40, 0.1, Some(0.0)), 4);
        // New clients completing 300 handshakes a second held 10 ms each: 3 in handshake
        // on average, twice that reserved for them.
        assert_eq!(unproven_cap(40, 0.1, Some(3.0)), 10);
        // Never below one, never above the class's share.
        assert_eq!(unproven_cap(0, 0.1, Some(0.0)), 1);
        assert_eq!(unproven_cap(3, 0.1, Some(0.0)), 1);
        assert_eq!(unproven_cap(40, 0.1, Some(1e9)), 40);
        assert_eq!(unproven_cap(40, 1.0, Some(0.0)), 40);
    }
}
