//! The share arithmetic: budgets, equal targets, static shares, ceilings and claims (pure).

/// What the fleet may hold of a service: `⌊global_limit × safety⌋`.
pub fn budget(global_limit: u32, safety: f64) -> u32 {
    (global_limit as f64 * safety).floor() as u32
}

/// An equal share of the budget among `members` nodes, never above the node's own maximum.
pub fn target(budget: u32, members: usize, max_limit: u32) -> u32 {
    (budget / members.max(1) as u32).min(max_limit)
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

/// The claim a node publishes for a service: everything it may hold.
pub fn claim(ceiling: u32, applied: u32, occupancy: u32) -> u32 {
    ceiling.max(applied).max(occupancy)
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
    fn claims_cover_what_the_kernel_may_still_hold() {
        // Lowered to 100, kernel still at 150: the claim stays 150 until the kernel moves.
        assert_eq!(claim(100, 150, 90), 150);
        // Kernel at 100, but 130 connections still open from before: claim 130.
        assert_eq!(claim(100, 100, 130), 130);
        assert_eq!(claim(100, 100, 40), 100);
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
