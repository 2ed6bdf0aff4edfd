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
//! 4. a class at its **share** of the service limit is shed;
//! 5. when the **service** is at its total limit, the attempt is shed;
//! 6. otherwise it is admitted (the token bucket, if any, is checked afterwards).
//!
//! With a stale heartbeat the fallback share, floor and total are used instead.

use crate::{
    CLASS_CRITICAL, NUM_CLASSES, REASON_CEILING, REASON_CLASS_LIMIT, REASON_CRITICAL, REASON_FLOOR,
    REASON_SERVICE_LIMIT, REASON_UNDER_LIMIT, ServicePolicy,
};

/// The outcome of the concurrency check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// 1 = admit, 0 = shed (an integer keeps the eBPF code free of bool/Option plumbing).
    pub admit: u32,
    /// One of the `REASON_*` constants.
    pub reason: u32,
}

impl Decision {
    #[inline(always)]
    const fn admit(reason: u32) -> Self {
        Self { admit: 1, reason }
    }
    #[inline(always)]
    const fn shed(reason: u32) -> Self {
        Self { admit: 0, reason }
    }
}

/// Decide one attempt of `class` (0..4) given the class's occupancy (`mine`) and the
/// service's (`total`).
#[inline(always)]
pub fn decide(policy: &ServicePolicy, class: u32, mine: u32, total: u32, stale: bool) -> Decision {
    let class = (class as usize) & (NUM_CLASSES - 1);
    let cp = &policy.classes[class];
    if mine >= cp.ceiling {
        return Decision::shed(REASON_CEILING);
    }
    if class as u32 == CLASS_CRITICAL {
        return Decision::admit(REASON_CRITICAL);
    }
    let (share, floor, total_limit) = if stale {
        (cp.fallback_limit, cp.fallback_floor, policy.fallback_total)
    } else {
        (cp.limit, cp.floor, policy.total_limit)
    };
    if mine < floor {
        return Decision::admit(REASON_FLOOR);
    }
    if mine >= share {
        return Decision::shed(REASON_CLASS_LIMIT);
    }
    if total >= total_limit {
        return Decision::shed(REASON_SERVICE_LIMIT);
    }
    Decision::admit(REASON_UNDER_LIMIT)
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

    /// Decide from every class's occupancy, as the packet path sees it.
    fn decide_occ(p: &ServicePolicy, class: u32, occ: &[u32; 4], stale: bool) -> Decision {
        let total = occ.iter().fold(0u32, |a, &b| a.saturating_add(b));
        decide(p, class, occ[(class & 3) as usize], total, stale)
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
        assert_eq!(d, Decision::admit(REASON_CRITICAL));
        // At its ceiling: shed, also with a stale heartbeat.
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[5, 0, 0, 0], false),
            Decision::shed(REASON_CEILING)
        );
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[5, 0, 0, 0], true),
            Decision::shed(REASON_CEILING)
        );
    }

    #[test]
    fn floor_is_kept_when_the_service_is_full() {
        let p = policy();
        // Total 140 > 100, but high holds 59 < floor 60.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 59, 51, 30], false),
            Decision::admit(REASON_FLOOR)
        );
        // At the floor the service limit applies again.
        assert_eq!(
            decide_occ(&p, CLASS_HIGH, &[0, 60, 40, 0], false),
            Decision::shed(REASON_SERVICE_LIMIT)
        );
        // Medium's floor of 5 also holds against a full service.
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &[0, 100, 4, 0], false),
            Decision::admit(REASON_FLOOR)
        );
    }

    #[test]
    fn class_share_and_service_limit() {
        let p = policy();
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 0, 0, 30], false),
            Decision::shed(REASON_CLASS_LIMIT)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 0, 0, 29], false),
            Decision::admit(REASON_UNDER_LIMIT)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &[0, 50, 21, 29], false),
            Decision::shed(REASON_SERVICE_LIMIT)
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
                Decision::shed(REASON_CLASS_LIMIT)
            );
        }
        assert_eq!(
            decide_occ(&p, CLASS_CRITICAL, &[0; 4], false),
            Decision::admit(REASON_CRITICAL)
        );
    }

    #[test]
    fn stale_heartbeat_uses_the_fallback_limits() {
        let p = policy();
        // Fresh: sheddable share 30, 20 in use → admitted. Stale: fallback share 15 → shed.
        let occ = [0, 0, 0, 20];
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, false),
            Decision::admit(REASON_UNDER_LIMIT)
        );
        assert_eq!(
            decide_occ(&p, CLASS_SHEDDABLE, &occ, true),
            Decision::shed(REASON_CLASS_LIMIT)
        );
        // Fresh total 100 admits 60 occupants; stale total 50 does not.
        let occ = [0, 30, 30, 0];
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, false),
            Decision::admit(REASON_UNDER_LIMIT)
        );
        assert_eq!(
            decide_occ(&p, CLASS_MEDIUM, &occ, true),
            Decision::shed(REASON_SERVICE_LIMIT)
        );
    }

    #[test]
    fn occupancy_sum_saturates() {
        let p = policy();
        let d = decide_occ(&p, CLASS_MEDIUM, &[u32::MAX, u32::MAX, 10, 0], false);
        assert_eq!(d, Decision::shed(REASON_SERVICE_LIMIT));
    }

    #[test]
    fn class_id_is_masked() {
        let p = policy();
        // 4 masks to CRITICAL: no out-of-bounds access, deterministic answer.
        assert_eq!(
            decide_occ(&p, 4, &[0; 4], false),
            Decision::admit(REASON_CRITICAL)
        );
    }
}
