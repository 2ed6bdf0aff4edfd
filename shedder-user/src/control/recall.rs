//! Recalling keep-alive connections: which established connections of a service to close
//! so that the next request of a class the gate is refusing meets the gate. Pure: the
//! daemon lists the connections and closes the ones chosen here.
//!
//! Refusing new connections sheds nothing that arrives over connections already open. A
//! class that holds more work than a new attempt of it would be allowed (the bound
//! [`admit::decide`] refuses it at, exceeded) is taking that work over its keep-alive
//! connections; recalling as many of them as it is over sends their clients back through
//! the gate. The rules:
//!
//! - lowest class first, and a class only while every class below it holds no more work
//!   than its floor: a higher class over its share because a lower one's queue slows
//!   everything down keeps its connections (the lower one's go, and the higher one's work
//!   shrinks as the queue drains);
//! - CRITICAL never;
//! - only connections that answered a request before (a keep-alive connection): one whose
//!   first request is in service was admitted by the gate for that request;
//! - at most as many from a class as its keep-alive connections with a request in service:
//!   an excess made of fresh connections (after the limit was cut) drains as they are
//!   answered, and recalling an idle pool for it would shed nothing;
//! - idle connections first (closing one loses no request), the most recently active of
//!   them first (they are the ones sending; a pool idle for minutes carries no load), then
//!   busy ones, the youngest request first (the least work lost);
//! - at most `per_second` a second ([`Budget`]).

use std::time::Duration;

use shedder_common::{CLASS_CRITICAL, NUM_CLASSES, ServicePolicy, admit, is_pressure};

use crate::config::Prefix;

/// One established connection of a service, as recall sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn {
    pub class: u32,
    /// A request received and not yet answered.
    pub busy: bool,
    /// Busy: the request's age; idle: the time since its last request arrived (ms).
    pub since_ms: u32,
    /// It answered a request before: a keep-alive connection.
    pub answered: bool,
}

/// How many connections to recall from each class, given the policy in force and each
/// class's work in flight (`busy`) and keep-alive connections with a request in service
/// (`reused`). Lowest class first, each class's recall taken off its work before the next
/// is decided; CRITICAL is never recalled.
pub fn wanted(
    policy: &ServicePolicy,
    busy: &[u32; NUM_CLASSES],
    reused: &[u32; NUM_CLASSES],
) -> [u32; NUM_CLASSES] {
    let mut occ: [u64; NUM_CLASSES] = std::array::from_fn(|c| busy[c] as u64);
    let mut out = [0; NUM_CLASSES];
    // Some class below holds work over its floor now: the classes above keep theirs,
    // however far over their shares the queue it makes puts them. Now, not once its own
    // recall is done: what it has queued drains only as it is served.
    let mut below = false;
    for class in (0..NUM_CLASSES as u32).rev() {
        let c = class as usize;
        let over_floor = busy[c] > policy.classes[c].floor;
        if class == CLASS_CRITICAL || below {
            below |= over_floor;
            continue;
        }
        let attempt = admit::Attempt {
            class,
            origin: class,
            ..Default::default()
        };
        let d = admit::decide(policy, &attempt, &occ, false);
        if d.admit == 0 && is_pressure(d.reason) == 1 {
            // Over by `excess` at the bound the attempt met: at the bound exactly, the class's
            // connections hold it there and nothing needs to go. Never more than the class
            // holds: `reused` is sock_diag's count, taken at another instant than the
            // kernel's `busy`, and may be the larger.
            let n = d.excess.min(reused[c]).min(busy[c]);
            out[c] = n;
            occ[c] -= n as u64;
        }
        below |= over_floor;
    }
    out
}

/// Which of `conns` to recall (their indexes): up to `want[class]` of each class, lowest
/// class first, at most `budget` in all, in the order the module documents.
pub fn choose(conns: &[Conn], want: &[u32; NUM_CLASSES], budget: u32) -> Vec<usize> {
    let mut left = budget;
    let mut out = Vec::new();
    for class in (0..NUM_CLASSES as u32).rev() {
        let n = want[class as usize].min(left);
        if class == CLASS_CRITICAL || n == 0 {
            continue;
        }
        let mut candidates: Vec<usize> = (0..conns.len())
            .filter(|&i| conns[i].class == class && conns[i].answered)
            .collect();
        candidates.sort_by_key(|&i| (conns[i].busy, conns[i].since_ms));
        candidates.truncate(n as usize);
        left -= candidates.len() as u32;
        out.extend(candidates);
    }
    out
}

/// The recall rate: `per_second` recalls a second, spent as ticks come. What a tick does
/// not spend is carried to the next, at most one tick's worth, so a recall that starts
/// after a quiet minute does not begin with a burst.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    carry: f64,
}

impl Budget {
    /// Recalls allowed this tick, `dt` after the last; `spend` them with [`Self::spent`].
    pub fn allowance(&self, per_second: u32, dt: Duration) -> u32 {
        let earned = per_second as f64 * dt.as_secs_f64();
        (self.carry + earned).floor() as u32
    }

    /// `n` of this tick's allowance were used.
    pub fn spent(&mut self, per_second: u32, dt: Duration, n: u32) {
        let earned = per_second as f64 * dt.as_secs_f64();
        self.carry = (self.carry + earned - n as f64).clamp(0.0, earned.max(1.0));
    }
}

/// The class of a client at `addr` by the class rules (the longest prefix that holds it),
/// else `default`: what the packet path's classification answers. An IPv4 client of a
/// dual-stack socket (`::ffff:a.b.c.d`) is classified as IPv4, as the packet path sees it.
pub fn classify(rules: &[(Prefix, u32)], default: u32, addr: std::net::IpAddr) -> u32 {
    let addr = addr.to_canonical();
    rules
        .iter()
        .filter(|(p, _)| p.contains(addr))
        .max_by_key(|(p, _)| p.len)
        .map_or(default, |&(_, class)| class)
}

#[cfg(test)]
mod tests {
    use shedder_common::{ClassPolicy, POLICY_CONFIGURED};

    use super::*;

    /// Total 100; HIGH's share 60, MEDIUM's 30, SHEDDABLE's 10; no floors, reserves or
    /// ceilings in the way.
    fn policy() -> ServicePolicy {
        let class = |limit| ClassPolicy {
            limit,
            ceiling: 10_000,
            ..ClassPolicy::default()
        };
        ServicePolicy {
            classes: [class(100), class(60), class(30), class(10)],
            total_limit: 100,
            configured: POLICY_CONFIGURED,
            ..ServicePolicy::default()
        }
    }

    #[test]
    fn a_class_over_its_bound_recalls_its_excess_of_reused_connections() {
        // SHEDDABLE holds 25 against its 10: 15 over, all of them reused.
        assert_eq!(
            wanted(&policy(), &[0, 10, 10, 25], &[0, 10, 10, 25]),
            [0, 0, 0, 15]
        );
        // Only 4 of its busy connections came over keep-alive: the rest were admitted for
        // their first request and drain as they are answered.
        assert_eq!(
            wanted(&policy(), &[0, 10, 10, 25], &[0, 0, 0, 4]),
            [0, 0, 0, 4]
        );
        // Within every bound: nothing.
        assert_eq!(
            wanted(&policy(), &[5, 50, 20, 10], &[5, 50, 20, 10]),
            [0; 4]
        );
    }

    #[test]
    fn the_lowest_class_gives_first_and_critical_never() {
        // CRITICAL alone at 120 fills the service: every other class would be refused.
        // SHEDDABLE gives its 5 first; MEDIUM and HIGH keep theirs while it holds work.
        let w = wanted(&policy(), &[120, 10, 5, 5], &[120, 10, 5, 5]);
        assert_eq!(w, [0, 0, 0, 5]);
        // A tick later SHEDDABLE is gone: MEDIUM gives its 5; then HIGH what is left of the
        // service's excess (120 + 10 - 100), never CRITICAL.
        assert_eq!(
            wanted(&policy(), &[120, 10, 5, 0], &[120, 10, 5, 0]),
            [0, 0, 5, 0]
        );
        assert_eq!(
            wanted(&policy(), &[120, 10, 0, 0], &[120, 10, 0, 0]),
            [0, 10, 0, 0]
        );
        // HIGH 30 over its share fills the service, but SHEDDABLE, at its own share exactly
        // (nothing to give), holds work over its floor of 0: nothing above it is recalled.
        let w = wanted(&policy(), &[0, 90, 20, 10], &[0, 90, 20, 10]);
        assert_eq!(w, [0; 4]);
        // SHEDDABLE 15 over its share while HIGH is over its own (a queue SHEDDABLE's load
        // makes): only SHEDDABLE gives, since it still holds work after its recall.
        let w = wanted(&policy(), &[0, 90, 10, 25], &[0, 90, 10, 25]);
        assert_eq!(w, [0, 0, 0, 15]);
    }

    fn conn(class: u32, busy: bool, since_ms: u32, answered: bool) -> Conn {
        Conn {
            class,
            busy,
            since_ms,
            answered,
        }
    }

    #[test]
    fn idle_and_recently_active_first_then_the_youngest_request() {
        let conns = [
            conn(3, true, 900, true),     // 0: busy, old request
            conn(3, false, 60_000, true), // 1: pool idle a minute
            conn(3, false, 5, true),      // 2: just answered
            conn(3, true, 10, true),      // 3: busy, young request
            conn(3, true, 1, false),      // 4: its first request: never
            conn(0, false, 1, true),      // 5: critical: never
            conn(2, false, 1, true),      // 6: another class
        ];
        assert_eq!(choose(&conns, &[0, 0, 0, 3], 100), vec![2, 1, 3]);
        assert_eq!(choose(&conns, &[0, 0, 0, 10], 100), vec![2, 1, 3, 0]);
        assert_eq!(choose(&conns, &[5, 0, 0, 0], 100), Vec::<usize>::new());
        // Lowest class first within the budget.
        assert_eq!(choose(&conns, &[0, 0, 1, 10], 2), vec![2, 1]);
        assert_eq!(choose(&conns, &[0, 0, 1, 1], 2), vec![2, 6]);
    }

    #[test]
    fn the_budget_holds_the_rate_and_carries_at_most_a_tick() {
        let mut b = Budget::default();
        let tick = Duration::from_millis(100);
        let mut total = 0;
        for _ in 0..100 {
            let n = b.allowance(25, tick);
            b.spent(25, tick, n);
            total += n;
        }
        // 25 a second for 10 s.
        assert!((249..=251).contains(&total), "{total}");
        // A quiet minute does not pile up a burst.
        for _ in 0..600 {
            b.spent(200, tick, 0);
        }
        assert!(b.allowance(200, tick) <= 40);
        assert_eq!(Budget::default().allowance(0, tick), 0);
    }

    #[test]
    fn clients_are_classified_by_their_longest_prefix() {
        let rules = vec![
            (Prefix::parse("198.18.0.0/16").unwrap(), 3),
            (Prefix::parse("198.18.20.0/24").unwrap(), 1),
            (Prefix::parse("2001:db8::/32").unwrap(), 0),
        ];
        let class = |a: &str| classify(&rules, 2, a.parse().unwrap());
        assert_eq!(class("198.18.20.7"), 1);
        assert_eq!(class("::ffff:198.18.20.7"), 1);
        assert_eq!(class("198.18.21.7"), 3);
        assert_eq!(class("198.19.0.1"), 2);
        assert_eq!(class("2001:db8::1"), 0);
    }
}
