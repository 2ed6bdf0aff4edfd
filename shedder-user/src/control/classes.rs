//! Splitting a service's limit among the priority classes: floors kept first, then the
//! rest by priority, statically or by measured demand.

use shedder_common::{CLASS_CRITICAL, CLASS_HIGH, NUM_CLASSES};

use crate::config::Config;

/// Per-class concurrency bounds derived from one service limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassLimits {
    /// Occupancy at which the class is shed.
    pub share: u32,
    /// Occupancy below which the class is admitted whatever the pressure.
    pub floor: u32,
    /// Occupancy the class may never exceed.
    pub ceiling: u32,
    /// Connections of the service limit this class leaves free for the classes above it
    /// (see [`allocate_for_demand`]).
    pub reserve: u32,
}

/// The most of the limit a class leaves free for the classes above it: 60%. Simulating
/// the overload benchmark's class table (Poisson arrivals, a few workers, first come first
/// served) at 3×, reserves of 50, 60 and 75% gave the class above 95–96%, 96–97% and 97%
/// against 87–88% with none, and goodput 99% against 96%; 60% keeps most of what 75% gains
/// while leaving the classes below more of the limit.
pub const RESERVE_MAX: f64 = 0.6;

/// Class fractions from the `[classes]` section: floors of the service limit, ceilings of
/// the service's hard maximum; and what makes one source of each class (IPv4 and IPv6
/// prefix lengths) for its fair shares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ladder {
    pub floor: [f64; NUM_CLASSES],
    pub ceiling: [f64; NUM_CLASSES],
    pub source_prefix: [(u8, u8); NUM_CLASSES],
}

/// Every address its own source, in every class.
pub const ADDRESSES: [(u8, u8); NUM_CLASSES] = [(32, 128); NUM_CLASSES];

impl Ladder {
    pub fn from_config(cfg: &Config) -> Self {
        let classes = cfg.classes.by_id();
        let mut floor = [0.0; NUM_CLASSES];
        let mut ceiling = [1.0; NUM_CLASSES];
        let mut source_prefix = ADDRESSES;
        for (id, c) in classes.into_iter().enumerate() {
            if id != CLASS_CRITICAL as usize {
                floor[id] = c.floor.unwrap_or(0.0);
            }
            ceiling[id] = c.ceiling.unwrap_or(1.0);
            source_prefix[id] = (c.source_prefix_v4, c.source_prefix_v6);
        }
        Self {
            floor,
            ceiling,
            source_prefix,
        }
    }
}

/// What the classes' ceilings are fractions of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Maxima {
    /// The service's hard ceiling in force: its `max_limit`, or a fleet's ceiling below it.
    pub service: u32,
    /// What CRITICAL's ceiling is a fraction of. CRITICAL is never shed by pressure, and
    /// a fleet's ceiling is the pressure of a shared downstream: under it (at 0 for a
    /// node waiting for its share, or after a rogue record) CRITICAL keeps the ceiling the
    /// node's own configuration gives it (see `control::capped`).
    pub critical: u32,
}

impl Maxima {
    /// Every class's ceiling a fraction of `max_limit` (no fleet).
    pub fn of(max_limit: u32) -> Self {
        Self {
            service: max_limit,
            critical: max_limit,
        }
    }
}

/// CRITICAL's ceiling: its fraction of `critical`, at least one connection (CRITICAL is
/// the class that must get through), at most `critical`.
fn critical_ceiling(ladder: &Ladder, critical: u32) -> u32 {
    ((ladder.ceiling[CLASS_CRITICAL as usize] * critical as f64).ceil() as u32)
        .max(1)
        .min(critical)
}

/// Split a service limit `total` among the classes (the static part of the allocation):
///
/// - CRITICAL is bounded only by its ceiling (a fraction of `max_limit`): never shed by
///   pressure, never unbounded;
/// - every other class keeps `floor × total` whole connections (and, on the packet path,
///   the same fraction of the service's admissions, so a floor below one connection still
///   holds);
/// - a class may grow to `total` minus the floors of the classes above it, so as the
///   service fills up SHEDDABLE is refused first, then MEDIUM, then HIGH.
pub fn allocate(total: u32, max_limit: u32, ladder: &Ladder) -> [ClassLimits; NUM_CLASSES] {
    allocate_in(total, Maxima::of(max_limit), ladder)
}

/// [`allocate`] with CRITICAL's ceiling a fraction of `max.critical` and every other
/// class's of `max.service`.
pub fn allocate_in(total: u32, max: Maxima, ladder: &Ladder) -> [ClassLimits; NUM_CLASSES] {
    let max_limit = max.service;
    let mut out = [ClassLimits::default(); NUM_CLASSES];
    let mut reserved_above: u32 = 0;
    for (id, limits) in out.iter_mut().enumerate() {
        // At least one connection, except under a ceiling of 0 (a fleet node waiting for
        // its share), where nothing but CRITICAL is admitted.
        let ceiling = ((ladder.ceiling[id] * max_limit as f64).ceil() as u32)
            .max(1)
            .min(max_limit);
        if id == CLASS_CRITICAL as usize {
            let ceiling = critical_ceiling(ladder, max.critical);
            *limits = ClassLimits {
                share: ceiling,
                floor: 0,
                ceiling,
                reserve: 0,
            };
            continue;
        }
        // Whole connections only: the part of a floor below one connection is held in
        // admissions by the packet path (`ClassPolicy::floor_share`), not rounded up to a
        // connection, which at a limit of 8 would give a 5% floor an eighth of the service.
        let floor = ((ladder.floor[id] * total as f64).floor() as u32).min(ceiling);
        let share = total.saturating_sub(reserved_above).max(floor).min(ceiling);
        *limits = ClassLimits {
            share,
            floor,
            ceiling,
            reserve: 0,
        };
        reserved_above = reserved_above.saturating_add(floor);
    }
    out
}

/// Split a service limit `total` among the classes by demand (the daemon's allocation):
///
/// - CRITICAL is bounded only by its ceiling, and what it wants (up to that ceiling) is
///   given first: the packet path never refuses it for pressure;
/// - every other class first gets what it wants of its floor (`floor × total`);
/// - what is left goes by priority — HIGH, then MEDIUM, then SHEDDABLE — each class taking
///   what it wants, up to its ceiling; so under overload SHEDDABLE is refused first;
/// - a class's share is the total less what the classes above it are given and the part
///   of their floors the classes below it use: capacity is only ever held back from a
///   class for a class of higher priority or for a reservation in use. (HIGH's share is
///   not held back for CRITICAL, which is admitted over any limit; what CRITICAL uses
///   counts against HIGH when the packet path sees whether the service is full.) A lower class that
///   wants more than is left (or whose demand is unknown) is squeezed; it never takes the
///   headroom of a class above it. (Handing all spare capacity to whichever class reported
///   unbounded demand, which an allocation that gives every class "its demand plus what
///   nobody wants" does, caps the classes above at their last measured occupancy, and a
///   higher class is then refused as soon as its concurrency rises between two ticks.)
/// - a class's share never drops below its floor: a reservation lent to others is taken
///   back as soon as its class wants it (the packet path admits a class below its floor
///   whatever the total), so a class with a floor is never starved;
/// - a class below HIGH leaves free what the classes above it are given, up to
///   [`RESERVE_MAX`] of the total (its `reserve`): it fills the service only while that
///   much is free. A share alone cannot protect the class above, which wants its demand
///   *on average*: its arrivals are random, and a lower class filling the rest of the
///   limit both meets its peaks and, queued ahead of them, lengthens them (see
///   `shedder_common::admit`). HIGH has no reserve: above it is only CRITICAL, which is
///   admitted over any limit.
///
/// `demand[c]` is the concurrency class `c` would use if none of it were shed
/// (`f64::INFINITY` when unknown but unsatisfied). For example, a 4,000-unit capacity with
/// premium reserved 60% and free 40%, premium wanting 3,000 and free 6,000, gives 2,400 and
/// 1,600; when premium wants only 1,200, free borrows the slack (2,800).
pub fn allocate_for_demand(
    total: u32,
    max_limit: u32,
    ladder: &Ladder,
    demand: &[f64; NUM_CLASSES],
) -> [ClassLimits; NUM_CLASSES] {
    allocate_for_demand_in(total, Maxima::of(max_limit), ladder, demand)
}

/// [`allocate_for_demand`] with the ceilings of [`allocate_in`].
pub fn allocate_for_demand_in(
    total: u32,
    max: Maxima,
    ladder: &Ladder,
    demand: &[f64; NUM_CLASSES],
) -> [ClassLimits; NUM_CLASSES] {
    let base = allocate_in(total, max, ladder);
    let mut reserved = [0f64; NUM_CLASSES];
    // CRITICAL is never refused by pressure, so what it uses is not there for anyone else.
    reserved[0] = demand[0].max(0.0).min(base[0].ceiling as f64);
    let mut avail = total as f64 - reserved[0];
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
        // What the classes above are given, CRITICAL's part only where there is a class
        // above that can be refused: HIGH's own admission already counts CRITICAL's
        // connections (the service as HIGH sees it), and CRITICAL is admitted over any
        // limit, so room held from HIGH for it would protect nothing.
        // The same room is the class's reserve, up to RESERVE_MAX of the total (so HIGH
        // has none).
        let above: f64 = if c == CLASS_HIGH as usize {
            0.0
        } else {
            give[..c].iter().sum()
        };
        let below: f64 = reserved[c + 1..].iter().sum();
        let share = (total as f64 - above - below).max(0.0).floor() as u32;
        out[c].share = share.max(base[c].floor).min(base[c].ceiling);
        out[c].reserve = above.min(RESERVE_MAX * total as f64).ceil() as u32;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn example_ladder() -> Ladder {
        // critical never shed (ceiling 5%), paid (high) floor 60%, free (medium) floor 5%,
        // batch (sheddable) no floor.
        Ladder {
            floor: [0.0, 0.60, 0.05, 0.0],
            ceiling: [0.05, 1.0, 1.0, 1.0],
            source_prefix: ADDRESSES,
        }
    }

    #[test]
    fn the_example_ladder_splits_as_priority_says() {
        let a = allocate(100, 1000, &example_ladder());
        assert_eq!(
            a[0],
            ClassLimits {
                share: 50,
                floor: 0,
                ceiling: 50,
                reserve: 0
            },
            "critical: ceiling only"
        );
        assert_eq!(
            a[1],
            ClassLimits {
                share: 100,
                floor: 60,
                ceiling: 1000,
                reserve: 0
            },
            "paid: floor 60%"
        );
        assert_eq!(
            a[2],
            ClassLimits {
                share: 40,
                floor: 5,
                ceiling: 1000,
                reserve: 0
            },
            "free: floor 5%"
        );
        assert_eq!(
            a[3],
            ClassLimits {
                share: 35,
                floor: 0,
                ceiling: 1000,
                reserve: 0
            },
            "batch goes first"
        );
        // Batch is refused first as the service fills: its share is the smallest.
        assert!(a[3].share < a[2].share && a[2].share < a[1].share);
    }

    #[test]
    fn reservations_split_by_demand_and_lend_their_slack() {
        // Capacity 4,000 units; premium (high) reserved 60%, free (medium) 40%.
        let ladder = Ladder {
            floor: [0.0, 0.60, 0.40, 0.0],
            ceiling: [0.05, 1.0, 1.0, 1.0],
            source_prefix: ADDRESSES,
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
    fn the_example_ladder_under_overload() {
        // Every class but critical (5 connections) wants more than the service has.
        let inf = f64::INFINITY;
        let a = allocate_for_demand(100, 1000, &example_ladder(), &[5.0, inf, inf, inf]);
        assert_eq!(
            a[0].ceiling, 50,
            "critical: never shed by pressure, bounded by its ceiling"
        );
        assert_eq!(
            (a[1].floor, a[1].share),
            (60, 95),
            "paid: its floor, then the surplus (what critical uses counts on the packet path)"
        );
        assert_eq!(
            (a[2].floor, a[2].share),
            (5, 5),
            "free: kept at its floor, not starved"
        );
        assert_eq!((a[3].floor, a[3].share), (0, 0), "batch: shed first");
        // Critical wanting more than its ceiling is given its ceiling, and no class's
        // share drops below its floor; high's share is not held back for critical (what
        // critical uses holds high back on the packet path, down to high's floor).
        let a = allocate_for_demand(100, 1000, &example_ladder(), &[inf; 4]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (95, 5, 0));
        // Batch alone wants capacity: it gets what the others leave.
        let a = allocate_for_demand(100, 1000, &example_ladder(), &[0.0, 10.0, 3.0, inf]);
        assert_eq!(a[3].share, 87, "100 - 10 - 3");
        // Little demand: headroom for everybody, less what the classes above want and
        // the reservations in use below.
        let a = allocate_for_demand(100, 1000, &example_ladder(), &[0.0, 10.0, 3.0, 2.0]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (97, 90, 87));
    }

    #[test]
    fn unbounded_demand_below_never_caps_a_class_above() {
        // Light load (a limit of 10, a few connections per class) while one SHEDDABLE
        // attempt was refused in the last tick and none admitted: its demand is unknown.
        // HIGH and MEDIUM keep room to grow past their last occupancy; only SHEDDABLE is
        // held to what they leave.
        let inf = f64::INFINITY;
        let a = allocate_for_demand(10, 64, &example_ladder(), &[0.0, 1.3, 1.2, inf]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (10, 8, 7));
        // Unknown MEDIUM demand squeezes SHEDDABLE, not HIGH.
        let a = allocate_for_demand(10, 64, &example_ladder(), &[0.0, 1.3, inf, 2.0]);
        assert_eq!((a[1].share, a[2].share, a[3].share), (10, 8, 0));
    }

    #[test]
    fn the_classes_below_high_leave_room_for_the_classes_above() {
        let inf = f64::INFINITY;
        // The overload benchmark at 3×: a limit of 10, critical wanting 1.5, high 9, the
        // rest unbounded. High and critical are given all 10; medium and sheddable leave
        // the most a class leaves, 60% (6), and so fill the service only while 7 are free.
        let a = allocate_for_demand(10, 1000, &example_ladder(), &[1.5, 9.0, inf, inf]);
        assert_eq!(
            a.map(|c| c.reserve),
            [0, 0, 6, 6],
            "high has none, critical is admitted over any limit"
        );
        // Light demand above: each class leaves what the classes above it want.
        let a = allocate_for_demand(10, 64, &example_ladder(), &[0.0, 1.3, 1.2, inf]);
        assert_eq!(a.map(|c| c.reserve), [0, 0, 2, 3]);
        // Nothing wanted above: nothing left free.
        let a = allocate_for_demand(10, 64, &example_ladder(), &[0.0, 0.0, inf, inf]);
        assert_eq!(a[2].reserve, 0);
        // The static split (no demand known) holds nothing back.
        assert!(
            allocate(10, 64, &example_ladder())
                .iter()
                .all(|c| c.reserve == 0)
        );
    }

    #[test]
    fn demand_estimate() {
        assert_eq!(class_demand(10, 0.0, 0.0), 10.0);
        assert_eq!(class_demand(10, 300.0, 100.0), 30.0);
        assert_eq!(class_demand(0, 50.0, 0.0), f64::INFINITY);
        assert_eq!(class_demand(10, 100.0, 100.0), 10.0);
    }

    #[test]
    fn floors_are_whole_connections() {
        let a = allocate(8, 4000, &example_ladder());
        // 5% of 8 is no whole connection: the packet path holds it in admissions.
        assert_eq!(a[2].floor, 0);
        assert_eq!(a[1].floor, 4);
        assert!(a.iter().skip(1).all(|c| c.share >= c.floor));
    }

    /// A fleet's ceiling of 0 (a node waiting for its share, or one whose view a rogue
    /// record drove down) refuses every class but CRITICAL, which keeps the ceiling of the
    /// node's own bound; every other class's ceiling follows the fleet's.
    #[test]
    fn a_fleet_ceiling_never_takes_critical_below_its_own_ceiling() {
        let ladder = example_ladder();
        for (fleet, want) in [(0, 0), (8, 8), (1000, 1000)] {
            let max = Maxima {
                service: fleet,
                critical: 1000,
            };
            for a in [
                allocate_in(fleet, max, &ladder),
                allocate_for_demand_in(fleet, max, &ladder, &[10.0, 50.0, 50.0, 50.0]),
            ] {
                assert_eq!(a[0].ceiling, 50, "5% of the node's 1000, fleet at {fleet}");
                assert!(
                    a[1..].iter().all(|c| c.ceiling == want && c.share <= want),
                    "{a:?}"
                );
            }
        }
        // Without a fleet, the same as before.
        assert_eq!(
            allocate(100, 1000, &ladder),
            allocate_in(100, Maxima::of(1000), &ladder)
        );
        // At least one connection, at most the bound.
        let tiny = Maxima {
            service: 0,
            critical: 3,
        };
        assert_eq!(allocate_in(0, tiny, &ladder)[0].ceiling, 1);
    }

    #[test]
    fn floors_are_capped_by_ceilings() {
        let ladder = Ladder {
            floor: [0.0, 0.5, 0.0, 0.0],
            ceiling: [0.05, 0.1, 1.0, 1.0],
            source_prefix: ADDRESSES,
        };
        let a = allocate(1000, 1000, &ladder);
        assert_eq!(
            a[1],
            ClassLimits {
                share: 100,
                floor: 100,
                ceiling: 100,
                reserve: 0
            }
        );
    }
}
