//! What the daemon and the agent share, behind the handle's lock: the shared services, the
//! daemon's reports, the ceilings in force and when etcd last answered; and what the
//! daemon reads of it (the cap of each service, the state). Plain data, the clock passed
//! in: the fall back to the static shares without etcd is decided here.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::{
    config::Fleet,
    fleet::{
        Cap, FleetState, Report, ServiceShare, SharedService, Smoother, budget, claim,
        settings::Settings,
    },
};

pub(super) struct Local {
    pub(super) services: Vec<SharedService>,
    pub(super) reports: BTreeMap<String, Report>,
    /// Per service, the moving means of this node's demand and when they last moved.
    pub(super) demand: BTreeMap<String, (Smoother, Instant)>,
    pub(super) ceilings: BTreeMap<String, u32>,
    pub(super) last_ok: Option<Instant>,
    pub(super) started: Instant,
    pub(super) state: FleetState,
}

impl Local {
    pub(super) fn new(f: &Fleet, s: &Settings, services: Vec<SharedService>, now: Instant) -> Self {
        Self {
            services,
            reports: BTreeMap::new(),
            demand: BTreeMap::new(),
            ceilings: BTreeMap::new(),
            last_ok: None,
            started: now,
            state: FleetState {
                node: s.node.clone(),
                prefix: f.prefix.clone(),
                endpoints: s.endpoints.clone(),
                standing: "joining".into(),
                lease_ttl_s: f.lease_ttl_s,
                ..Default::default()
            },
        }
    }

    /// Whether etcd has not answered for longer than `fail_static` (since the start when it
    /// never has).
    pub(super) fn cut_off(&self, fail_static: Duration, now: Instant) -> bool {
        now.saturating_duration_since(self.last_ok.unwrap_or(self.started)) > fail_static
    }

    /// The services the fleet shares (after a reload).
    pub(super) fn set_services(&mut self, services: Vec<SharedService>) {
        self.ceilings
            .retain(|name, _| services.iter().any(|s| &s.name == name));
        self.demand
            .retain(|name, _| services.iter().any(|s| &s.name == name));
        self.services = services;
    }

    /// This tick's limit, occupancy and demand of a shared service.
    pub(super) fn report(&mut self, service: &str, report: Report, now: Instant) {
        if let Some((attempts, admitted)) = report.rates {
            let (smoother, last) = self
                .demand
                .entry(service.to_string())
                .or_insert_with(|| (Smoother::default(), now));
            smoother.update(
                now.saturating_duration_since(*last),
                attempts,
                admitted,
                report.established,
            );
            *last = now;
        }
        self.reports.insert(service.to_string(), report);
    }

    /// The ceiling in force for a shared service and its static share (`None`: not
    /// shared). Without an answer from etcd for longer than `fail_static` (since the start,
    /// or since the last answer) the ceiling is the static share, whatever the agent is
    /// doing.
    pub(super) fn cap(&self, s: &Settings, service: &str, now: Instant) -> Option<Cap> {
        let svc = self.services.iter().find(|v| v.name == service)?;
        let static_share = s.static_share(svc);
        let ceiling = if self.cut_off(s.fail_static, now) {
            static_share
        } else {
            self.ceilings.get(service).copied().unwrap_or(0)
        };
        Some(Cap {
            ceiling,
            static_share,
            budget: budget(svc.global_limit, s.safety),
        })
    }

    /// The fleet as this node sees it, for `shedder status` and the metrics.
    pub(super) fn state(&self, s: &Settings, now: Instant) -> FleetState {
        let mut st = self.state.clone();
        st.etcd_last_contact_s = self
            .last_ok
            .map(|t| now.saturating_duration_since(t).as_secs_f64());
        let cut_off = self.cut_off(s.fail_static, now);
        if cut_off {
            st.standing = "static".into();
        } else if st.standing == "member" && !st.etcd_up {
            st.standing = "fail-static".into();
        }
        if st.services.is_empty() {
            st.services = self
                .services
                .iter()
                .map(|svc| ServiceShare {
                    service: svc.name.clone(),
                    global_limit: svc.global_limit,
                    budget: budget(svc.global_limit, s.safety),
                    static_share: s.static_share(svc),
                    ..Default::default()
                })
                .collect();
        }
        for v in &mut st.services {
            v.ceiling = if cut_off {
                v.static_share
            } else {
                self.ceilings.get(&v.service).copied().unwrap_or(0)
            };
        }
        st
    }

    /// etcd answered.
    pub(super) fn contact(&mut self, now: Instant) {
        self.last_ok = Some(now);
        self.state.etcd_up = true;
    }

    /// A session with etcd failed with `msg`: counted; whether it is not the last error
    /// already (to log it once).
    pub(super) fn failed(&mut self, msg: &str) -> bool {
        let first = self.state.last_error.as_deref() != Some(msg);
        self.state.etcd_errors += 1;
        self.state.etcd_up = false;
        self.state.last_error = Some(msg.to_string());
        first
    }

    /// Put every ceiling at the static share: at most that (`at_most`), or exactly that
    /// (a node coming back from a cut-off, where it has been holding it).
    pub(super) fn cap_at_static(&mut self, s: &Settings, at_most: bool) {
        for svc in &self.services {
            let st = s.static_share(svc);
            let c = self.ceilings.entry(svc.name.clone()).or_insert(0);
            *c = if at_most { (*c).min(st) } else { st };
        }
    }

    /// This node's claims from its ceilings and the daemon's reports.
    pub(super) fn claims(&self) -> BTreeMap<String, u32> {
        self.services
            .iter()
            .map(|s| {
                let r = self.reports.get(&s.name).copied().unwrap_or_default();
                let c = self.ceilings.get(&s.name).copied().unwrap_or(0);
                (s.name.clone(), claim(c, r.applied, r.established))
            })
            .collect()
    }
}
