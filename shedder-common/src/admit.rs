//! The admission decision for one new connection attempt, shared verbatim by the eBPF
//! programs and by the daemon's tests and simulations.
//!
//! Occupancy of a class = its established connections + its admitted-but-not-yet-established
//! attempts. The order of the checks is the contract:
//!
//! 1. a class at its **ceiling** is shed, in every mode (critical means unsheddable by
//!    pressure, not unbounded: a flood marked critical must still be bounded);
//! 2. **CRITICAL** below its ceiling is admitted: it is never shed by pressure;
//! 3. a class below its **floor** is admitted whatever the service's pressure, so a class
//!    with a floor is never starved;
//! 4. a class at its **share** is shed ([`Reason::Priority`]): the daemon sets each share to
//!    the limit less what the classes above it want and the floors in use below it — but
//!    a retry filling idle room ([`Attempt::fills_idle`]) only while the whole service is
//!    full;
//! 5. when the **service** is full the attempt is shed, where *full* is seen from the
//!    attempt's class: this class and every class above it count in full, the classes
//!    below it only up to their floors ([`Reason::ServiceLimit`], or
//!    [`Reason::FloorsBelow`] when only those floors make it full);
//! 6. the class's **reserve** is room it leaves free for the classes above it: it is shed
//!    ([`Reason::Priority`]) once the service, seen as in step 5, is within `reserve` of
//!    the limit;
//! 7. otherwise it is admitted (the token bucket, if any, is checked afterwards).
//!
//! Step 5 is what makes the surplus go by priority: connections cannot be taken back once
//! admitted, so when a higher class's demand rises between two ticks of the daemon the
//! service may already be full of a lower class's connections above its floor. Those do
//! not count against the higher class: it is admitted over the total, and the lower class
//! is refused (it sees the service full) until its connections end. The overshoot is
//! bounded by the lower classes' occupancy above their floors, which their shares bound.
//! A non-critical class is therefore refused for pressure only while every class below it
//! is at or below its floor.
//!
//! Step 6 is a trunk reservation, as circuit-switched telephone networks protect
//! priority calls: a lower class is admitted only while more than `reserve` connections of
//! the limit are free. Connections are served first come, first served, so a lower class
//! that fills the limit also lengthens the queue a higher class's connections wait in, and
//! the higher class, its occupancy swollen by that wait, meets the limit at its random
//! peaks. Held back from the last `reserve` connections, the lower class still fills the
//! service whenever it is lightly loaded (what keeps its workers busy) but no longer
//! queues ahead of the classes above. The daemon sets the reserve from what those classes
//! want (see the daemon's class allocation).
//!
//! With a stale heartbeat the fallback share, floor and total are used instead.

use crate::{
    CLASS_CRITICAL, NUM_CLASSES, Reason, ServicePolicy,
    fair::{self, ClassEpoch},
    is_pressure, mask,
};

/// The outcome of the concurrency check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// 1 = admit, 0 = shed (an integer keeps the eBPF code free of bool/Option plumbing).
    pub admit: u32,
    /// A [`Reason`]'s number.
    pub reason: u32,
    /// Refused for pressure: by how many connections the bound that refused it (the
    /// class's share, the service's total as the class sees it, or that less the class's
    /// reserve) is already exceeded; 0 otherwise. Fair shares bound the within-share
    /// attempts admitted over a full class or service by it
    /// ([`crate::fair::may_preempt`]).
    pub excess: u32,
}

impl Decision {
    #[inline(always)]
    pub const fn admit(reason: u32) -> Self {
        Self {
            admit: 1,
            reason,
            excess: 0,
        }
    }
    #[inline(always)]
    pub const fn shed(reason: u32) -> Self {
        Self {
            admit: 0,
            reason,
            excess: 0,
        }
    }
    /// Refused for pressure at a bound `used` has reached (`used >= bound`).
    #[inline(always)]
    pub fn over(reason: u32, used: u64, bound: u64) -> Self {
        Self {
            admit: 0,
            reason,
            excess: mask::min(used - bound, u32::MAX as u64) as u32,
        }
    }
}

/// What the decision needs to know of one attempt besides the occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    /// The class it is decided in (0..4; a demoted retry's lower class).
    pub class: u32,
    /// The class has had less than its floor's share of the service's admissions
    /// (`ClassPolicy::floor_share`): admitted like a class below its floor.
    pub below_floor_share: bool,
    /// A retry that may fill idle room: its class's share does not hold it back while the
    /// whole service, every class counted in full, has room (refusing it then would leave
    /// capacity idle). The packet path sets it for a retry only while first attempts are
    /// not being refused for want of room ([`crate::fair::may_fill`]): a retry ranks below
    /// every first attempt, and a connection it takes cannot be given back to them.
    pub fills_idle: bool,
    /// The class the source is in (`class` unless the attempt is a demoted retry): its
    /// reserve is the one that applies. A retry ranks below first attempts by the retry
    /// rules, but the room its own class leaves for the classes above is all it is kept
    /// out of: held out of its own class's room too, the retries of a source that is most
    /// of its class were kept from capacity its class did not use.
    pub origin: u32,
}

/// Decide one attempt given every class's occupancy.
#[inline(always)]
pub fn decide(
    policy: &ServicePolicy,
    attempt: &Attempt,
    occ: &[u64; NUM_CLASSES],
    stale: bool,
) -> Decision {
    let class = (attempt.class as usize) & (NUM_CLASSES - 1);
    let cp = &policy.classes[class];
    let mine = occ[class];
    if mine >= cp.ceiling as u64 {
        return Decision::shed(Reason::Ceiling as u32);
    }
    if class as u32 == CLASS_CRITICAL {
        return Decision::admit(Reason::Critical as u32);
    }
    let (share, floor, total_limit) = if stale {
        (cp.fallback_limit, cp.fallback_floor, policy.fallback_total)
    } else {
        (cp.limit, cp.floor, policy.total_limit)
    };
    if mine < floor as u64 || attempt.below_floor_share {
        return Decision::admit(Reason::Floor as u32);
    }
    // All ones for a retry filling idle room while the whole service has some (masks: one
    // branch, not three).
    let total = occ[0] + occ[1] + occ[2] + occ[3];
    let waived = mask::sign(total as i64 - total_limit as i64)
        & 0u64.wrapping_sub(attempt.fills_idle as u64);
    if mine >= share as u64 && waived == 0 {
        return Decision::over(Reason::Priority as u32, mine, share as u64);
    }
    // The service as this class sees it: itself and the classes above in full (`ahead`),
    // the classes below up to their floors (`held`). With masks, not branches (see
    // [`crate::mask`]): the verifier walks one path through the loop rather than one per
    // combination of classes above or below their floors.
    let (mut ahead, mut held) = (0u64, 0u64);
    let mut k = 0;
    while k < NUM_CLASSES {
        let o = occ[k];
        let c = &policy.classes[k];
        let f = (if stale { c.fallback_floor } else { c.floor }) as u64;
        let below = mask::sign(class as i64 - k as i64);
        ahead += o & !below;
        held += mask::min(o, f) & below;
        k += 1;
    }
    if ahead >= total_limit as u64 {
        return Decision::over(Reason::ServiceLimit as u32, ahead, total_limit as u64);
    }
    if ahead + held >= total_limit as u64 {
        return Decision::over(Reason::FloorsBelow as u32, ahead + held, total_limit as u64);
    }
    // The room held for the classes above the source's own class (none with a stale
    // heartbeat: the fallback split is static).
    let reserve = policy.classes[(attempt.origin as usize) & (NUM_CLASSES - 1)].reserve as u64
        & !0u64.wrapping_sub(stale as u64);
    if ahead + held + reserve >= total_limit as u64 {
        return Decision::over(
            Reason::Priority as u32,
            ahead + held + reserve,
            total_limit as u64,
        );
    }
    Decision::admit(Reason::UnderLimit as u32)
}

/// What fair shares and the retry budget know of a proven attempt (step 7 of the
/// decision, [`share`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sharing {
    /// The service shares each class fairly among its sources.
    pub fair: bool,
    /// The attempt's source is over its share of the class ([`fair::over`]).
    pub over: bool,
    /// The attempt is a retry.
    pub retry: bool,
    /// The service's retry budget, in 1/[`fair::BUDGET_ONE`] of first attempts (0: off),
    /// and the retries allowed whatever the first attempts.
    pub retry_budget: u32,
    pub retry_budget_min: u32,
}

/// Step 7: fair shares and the retry budget re-decide `d`, a proven attempt of `class`
/// decided by [`decide`] against `occ` with `limit` the service total in force.
/// `window` gives the class's counts over the window; it is read only where they decide
/// (a refusal for pressure, an admitted retry), off the path of a plain admission. Returns
/// the decision and whether it took the place of an over-share admission.
///
/// - Refused for pressure with fair shares on: a source over its share is the one to
///   refuse ([`Reason::FairShare`]); a source within it is admitted in place of an
///   over-share admission while the class holds more such connections than the bound is
///   exceeded by ([`fair::may_preempt`]).
/// - An admitted retry over the retry budget ([`fair::within_budget`]) is refused
///   ([`Reason::RetryBudget`]) only where it takes room from first attempts: over a full
///   service (it ranks below every class) or in place of an over-share admission. So the
///   budget bounds what retries take from first attempts without leaving a service
///   refusing with idle connections.
#[inline(always)]
pub fn share<W: Fn() -> ClassEpoch>(
    d: Decision,
    s: &Sharing,
    class: u32,
    occ: &[u64; NUM_CLASSES],
    limit: u64,
    window: W,
) -> (Decision, bool) {
    let mut d = d;
    let mut preempt = false;
    if d.admit == 0 && is_pressure(d.reason) == 1 && s.fair {
        if s.over {
            d.reason = Reason::FairShare as u32;
        } else if fair::may_preempt(
            &window(),
            occ[(class as usize) & (NUM_CLASSES - 1)],
            d.excess as u64,
        ) {
            d = Decision::admit(Reason::FairShare as u32);
            preempt = true;
        }
    }
    let total = occ[0] + occ[1] + occ[2] + occ[3];
    if d.admit == 1
        && s.retry
        && s.retry_budget != 0
        && (preempt || total >= limit)
        && !fair::within_budget(&window(), s.retry_budget, s.retry_budget_min)
    {
        return (Decision::shed(Reason::RetryBudget as u32), false);
    }
    (d, preempt)
}

/// The occupancy an attempt is decided against: every class's established connections
/// (`inflight`) and attempts in handshake (`held`, `[proven, unproven]` as
/// [`crate::Pending::count`] gives them). A proven attempt (`proven` 1) does not see the
/// unproven ones: they hold capacity only within their class's cap ([`cap_unproven`]), so
/// a flood of spoofed SYNs takes nothing from sources with standing. An unproven attempt
/// (`proven` 0) sees everything. Without a branch (one path for the verifier).
#[inline(always)]
pub fn occupancy(
    inflight: &[u32; NUM_CLASSES],
    held: &[[u64; NUM_CLASSES]; 2],
    proven: u32,
) -> [u64; NUM_CLASSES] {
    let unproven = 0u64.wrapping_sub(1 - (proven & 1) as u64);
    let mut occ = [0u64; NUM_CLASSES];
    let mut k = 0;
    while k < NUM_CLASSES {
        occ[k] = inflight[k] as u64 + held[0][k] + (held[1][k] & unproven);
        k += 1;
    }
    occ
}

/// An unproven attempt's decision (`proven` 0) within its class's cap: admitted by
/// [`decide`], it is still refused for [`Reason::Unproven`] while the class holds
/// `unproven_cap` unproven attempts (`held[1]`). This bounds what attempts from sources
/// without standing hold, CRITICAL's included; a proven attempt's decision is unchanged.
#[inline(always)]
pub fn cap_unproven(
    d: Decision,
    policy: &ServicePolicy,
    class: u32,
    held: &[[u64; NUM_CLASSES]; 2],
    proven: u32,
) -> Decision {
    let c = (class as usize) & (NUM_CLASSES - 1);
    let full = (held[1][c] >= policy.classes[c].unproven_cap as u64) as u32;
    // With masks, not a branch: the decision's value is carried on into the packet path's
    // updates, where two shapes of it would double what the verifier walks.
    let cut = d.admit & full & (1 - (proven & 1));
    let m = 0u32.wrapping_sub(cut);
    Decision {
        admit: d.admit & !m,
        reason: (d.reason & !m) | (Reason::Unproven as u32 & m),
        excess: d.excess & !m,
    }
}

/// An unproven attempt's whole decision: [`decide`] (a first attempt of its own class)
/// against [`occupancy`], then, with fair shares on (`fair`), as a source within its share
/// ([`share`]): refused for pressure, it is admitted in place of an over-share admission of
/// its class while the class holds more of those than the bound is exceeded by (`window`
/// gives the class's counts). Without that, a class full of proven sources' connections
/// would never admit a new client under a sustained overload: proven sources within their
/// share are admitted over a full class in place of over-share ones, and the occupancy
/// they leave over the limit is what an unproven attempt would wait for. A proven attempt
/// within its share is admitted in every state this one is, since it sees less
/// occupancy. All within [`cap_unproven`].
#[inline(always)]
pub fn unproven<W: Fn() -> ClassEpoch>(
    policy: &ServicePolicy,
    class: u32,
    held: &[[u64; NUM_CLASSES]; 2],
    inflight: &[u32; NUM_CLASSES],
    stale: bool,
    fair: bool,
    window: W,
) -> Decision {
    let class = class & (NUM_CLASSES as u32 - 1);
    let attempt = Attempt {
        class,
        origin: class,
        ..Default::default()
    };
    let occ = occupancy(inflight, held, 0);
    let d = decide(policy, &attempt, &occ, stale);
    let sharing = Sharing {
        fair,
        ..Default::default()
    };
    let (d, _) = share(d, &sharing, class, &occ, 0, window);
    cap_unproven(d, policy, class, held, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE, ClassPolicy};

    fn class(limit: u32, floor: u32, ceiling: u32) -> ClassPolicy {
        ClassPolicy {
            limit,
            fallback_limit: limit / 2,
            floor,
            fallback_floor: floor / 2,
            ceiling,
            ..Default::default()
        }
    }

    /// The decision without its excess (see [`excess`]).
    fn decide_occ(p: &ServicePolicy, class: u32, occ: &[u32; 4], stale: bool) -> Decision {
        let attempt = Attempt {
            class,
            origin: class,
            ..Default::default()
        };
        Decision {
            excess: 0,
            ..decide(p, &attempt, &occ.map(u64::from), stale)
        }
    }

    fn excess(p: &ServicePolicy, class: u32, occ: &[u32; 4]) -> u32 {
        let attempt = Attempt {
            class,
            origin: class,
            ..Default::default()
        };
        decide(p, &attempt, &occ.map(u64::from), false).excess
    }

    fn policy() -> ServicePolicy {
        ServicePolicy {
            classes: [
                class(0, 0, 5),      // critical: ceiling 5 (5% of 100)
                class(100, 60, 100), // high: floor 60
                class(100, 5, 100),  // medium: floor 5
                class(30, 0, 100),   // sheddable: share 30, no floor
            ],
            total_limit: 100,
            fallback_total: 50,
            ..Default::default()
        }
    }

    #[test]
    fn critical_is_never_shed_by_pressure_but_has_a_ceiling() {
        let p = policy();
        // Service far over its limit: critical still admitted.
        let d = decide_occ(&p, CLASS_CRITICAL, &[4, 90, 90, 90], false);
        assert_eq!(d, Decision::admit(Reason::Critical as u32));
        // At its ceiling: shed, also with a stale heartbeat.
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[5, 0, 0, 0], false),
            Decision::shed(Reason::Ceiling as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[5, 0, 0, 0], true),
            Decision::shed(Reason::Ceiling as u32)
        );
    }

    #[test]
    fn floor_is_kept_when_the_service_is_full() {
        let p = policy();
        // Total 140 > 100, but high holds 59 < floor 60.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 59, 51, 30], false),
            Decision::admit(Reason::Floor as u32)
        );
        // At the floor the service limit applies again, with the classes below counted
        // only up to their floors: medium's 35 connections over its floor of 5 do not
        // hold high back.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 60, 40, 0], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[5, 95, 40, 0], false),
            Decision::shed(Reason::ServiceLimit as u32)
        );
        // Medium's floor of 5 also holds against a full service.
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[0, 100, 4, 0], false),
            Decision::admit(Reason::Floor as u32)
        );
    }

    #[test]
    fn a_class_below_its_share_of_admissions_is_admitted_as_below_its_floor() {
        let p = policy();
        let full = [0u64, 60, 40, 0];
        let below = |class| Attempt {
            class,
            below_floor_share: true,
            ..Default::default()
        };
        assert_eq!(
            decide(&p, &below(CLASS_SHEDDABLE), &full, false),
            Decision::admit(Reason::Floor as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 60, 40, 0], false),
            Decision::shed(Reason::ServiceLimit as u32)
        );
        // The ceiling still holds.
        assert_eq!(
            decide(&p, &below(CLASS_CRITICAL), &[5, 0, 0, 0], false),
            Decision::shed(Reason::Ceiling as u32)
        );
    }

    #[test]
    fn a_retry_is_held_back_by_its_share_only_when_the_service_is_full() {
        let p = policy();
        let retry = Attempt {
            class: CLASS_SHEDDABLE,
            fills_idle: true,
            ..Default::default()
        };
        // Sheddable at its share of 30, the service at 60 of 100: a first attempt is
        // refused, a retry takes the idle room.
        let occ = [0u64, 20, 10, 30];
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 20, 10, 30], false),
            Decision::shed(Reason::Priority as u32)
        );
        assert_eq!(
            decide(&p, &retry, &occ, false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        // The whole service full: refused at its share like anyone.
        assert_eq!(
            decide(&p, &retry, &[0, 50, 20, 30], false),
            Decision::shed(Reason::Priority as u32)
        );
    }

    #[test]
    fn the_surplus_goes_by_priority() {
        let p = policy();
        // The service is full (100): medium holds 30, 25 over its floor of 5, sheddable 10
        // over its floor of 0. High is admitted over them, medium and sheddable see the
        // service full.
        let occ = [0, 60, 30, 10];
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &occ, false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[0, 60, 40, 0], false),
            Decision::shed(Reason::ServiceLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, false),
            Decision::shed(Reason::ServiceLimit as u32)
        );
        // Medium over its floor is admitted over sheddable's surplus, not over its own.
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[0, 60, 30, 5], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        // High is refused for pressure only when every class below is at or below its
        // floor: 96 of high and critical with medium at its floor of 4 of 5 in use.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[1, 95, 4, 0], false),
            Decision::shed(Reason::FloorsBelow as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[1, 94, 4, 0], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        // The same with a stale heartbeat: fallback total 50, medium's fallback floor 2.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 47, 9, 9], true),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 48, 9, 9], true),
            Decision::shed(Reason::FloorsBelow as u32)
        );
    }

    #[test]
    fn a_reserve_keeps_the_last_connections_for_the_classes_above() {
        let mut p = policy();
        // Medium leaves 30 of the 100 to critical and high, sheddable 40.
        p.classes[CLASS_MEDIUM as usize].reserve = 30;
        p.classes[CLASS_SHEDDABLE as usize].reserve = 40;
        // 69 in use: medium is admitted, sheddable is not (its 40 are within reach).
        let occ = [4, 40, 25, 0];
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, false),
            Decision::shed(Reason::Priority as u32)
        );
        // 70 in use: medium now sees its reserve reached; high, with none, goes on to the
        // limit.
        let occ = [4, 40, 26, 0];
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, false),
            Decision::shed(Reason::Priority as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[4, 95, 0, 0], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        // A floor still holds inside the reserve.
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[4, 90, 4, 0], false),
            Decision::admit(Reason::Floor as u32)
        );
        // With a stale heartbeat the split is static: no reserve (fallback total 50).
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[4, 20, 20, 0], true),
            Decision::admit(Reason::UnderLimit as u32)
        );
        // A retry of a medium source decided as sheddable keeps out of medium's reserve
        // only, not sheddable's: at 69 in use it is admitted, at 70 it is not.
        let retry = |origin| Attempt {
            class: CLASS_SHEDDABLE,
            origin,
            ..Default::default()
        };
        assert_eq!(
            decide(&p, &retry(CLASS_MEDIUM), &[4, 40, 25, 0], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide(&p, &retry(CLASS_MEDIUM), &[4, 40, 26, 0], false),
            Decision::shed(Reason::Priority as u32)
        );
        assert_eq!(
            decide(&p, &retry(CLASS_SHEDDABLE), &[4, 40, 25, 0], false),
            Decision::over(Reason::Priority as u32, 109, 100)
        );
    }

    #[test]
    fn a_refusal_says_how_far_its_bound_is_exceeded() {
        let mut p = policy();
        // Sheddable's share of 30: at it, 0; 2 over it, 2.
        assert_eq!(excess(&p, CLASS_SHEDDABLE, &[0, 0, 0, 30]), 0);
        assert_eq!(excess(&p, CLASS_SHEDDABLE, &[0, 0, 0, 32]), 2);
        // The service's 100 as medium sees it (high in full): 103 is 3 over.
        assert_eq!(excess(&p, CLASS_MEDIUM, &[0, 95, 8, 0]), 3);
        // Medium's reserve of 30: 71 of 100 in use is 1 past the 70 it may fill.
        p.classes[CLASS_MEDIUM as usize].reserve = 30;
        assert_eq!(excess(&p, CLASS_MEDIUM, &[0, 60, 11, 0]), 1);
        // Admitted: none.
        assert_eq!(excess(&p, CLASS_MEDIUM, &[0, 10, 10, 0]), 0);
    }

    #[test]
    fn class_share_and_service_limit() {
        let p = policy();
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 0, 0, 30], false),
            Decision::shed(Reason::Priority as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 0, 0, 29], false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 50, 21, 29], false),
            Decision::shed(Reason::ServiceLimit as u32)
        );
    }

    #[test]
    fn limit_zero_sheds_everything_but_critical_and_floors() {
        let mut p = policy();
        for c in &mut p.classes[1..] {
            c.limit = 0;
            c.floor = 0;
        }
        p.total_limit = 0;
        for class in [CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE] {
            assert_eq!(
                decide_occ(&p, class, &[0; 4], false),
                Decision::shed(Reason::Priority as u32)
            );
        }
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[0; 4], false),
            Decision::admit(Reason::Critical as u32)
        );
    }

    #[test]
    fn stale_heartbeat_uses_the_fallback_limits() {
        let p = policy();
        // Fresh: sheddable share 30, 20 in use → admitted. Stale: fallback share 15 → shed.
        let occ = [0, 0, 0, 20];
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, true),
            Decision::shed(Reason::Priority as u32)
        );
        // Fresh total 100 admits 60 occupants; stale total 50 does not.
        let occ = [0, 30, 30, 0];
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, false),
            Decision::admit(Reason::UnderLimit as u32)
        );
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, true),
            Decision::shed(Reason::ServiceLimit as u32)
        );
    }

    #[test]
    fn occupancy_sum_saturates() {
        let p = policy();
        let d = decide_occ(&p, CLASS_MEDIUM, &[u32::MAX, u32::MAX, 10, 0], false);
        assert_eq!(d, Decision::shed(Reason::ServiceLimit as u32));
    }

    #[test]
    fn class_id_is_masked() {
        let p = policy();
        // 4 masks to CRITICAL: no out-of-bounds access, deterministic answer.
        assert_eq!(
            decide_occ(&p, 4, &[0; 4], false),
            Decision::admit(Reason::Critical as u32)
        );
    }
}
