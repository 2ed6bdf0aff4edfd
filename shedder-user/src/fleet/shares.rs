//! The share arithmetic: budgets, equal and demand-weighted targets, static shares,
//! ceilings and claims (pure).

/// What the fleet may hold of a service: `⌊global_limit × safety⌋`.
pub fn budget(global_limit: u32, safety: f64) -> u32 {
    (global_limit as f64 * safety).floor() as u32
}

/// An equal share of the budget among `members` nodes, never above the node's own maximum.
pub fn target(budget: u32, members: usize, max_limit: u32) -> u32 {
    (budget / members.max(1) as u32).min(max_limit)
}

/// The part of an equal share every live member keeps whatever its demand, so that a node
/// whose demand rises is admitted at once, while the fleet moves its share.
pub const FLOOR_FRACTION: f64 = 0.2;

/// One member's claim on the budget, as the shares by demand read it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Want {
    /// The connections the member's attempts would hold if all were admitted, by class
    /// (CRITICAL first).
    pub need: [f64; shedder_common::NUM_CLASSES],
    /// The member's own hard ceiling.
    pub max_limit: u32,
}

/// The connections that serve a need of `need` (the mean number its attempts would hold):
/// the square-root staffing rule, `need + 2√need`. Arrivals are random, so a share of just
/// the mean need refuses about one attempt in ten at 40 connections (Erlang B); two
/// standard deviations of headroom bring that under 1%.
pub fn staffed(need: f64) -> f64 {
    if need > 0.0 {
        need + 2.0 * need.sqrt()
    } else {
        0.0
    }
}

/// Shares of `budget` by demand, in the members' order. Every member first keeps its floor
/// ([`FLOOR_FRACTION`] of an equal share). The rest goes class by class, CRITICAL first:
/// each member's need in the class and above is met if the budget allows, then its
/// headroom ([`staffed`]), and if it does not, the
/// budget left is split in proportion to the class's need and the classes below get
/// nothing, fleet-wide as on one node. What no class needs is split in proportion to the
/// members' total need (equally when none has any), so a node whose demand grows has room
/// at once. A member never gets more than its `max_limit`, and the shares never sum above
/// the budget. The same view gives every node the same shares.
pub fn by_demand(budget: u32, members: &[Want]) -> Vec<u32> {
    let n = members.len();
    if n == 0 {
        return Vec::new();
    }
    let cap = |m: &Want| m.max_limit as f64;
    let floor = (budget as f64 / n as f64 * FLOOR_FRACTION).floor();
    let mut alloc: Vec<f64> = members.iter().map(|m| floor.min(cap(m))).collect();
    let mut left = budget as f64 - alloc.iter().sum::<f64>();
    // Each class's need, then its headroom, before the class below.
    let steps = (0..shedder_common::NUM_CLASSES).flat_map(|c| [(c, false), (c, true)]);
    for (class, headroom) in steps {
        let wants: Vec<f64> = members
            .iter()
            .zip(&alloc)
            .map(|(m, a)| {
                let need: f64 = m.need[..=class].iter().sum();
                let want = if headroom { staffed(need) } else { need };
                (want.min(cap(m)) - a).max(0.0)
            })
            .collect();
        let total: f64 = wants.iter().sum();
        if total <= 0.0 {
            continue;
        }
        let part = (left / total).min(1.0);
        for (a, w) in alloc.iter_mut().zip(&wants) {
            *a += w * part;
        }
        left -= total * part;
        if part < 1.0 {
            left = 0.0;
            break;
        }
    }
    // What no class needs: by total need, capped, spread again over the members below
    // their caps until none is left or all are full.
    for _ in 0..n {
        let open: Vec<usize> = (0..n).filter(|&i| alloc[i] < cap(&members[i])).collect();
        if left < 1e-9 || open.is_empty() {
            break;
        }
        let weight = |i: usize| members[i].need.iter().sum::<f64>();
        let total: f64 = open.iter().map(|&i| weight(i)).sum();
        let mut given = 0.0;
        for &i in &open {
            let part = if total > 0.0 {
                weight(i) / total
            } else {
                1.0 / open.len() as f64
            };
            let add = (left * part).min(cap(&members[i]) - alloc[i]);
            alloc[i] += add;
            given += add;
        }
        left -= given;
    }
    // Whole connections: round down, then hand the units rounding left over to the largest
    // remainders (ties to the earlier member), never past a cap.
    let mut shares: Vec<u32> = alloc.iter().map(|a| a.floor() as u32).collect();
    let mut spare = budget.saturating_sub(shares.iter().sum());
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let r = |i: usize| alloc[i] - alloc[i].floor();
        r(b).total_cmp(&r(a)).then(a.cmp(&b))
    });
    for i in order {
        if spare == 0 {
            break;
        }
        if shares[i] < members[i].max_limit && alloc[i] - (shares[i] as f64) > 1e-9 {
            shares[i] += 1;
            spare -= 1;
        }
    }
    shares
}

/// What a node cut off from etcd holds: the budget split among the most nodes the fleet
/// runs.
pub fn static_share(budget: u32, max_nodes: u32, max_limit: u32) -> u32 {
    (budget / max_nodes.max(1)).min(max_limit)
}

/// The next ceiling of a service from the current one, the node's target and the room the
/// other members' claims leave: `(ceiling, raise)`, where `raise` means the new ceiling is
/// higher and may be used only once a transaction has published it.
pub fn next_ceiling(current: u32, target: u32, room: u32) -> (u32, bool) {
    let want = target.min(room);
    (want, want > current)
}

/// The band within which a ceiling above its target by demand is kept: a connection, or
/// 5% of the ceiling. Shares by demand move by a connection or two as the estimates
/// jitter, and lowering for that only drains connections that another node takes a moment
/// later (a raise waits for the drain): the fleet would hold less than its budget.
pub fn band(current: u32) -> u32 {
    (current / 20).max(1)
}

/// [`next_ceiling`] for shares by demand: a ceiling within [`band`] above its target is
/// kept, as long as the others' claims leave room for it.
pub fn next_ceiling_by_demand(current: u32, target: u32, room: u32) -> (u32, bool) {
    if target < current && current <= room && current - target <= band(current) {
        return (current, false);
    }
    next_ceiling(current, target, room)
}

/// The claim a node publishes for a service: everything it may hold, its ceiling, the
/// limit in its kernel (which bounds what its packet path admits) and the connections it
/// has established (CRITICAL's may be past the limit, and a lowered node's are until they
/// close).
pub fn claim(ceiling: u32, applied: u32, established: u32) -> u32 {
    ceiling.max(applied).max(established)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_hundred_nodes_share_a_database_of_five_hundred() {
        // 200 instances, a database of 500 connections: each instance's share is 2 (with
        // safety 0.9: ⌊450 / 200⌋), not the 50 its own AIMD would find.
        let b = budget(500, 0.9);
        assert_eq!(b, 450);
        assert_eq!(target(b, 200, 50), 2);
        assert_eq!(target(budget(500, 1.0), 200, 50), 2);
        // Fewer nodes: the share grows, never above the node's own max_limit.
        assert_eq!(target(b, 3, 4096), 150);
        assert_eq!(target(b, 3, 100), 100);
        // Cut off from etcd: the budget split among the most nodes the fleet runs.
        assert_eq!(static_share(b, 10, 4096), 45);
        assert_eq!(static_share(b, 1000, 4096), 0);
    }

    #[test]
    fn lowering_is_immediate_and_raising_needs_room() {
        // Lower at once, whatever the room.
        assert_eq!(next_ceiling(150, 112, 0), (0, false));
        assert_eq!(next_ceiling(150, 112, 500), (112, false));
        // Raise to the target only as far as the others' claims leave room.
        assert_eq!(next_ceiling(112, 150, 130), (130, true));
        assert_eq!(next_ceiling(112, 150, 500), (150, true));
        // No room: hold (a raise to what is already held is no raise).
        assert_eq!(next_ceiling(112, 150, 112), (112, false));
        // A joining node starts at 0 and takes only the room left.
        assert_eq!(next_ceiling(0, 112, 0), (0, false));
        assert_eq!(next_ceiling(0, 112, 40), (40, true));
    }

    #[test]
    fn shares_by_demand_are_not_lowered_for_a_jitter() {
        // 37 → 36 and 12 → 11: kept; 37 → 35 (over 5%): lowered.
        assert_eq!(next_ceiling_by_demand(37, 36, 54), (37, false));
        assert_eq!(next_ceiling_by_demand(12, 11, 20), (12, false));
        assert_eq!(next_ceiling_by_demand(37, 35, 54), (35, false));
        assert_eq!(next_ceiling_by_demand(100, 95, 200), (100, false));
        assert_eq!(next_ceiling_by_demand(100, 94, 200), (94, false));
        // No room for the ceiling kept: lowered to what the others leave.
        assert_eq!(next_ceiling_by_demand(37, 36, 30), (30, false));
        // Raises as ever.
        assert_eq!(next_ceiling_by_demand(11, 12, 54), (12, true));
    }

    #[test]
    fn claims_cover_what_the_kernel_may_still_hold() {
        // Lowered to 100, kernel still at 150: the claim stays 150 until the kernel moves.
        assert_eq!(claim(100, 150, 90), 150);
        // Kernel at 100, but 130 connections still open from before: claim 130.
        assert_eq!(claim(100, 100, 130), 130);
        assert_eq!(claim(100, 100, 40), 100);
    }

    fn want(need: [f64; 4], max_limit: u32) -> Want {
        Want { need, max_limit }
    }

    fn medium(n: f64) -> Want {
        want([0.0, 0.0, n, 0.0], 4096)
    }

    #[test]
    fn shares_follow_demand_split_seventy_twenty_ten() {
        // 54 connections, demand for 81 split 70/20/10: each keeps its floor (⌊18 × 0.2⌋ =
        // 3), and the budget left goes in proportion to need.
        let s = by_demand(54, &[medium(56.7), medium(16.2), medium(8.1)]);
        assert_eq!(s.iter().sum::<u32>(), 54);
        assert_eq!(s, [37, 11, 6]);
        // Demand under the budget: every need met, and the 14 left split by the headroom
        // each would want (10.6, 5.7 and 4).
        let s = by_demand(54, &[medium(28.0), medium(8.0), medium(4.0)]);
        assert_eq!(s, [35, 12, 7]);
        // Room for all the headroom too: the rest by need.
        let s = by_demand(90, &[medium(28.0), medium(8.0), medium(4.0)]);
        assert_eq!(s.iter().sum::<u32>(), 90);
        assert!(s[0] >= 39 && s[1] >= 14 && s[2] >= 8, "{s:?}");
        // No demand anywhere: equal shares.
        assert_eq!(by_demand(54, &[medium(0.0); 3]), [18, 18, 18]);
        // An idle node keeps only its floor.
        assert_eq!(by_demand(54, &[medium(100.0), medium(0.0)]), [49, 5]);
        assert!(by_demand(54, &[]).is_empty());
    }

    #[test]
    fn the_fleets_refusals_fall_on_the_lowest_classes_first() {
        // HIGH on one node needs 30, SHEDDABLE on the other 200: HIGH gets all it needs
        // and its headroom (30 + 2√30), SHEDDABLE the rest (more than its floor).
        let high = want([0.0, 30.0, 0.0, 0.0], 4096);
        let sheddable = want([0.0, 0.0, 0.0, 200.0], 4096);
        assert_eq!(by_demand(54, &[high, sheddable]), [41, 13]);
        // Needing 40, HIGH's headroom still comes before SHEDDABLE's need.
        let high = want([0.0, 40.0, 0.0, 0.0], 4096);
        assert_eq!(by_demand(54, &[high, sheddable]), [49, 5]);
        // HIGH needing more than the budget leaves SHEDDABLE its floor only.
        let high = want([0.0, 100.0, 0.0, 0.0], 4096);
        assert_eq!(by_demand(54, &[sheddable, high]), [5, 49]);
        // Two nodes both short in the same class: split by that class's need.
        let a = want([10.0, 30.0, 0.0, 50.0], 4096);
        let b = want([10.0, 90.0, 0.0, 0.0], 4096);
        let s = by_demand(54, &[a, b]);
        assert_eq!(s.iter().sum::<u32>(), 54);
        // CRITICAL and its headroom met on both (10 + 2√10 each); the 21 left split by
        // what HIGH still lacks on each (24 and 84).
        assert_eq!(s, [21, 33]);
    }

    #[test]
    fn a_share_never_passes_the_members_max_limit() {
        let s = by_demand(54, &[want([0.0, 0.0, 100.0, 0.0], 20), medium(10.0)]);
        assert_eq!(s, [20, 34]);
        // Everyone capped: the budget is not all handed out.
        let s = by_demand(54, &[want([0.0, 0.0, 100.0, 0.0], 10); 3]);
        assert_eq!(s, [10, 10, 10]);
        // Floors under a tiny cap.
        assert_eq!(by_demand(54, &[want([0.0; 4], 1), medium(0.0)]), [1, 53]);
    }

    /// Whatever the demands, the shares are whole, capped, at least the floor where the cap
    /// allows, and never sum above the budget.
    #[test]
    fn shares_by_demand_never_exceed_the_budget() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let n = (next() % 6 + 1) as usize;
            let budget = (next() % 500) as u32;
            let members: Vec<Want> = (0..n)
                .map(|_| {
                    let mut need = [0.0; 4];
                    for v in &mut need {
                        if next() % 3 > 0 {
                            *v = (next() % 4000) as f64 / 10.0;
                        }
                    }
                    want(need, (next() % 300) as u32)
                })
                .collect();
            let s = by_demand(budget, &members);
            assert!(
                s.iter().sum::<u32>() <= budget,
                "{budget} {members:?} {s:?}"
            );
            let floor = (budget as f64 / n as f64 * FLOOR_FRACTION).floor() as u32;
            for (share, m) in s.iter().zip(&members) {
                assert!(*share <= m.max_limit);
                assert!(
                    *share >= floor.min(m.max_limit),
                    "{budget} {members:?} {s:?}"
                );
            }
        }
    }

    /// Three nodes share a budget of 450; each raise is checked against the others' claims
    /// and the reservations, so however the steps interleave, claims and reservations never
    /// sum above the budget: through a join, a loss (whose static share stays reserved, as
    /// it may be serving cut off) and its return.
    #[test]
    fn serialised_raises_never_exceed_the_budget() {
        let b = budget(500, 0.9);
        let lost_static = static_share(b, 10, 4096);
        let mut claims = [0u32; 4];
        let (mut live, mut reserved) = (3usize, 0u32);
        for round in 0..40 {
            match round {
                8 => live = 4, // a node joins with nothing
                14 => {
                    // its lease expires: cut off, it holds its static share, reserved
                    claims[3] = lost_static;
                    reserved = lost_static;
                    live = 3;
                }
                26 => {
                    // it registers again with what it holds; the reservation ends
                    live = 4;
                    reserved = 0;
                }
                _ => {}
            }
            let held = if live == 3 { claims[3] } else { 0 };
            for i in (0..live).rev() {
                let others: u32 = (0..live).filter(|&j| j != i).map(|j| claims[j]).sum();
                let live_budget = b - reserved;
                let (c, _) = next_ceiling(
                    claims[i],
                    target(live_budget, live, 4096),
                    live_budget.saturating_sub(others),
                );
                claims[i] = c;
                let total = claims[..live].iter().sum::<u32>() + held;
                assert!(total <= b, "round {round}: claims {claims:?} exceed {b}");
            }
            if round == 25 {
                assert_eq!(
                    claims[..3],
                    [135, 135, 135],
                    "(450 − 45) / 3 while one is lost"
                );
            }
        }
        assert_eq!(claims, [112, 112, 112, 112]);
    }
}
