//! The agent's settings from `[fleet]`: node name, keys, timeouts, TLS, and the probe
//! `shedder doctor` runs against etcd.

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};

use super::{SharedService, budget, static_share};
use crate::config::{Fleet, Shares};

/// Settings the fleet thread works with.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) node: String,
    pub(super) key: String,
    /// `<prefix>/`: everything of this fleet (the raise transaction compares all of it).
    pub(super) fleet_prefix: String,
    pub(super) members_prefix: String,
    pub(super) departed_prefix: String,
    /// This node's departed key (deleted when it registers).
    pub(super) departed_key: String,
    pub(super) reserve_departed: Duration,
    pub(super) endpoints: Vec<String>,
    pub(super) lease_ttl: Duration,
    pub(super) safety: f64,
    pub(super) shares: Shares,
    pub(super) max_nodes: u32,
    pub(super) fail_static: Duration,
    pub(super) timeout: Duration,
    pub(super) user: Option<(String, String)>,
    pub(super) tls: Option<TlsFiles>,
}

#[derive(Clone, Debug)]
pub(super) struct TlsFiles {
    ca: Option<String>,
    identity: Option<(String, String)>,
}

/// An etcd client error in one line: gRPC's message and the root cause (e.g. `tcp connect
/// error: Connection refused (os error 111)`), not the transport's debug dump.
pub(super) fn brief(e: &etcd_client::Error) -> String {
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
    pub(super) fn from_config(f: &Fleet) -> Result<Self> {
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
            shares: f.shares,
            max_nodes: f.max_nodes,
            fail_static: f.fail_static(),
            timeout: Duration::from_millis(f.timeout_ms),
            user,
            tls,
        })
    }

    /// A shared service's static share on this node: what it holds cut off from etcd, and
    /// the cap of the kernel's fallback limit.
    pub(super) fn static_share(&self, svc: &SharedService) -> u32 {
        static_share(
            budget(svc.global_limit, self.safety),
            self.max_nodes,
            svc.max_limit,
        )
    }

    pub(super) fn connect_options(&self) -> etcd_client::ConnectOptions {
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
