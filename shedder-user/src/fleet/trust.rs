//! What this node believes of the records other members publish (pure).
//!
//! Everything under the fleet's prefix comes from etcd, which anyone holding a node's
//! credentials (or etcd's root) can write: a misconfigured node, an older version, a
//! buggy tool or an attacker. A record never changes this node's own configuration (its
//! `global_limit` is its own, see `view`), and every number in one is checked before it
//! weighs on a share:
//!
//! - a record that does not parse, whose `node` is not the name in its key (or not a
//!   valid node name), or, for a member, that is not attached to a lease, is rejected
//!   whole;
//! - a number out of its absolute range (attempts and admissions above [`MAX_RATE`], a
//!   hold above [`MAX_HOLD`], a claim or a limit above the largest limit a configuration
//!   accepts, anything negative) is clamped into it;
//! - a member's need is capped by what it has proved ([`proven_need`]), a departed
//!   member's reserve by the static share, and their total by the nodes that may be
//!   missing (`view`); a claim no daemon could have made counts only up to the member's
//!   share ([`suspect`]).
//!
//! Each value that no honest record holds (out of range, above the budget, a need its own
//! figures contradict, a reserve above the static share, a date in the future) is named by
//! a [`Field`] (the `field` label of `shedder_fleet_record_values_clamped_total`). The caps
//! that honest records meet too (a need over four times what the node holds) are applied
//! without a report; the per-member metrics show them.

use std::fmt;

use shedder_common::NUM_CLASSES;

use super::{Demand, Departed, Record, demand::MIN_ADMITTED};
use crate::config::{LIMIT_CEILING, valid_name};

/// The most attempts or admissions per second a record may state for one service: far
/// above what one node's packet path decides (a few million a second per core).
pub const MAX_RATE: f64 = 1e8;

/// The longest hold a record may state: a day (pooled database connections live for
/// hours; nothing the budget counts holds a connection for days without being idle).
pub const MAX_HOLD: f64 = 86_400.0;

/// How many times what it was granted a member's need may be ([`proven_need`]).
///
/// A node's need over what it holds is `attempts / admissions`, the load it refuses: a
/// node that refuses three attempts in four is weighed in full; one more overloaded than
/// that is weighed at four times its share, and once it has raised to the larger share,
/// at four times that: a share by demand grows at most fourfold with each raise. What a
/// record cannot claim this way is weight it was never granted: a record of a need of
/// millions from a node that holds nothing weighs one connection.
pub const PROOF_FACTOR: f64 = 4.0;

/// A value out of bounds in a record (the `field` label of the clamping metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// A claim above the budget, or one no daemon could have made ([`suspect`]).
    Claim,
    MaxLimit,
    Attempts,
    Admitted,
    Established,
    Hold,
    /// A need that is negative, or that the member's own figures contradict.
    Need,
    /// A departed member's reserve above the static share.
    Reserve,
    /// A departed record dated in the future.
    Since,
    /// Departed reserves above what the missing nodes can hold in all.
    Reserved,
}

impl Field {
    pub const ALL: [Field; 10] = [
        Field::Claim,
        Field::MaxLimit,
        Field::Attempts,
        Field::Admitted,
        Field::Established,
        Field::Hold,
        Field::Need,
        Field::Reserve,
        Field::Since,
        Field::Reserved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Field::Claim => "claim",
            Field::MaxLimit => "max_limit",
            Field::Attempts => "attempts",
            Field::Admitted => "admitted",
            Field::Established => "established",
            Field::Hold => "hold",
            Field::Need => "need",
            Field::Reserve => "reserve",
            Field::Since => "since",
            Field::Reserved => "reserved",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a record was ignored whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("does not parse: {0}")]
    Malformed(String),
    #[error("the key's node name is not a valid node name (1 to 64 of [A-Za-z0-9._-])")]
    BadName,
    #[error("names node `{0}` under another node's key")]
    Misnamed(String),
    #[error("is not attached to a lease (every daemon's member key lives on its lease)")]
    NoLease,
}

/// The kind of record (the `record` label of the rejection metric).
pub const RECORDS: [&str; 2] = ["member", "departed"];

/// A number clamped into `[0, max]`; NaN is 0. Whether it moved.
fn clamp(v: &mut f64, max: f64) -> bool {
    let c = if v.is_nan() { 0.0 } else { v.clamp(0.0, max) };
    let moved = c != *v;
    *v = c;
    moved
}

/// A member record from its key's node name, its value and the lease it is attached to
/// (0: none): rejected, or with every number in its absolute range (and the fields that
/// were not). A daemon writes its member key only on its lease, so that the key goes when
/// the daemon does; a key without one was written by something else, and would outlive
/// any writer.
pub fn member(key_node: &str, value: &[u8], lease: i64) -> Result<(Record, Vec<Field>), Rejected> {
    if !valid_name(key_node) {
        return Err(Rejected::BadName);
    }
    if lease == 0 {
        return Err(Rejected::NoLease);
    }
    let mut r: Record =
        serde_json::from_slice(value).map_err(|e| Rejected::Malformed(e.to_string()))?;
    if r.node != key_node {
        return Err(Rejected::Misnamed(r.node));
    }
    let mut found = Vec::new();
    let mut note = |moved: bool, f: Field| {
        if moved && !found.contains(&f) {
            found.push(f);
        }
    };
    for c in r.claims.values_mut() {
        note(*c > LIMIT_CEILING, Field::Claim);
        *c = (*c).min(LIMIT_CEILING);
    }
    for m in r.max_limits.values_mut() {
        note(*m > LIMIT_CEILING, Field::MaxLimit);
        *m = (*m).min(LIMIT_CEILING);
    }
    for d in r.demand.values_mut() {
        for a in &mut d.attempts {
            note(clamp(a, MAX_RATE), Field::Attempts);
        }
        for n in &mut d.need {
            note(clamp(n, f64::MAX), Field::Need);
        }
        note(clamp(&mut d.admitted, MAX_RATE), Field::Admitted);
        note(
            clamp(&mut d.established, LIMIT_CEILING as f64),
            Field::Established,
        );
        // 0 is a hold: connections admitted and none established (a node under a flood).
        if let Some(h) = d.hold_ms
            && !(0.0..=MAX_HOLD * 1000.0).contains(&h)
        {
            note(true, Field::Hold);
            d.hold_ms = None;
        }
    }
    Ok((r, found))
}

/// A departed record from its key's node name and its value (see [`member`]).
pub fn departed(key_node: &str, value: &[u8]) -> Result<(Departed, Vec<Field>), Rejected> {
    if !valid_name(key_node) {
        return Err(Rejected::BadName);
    }
    let mut d: Departed =
        serde_json::from_slice(value).map_err(|e| Rejected::Malformed(e.to_string()))?;
    if d.node != key_node {
        return Err(Rejected::Misnamed(d.node));
    }
    let mut found = Vec::new();
    for r in d.reserves.values_mut() {
        if *r > LIMIT_CEILING {
            *r = LIMIT_CEILING;
            if found.is_empty() {
                found.push(Field::Reserve);
            }
        }
    }
    Ok((d, found))
}

/// The hold a member has proved, in seconds: its established connections (at most what
/// it holds, its claim unless it is [`suspect`]) per admission per second; `None` when it
/// admits too little to say.
pub fn proven_hold(d: &Demand, held: u32) -> Option<f64> {
    let established = d.established.min(held as f64);
    (d.admitted >= MIN_ADMITTED)
        .then(|| (established / d.admitted).min(MAX_HOLD))
        .filter(|h| *h > 0.0)
}

/// The need of a member as the shares count it: what it published, at most
///
/// - per class, its attempts per second × the hold it proved ([`proven_hold`]: its
///   established connections, at most what it holds, per admission per second), or
///   `fallback_hold` (seconds: the fleet's median) when it admits too little to measure
///   one; and
/// - in all, [`PROOF_FACTOR`] × what it holds + 1, scaled down over the classes alike, so
///   the classes keep their order.
///
/// What it holds is its claim (connections it is counted for: every node makes room for
/// them), or nothing for a claim that is [`suspect`]. A need is the connections its
/// attempts would hold if all were admitted; by Little's law a node holding `established`
/// connections after `admitted` admissions a second would hold `attempts × established /
/// admitted`: the first rule holds a record to that, so a record that contradicts itself,
/// or states connections it is not counted for, gains nothing by it. The second bounds
/// what a node may ask for by what it holds: a suspect record weighs one connection
/// whatever it says, and an honest node grows its weight fourfold with each share it
/// raises to (a raise is a transaction: each is seen at once).
///
/// Also whether the record contradicts itself: a need more than a tenth (and a
/// connection) above its attempts × its established connections per admission, or, for a
/// member that admits too little to have a hold (its need uses the fleet's), more than
/// twice its attempts × `fallback_hold` (the fleet's hold may have moved since it
/// published). The other caps are routine (a node overloaded more than fourfold, a mean
/// of connections above a claim that has just fallen) and not reported.
pub fn proven_need(d: &Demand, held: u32, fallback_hold: f64) -> ([f64; NUM_CLASSES], bool) {
    let hold = proven_hold(d, held).unwrap_or(fallback_hold);
    let mut need: [f64; NUM_CLASSES] =
        std::array::from_fn(|c| d.need[c].min(d.attempts[c] * hold).max(0.0));
    let total: f64 = need.iter().sum();
    let most = PROOF_FACTOR * held as f64 + 1.0;
    if total > most {
        let scale = most / total;
        for n in &mut need {
            *n *= scale;
        }
    }
    // Figures are published to a tenth: the most they can stand for.
    let (hold, slack) = if d.admitted >= MIN_ADMITTED {
        ((d.established + 0.05) / (d.admitted - 0.05), 1.1)
    } else {
        (fallback_hold, 2.0)
    };
    let contradicts = d
        .need
        .iter()
        .zip(&d.attempts)
        .any(|(n, a)| *n > slack * (a + 0.05) * hold + 1.0);
    (need, contradicts)
}

/// Whether another member's claim is suspect: not believed, so that it counts against
/// the room this node raises into only up to the member's share, and proves nothing for
/// its need ([`proven_need`] with nothing held). `prev` is whether it was suspect in the
/// last view (`None`: a member this node sees for the first time), `share` its share in
/// this view, `returned` what was reserved for it if it has just come back from a
/// departure (its departed record, which its registration deleted), `steady` whether
/// this node's view has a history the member could have been seen in (not its first view,
/// not the first after a cut-off of its own).
///
/// Claims are believed as published: the bound rests on every claim being counted (a
/// node that holds connections says so in its claim, and the others make room), and every
/// node reading the same records must compute the same shares. One thing marks a record
/// no daemon writes: a node's claim rises only through a raise to its share, and starts at
/// 0, or at what was reserved for it when it comes back after its lease expired. So a
/// member that appears, while this node watches, claiming more than its share and more
/// than was reserved for it, is suspect, until its claim is within its share. A record
/// that appears claiming the budget leaves everyone else their share.
///
/// What this leaves out: a node whose daemon restarted holding more connections than its
/// new share (it adopts them from the kernel) is suspect until they close; its own
/// ceiling is its share, so it refuses until then, and the fleet holds them on top of its
/// budget meanwhile, as it would hold the connections of the others that made room. And a
/// record that appears within its share and then claims more is believed: that is a
/// daemon's behaviour, and what the etcd credentials (one user per node, docs/fleet.md)
/// keep others from imitating.
pub fn suspect(prev: Option<bool>, claim: u32, share: u32, returned: u32, steady: bool) -> bool {
    match prev {
        Some(was) => was && claim > share,
        None => steady && claim > share.max(returned),
    }
}

/// How much of a member's claim counts against the room, and what it holds for its need
/// to be proved against: `(counted, held)`. A suspect's counts up to its share and never
/// more than it counted in the last view (`before`): a daemon's claim rises only through
/// a raise the others see, and a suspect's share can leap (the surplus nobody needs goes
/// by need, and it may be the only member left with any) faster than the others' claims
/// fall; counted at once, it would make them lower for room no one is using.
pub fn counted_and_held(claim: u32, share: u32, suspect: bool, before: Option<u32>) -> (u32, u32) {
    if suspect {
        (claim.min(share).min(before.unwrap_or(u32::MAX)), 0)
    } else {
        (claim, claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(node: &str) -> Record {
        Record {
            node: node.into(),
            ..Default::default()
        }
    }

    #[test]
    fn records_that_do_not_parse_or_name_another_node_are_rejected() {
        let ok = serde_json::to_vec(&record("lb-2")).unwrap();
        assert!(member("lb-2", &ok, 7).is_ok());
        assert_eq!(
            member("lb-3", &ok, 7).unwrap_err(),
            Rejected::Misnamed("lb-2".into())
        );
        assert_eq!(member("lb 2", &ok, 7).unwrap_err(), Rejected::BadName);
        assert_eq!(member("lb-2", &ok, 0).unwrap_err(), Rejected::NoLease);
        assert_eq!(
            member(&"x".repeat(65), &ok, 7).unwrap_err(),
            Rejected::BadName
        );
        for bad in [
            &b"{"[..],
            b"null",
            b"{\"node\":\"lb-2\",\"claims\":{\"db\":-1},\"pid\":1,\"version\":\"x\"}",
            b"{\"node\":\"lb-2\",\"claims\":{\"db\":1e400},\"pid\":1,\"version\":\"x\"}",
            b"{\"node\":\"lb-2\",\"claims\":{\"db\":99999999999},\"pid\":1,\"version\":\"x\"}",
        ] {
            assert!(
                matches!(member("lb-2", bad, 7), Err(Rejected::Malformed(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let d = serde_json::to_vec(&Departed {
            node: "lb-2".into(),
            ..Default::default()
        })
        .unwrap();
        assert!(departed("lb-2", &d).is_ok());
        assert_eq!(
            departed("lb-4", &d).unwrap_err(),
            Rejected::Misnamed("lb-2".into())
        );
        assert!(matches!(
            departed("lb-2", b"[]"),
            Err(Rejected::Malformed(_))
        ));
    }

    #[test]
    fn numbers_out_of_range_are_clamped_and_named() {
        let mut r = record("lb-2");
        r.claims.insert("db".into(), u32::MAX);
        r.max_limits.insert("db".into(), u32::MAX);
        r.demand.insert(
            "db".into(),
            Demand {
                attempts: [-5.0, 1e300, 10.0, 0.0],
                need: [-1.0, 1e300, 4.0, 0.0],
                hold_ms: Some(1e12),
                admitted: -3.0,
                established: 1e300,
            },
        );
        let (r, found) = member("lb-2", &serde_json::to_vec(&r).unwrap(), 7).unwrap();
        assert_eq!(r.claims["db"], LIMIT_CEILING);
        assert_eq!(r.max_limits["db"], LIMIT_CEILING);
        let d = r.demand["db"];
        assert_eq!(d.attempts, [0.0, MAX_RATE, 10.0, 0.0]);
        assert_eq!(d.need, [0.0, 1e300, 4.0, 0.0]);
        assert_eq!((d.hold_ms, d.admitted), (None, 0.0));
        assert_eq!(d.established, LIMIT_CEILING as f64);
        let mut found = found;
        found.sort();
        assert_eq!(
            found,
            [
                Field::Claim,
                Field::MaxLimit,
                Field::Attempts,
                Field::Admitted,
                Field::Established,
                Field::Hold,
                Field::Need
            ]
        );
        // A record within range: nothing named.
        let mut fine = record("lb-2");
        fine.claims.insert("db".into(), 18);
        let (_, found) = member("lb-2", &serde_json::to_vec(&fine).unwrap(), 7).unwrap();
        assert!(found.is_empty());
    }

    fn demand(attempts: f64, admitted: f64, established: f64, need: f64) -> Demand {
        Demand {
            attempts: [0.0, 0.0, attempts, 0.0],
            need: [0.0, 0.0, need, 0.0],
            hold_ms: None,
            admitted,
            established,
        }
    }

    #[test]
    fn a_need_is_capped_by_what_the_member_proved() {
        // An honest node: 135 attempts a second, 45 admitted, 18 established (400 ms):
        // need 54, three times what it holds: counted as published.
        let (n, contradicts) = proven_need(&demand(135.0, 45.0, 18.0, 54.0), 18, 1.0);
        assert!((n[2] - 54.0).abs() < 1e-9 && !contradicts, "{n:?}");
        // Rounded figures (a tenth) do not contradict, small ones included: 0.04
        // connections published as 0.0.
        let (_, contradicts) = proven_need(&demand(133.4, 44.7, 17.9, 53.5), 18, 1.0);
        assert!(!contradicts);
        let (_, contradicts) = proven_need(&demand(3139.0, 10.0, 0.0, 12.6), 18, 1.0);
        assert!(!contradicts);
        // A need its own figures do not support (135 × 0.4 = 54, not 5,000).
        let (n, contradicts) = proven_need(&demand(135.0, 45.0, 18.0, 5000.0), 18, 1.0);
        assert!((n[2] - 54.0).abs() < 1e-9 && contradicts, "{n:?}");
        // Established connections count only up to what it holds: 2 connections for 45
        // admissions a second, a hold of 44 ms, a need of 6. A claim can have fallen below
        // a mean of connections: not reported.
        let (n, contradicts) = proven_need(&demand(135.0, 45.0, 18.0, 54.0), 2, 1.0);
        assert!((n[2] - 6.0).abs() < 1e-9 && !contradicts, "{n:?}");
        // Long-lived connections (the hold of a connection pool), 2 held: 4 × 2 + 1.
        let (n, _) = proven_need(&demand(135.0, 0.5, 18.0, 54.0), 2, 1.0);
        assert!((n[2] - 9.0).abs() < 1e-9, "{n:?}");
        // Established connections below what it holds weigh in the hold, not in the cap:
        // a node granted 18 and holding 9 (its hold 200 ms) may ask for 4 × 18 + 1.
        let (n, _) = proven_need(&demand(900.0, 45.0, 9.0, 180.0), 18, 1.0);
        assert!((n[2] - 73.0).abs() < 1e-9, "{n:?}");
        // Ten times overloaded: weighed at four times what it holds, plus one.
        let (n, _) = proven_need(&demand(450.0, 45.0, 18.0, 180.0), 18, 1.0);
        assert!((n[2] - 73.0).abs() < 1e-9, "{n:?}");
        // The absurd record: a million attempts, a need of a billion, nothing held.
        let (n, capped) = proven_need(&demand(1e6, 0.0, 0.0, 1e9), 0, 1.0);
        assert!(
            (n.iter().sum::<f64>() - 1.0).abs() < 1e-9 && capped,
            "{n:?}"
        );
        // Scaled over the classes alike: their order is kept.
        let d = Demand {
            attempts: [10.0, 100.0, 0.0, 0.0],
            need: [4.0, 40.0, 0.0, 0.0],
            admitted: 10.0,
            established: 4.0,
            hold_ms: Some(400.0),
        };
        let (n, _) = proven_need(&d, 4, 1.0);
        assert!((n[0] - 17.0 / 11.0).abs() < 1e-9, "{n:?}");
        assert!((n[1] - 170.0 / 11.0).abs() < 1e-9, "{n:?}");
        // Admitting nothing: the fleet's hold, and still the cap.
        let (n, _) = proven_need(&demand(10.0, 0.0, 0.0, 10.0), 0, 0.4);
        assert!((n[2] - 1.0).abs() < 1e-9, "{n:?}");
    }

    #[test]
    fn a_claim_is_believed_unless_it_appears_above_what_a_daemon_could_claim() {
        // A new member within its share, at 0, or back claiming what was reserved for it.
        assert!(!suspect(None, 18, 18, 0, true));
        assert!(!suspect(None, 0, 2, 0, true));
        assert!(!suspect(None, 9, 5, 9, true), "back from a cut-off");
        // Appearing above its share and above any reservation: suspect.
        assert!(
            suspect(None, 54, 2, 0, true),
            "a record claiming the budget"
        );
        assert!(suspect(None, 9, 2, 0, true));
        assert!(
            suspect(None, 54, 5, 9, true),
            "back, claiming more than reserved"
        );
        // Until its claim fits its share; a believed member stays believed (a drain, a
        // raise, CRITICAL past the limit).
        assert!(suspect(Some(true), 54, 16, 0, true));
        assert!(!suspect(Some(true), 16, 16, 0, true));
        assert!(!suspect(Some(false), 37, 7, 0, true));
        // Where this node has no history the member could have been seen in, believed.
        assert!(!suspect(None, 54, 2, 0, false));
        // What counts and what is held.
        assert_eq!(counted_and_held(54, 2, true, None), (2, 0));
        assert_eq!(
            counted_and_held(54, 16, true, Some(2)),
            (2, 0),
            "never rising"
        );
        assert_eq!(counted_and_held(54, 1, true, Some(2)), (1, 0));
        assert_eq!(counted_and_held(37, 7, false, Some(2)), (37, 37));
    }

    #[test]
    fn the_proven_hold_needs_admissions_and_a_claim() {
        assert_eq!(proven_hold(&demand(10.0, 45.0, 18.0, 4.0), 18), Some(0.4));
        assert_eq!(proven_hold(&demand(10.0, 0.05, 18.0, 4.0), 18), None);
        assert_eq!(proven_hold(&demand(10.0, 45.0, 18.0, 4.0), 0), None);
        assert_eq!(
            proven_hold(&demand(10.0, 0.1, 1e6, 4.0), u32::MAX),
            Some(MAX_HOLD)
        );
    }
}
