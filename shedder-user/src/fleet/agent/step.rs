//! A step of the ceilings (pure): every shared service's view of the fleet computed again;
//! a ceiling lowered at once, raised only through a transaction on the view it was
//! computed from; the claims published when they change. The driver runs it as
//! [`Protocol::plan`], the raise (if any) and [`Protocol::raised`], the put (if any) of
//! [`Protocol::publication`], then [`Protocol::report`].

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::{
    local::Local,
    ops::{Compare, Op, Txn},
    protocol::{Now, Protocol},
};
use crate::{
    config::Shares,
    fleet::{Record, ServiceShare, SharedService, next_ceiling, next_ceiling_by_demand, view},
};

/// Claims that change only because occupancy moved (connections draining after a lowering)
/// are published at most this often; a changed ceiling is published at once.
pub(super) const CLAIM_REFRESH: Duration = Duration::from_millis(250);

/// A step under way.
#[derive(Debug, Default)]
pub(super) struct Step {
    /// The transaction that publishes the raised claims if no key of the fleet changed
    /// since the view; the ceilings rise once it succeeded ([`Protocol::raised`]).
    pub(super) raise: Option<Txn>,
    /// The ceilings to raise to.
    pub(super) raises: BTreeMap<String, u32>,
    /// The claims to publish (with the raises, until one fails).
    pub(super) claims: BTreeMap<String, u32>,
    /// Whether a ceiling was lowered (its claim is published at once).
    pub(super) lowered: bool,
    /// Each service as this node sees it, for the state.
    pub(super) shares: Vec<ServiceShare>,
}

impl Protocol {
    /// Recompute every shared service's ceiling: lower at once, and plan the raises.
    pub(super) fn plan(&mut self, local: &mut Local, lease: i64, now: Now) -> Step {
        let services = local.services.clone();
        self.refresh_demand(local, now.at);
        let mut step = Step::default();
        let mut findings = Vec::new();
        for svc in &services {
            let o = self.view_of(svc, now.unix_ms);
            findings.extend(o.findings.iter().cloned());
            let current = local.ceilings.get(&svc.name).copied().unwrap_or(0);
            let (next, raise) = match self.s.shares {
                Shares::Demand => next_ceiling_by_demand(current, o.target, o.room),
                Shares::Equal => next_ceiling(current, o.target, o.room),
            };
            if raise {
                step.raises.insert(svc.name.clone(), next);
            } else if next != current {
                info!(service = %svc.name, from = current, to = next, members = o.share.members, "fleet: ceiling lowered");
                local.ceilings.insert(svc.name.clone(), next);
                step.lowered = true;
            }
            step.shares.push(o.share);
        }
        self.view.phase = view::Phase::Steady;
        self.view.returned.clear();
        for (node, f) in findings {
            self.clamped(local, &node, &[f]);
        }
        step.claims = local.claims();
        if !step.raises.is_empty() {
            for (name, c) in &step.raises {
                let e = step.claims.entry(name.clone()).or_default();
                *e = (*e).max(*c);
            }
            step.raise = Some(self.raise(local, &step.claims, lease));
        }
        step
    }

    /// One service's view of the fleet (`view::service`), its standings kept for the next,
    /// a global_limit other members disagree with logged once.
    fn view_of(&mut self, svc: &SharedService, now_ms: u64) -> view::Outcome {
        let settings = view::Settings {
            node: &self.s.node,
            safety: self.s.safety,
            max_nodes: self.s.max_nodes,
            shares: self.s.shares,
            reserve_departed_ms: self.s.reserve_departed.as_millis() as u64,
        };
        let empty = BTreeMap::new();
        let mut o = view::service(
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
        self.view
            .standings
            .insert(svc.name.clone(), std::mem::take(&mut o.standings));
        o
    }

    /// The raise: this node's record with the raised claims, put if no key of the fleet
    /// changed since the revision of the view the raise was computed from.
    fn raise(&self, local: &Local, claims: &BTreeMap<String, u32>, lease: i64) -> Txn {
        Txn {
            when: vec![Compare::Unchanged {
                prefix: self.s.fleet_prefix.clone(),
                revision: self.view.revision,
            }],
            then: vec![self.put_own(&self.record(local, claims.clone()), lease)],
            otherwise: Vec::new(),
        }
    }

    /// The raise's outcome. Succeeded: the ceilings rise, and the raised claims are
    /// published. Failed (another member changed since this view: the watch brings the
    /// change and the next step computes again): the claims to publish are without the
    /// raises.
    pub(super) fn raised(
        &mut self,
        local: &mut Local,
        step: &mut Step,
        succeeded: bool,
        now: Instant,
    ) {
        if !succeeded {
            step.claims = local.claims();
            return;
        }
        for (name, c) in &step.raises {
            info!(service = %name, from = local.ceilings.get(name).copied().unwrap_or(0), to = c, "fleet: ceiling raised");
            local.ceilings.insert(name.clone(), *c);
        }
        let record = self.record(local, step.claims.clone());
        self.published(record, now);
    }

    /// The put of the step's claims, and the record it publishes, if they or the demand
    /// differ from what was published: at once after a lowering, else at most every
    /// [`CLAIM_REFRESH`].
    pub(super) fn publication(
        &self,
        local: &Local,
        step: &Step,
        lease: i64,
        now: Instant,
    ) -> Option<(Op, Record)> {
        let published = self.view.published.as_ref().map(|r| (&r.claims, &r.demand));
        if published == Some((&step.claims, &self.view.demand)) {
            return None;
        }
        let due = self
            .view
            .last_put
            .is_none_or(|t| now.saturating_duration_since(t) >= CLAIM_REFRESH);
        if !(step.lowered || due) {
            return None;
        }
        let record = self.record(local, step.claims.clone());
        Some((self.put_own(&record, lease), record))
    }

    /// The step's view of the fleet, for the state.
    pub(super) fn report(&self, local: &mut Local, step: Step) {
        let published = self.view.published.clone().unwrap_or_default();
        let mut shares = step.shares;
        for s in &mut shares {
            s.claim = published.claims.get(&s.service).copied().unwrap_or(0);
        }
        local.state.departed = self.view.departed.keys().cloned().collect();
        local.state.services = shares;
        local.state.members = self.view.members.keys().cloned().collect();
    }
}
