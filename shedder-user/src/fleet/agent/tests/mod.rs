//! The fleet protocol without an etcd: a node's protocol and the state it shares with its
//! daemon, fed what etcd would answer, with the requests it returns checked. The fleet:
//! up to 6 nodes share `db` (`global_limit` 60, safety 0.9: a budget of 54; a static
//! share of 9), `lease_ttl_s` 3, `fail_static_ms` 1000, equal shares (which make every
//! share exact). This node is node-0.

mod demand;
mod departing;
mod hostile;
mod joining;
mod partition;

use std::time::{Duration, Instant};

use super::{
    local::Local,
    ops::{Event, Kv, Op, Txn, Watched},
    protocol::{Now, Protocol, encode},
};
use crate::{
    config::Fleet,
    fleet::{Cap, FleetState, Record, Report, SharedService, settings::Settings},
};

/// This node's lease, and the others'.
const LEASE: i64 = 100;
const THEIR_LEASE: i64 = 7;
/// The Unix clock when a test starts (ms).
const T0_MS: u64 = 1_700_000_000_000;

const MEMBERS: &str = "/shedder/members/";
const DEPARTED: &str = "/shedder/departed/";

fn db() -> SharedService {
    SharedService {
        name: "db".into(),
        global_limit: 60,
        max_limit: 100,
    }
}

/// A member's record as its daemon publishes it, claiming `claim` of db.
fn record(node: &str, claim: u32) -> Record {
    Record {
        node: node.into(),
        claims: [("db".to_string(), claim)].into(),
        global_limits: [("db".to_string(), 60)].into(),
        max_limits: [("db".to_string(), 100)].into(),
        pid: 1,
        version: "test".into(),
        ..Default::default()
    }
}

/// The record a put writes.
fn written(op: &Op) -> Record {
    match op {
        Op::Put { value, .. } => serde_json::from_slice(value).unwrap(),
        other => panic!("not a put: {other:?}"),
    }
}

/// db's claim in the record a put writes.
fn claim_put(op: &Op) -> u32 {
    written(op).claims["db"]
}

/// What a step asked of etcd.
#[derive(Debug, Default)]
struct Wrote {
    deletes: Vec<Op>,
    raise: Option<Txn>,
    put: Option<Op>,
}

/// One node: its protocol and the state it shares with its daemon, on a clock of its own.
struct Node {
    p: Protocol,
    local: Local,
    now: Now,
    settings: Settings,
}

impl Node {
    fn new(shares: &str) -> Self {
        let f: Fleet = toml::from_str(&format!(
            "endpoints = [\"http://198.18.0.21:2379\"]\nnode = \"node-0\"\nmax_nodes = 6\n\
             lease_ttl_s = 3\nfail_static_ms = 1000\nshares = \"{shares}\"\n"
        ))
        .unwrap();
        let settings = Settings::from_config(&f).unwrap();
        let now = Now {
            at: Instant::now(),
            unix_ms: T0_MS,
        };
        Self {
            p: Protocol::new(settings.clone()),
            local: Local::new(&f, &settings, vec![db()], now.at),
            now,
            settings,
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now.at += d;
        self.now.unix_ms += d.as_millis() as u64;
    }

    /// etcd answered (a renewal, a watch answer, a request).
    fn contact(&mut self) {
        self.local.contact(self.now.at);
    }

    /// The daemon's report of db: the limit in the kernel and the connections held.
    fn report(&mut self, applied: u32, established: u32) {
        let r = Report {
            applied,
            established,
            rates: None,
        };
        self.local.report("db", r, self.now.at);
    }

    /// A session as the driver runs it on a new lease, the registration answered as a
    /// first one, then the fleet's keys read at `revision` (this node's among them): the
    /// registration transaction.
    fn join(&mut self, others: &[Record], revision: i64) -> Txn {
        self.p.begin_session(&mut self.local, self.now.at);
        self.contact();
        if self.p.lease().is_none() {
            self.p.lease_granted(&mut self.local, LEASE);
        }
        self.p.lease_held(&mut self.local, LEASE);
        let (txn, record) = self.p.registration(&self.local, LEASE);
        self.p.published(record.clone(), self.now.at);
        let mut records = vec![(format!("{MEMBERS}node-0"), encode(&record), LEASE)];
        for r in others {
            records.push((
                format!("{MEMBERS}{}", r.node),
                serde_json::to_vec(r).unwrap(),
                THEIR_LEASE,
            ));
        }
        self.read(&records, revision);
        self.p.registered(&mut self.local, LEASE);
        txn
    }

    /// The fleet's keys as read at `revision`: (key, value, lease).
    fn read(&mut self, records: &[(String, Vec<u8>, i64)], revision: i64) {
        let kvs: Vec<Kv<'_>> = records
            .iter()
            .map(|(k, v, l)| Kv {
                key: k.as_bytes(),
                value: v,
                lease: *l,
            })
            .collect();
        self.p
            .read_all(&mut self.local, &kvs, revision, self.now.unix_ms);
    }

    /// A key put under the prefix, as the watch reports it at `revision`.
    fn put(&mut self, key: &str, value: &[u8], lease: i64, revision: i64) -> Watched {
        let kv = Kv {
            key: key.as_bytes(),
            value,
            lease,
        };
        let w = self
            .p
            .on_event(&mut self.local, Event::Put(kv), self.now.unix_ms)
            .unwrap();
        self.p.seen_revision(revision);
        w
    }

    /// Another member's record put, at `revision`.
    fn member(&mut self, r: &Record, revision: i64) -> Watched {
        let value = serde_json::to_vec(r).unwrap();
        self.put(
            &format!("{MEMBERS}{}", r.node),
            &value,
            THEIR_LEASE,
            revision,
        )
    }

    /// A key deleted under the prefix, as the watch reports it at `revision`.
    fn delete(&mut self, key: &str, revision: i64) -> anyhow::Result<Watched> {
        let event = Event::Delete(key.as_bytes());
        let w = self.p.on_event(&mut self.local, event, self.now.unix_ms)?;
        self.p.seen_revision(revision);
        Ok(w)
    }

    /// A step as the driver runs it, the raise (if any) answered `raise_ok` and every
    /// other request succeeding: what it asked of etcd.
    fn step(&mut self, raise_ok: bool) -> Wrote {
        let mut wrote = Wrote::default();
        while let Some(delete) = self.p.next_expired(self.now.unix_ms) {
            wrote.deletes.push(delete);
        }
        let mut step = self.p.plan(&mut self.local, LEASE, self.now);
        wrote.raise = step.raise.take();
        if wrote.raise.is_some() {
            self.p
                .raised(&mut self.local, &mut step, raise_ok, self.now.at);
        }
        if let Some((put, record)) = self.p.publication(&self.local, &step, LEASE, self.now.at) {
            self.p.published(record, self.now.at);
            wrote.put = Some(put);
        }
        self.p.report(&mut self.local, step);
        wrote
    }

    /// The ceiling the protocol holds for db.
    fn ceiling(&self) -> u32 {
        self.local.ceilings.get("db").copied().unwrap_or(0)
    }

    /// What the daemon applies for db now.
    fn cap(&self) -> Cap {
        self.local.cap(&self.settings, "db", self.now.at).unwrap()
    }

    /// What `shedder status` shows now.
    fn state(&self) -> FleetState {
        self.local.state(&self.settings, self.now.at)
    }

    /// db's target, and the other members' claims as counted, in the last step's view.
    fn target_and_others(&self) -> (u32, u32) {
        let s = &self.local.state.services[0];
        (s.target, s.others)
    }
}

/// node-0 a member at 18 beside node-1 and node-2 at 18 (revision 10), the daemon's
/// kernel at 18 with 12 connections held.
fn three_at_18() -> Node {
    let mut n = Node::new("equal");
    n.join(&[record("node-1", 18), record("node-2", 18)], 10);
    let wrote = n.step(true);
    assert_eq!(
        wrote.raise.as_ref().map(|t| claim_put(&t.then[0])),
        Some(18)
    );
    n.report(18, 12);
    assert_eq!(n.ceiling(), 18);
    n
}
