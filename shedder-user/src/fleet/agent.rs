//! The etcd agent (a task on the side-I/O runtime) and the daemon's handle on it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use tracing::{info, warn};

use crate::config::{Fleet, Shares};

use super::{
    Cap, Demand, Departed, FleetState, Record, Report, ServiceShare, SharedService, Smoother,
    budget, claim, next_ceiling, next_ceiling_by_demand,
    records::unix_ms,
    settings::{Settings, brief},
    static_share,
    trust::{self, Field},
    view::{self, Seen},
};

struct Shared {
    services: Vec<SharedService>,
    reports: BTreeMap<String, Report>,
    /// Per service, the moving means of this node's demand and when they last moved.
    demand: BTreeMap<String, (Smoother, Instant)>,
    ceilings: BTreeMap<String, u32>,
    last_ok: Option<Instant>,
    started: Instant,
    state: FleetState,
}

impl Shared {
    /// Whether etcd has not answered for longer than `fail_static` (since the start when it
    /// never has).
    fn cut_off(&self, fail_static: Duration) -> bool {
        self.last_ok.unwrap_or(self.started).elapsed() > fail_static
    }
}

/// The daemon's handle on the fleet agent.
pub struct Handle {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    /// Answers (or closes) once the agent has left the fleet.
    done: std::sync::mpsc::Receiver<()>,
    settings: Settings,
}

impl Handle {
    /// Start the fleet thread. It never fails for want of etcd: an unreachable etcd is
    /// reported and retried, and the node holds a ceiling of 0, then its static share.
    pub fn start(f: &Fleet, services: Vec<SharedService>) -> Result<Self> {
        let settings = Settings::from_config(f)?;
        let shared = Arc::new(Mutex::new(Shared {
            services,
            reports: BTreeMap::new(),
            demand: BTreeMap::new(),
            ceilings: BTreeMap::new(),
            last_ok: None,
            started: Instant::now(),
            state: FleetState {
                node: settings.node.clone(),
                prefix: f.prefix.clone(),
                endpoints: settings.endpoints.clone(),
                standing: "joining".into(),
                lease_ttl_s: f.lease_ttl_s,
                ..Default::default()
            },
        }));
        let stop = Arc::new(AtomicBool::new(false));
        // The agent is a task on the side-I/O runtime; `done` says when it has left.
        let (finished, done) = std::sync::mpsc::channel();
        let agent = Agent {
            shared: shared.clone(),
            stop: stop.clone(),
            s: settings.clone(),
            view: View::default(),
        };
        crate::runtime::handle().spawn(async move {
            agent.run().await;
            let _ = finished.send(());
        });
        info!(node = %settings.node, endpoints = ?settings.endpoints, key = %settings.key, "fleet mode: registering with etcd");
        Ok(Self {
            shared,
            stop,
            done,
            settings,
        })
    }

    /// The services the fleet shares (after a reload).
    pub fn set_services(&self, services: Vec<SharedService>) {
        if let Ok(mut sh) = self.shared.lock() {
            sh.ceilings
                .retain(|name, _| services.iter().any(|s| &s.name == name));
            sh.demand
                .retain(|name, _| services.iter().any(|s| &s.name == name));
            sh.services = services;
        }
    }

    /// This tick's limit, occupancy and demand of a shared service.
    pub fn report(&self, service: &str, report: Report) {
        if let Ok(mut sh) = self.shared.lock() {
            if let Some((attempts, admitted)) = report.rates {
                let now = Instant::now();
                let (smoother, last) = sh
                    .demand
                    .entry(service.to_string())
                    .or_insert_with(|| (Smoother::default(), now));
                smoother.update(now - *last, attempts, admitted, report.established);
                *last = now;
            }
            sh.reports.insert(service.to_string(), report);
        }
    }

    /// The ceiling in force for a shared service and its static share (`None`: not
    /// shared). Without an answer from etcd for longer than `fail_static` (since the start,
    /// or since the last answer) the ceiling is the static share, whatever the fleet thread
    /// is doing.
    pub fn cap(&self, service: &str) -> Option<Cap> {
        let sh = self.shared.lock().ok()?;
        let svc = sh.services.iter().find(|s| s.name == service)?;
        let static_share = self.settings.static_share(svc);
        let ceiling = if sh.cut_off(self.settings.fail_static) {
            static_share
        } else {
            sh.ceilings.get(service).copied().unwrap_or(0)
        };
        Some(Cap {
            ceiling,
            static_share,
            budget: budget(svc.global_limit, self.settings.safety),
        })
    }

    pub fn state(&self) -> FleetState {
        let Ok(sh) = self.shared.lock() else {
            return FleetState::default();
        };
        let mut st = sh.state.clone();
        st.etcd_last_contact_s = sh.last_ok.map(|t| t.elapsed().as_secs_f64());
        let cut_off = sh.cut_off(self.settings.fail_static);
        if cut_off {
            st.standing = "static".into();
        } else if st.standing == "member" && !st.etcd_up {
            st.standing = "fail-static".into();
        }
        if st.services.is_empty() {
            st.services = sh
                .services
                .iter()
                .map(|svc| ServiceShare {
                    service: svc.name.clone(),
                    global_limit: svc.global_limit,
                    budget: budget(svc.global_limit, self.settings.safety),
                    static_share: self.settings.static_share(svc),
                    ..Default::default()
                })
                .collect();
        }
        for s in &mut st.services {
            s.ceiling = if cut_off {
                s.static_share
            } else {
                sh.ceilings.get(&s.service).copied().unwrap_or(0)
            };
        }
        st
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Leaving is bounded by the etcd timeout; this waits for it, as a join would.
        let _ = self.done.recv();
    }
}

/// The members this node knows of, and the etcd revision of that view.
#[derive(Default)]
struct View {
    /// Members' records as checked by `trust::member` (a record that fails the check leaves
    /// the member's last good one in place).
    members: BTreeMap<String, Record>,
    departed: BTreeMap<String, Seen>,
    revision: i64,
    lease: Option<i64>,
    published: Option<Record>,
    last_put: Option<Instant>,
    /// This node's demand as it publishes it, and when it last changed.
    demand: BTreeMap<String, Demand>,
    demand_changed: Option<Instant>,
    /// Per service, what each other member's claim counts and holds (`view::Standing`).
    /// Kept across sessions: a member seen before is not new after a reconnect.
    standings: BTreeMap<String, BTreeMap<String, view::Standing>>,
    /// Where this node's view stands in its history with etcd (`view::Phase`).
    phase: view::Phase,
    /// Members back from a departure since the last step, with their departed records
    /// (deleted by their registration): what was reserved for them counts as theirs.
    returned: BTreeMap<String, Departed>,
    /// (member, field) found out of bounds in the member's current record: counted once
    /// per record published.
    noted: BTreeSet<(String, Field)>,
    /// What was logged already: rejections by key and error, findings by member and
    /// field, disagreements by service, member and value; once each.
    logged: BTreeSet<String>,
}

struct Agent {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    s: Settings,
    view: View,
}

/// How often the fleet thread recomputes its ceilings.
const STEP: Duration = Duration::from_millis(100);
/// Claims that change only because occupancy moved (connections draining after a lowering)
/// are published at most this often; a changed ceiling is published at once.
const CLAIM_REFRESH: Duration = Duration::from_millis(250);
/// A node's demand is published again when it has moved (see [`Demand::moved_from`]), at
/// most this often; any change at all is published after [`DEMAND_STALE`].
const DEMAND_REFRESH: Duration = Duration::from_millis(500);
const DEMAND_STALE: Duration = Duration::from_secs(5);

impl Agent {
    async fn run(mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            let result = self.session().await;
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = result {
                self.failed(&e);
            }
            self.note_state(|st| st.etcd_up = false);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.leave().await;
    }

    fn failed(&self, e: &anyhow::Error) {
        let msg = format!("{e:#}");
        let mut first = false;
        if let Ok(mut sh) = self.shared.lock() {
            first = sh.state.last_error.as_deref() != Some(&msg);
            sh.state.etcd_errors += 1;
            sh.state.etcd_up = false;
            sh.state.last_error = Some(msg.clone());
        }
        if first {
            warn!(error = %msg, "fleet: etcd");
        }
    }

    fn note_state(&self, f: impl FnOnce(&mut FleetState)) {
        if let Ok(mut sh) = self.shared.lock() {
            f(&mut sh.state);
        }
    }

    fn contact(&self) {
        if let Ok(mut sh) = self.shared.lock() {
            sh.last_ok = Some(Instant::now());
            sh.state.etcd_up = true;
        }
    }

    /// Put every ceiling at the static share: at most that (`at_most`), or exactly that
    /// (a node coming back from a cut-off, where it has been holding it).
    fn cap_at_static(&self, at_most: bool) {
        if let Ok(mut sh) = self.shared.lock() {
            let statics: Vec<(String, u32)> = sh
                .services
                .iter()
                .map(|svc| (svc.name.clone(), self.s.static_share(svc)))
                .collect();
            for (name, st) in statics {
                let c = sh.ceilings.entry(name).or_insert(0);
                *c = if at_most { (*c).min(st) } else { st };
            }
        }
    }

    /// An etcd request under the timeout; an answer counts as contact.
    async fn timed<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let v = self.bounded(what, f).await?;
        self.contact();
        Ok(v)
    }

    /// A step under the timeout that need not reach etcd (connecting is lazy): no contact.
    async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.s.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(anyhow!("{what}: {}", brief(&e))),
            Err(_) => Err(anyhow!(
                "{what}: no answer within {} ms",
                self.s.timeout.as_millis()
            )),
        }
    }

    /// Revoke the lease on the way out, so the others' ceilings rise at once; the whole
    /// exchange is bounded by one etcd timeout, so a daemon stopping without etcd does not
    /// wait long (its lease then expires, and the others reserve its static share).
    async fn leave(&mut self) {
        let Some(lease) = self.view.lease.take() else {
            return;
        };
        let exchange = async {
            let mut c =
                etcd_client::Client::connect(&self.s.endpoints, Some(self.s.connect_options()))
                    .await?;
            // Say this node is leaving before its key goes, so that nobody reserves its
            // static share.
            let mut record = self.record(BTreeMap::new());
            record.leaving = true;
            let value = serde_json::to_vec(&record).unwrap_or_default();
            c.put(
                self.s.key.clone(),
                value,
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await?;
            c.lease_revoke(lease).await?;
            Ok::<(), etcd_client::Error>(())
        };
        match tokio::time::timeout(self.s.timeout, exchange).await {
            Ok(Ok(())) => info!(node = %self.s.node, "fleet: left (lease revoked)"),
            Ok(Err(e)) => {
                warn!(node = %self.s.node, error = %brief(&e), "fleet: could not leave cleanly; the others see this node's lease expire and keep its static share reserved")
            }
            Err(_) => {
                warn!(node = %self.s.node, "fleet: etcd did not answer the leave in time; the others see this node's lease expire and keep its static share reserved")
            }
        }
    }

    /// One connection to etcd: register, watch the members, keep the lease alive and keep
    /// the ceilings; returns on the first error (the caller reconnects).
    async fn session(&mut self) -> Result<()> {
        // Cut off for longer than fail_static, this node has been holding its static
        // shares: it comes back from those.
        let was_cut_off = self
            .shared
            .lock()
            .map(|sh| sh.cut_off(self.s.fail_static))
            .unwrap_or(false);
        // Whether its lease survived or not, it comes back from the static shares it has
        // been holding, before anything from etcd counts as contact (and ends the cut-off):
        // the ceilings above those are raised again through transactions like any other.
        if was_cut_off {
            self.cap_at_static(false);
        }
        let mut client = self
            .bounded(
                "connecting",
                etcd_client::Client::connect(&self.s.endpoints, Some(self.s.connect_options())),
            )
            .await?;
        // A lease still alive from before a reconnect is kept (its key is ours).
        if let Some(id) = self.view.lease {
            let alive = self
                .timed("checking the lease", client.lease_time_to_live(id, None))
                .await?;
            if alive.ttl() <= 0 {
                self.view.lease = None;
                warn!(node = %self.s.node, "fleet: the lease expired while etcd was unreachable; registering again");
            }
        }
        let lease = match self.view.lease {
            Some(id) => id,
            None => {
                let g = self
                    .timed(
                        "granting a lease",
                        client.lease_grant(self.s.lease_ttl.as_secs() as i64, None),
                    )
                    .await?;
                self.view.lease = Some(g.id());
                self.view.published = None;
                // A new lease: whatever this node claimed before is gone from etcd (the
                // others may hold it now). It starts again from at most its static share.
                self.cap_at_static(true);
                g.id()
            }
        };
        self.note_state(|st| st.lease_id = Some(lease));
        self.register(&mut client, lease).await?;
        let got = self
            .timed(
                "reading the members",
                client.get(
                    self.s.fleet_prefix.clone(),
                    Some(etcd_client::GetOptions::new().with_prefix()),
                ),
            )
            .await?;
        // Departed records keep when this node first read them (see `Seen`), and members
        // their standings, across a reconnect; what is gone from etcd is gone here.
        self.view.members.clear();
        let present: BTreeSet<String> = got
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).to_string())
            .collect();
        let departed_prefix = self.s.departed_prefix.clone();
        self.view
            .departed
            .retain(|node, _| present.contains(&format!("{departed_prefix}{node}")));
        for kv in got.kvs() {
            self.apply_put(kv.key(), kv.value(), kv.lease());
        }
        let members: Vec<String> = self.view.members.keys().cloned().collect();
        for a in self.view.standings.values_mut() {
            a.retain(|node, _| members.contains(node));
        }
        // A member whose claim moved while this node could not see it may have raised
        // meanwhile: the first view of this session takes it as published.
        if self.view.phase == view::Phase::Steady {
            self.view.phase = view::Phase::Reconnect;
        }
        self.view.revision = got.header().map_or(0, |h| h.revision());
        let mut watch = self
            .timed(
                "watching the members",
                client.watch(
                    self.s.fleet_prefix.clone(),
                    Some(
                        etcd_client::WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(self.view.revision + 1),
                    ),
                ),
            )
            .await?;
        let (mut keeper, mut kept) = self
            .timed("keeping the lease alive", client.lease_keep_alive(lease))
            .await?;
        self.note_state(|st| {
            st.standing = "member".into();
            st.last_error = None;
        });
        info!(node = %self.s.node, lease, members = self.view.members.len(), "fleet: registered");
        // Renewals are also how this node knows etcd still answers: often enough that
        // fail_static counts from less than a quarter of it after the last answer.
        let mut renew = tokio::time::interval((self.s.lease_ttl / 4).min(self.s.fail_static / 4));
        let mut step = tokio::time::interval(STEP);
        let mut last_renewal = Instant::now();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            tokio::select! {
                _ = renew.tick() => {
                    keeper.keep_alive().await.map_err(|e| anyhow!("renewing the lease: {}", brief(&e)))?;
                }
                m = kept.message() => match m {
                    Ok(Some(r)) if r.ttl() > 0 => {
                        self.contact();
                        last_renewal = Instant::now();
                    }
                    Ok(Some(_)) => {
                        self.view.lease = None;
                        bail!("the lease expired (etcd did not hear from this node for {} s)", self.s.lease_ttl.as_secs());
                    }
                    Ok(None) => bail!("etcd closed the lease keep-alive stream"),
                    Err(e) => bail!("lease keep-alive: {}", brief(&e)),
                },
                m = watch.message() => match m {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            bail!("etcd cancelled the watch: {}", resp.cancel_reason());
                        }
                        self.contact();
                        // A member gone, or its share reserved: room to raise into.
                        let mut room = false;
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            match ev.event_type() {
                                etcd_client::EventType::Put => {
                                    room |= kv.key().starts_with(self.s.departed_prefix.as_bytes());
                                    self.apply_put(kv.key(), kv.value(), kv.lease());
                                }
                                etcd_client::EventType::Delete => {
                                    room = true;
                                    let key = String::from_utf8_lossy(kv.key()).to_string();
                                    if key == self.s.key {
                                        bail!("this node's key was deleted (its lease expired or an operator removed it)");
                                    }
                                    if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
                                        // Deleted by the member's registration: it is back,
                                        // holding what was reserved for it.
                                        if let Some(seen) = self.view.departed.remove(node)
                                            && self.view.members.contains_key(node)
                                        {
                                            self.view.returned.insert(node.to_string(), seen.record);
                                        }
                                        self.forget_findings(node);
                                        self.forget_findings("*");
                                    } else if let Some(node) = key.strip_prefix(&self.s.members_prefix)
                                        && let Some(last) = self.view.members.remove(node)
                                    {
                                        self.forget_findings(node);
                                        for a in self.view.standings.values_mut() {
                                            a.remove(node);
                                        }
                                        self.member_left(&mut client, node, &last).await?;
                                    }
                                }
                            }
                        }
                        if let Some(h) = resp.header() {
                            self.view.revision = self.view.revision.max(h.revision());
                        }
                        // Raise into the room now rather than at the next step: every
                        // step saved counts against the lease TTL the others' shares must
                        // rise within.
                        if room {
                            self.step(&mut client, lease).await?;
                        }
                    }
                    Ok(None) => bail!("etcd closed the watch stream"),
                    Err(e) => bail!("watch: {}", brief(&e)),
                },
                _ = step.tick() => {
                    if last_renewal.elapsed() > self.s.lease_ttl / 2 {
                        bail!("no lease renewal answered for {} ms", last_renewal.elapsed().as_millis());
                    }
                    self.step(&mut client, lease).await?;
                }
            }
        }
    }

    /// A member's key is gone. Left cleanly: nothing to do. Its lease expired: it may be
    /// dead or alive and cut off, holding its static share; keep that free for it (locally
    /// at once, and in etcd for every other node, including any that starts later).
    async fn member_left(
        &mut self,
        client: &mut etcd_client::Client,
        node: &str,
        last: &Record,
    ) -> Result<()> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        if last.leaving {
            info!(node, "fleet: member left");
            return Ok(());
        }
        // Its static share as this node's configuration has it (the budget is this node's,
        // whatever the member published), for the services both share.
        let services = self
            .shared
            .lock()
            .map(|sh| sh.services.clone())
            .unwrap_or_default();
        let reserves: BTreeMap<String, u32> = services
            .iter()
            .filter(|svc| last.claims.contains_key(&svc.name))
            .map(|svc| {
                let b = budget(svc.global_limit, self.s.safety);
                (
                    svc.name.clone(),
                    static_share(b, self.s.max_nodes, u32::MAX),
                )
            })
            .collect();
        let d = Departed {
            node: node.to_string(),
            reserves,
            since_unix_ms: unix_ms(),
        };
        info!(node, reserves = ?d.reserves, "fleet: member lost (its lease expired): its static share stays reserved until it registers again");
        let key = format!("{}{node}", self.s.departed_prefix);
        let value = serde_json::to_vec(&d)?;
        let first_seen_unix_ms = d.since_unix_ms;
        self.view.departed.insert(
            node.to_string(),
            Seen {
                record: d,
                first_seen_unix_ms,
            },
        );
        // Only while it has not registered again (a late event must not reserve for a node
        // that is back).
        let member_key = format!("{}{node}", self.s.members_prefix);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Compare::create_revision(member_key, CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(key, value, None)]);
        self.timed("reserving a departed member's share", client.txn(txn))
            .await?;
        Ok(())
    }

    /// A record put under the prefix: checked (`trust`), then in the view. A record that
    /// fails the check is ignored whole, and a member's last good record stays in force.
    fn apply_put(&mut self, key: &[u8], value: &[u8], lease: i64) {
        let key = String::from_utf8_lossy(key).to_string();
        if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
            self.forget_findings(node);
            self.forget_findings("*");
            match trust::departed(node, value) {
                Ok((d, found)) => {
                    self.clamped(node, &found);
                    let first_seen_unix_ms = self
                        .view
                        .departed
                        .get(node)
                        .map_or_else(unix_ms, |s| s.first_seen_unix_ms);
                    self.view.departed.insert(
                        node.to_string(),
                        Seen {
                            record: d,
                            first_seen_unix_ms,
                        },
                    );
                }
                Err(e) => self.rejected("departed", &key, &e),
            }
            return;
        }
        let Some(node) = key.strip_prefix(&self.s.members_prefix) else {
            return;
        };
        self.forget_findings(node);
        match trust::member(node, value, lease) {
            Ok((r, found)) => {
                self.clamped(node, &found);
                if !self.view.members.contains_key(node) && node != self.s.node {
                    info!(node, "fleet: member joined");
                }
                self.view.members.insert(node.to_string(), r);
            }
            Err(e) => self.rejected("member", &key, &e),
        }
    }

    /// A member's new record (or its key gone): what was found in the old one is counted
    /// again if the new one has it too.
    fn forget_findings(&mut self, node: &str) {
        self.view.noted.retain(|(n, _)| n != node);
    }

    /// A record ignored whole: counted, logged once per key and error.
    fn rejected(&mut self, kind: &str, key: &str, e: &trust::Rejected) {
        if let Ok(mut sh) = self.shared.lock() {
            *sh.state.rejected.entry(kind.to_string()).or_default() += 1;
        }
        if self.view.logged.insert(format!("rejected {key} {e}")) {
            warn!(key, error = %e, "fleet: ignoring a {kind} record");
        }
    }

    /// Values of `node`'s current record not believed as published: counted once per
    /// record, logged once per member and field.
    fn clamped(&mut self, node: &str, found: &[Field]) {
        for f in found {
            if !self.view.noted.insert((node.to_string(), *f)) {
                continue;
            }
            if let Ok(mut sh) = self.shared.lock() {
                *sh.state.clamped.entry(f.as_str().to_string()).or_default() += 1;
            }
            if self.view.logged.insert(format!("clamped {node} {f}")) {
                let what = match f {
                    Field::Claim => {
                        "a claim above the budget, or above any it could have been granted"
                    }
                    Field::Need => "a need its own figures or its connections do not support",
                    Field::Reserve => "a departed reserve above the static share",
                    Field::Reserved => "departed reserves above what the missing nodes can hold",
                    Field::Since => "a departed record dated in the future",
                    _ => "a value out of range",
                };
                warn!(node, field = %f, "fleet: a record holds {what}; counting it within bounds");
            }
        }
    }

    /// Create this node's key, or take back the one its lease already holds.
    async fn register(&mut self, client: &mut etcd_client::Client, lease: i64) -> Result<()> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let record = self.record(self.claims());
        let value = serde_json::to_vec(&record)?;
        let key = self.s.key.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                // Back: nothing needs reserving for this node any more.
                TxnOp::delete(self.s.departed_key.clone(), None),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let r = self.timed("registering", client.txn(txn)).await?;
        if !r.succeeded() {
            let holder = r.op_responses().into_iter().find_map(|op| match op {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
                _ => None,
            });
            if holder != Some(lease) {
                bail!(
                    "`{key}` is held by another live lease ({holder:?}): another daemon registered as node `{}`, \
                     or this node's previous daemon whose lease has not expired yet (it does within {} s)",
                    self.s.node,
                    self.s.lease_ttl.as_secs()
                );
            }
            self.timed(
                "re-registering",
                client.put(key, value, Some(PutOptions::new().with_lease(lease))),
            )
            .await?;
        }
        self.view.published = Some(record);
        self.view.last_put = Some(Instant::now());
        Ok(())
    }

    fn record(&self, claims: BTreeMap<String, u32>) -> Record {
        let (global_limits, max_limits) = self
            .shared
            .lock()
            .map(|sh| {
                (
                    sh.services
                        .iter()
                        .map(|s| (s.name.clone(), s.global_limit))
                        .collect(),
                    sh.services
                        .iter()
                        .map(|s| (s.name.clone(), s.max_limit))
                        .collect(),
                )
            })
            .unwrap_or_default();
        Record {
            node: self.s.node.clone(),
            claims,
            global_limits,
            demand: self.view.demand.clone(),
            max_limits,
            leaving: false,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// This node's claims from its ceilings and the daemon's reports.
    fn claims(&self) -> BTreeMap<String, u32> {
        let Ok(sh) = self.shared.lock() else {
            return BTreeMap::new();
        };
        sh.services
            .iter()
            .map(|s| {
                let r = sh.reports.get(&s.name).copied().unwrap_or_default();
                let c = sh.ceilings.get(&s.name).copied().unwrap_or(0);
                (s.name.clone(), claim(c, r.applied, r.established))
            })
            .collect()
    }

    /// Recompute every shared service's ceiling; lower at once, raise through a transaction;
    /// publish the claims when they change.
    async fn step(&mut self, client: &mut etcd_client::Client, lease: i64) -> Result<()> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let (services, mut ceilings) = match self.shared.lock() {
            Ok(sh) => (sh.services.clone(), sh.ceilings.clone()),
            Err(_) => return Ok(()),
        };
        // Departed members: reserved until they register again or reserve_departed passes
        // (then the key is removed); a key naming this node is stale (it is registered).
        let now_ms = unix_ms();
        let reserve_ms = self.s.reserve_departed.as_millis() as u64;
        let expired: Vec<String> = self
            .view
            .departed
            .iter()
            .filter(|(n, d)| **n == self.s.node || d.expired(now_ms, reserve_ms))
            .map(|(n, _)| n.clone())
            .collect();
        for n in expired {
            if n != self.s.node {
                info!(node = %n, "fleet: no longer reserving for a departed member (fleet.reserve_departed_s passed)");
            }
            self.view.departed.remove(&n);
            self.timed(
                "removing a departed record",
                client.delete(format!("{}{n}", self.s.departed_prefix), None),
            )
            .await?;
        }
        self.refresh_demand(&services);
        let settings = view::Settings {
            node: &self.s.node,
            safety: self.s.safety,
            max_nodes: self.s.max_nodes,
            shares: self.s.shares,
            reserve_departed_ms: reserve_ms,
        };
        let mut raises = BTreeMap::new();
        let mut lowered = false;
        let mut shares = Vec::new();
        let mut findings = Vec::new();
        for svc in &services {
            let empty = BTreeMap::new();
            let o = view::service(
                &settings,
                svc,
                &self.view.members,
                &self.view.departed,
                self.view.standings.get(&svc.name).unwrap_or(&empty),
                &self.view.returned,
                self.view.phase,
                now_ms,
            );
            for (node, g) in &o.disagreeing {
                if self
                    .view
                    .logged
                    .insert(format!("global_limit {} {node} {g}", svc.name))
                {
                    warn!(
                        service = %svc.name,
                        node = %node,
                        configured = svc.global_limit,
                        theirs = g,
                        "fleet: another member publishes another global_limit for this service; \
                         this node keeps its own (make the fleet's configurations agree)"
                    );
                }
            }
            findings.extend(o.findings.iter().cloned());
            self.view.standings.insert(svc.name.clone(), o.standings);
            let current = ceilings.get(&svc.name).copied().unwrap_or(0);
            let (next, raise) = match self.s.shares {
                Shares::Demand => next_ceiling_by_demand(current, o.target, o.room),
                Shares::Equal => next_ceiling(current, o.target, o.room),
            };
            if raise {
                raises.insert(svc.name.clone(), next);
            } else if next != current {
                info!(service = %svc.name, from = current, to = next, members = o.share.members, "fleet: ceiling lowered");
                ceilings.insert(svc.name.clone(), next);
                lowered = true;
            }
            shares.push(o.share);
        }
        self.view.phase = view::Phase::Steady;
        self.view.returned.clear();
        for (node, f) in findings {
            self.clamped(&node, &[f]);
        }
        if let Ok(mut sh) = self.shared.lock() {
            sh.ceilings = ceilings.clone();
        }
        let mut claims = self.claims();
        if !raises.is_empty() {
            for (name, c) in &raises {
                let e = claims.entry(name.clone()).or_default();
                *e = (*e).max(*c);
            }
            let value = serde_json::to_vec(&self.record(claims.clone()))?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    self.s.fleet_prefix.clone(),
                    CompareOp::Less,
                    self.view.revision + 1,
                )
                .with_prefix()])
                .and_then([TxnOp::put(
                    self.s.key.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let r = self.timed("raising a ceiling", client.txn(txn)).await?;
            if r.succeeded() {
                if let Ok(mut sh) = self.shared.lock() {
                    for (name, c) in &raises {
                        info!(service = %name, from = sh.ceilings.get(name).copied().unwrap_or(0), to = c, "fleet: ceiling raised");
                        sh.ceilings.insert(name.clone(), *c);
                    }
                }
                self.view.published = Some(self.record(claims.clone()));
                self.view.last_put = Some(Instant::now());
            } else {
                // Another member changed since this view: the watch brings the change and
                // the next step computes again. Undo the raises in the claims to publish.
                claims = self.claims();
            }
        }
        let published = self.view.published.as_ref().map(|r| (&r.claims, &r.demand));
        if published != Some((&claims, &self.view.demand)) {
            let due = self
                .view
                .last_put
                .is_none_or(|t| t.elapsed() >= CLAIM_REFRESH);
            if lowered || due {
                let record = self.record(claims.clone());
                self.timed(
                    "publishing the claims",
                    client.put(
                        self.s.key.clone(),
                        serde_json::to_vec(&record)?,
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                )
                .await?;
                self.view.published = Some(record);
                self.view.last_put = Some(Instant::now());
            }
        }
        let published = self.view.published.clone().unwrap_or_default();
        let members: Vec<String> = self.view.members.keys().cloned().collect();
        let departed: Vec<String> = self.view.departed.keys().cloned().collect();
        if let Ok(mut sh) = self.shared.lock() {
            sh.state.departed = departed;
            for s in &mut shares {
                s.claim = published.claims.get(&s.service).copied().unwrap_or(0);
            }
            sh.state.services = shares;
            sh.state.members = members;
        }
        Ok(())
    }
    /// Take this node's demand to publish from the moving means: when it has moved enough
    /// and [`DEMAND_REFRESH`] has passed, or when it differs at all after [`DEMAND_STALE`].
    /// A node that has admitted nothing yet computes its need with the median hold the
    /// other members publish.
    fn refresh_demand(&mut self, services: &[SharedService]) {
        let due = |after| {
            self.view
                .demand_changed
                .is_none_or(|t| t.elapsed() >= after)
        };
        let (moved_due, stale_due) = (due(DEMAND_REFRESH), due(DEMAND_STALE));
        let Ok(sh) = self.shared.lock() else { return };
        let mut changed = false;
        for svc in services {
            let Some((smoother, _)) = sh.demand.get(&svc.name) else {
                continue;
            };
            // The median of the holds the others proved (a hold a record merely states
            // could be anything).
            // A suspect member holds nothing its hold could be measured by.
            let held: BTreeMap<String, u32> = self
                .view
                .standings
                .get(&svc.name)
                .into_iter()
                .flatten()
                .filter(|(_, st)| st.suspect)
                .map(|(n, _)| (n.clone(), 0))
                .collect();
            let fallback = Duration::from_secs_f64(view::fleet_hold(
                &self.view.members,
                &svc.name,
                &self.s.node,
                &held,
            ));
            let now = smoother.demand(fallback).rounded();
            let publish = match self.view.demand.get(&svc.name) {
                None => true,
                Some(p) => (moved_due && now.moved_from(p)) || (stale_due && now != *p),
            };
            if publish {
                self.view.demand.insert(svc.name.clone(), now);
                changed = true;
            }
        }
        drop(sh);
        self.view
            .demand
            .retain(|name, _| services.iter().any(|s| &s.name == name));
        if changed {
            self.view.demand_changed = Some(Instant::now());
        }
    }
}
