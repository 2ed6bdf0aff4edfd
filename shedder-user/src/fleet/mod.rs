//! Fleet mode: the nodes of a fleet share each downstream's capacity (`global_limit`)
//! through etcd (seed 000 R5: `per_instance_max = db_limit / instance_count × safety`;
//! seed 003: leases and escrow-like allocations where a global cap and local availability
//! must coexist).
//!
//! ## Protocol
//!
//! Every daemon holds an etcd lease and, attached to it, one key
//! `<prefix>/members/<node>` whose value is a [`Record`]: per fleet service, the **claim**
//! of this node — the most connections it may hold, `max(ceiling granted, limit written in
//! the kernel, connections it holds now)`. A node whose lease expires (it died, or lost
//! etcd for a lease TTL) leaves the fleet with its key.
//!
//! Per service, with `budget = ⌊global_limit × safety⌋` and `n` live members protecting a
//! service of that name:
//!
//! - the node's **target** is `⌊budget / n⌋`, never above its own `max_limit` (equal shares;
//!   a node's local controller still adapts below its ceiling);
//! - it may **lower** its ceiling at any time (its claim follows once the kernel holds the
//!   lower limit and the connections above it have closed);
//! - it may **raise** its ceiling only to `min(target, budget − Σ other members' claims)`,
//!   and only through an etcd transaction that succeeds if no member key changed since the
//!   view it computed from. Raises are therefore serialised against every claim, and
//!   `Σ claims ≤ budget` holds whenever all nodes reach etcd;
//! - a node starts at a ceiling of 0 and registers with claims of what it holds: a joining
//!   node admits nothing for a shared service until the others have lowered their ceilings
//!   and drained to them;
//! - a member whose lease expires without its having left cleanly (a clean stop marks its
//!   record `leaving` before revoking the lease) may be dead, or alive and cut off, serving
//!   on its static share: its static share stays reserved (a [`Departed`] record under
//!   `<prefix>/departed/`, and the budget the others share is `budget − reserved`) until it
//!   registers again or `reserve_departed_s` passes.
//!
//! ## Without etcd
//!
//! A node that has not heard from etcd for `fail_static` keeps its last ceiling until then
//! (fail-static), then holds its **static share** `⌊budget / max_nodes⌋`. Since
//! `fail_static` is shorter than its etcd lease, it has let go of its share before its lease
//! expires and the others take its share less that static share. The kernel's fallback
//! limit (a dead daemon) is capped at the static share too. So the fleet total stays within
//! `budget` while nodes reach etcd, through partitions (for `reserve_departed_s`), and when
//! etcd is down for every node (each holds at most `budget / max_nodes`).

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{Config, Fleet};

/// One service shared by the fleet, as this node configures it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedService {
    pub name: String,
    pub global_limit: u32,
    /// This node's own hard ceiling: its share never goes above it.
    pub max_limit: u32,
}

/// The fleet services of a configuration.
pub fn shared_services(cfg: &Config) -> Vec<SharedService> {
    cfg.services
        .iter()
        .filter_map(|s| {
            s.global_limit.map(|g| SharedService {
                name: s.name.clone(),
                global_limit: g,
                max_limit: s.max_limit,
            })
        })
        .collect()
}

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

/// The value of a member key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    /// Service name → claim.
    pub claims: BTreeMap<String, u32>,
    /// Service name → the `global_limit` this node is configured with. Nodes whose
    /// configurations disagree all use the smallest.
    #[serde(default)]
    pub global_limits: BTreeMap<String, u32>,
    /// Set by a node stopping cleanly just before it revokes its lease: it is not serving
    /// any more, so the others reserve nothing for it.
    #[serde(default)]
    pub leaving: bool,
    pub pid: u32,
    pub version: String,
}

/// The value of a departed key (`<prefix>/departed/<node>`, no lease): a member whose lease
/// expired without its leaving cleanly. It may be dead, or alive and cut off from etcd,
/// holding its static share; the others keep that share free for it until it registers
/// again (which deletes the key) or `reserve_departed_s` has passed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departed {
    pub node: String,
    /// Service name → the connections reserved (its static share).
    pub reserves: BTreeMap<String, u32>,
    /// When its lease expired (ms since the Unix epoch, by the clock of the node that saw it).
    pub since_unix_ms: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A service's state on this node, for `shedder status` and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceShare {
    pub service: String,
    pub global_limit: u32,
    /// `⌊global_limit × safety⌋`.
    pub budget: u32,
    /// Live members protecting a service of this name (this node included once joined).
    pub members: u32,
    /// This node's share of the budget: `⌊budget / members⌋`, at most its max_limit.
    pub target: u32,
    /// The ceiling in force on this node.
    pub ceiling: u32,
    /// What this node last published as its claim.
    pub claim: u32,
    /// The other members' claims.
    pub others: u32,
    /// Kept free for departed members that may still be serving, cut off (their static
    /// shares).
    #[serde(default)]
    pub reserved: u32,
    /// What this node holds when cut off from etcd.
    pub static_share: u32,
}

/// The fleet as this node sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetState {
    pub node: String,
    pub prefix: String,
    pub endpoints: Vec<String>,
    /// `joining` (not registered yet), `member`, `fail-static` (etcd unreachable, last
    /// ceilings kept), `static` (etcd unreachable for longer than fail_static).
    pub standing: String,
    /// Whether the last etcd exchange succeeded.
    pub etcd_up: bool,
    /// Seconds since etcd last answered (`None`: never).
    pub etcd_last_contact_s: Option<f64>,
    pub etcd_errors: u64,
    pub last_error: Option<String>,
    pub lease_id: Option<i64>,
    pub lease_ttl_s: u64,
    /// Live members' node names.
    pub members: Vec<String>,
    /// Departed members whose static share is still reserved.
    #[serde(default)]
    pub departed: Vec<String>,
    pub services: Vec<ServiceShare>,
}

/// What the fleet allows this node for one service (held by the decorator that applies it).
pub use crate::control::capped::Cap;

/// What the daemon tells the fleet thread about one service each tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The total limit written in the kernel.
    pub applied: u32,
    /// Connections held (established + admitted, not yet established).
    pub occupancy: u32,
}

struct Shared {
    services: Vec<SharedService>,
    reports: BTreeMap<String, Report>,
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

/// Settings the fleet thread works with.
#[derive(Clone, Debug)]
struct Settings {
    node: String,
    key: String,
    /// `<prefix>/`: everything of this fleet (the raise transaction compares all of it).
    fleet_prefix: String,
    members_prefix: String,
    departed_prefix: String,
    /// This node's departed key (deleted when it registers).
    departed_key: String,
    reserve_departed: Duration,
    endpoints: Vec<String>,
    lease_ttl: Duration,
    safety: f64,
    max_nodes: u32,
    fail_static: Duration,
    timeout: Duration,
    user: Option<(String, String)>,
    tls: Option<TlsFiles>,
}

#[derive(Clone, Debug)]
struct TlsFiles {
    ca: Option<String>,
    identity: Option<(String, String)>,
}

/// An etcd client error in one line: gRPC's message and the root cause (e.g. `tcp connect
/// error: Connection refused (os error 111)`), not the transport's debug dump.
fn brief(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            let mut root: &dyn std::error::Error = s;
            while let Some(next) = root.source() {
                root = next;
            }
            let root = if std::ptr::addr_eq(root, s as &dyn std::error::Error) {
                String::new()
            } else {
                root.to_string()
            };
            let message = s.message();
            if root.is_empty() || root == message {
                message.to_string()
            } else if message.is_empty() {
                root
            } else {
                format!("{message}: {root}")
            }
        }
        _ => e.to_string(),
    }
}

/// This node's name: configured, else the host name.
pub fn node_name(f: &Fleet) -> Result<String> {
    if let Some(n) = &f.node {
        return Ok(n.clone());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name for fleet.node")?;
    let host = host.trim().to_string();
    if host.is_empty() {
        bail!("fleet.node: the host name is empty; set fleet.node");
    }
    Ok(host)
}

impl Settings {
    fn from_config(f: &Fleet) -> Result<Self> {
        let node = node_name(f)?;
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read_to_string(p)
                .with_context(|| format!("fleet.{what}: reading {}", p.display()))
        };
        let user = match (&f.username, &f.password_file) {
            (Some(u), Some(p)) => Some((
                u.clone(),
                read(p, "password_file")?
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            )),
            _ => None,
        };
        let tls = if f.tls() {
            Some(TlsFiles {
                ca: f
                    .ca_file
                    .as_deref()
                    .map(|p| read(p, "ca_file"))
                    .transpose()?,
                identity: match (&f.cert_file, &f.key_file) {
                    (Some(c), Some(k)) => Some((read(c, "cert_file")?, read(k, "key_file")?)),
                    _ => None,
                },
            })
        } else {
            None
        };
        let members_prefix = format!("{}/members/", f.prefix);
        let departed_prefix = format!("{}/departed/", f.prefix);
        Ok(Self {
            key: format!("{members_prefix}{node}"),
            fleet_prefix: format!("{}/", f.prefix),
            departed_key: format!("{departed_prefix}{node}"),
            departed_prefix,
            reserve_departed: Duration::from_secs(f.reserve_departed_s),
            node,
            members_prefix,
            endpoints: f.endpoints.clone(),
            lease_ttl: f.etcd_lease_ttl(),
            safety: f.safety,
            max_nodes: f.max_nodes,
            fail_static: f.fail_static(),
            timeout: Duration::from_millis(f.timeout_ms),
            user,
            tls,
        })
    }

    /// A shared service's static share on this node: what it holds cut off from etcd, and
    /// the cap of the kernel's fallback limit.
    fn static_share(&self, svc: &SharedService) -> u32 {
        static_share(
            budget(svc.global_limit, self.safety),
            self.max_nodes,
            svc.max_limit,
        )
    }

    fn connect_options(&self) -> etcd_client::ConnectOptions {
        let mut o = etcd_client::ConnectOptions::new()
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout)
            .with_keep_alive(self.timeout, self.timeout);
        if let Some((u, p)) = &self.user {
            o = o.with_user(u.clone(), p.clone());
        }
        if let Some(t) = &self.tls {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &t.ca {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((c, k)) = &t.identity {
                tls = tls.identity(etcd_client::Identity::from_pem(c, k));
            }
            o = o.with_tls(tls);
        }
        o
    }
}

/// Connect to etcd and ask it for its status: `shedder doctor`'s check.
pub fn probe(f: &Fleet) -> Result<String> {
    let s = Settings::from_config(f)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the etcd client runtime")?;
    rt.block_on(async {
        let mut client = tokio::time::timeout(
            s.timeout,
            etcd_client::Client::connect(&s.endpoints, Some(s.connect_options())),
        )
        .await
        .map_err(|_| anyhow!("no answer within {} ms", s.timeout.as_millis()))?
        .map_err(|e| anyhow!("{}", brief(&e)))?;
        let status = tokio::time::timeout(s.timeout, client.status())
            .await
            .map_err(|_| anyhow!("no status within {} ms", s.timeout.as_millis()))?
            .map_err(|e| anyhow!("{}", brief(&e)))?;
        let members = tokio::time::timeout(
            s.timeout,
            client.get(
                s.members_prefix.clone(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            ),
        )
        .await
        .map_err(|_| anyhow!("no answer within {} ms", s.timeout.as_millis()))?
        .map_err(|e| anyhow!("{}", brief(&e)))?;
        Ok(format!(
            "etcd {} answers at {} (leader {}); {} node(s) registered under {}",
            status.version(),
            s.endpoints.join(","),
            status.leader(),
            members.count(),
            s.members_prefix
        ))
    })
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
            sh.services = services;
        }
    }

    /// This tick's limit and occupancy of a shared service.
    pub fn report(&self, service: &str, report: Report) {
        if let Ok(mut sh) = self.shared.lock() {
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
    members: BTreeMap<String, Record>,
    departed: BTreeMap<String, Departed>,
    revision: i64,
    lease: Option<i64>,
    published: Option<Record>,
    last_put: Option<Instant>,
    /// Services whose global_limit disagreement was logged.
    warned: Vec<String>,
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
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let v = self.bounded(what, f).await?;
        self.contact();
        Ok(v)
    }

    /// A step under the timeout that need not reach etcd (connecting is lazy): no contact.
    async fn bounded<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
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
        self.view.members.clear();
        self.view.departed.clear();
        for kv in got.kvs() {
            self.apply_put(kv.key(), kv.value());
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
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            match ev.event_type() {
                                etcd_client::EventType::Put => self.apply_put(kv.key(), kv.value()),
                                etcd_client::EventType::Delete => {
                                    let key = String::from_utf8_lossy(kv.key()).to_string();
                                    if key == self.s.key {
                                        bail!("this node's key was deleted (its lease expired or an operator removed it)");
                                    }
                                    if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
                                        self.view.departed.remove(node);
                                    } else if let Some(node) = key.strip_prefix(&self.s.members_prefix)
                                        && let Some(last) = self.view.members.remove(node)
                                    {
                                        self.member_left(&mut client, node, &last).await?;
                                    }
                                }
                            }
                        }
                        if let Some(h) = resp.header() {
                            self.view.revision = self.view.revision.max(h.revision());
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
        let reserves: BTreeMap<String, u32> = last
            .claims
            .keys()
            .map(|svc| {
                let global = last.global_limits.get(svc).copied().unwrap_or(0);
                let b = budget(global, self.s.safety);
                (svc.clone(), static_share(b, self.s.max_nodes, u32::MAX))
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
        self.view.departed.insert(node.to_string(), d);
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

    fn apply_put(&mut self, key: &[u8], value: &[u8]) {
        let key = String::from_utf8_lossy(key);
        if let Some(node) = key.strip_prefix(&self.s.departed_prefix) {
            match serde_json::from_slice::<Departed>(value) {
                Ok(d) => {
                    self.view.departed.insert(node.to_string(), d);
                }
                Err(e) => {
                    warn!(node, error = %e, "fleet: ignoring a departed record that does not parse")
                }
            }
            return;
        }
        let Some(node) = key.strip_prefix(&self.s.members_prefix) else {
            return;
        };
        match serde_json::from_slice::<Record>(value) {
            Ok(r) => {
                if !self.view.members.contains_key(node) && node != self.s.node {
                    info!(node, "fleet: member joined");
                }
                self.view.members.insert(node.to_string(), r);
            }
            Err(e) => {
                warn!(node, error = %e, "fleet: ignoring a member record that does not parse")
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
        let global_limits = self
            .shared
            .lock()
            .map(|sh| {
                sh.services
                    .iter()
                    .map(|s| (s.name.clone(), s.global_limit))
                    .collect()
            })
            .unwrap_or_default();
        Record {
            node: self.s.node.clone(),
            claims,
            global_limits,
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
                (s.name.clone(), claim(c, r.applied, r.occupancy))
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
        let expired: Vec<String> = self
            .view
            .departed
            .iter()
            .filter(|(n, d)| {
                **n == self.s.node
                    || now_ms.saturating_sub(d.since_unix_ms)
                        > self.s.reserve_departed.as_millis() as u64
            })
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
        let mut raises = BTreeMap::new();
        let mut lowered = false;
        let mut shares = Vec::new();
        for svc in &services {
            // The smallest global_limit any member is configured with.
            let global_limit = self
                .view
                .members
                .values()
                .filter_map(|r| r.global_limits.get(&svc.name))
                .fold(svc.global_limit, |a, g| a.min(*g));
            if global_limit < svc.global_limit && !self.view.warned.contains(&svc.name) {
                warn!(
                    service = %svc.name,
                    configured = svc.global_limit,
                    fleet = global_limit,
                    "fleet: another member has a smaller global_limit for this service; using it"
                );
                self.view.warned.push(svc.name.clone());
            }
            let budget = budget(global_limit, self.s.safety);
            let reserved: u32 = self
                .view
                .departed
                .values()
                .filter_map(|d| d.reserves.get(&svc.name))
                .fold(0u32, |a, r| a.saturating_add(*r));
            let live_budget = budget.saturating_sub(reserved);
            let members = self
                .view
                .members
                .values()
                .filter(|r| r.claims.contains_key(&svc.name))
                .count()
                .max(1);
            let others: u32 = self
                .view
                .members
                .iter()
                .filter(|(n, _)| **n != self.s.node)
                .filter_map(|(_, r)| r.claims.get(&svc.name))
                .fold(0u32, |a, c| a.saturating_add(*c));
            let target = target(live_budget, members, svc.max_limit);
            let current = ceilings.get(&svc.name).copied().unwrap_or(0);
            let (next, raise) = next_ceiling(current, target, live_budget.saturating_sub(others));
            if raise {
                raises.insert(svc.name.clone(), next);
            } else if next != current {
                info!(service = %svc.name, from = current, to = next, members, "fleet: ceiling lowered");
                ceilings.insert(svc.name.clone(), next);
                lowered = true;
            }
            shares.push(ServiceShare {
                service: svc.name.clone(),
                global_limit,
                budget,
                members: members as u32,
                target,
                ceiling: 0,
                claim: 0,
                others,
                reserved,
                static_share: self.s.static_share(svc),
            });
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
        let published = self.view.published.as_ref().map(|r| &r.claims);
        if published != Some(&claims) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_services_with_a_global_limit_are_shared_and_only_in_fleet_mode() {
        const FLEET: &str = "[daemon]\ninterfaces = [\"eth0\"]\n[fleet]\nendpoints = [\"http://198.18.0.21:2379\"]\nnode = \"lb-1\"\nmax_nodes = 10\n";
        const SERVICES: &str = "[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 500\n[[service]]\nname = \"web\"\nports = [80]\n";
        let cfg = Config::parse(&format!("{FLEET}{SERVICES}")).unwrap();
        let shared = shared_services(&cfg);
        assert_eq!(shared.len(), 1);
        assert_eq!(shared[0].name, "db");
        assert_eq!((shared[0].global_limit, shared[0].max_limit), (500, 4096));
        let plain = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"db\"\nports = [5432]\n",
        )
        .unwrap();
        assert!(shared_services(&plain).is_empty());
    }

    #[test]
    fn seed_000_c5_arithmetic() {
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
