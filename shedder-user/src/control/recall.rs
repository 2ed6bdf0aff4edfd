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
//! - lowest class first, and a class only once every class below it has held no more work
//!   than its floor for a second ([`Settled`]): a higher class over its share because a
//!   lower one's queue slows everything down keeps its connections (the lower one's go, and
//!   the higher one's work shrinks as the queue drains);
//! - CRITICAL never;
//! - only connections that answered a request before (a keep-alive connection): one whose
//!   first request is in service was admitted by the gate for that request;
//! - only what the class is over beyond its fresh connections (a first request in service),
//!   and at most its keep-alive connections with a request in service: fresh connections
//!   leave as they are answered and the gate lets no new ones in, so an excess they make
//!   (after the limit was cut, or while keep-alive requests are a few among many new
//!   clients) is the gate's to remove; what keep-alive requests hold beyond it is not;
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

/// How many connections to recall from each class, given the policy in force, each
/// class's work in flight (`busy`) and keep-alive connections with a request in service
/// (`reused`), and which classes may be recalled at all (`may`, see [`Settled`]). Lowest
/// class first, each class's recall taken off its work before the next is decided; CRITICAL
/// is never recalled.
pub fn wanted(
    policy: &ServicePolicy,
    busy: &[u32; NUM_CLASSES],
    reused: &[u32; NUM_CLASSES],
    may: &[bool; NUM_CLASSES],
) -> [u32; NUM_CLASSES] {
    let mut occ: [u64; NUM_CLASSES] = std::array::from_fn(|c| busy[c] as u64);
    let mut out = [0; NUM_CLASSES];
    for class in (0..NUM_CLASSES as u32).rev() {
        let c = class as usize;
        if class == CLASS_CRITICAL || !may[c] {
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
            // connections hold it there and nothing needs to go. Its fresh connections (a
            // first request in service) leave as they are answered, and the gate, refusing
            // the class, lets no new ones in: only what is over beyond them is the gate's
            // blind spot. Never more than the class holds: `reused` is sock_diag's count,
            // taken at another instant than the kernel's `busy`, and may be the larger.
            let reused = reused[c].min(busy[c]);
            let fresh = busy[c] - reused;
            let n = d.excess.saturating_sub(fresh).min(reused);
            out[c] = n;
            occ[c] -= n as u64;
        }
    }
    out
}

/// Per class, whether every class below it holds no more work than its floor now.
pub fn quiet_below(policy: &ServicePolicy, busy: &[u32; NUM_CLASSES]) -> [bool; NUM_CLASSES] {
    let mut out = [true; NUM_CLASSES];
    let mut below = false;
    for c in (0..NUM_CLASSES).rev() {
        out[c] = !below;
        below |= busy[c] > policy.classes[c].floor;
    }
    out
}

/// How long the classes below a class must have been quiet ([`quiet_below`]) before it is
/// recalled: a higher class over its share because a lower one's queue slowed everything
/// keeps its connections while that queue drains (HIGH's sixty waiting connections, left
/// over its share by SHEDDABLE's backlog, were recalled the tick SHEDDABLE's last went).
pub const SETTLE: Duration = Duration::from_secs(1);

/// Since when each class has had quiet classes below it.
#[derive(Clone, Debug, Default)]
pub struct Settled {
    since: [Option<Duration>; NUM_CLASSES],
}

impl Settled {
    /// Which classes may be recalled at `now` (any clock), given which have quiet classes
    /// below them now.
    pub fn update(&mut self, quiet: [bool; NUM_CLASSES], now: Duration) -> [bool; NUM_CLASSES] {
        std::array::from_fn(|c| {
            if !quiet[c] {
                self.since[c] = None;
                return false;
            }
            let since = *self.since[c].get_or_insert(now);
            now.saturating_sub(since) >= SETTLE
        })
    }
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

    /// `wanted` with the classes below already settled as `quiet_below` says now.
    fn settled(busy: &[u32; NUM_CLASSES], reused: &[u32; NUM_CLASSES]) -> [u32; NUM_CLASSES] {
        let may = quiet_below(&policy(), busy);
        wanted(&policy(), busy, reused, &may)
    }

    #[test]
    fn a_class_over_its_bound_recalls_its_excess_of_reused_connections() {
        // SHEDDABLE holds 25 against its 10: 15 over, all of them reused.
        assert_eq!(settled(&[0, 10, 10, 25], &[0, 10, 10, 25]), [0, 0, 0, 15]);
        // Only 4 of its 25 came over keep-alive: the other 21 were admitted for their first
        // request, and as they are answered the class falls under its bound by itself (the
        // gate lets no new ones in): nothing to recall.
        assert_eq!(settled(&[0, 10, 10, 25], &[0, 0, 0, 4]), [0, 0, 0, 0]);
        // 20 of 25 over keep-alive: the 5 fresh ones take 5 of the 15 over with them.
        assert_eq!(settled(&[0, 10, 10, 25], &[0, 0, 0, 20]), [0, 0, 0, 10]);
        // Within every bound: nothing.
        assert_eq!(settled(&[5, 50, 20, 10], &[5, 50, 20, 10]), [0; 4]);
    }

    #[test]
    fn the_lowest_class_gives_first_and_critical_never() {
        // CRITICAL alone at 120 fills the service: every other class would be refused.
        // SHEDDABLE gives its 5 first; MEDIUM and HIGH keep theirs while it holds work.
        let w = settled(&[120, 10, 5, 5], &[120, 10, 5, 5]);
        assert_eq!(w, [0, 0, 0, 5]);
        // A tick later SHEDDABLE is gone: MEDIUM gives its 5; then HIGH what is left of the
        // service's excess (120 + 10 - 100), never CRITICAL.
        assert_eq!(settled(&[120, 10, 5, 0], &[120, 10, 5, 0]), [0, 0, 5, 0]);
        assert_eq!(settled(&[120, 10, 0, 0], &[120, 10, 0, 0]), [0, 10, 0, 0]);
        // HIGH 30 over its share fills the service, but SHEDDABLE, at its own share exactly
        // (nothing to give), holds work over its floor of 0: nothing above it is recalled.
        let w = settled(&[0, 90, 20, 10], &[0, 90, 20, 10]);
        assert_eq!(w, [0; 4]);
        // SHEDDABLE 15 over its share while HIGH is over its own (a queue SHEDDABLE's load
        // makes): only SHEDDABLE gives, since it still holds work after its recall.
        let w = settled(&[0, 90, 10, 25], &[0, 90, 10, 25]);
        assert_eq!(w, [0, 0, 0, 15]);
    }

    #[test]
    fn a_class_waits_a_second_of_quiet_below_it() {
        let ms = Duration::from_millis;
        let mut s = Settled::default();
        // SHEDDABLE (nothing below) may at once... after the settling second.
        let quiet = quiet_below(&policy(), &[0, 90, 0, 5]);
        assert_eq!(quiet, [false, false, false, true]);
        assert_eq!(s.update(quiet, ms(0)), [false; 4]);
        assert_eq!(s.update(quiet, ms(1000)), [false, false, false, true]);
        // SHEDDABLE's last work leaves: HIGH and MEDIUM wait a second of it.
        let quiet = quiet_below(&policy(), &[0, 90, 0, 0]);
        assert_eq!(s.update(quiet, ms(1100)), [false, false, false, true]);
        assert_eq!(s.update(quiet, ms(2000)), [false, false, false, true]);
        assert_eq!(s.update(quiet, ms(2100)), [false, true, true, true]);
        // It comes back: HIGH waits again.
        let quiet = quiet_below(&policy(), &[0, 90, 0, 3]);
        assert_eq!(s.update(quiet, ms(2200)), [false, false, false, true]);
        // The busy HIGH is recalled only once settled.
        let busy = [0, 90, 0, 0];
        assert_eq!(wanted(&policy(), &busy, &busy, &[false; 4]), [0; 4]);
        assert_eq!(
            wanted(&policy(), &busy, &busy, &[false, true, true, true]),
            [0, 30, 0, 0]
        );
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
