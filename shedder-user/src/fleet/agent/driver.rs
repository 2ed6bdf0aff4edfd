//! The agent's etcd driver, a task on the side-I/O runtime: it connects, performs what the
//! protocol asks ([`ops`](super::ops)) under the etcd timeout, feeds the protocol what
//! etcd answers and watches, keeps the lease alive, and reconnects after any error. What
//! to write, and what an answer means, is the protocol's.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use etcd_client::{
    Client, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, WatchOptions, WatchResponse,
    WatchStream,
};
use tracing::{info, warn};

use super::{
    etcd,
    local::Local,
    ops::{Event, Op, Txn, TxnAnswer},
    protocol::{Now, Protocol},
};
use crate::fleet::{records::unix_ms, settings::brief};

/// How often the agent recomputes its ceilings.
const STEP: Duration = Duration::from_millis(100);

pub(super) struct Agent {
    local: Arc<Mutex<Local>>,
    stop: Arc<AtomicBool>,
    core: Protocol,
}

impl Agent {
    pub(super) fn new(local: Arc<Mutex<Local>>, stop: Arc<AtomicBool>, core: Protocol) -> Self {
        Self { local, stop, core }
    }

    /// Sessions with etcd until the daemon stops, then the leave.
    pub(super) async fn run(mut self) {
        while !self.stopping() {
            let result = self.session().await;
            if self.stopping() {
                break;
            }
            if let Err(e) = result {
                let msg = format!("{e:#}");
                if self.local().failed(&msg) {
                    warn!(error = %msg, "fleet: etcd");
                }
            }
            self.local().state.etcd_up = false;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.leave().await;
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The state shared with the daemon. Its holders never leave it half-written, so one
    /// that panicked leaves it usable.
    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The protocol with the state shared with the daemon.
    fn with_local<T>(&mut self, f: impl FnOnce(&mut Protocol, &mut Local) -> T) -> T {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut self.core, &mut local)
    }

    /// An etcd request under the timeout; an answer counts as contact.
    async fn timed<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let v = self.bounded(what, f).await?;
        self.local().contact(Instant::now());
        Ok(v)
    }

    /// A step under the timeout that need not reach etcd (connecting is lazy): no contact.
    async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let timeout = self.core.s.timeout;
        match tokio::time::timeout(timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(anyhow!("{what}: {}", brief(&e))),
            Err(_) => Err(anyhow!(
                "{what}: no answer within {} ms",
                timeout.as_millis()
            )),
        }
    }

    async fn perform(&self, client: &mut Client, what: &str, op: Op) -> Result<()> {
        self.timed(what, etcd::perform(client, op)).await
    }

    async fn txn(&self, client: &mut Client, what: &str, txn: Txn) -> Result<TxnAnswer> {
        let r = self.timed(what, client.txn(etcd::txn(txn))).await?;
        Ok(etcd::answer(&r))
    }

    /// Revoke the lease on the way out, so the others' ceilings rise at once; the whole
    /// exchange is bounded by one etcd timeout, so a daemon stopping without etcd does not
    /// wait long (its lease then expires, and the others reserve its static share).
    async fn leave(&mut self) {
        let Some((lease, put)) = self.with_local(|p, l| p.leaving(l)) else {
            return;
        };
        let s = &self.core.s;
        let exchange = async {
            let mut c = Client::connect(&s.endpoints, Some(s.connect_options())).await?;
            etcd::perform(&mut c, put).await?;
            c.lease_revoke(lease).await?;
            Ok::<(), etcd_client::Error>(())
        };
        match tokio::time::timeout(s.timeout, exchange).await {
            Ok(Ok(())) => info!(node = %s.node, "fleet: left (lease revoked)"),
            Ok(Err(e)) => {
                warn!(node = %s.node, error = %brief(&e), "fleet: could not leave cleanly; the others see this node's lease expire and keep its static share reserved")
            }
            Err(_) => {
                warn!(node = %s.node, "fleet: etcd did not answer the leave in time; the others see this node's lease expire and keep its static share reserved")
            }
        }
    }

    /// One connection to etcd: register, watch the members, keep the lease alive and keep
    /// the ceilings; returns on the first error (the caller reconnects).
    async fn session(&mut self) -> Result<()> {
        self.with_local(|p, l| p.begin_session(l, Instant::now()));
        let s = &self.core.s;
        let mut client = self
            .bounded(
                "connecting",
                Client::connect(&s.endpoints, Some(s.connect_options())),
            )
            .await?;
        let lease = self.lease(&mut client).await?;
        self.register(&mut client, lease).await?;
        self.read(&mut client).await?;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.core.view.revision + 1);
        let watch = self
            .timed(
                "watching the members",
                client.watch(self.core.s.fleet_prefix.clone(), Some(options)),
            )
            .await?;
        let (keeper, kept) = self
            .timed("keeping the lease alive", client.lease_keep_alive(lease))
            .await?;
        self.with_local(|p, l| p.registered(l, lease));
        self.serve(client, lease, watch, (keeper, kept)).await
    }

    /// The lease this session's key lives on: the one kept from before a reconnect if it is
    /// still alive (its key is this node's), else a new one.
    async fn lease(&mut self, client: &mut Client) -> Result<i64> {
        if let Some(id) = self.core.lease() {
            let alive = self
                .timed("checking the lease", client.lease_time_to_live(id, None))
                .await?;
            self.core.lease_checked(alive.ttl() > 0);
        }
        let lease = match self.core.lease() {
            Some(id) => id,
            None => {
                let ttl = self.core.s.lease_ttl.as_secs() as i64;
                let g = self
                    .timed("granting a lease", client.lease_grant(ttl, None))
                    .await?;
                self.with_local(|p, l| p.lease_granted(l, g.id()));
                g.id()
            }
        };
        self.with_local(|p, l| p.lease_held(l, lease));
        Ok(lease)
    }

    /// Create this node's key, or take back the one its lease already holds.
    async fn register(&mut self, client: &mut Client, lease: i64) -> Result<()> {
        let (txn, record) = self.with_local(|p, l| p.registration(l, lease));
        let answer = self.txn(client, "registering", txn).await?;
        if !answer.succeeded {
            let put = self.core.reregistration(answer.holder, lease, &record)?;
            self.perform(client, "re-registering", put).await?;
        }
        self.core.published(record, Instant::now());
        Ok(())
    }

    /// Read every key of the fleet: the view this session starts from.
    async fn read(&mut self, client: &mut Client) -> Result<()> {
        let got = self
            .timed(
                "reading the members",
                client.get(
                    self.core.s.fleet_prefix.clone(),
                    Some(GetOptions::new().with_prefix()),
                ),
            )
            .await?;
        let kvs: Vec<_> = got.kvs().iter().map(etcd::kv).collect();
        let revision = got.header().map_or(0, |h| h.revision());
        self.with_local(|p, l| p.read_all(l, &kvs, revision, unix_ms()));
        Ok(())
    }

    /// The session's loop: renew the lease, follow the watch, step the ceilings.
    async fn serve(
        &mut self,
        mut client: Client,
        lease: i64,
        mut watch: WatchStream,
        (mut keeper, mut kept): (LeaseKeeper, LeaseKeepAliveStream),
    ) -> Result<()> {
        let s = &self.core.s;
        // Renewals are also how this node knows etcd still answers: often enough that
        // fail_static counts from less than a quarter of it after the last answer.
        let mut renew = tokio::time::interval((s.lease_ttl / 4).min(s.fail_static / 4));
        let mut step = tokio::time::interval(STEP);
        let mut last_renewal = Instant::now();
        loop {
            if self.stopping() {
                return Ok(());
            }
            tokio::select! {
                _ = renew.tick() => {
                    keeper.keep_alive().await.map_err(|e| anyhow!("renewing the lease: {}", brief(&e)))?;
                }
                m = kept.message() => match m {
                    Ok(Some(r)) if r.ttl() > 0 => {
                        self.local().contact(Instant::now());
                        last_renewal = Instant::now();
                    }
                    Ok(Some(_)) => {
                        self.core.lease_lost();
                        bail!("the lease expired (etcd did not hear from this node for {} s)", self.core.s.lease_ttl.as_secs());
                    }
                    Ok(None) => bail!("etcd closed the lease keep-alive stream"),
                    Err(e) => bail!("lease keep-alive: {}", brief(&e)),
                },
                m = watch.message() => match m {
                    Ok(Some(resp)) => self.watched(&mut client, lease, resp).await?,
                    Ok(None) => bail!("etcd closed the watch stream"),
                    Err(e) => bail!("watch: {}", brief(&e)),
                },
                _ = step.tick() => {
                    if last_renewal.elapsed() > self.core.s.lease_ttl / 2 {
                        bail!("no lease renewal answered for {} ms", last_renewal.elapsed().as_millis());
                    }
                    self.step(&mut client, lease).await?;
                }
            }
        }
    }

    /// A watch answer: each change fed to the protocol, and what it asks performed before
    /// the next; then a step at once if a change asked for one.
    async fn watched(
        &mut self,
        client: &mut Client,
        lease: i64,
        resp: WatchResponse,
    ) -> Result<()> {
        if resp.canceled() {
            bail!("etcd cancelled the watch: {}", resp.cancel_reason());
        }
        self.local().contact(Instant::now());
        let mut step = false;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let event = match ev.event_type() {
                EventType::Put => Event::Put(etcd::kv(kv)),
                EventType::Delete => Event::Delete(kv.key()),
            };
            let w = self.with_local(|p, l| p.on_event(l, event, unix_ms()))?;
            step |= w.step;
            if let Some(txn) = w.reserve {
                self.txn(client, "reserving a departed member's share", txn)
                    .await?;
            }
        }
        if let Some(h) = resp.header() {
            self.core.seen_revision(h.revision());
        }
        if step {
            self.step(client, lease).await?;
        }
        Ok(())
    }

    /// A step of the ceilings: the departed records no longer reserved for removed, the
    /// ceilings computed again, the raise tried, the claims published.
    async fn step(&mut self, client: &mut Client, lease: i64) -> Result<()> {
        let now = Now::read();
        while let Some(delete) = self.core.next_expired(now.unix_ms) {
            self.perform(client, "removing a departed record", delete)
                .await?;
        }
        let mut step = self.with_local(|p, l| p.plan(l, lease, now));
        if let Some(txn) = step.raise.take() {
            let ok = self.txn(client, "raising a ceiling", txn).await?.succeeded;
            self.with_local(|p, l| p.raised(l, &mut step, ok, Instant::now()));
        }
        let put = self.with_local(|p, l| p.publication(l, &step, lease, Instant::now()));
        if let Some((put, record)) = put {
            self.perform(client, "publishing the claims", put).await?;
            self.core.published(record, Instant::now());
        }
        self.with_local(|p, l| p.report(l, step));
        Ok(())
    }
}
