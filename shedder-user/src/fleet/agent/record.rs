//! This node's record as it publishes it: its claims, its configured limits, and the
//! demand it publishes, refreshed from the daemon's moving means when it has moved (pure).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    local::Local,
    ops::Op,
    protocol::{Protocol, encode},
};
use crate::fleet::{Record, SharedService, view};

/// A node's demand is published again when it has moved (see [`Demand::moved_from`]), at
/// most this often; any change at all is published after [`DEMAND_STALE`].
///
/// [`Demand::moved_from`]: crate::fleet::Demand::moved_from
pub(super) const DEMAND_REFRESH: Duration = Duration::from_millis(500);
pub(super) const DEMAND_STALE: Duration = Duration::from_secs(5);

impl Protocol {
    /// This node's record with `claims`.
    pub(super) fn record(&self, local: &Local, claims: BTreeMap<String, u32>) -> Record {
        let limits = |f: fn(&SharedService) -> u32| {
            local
                .services
                .iter()
                .map(|s| (s.name.clone(), f(s)))
                .collect()
        };
        Record {
            node: self.s.node.clone(),
            claims,
            global_limits: limits(|s| s.global_limit),
            demand: self.view.demand.clone(),
            max_limits: limits(|s| s.max_limit),
            leaving: false,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// The put of this node's key on its lease.
    pub(super) fn put_own(&self, record: &Record, lease: i64) -> Op {
        Op::Put {
            key: self.s.key.clone(),
            value: encode(record),
            lease: Some(lease),
        }
    }

    /// Take this node's demand to publish from the moving means: when it has moved enough
    /// and [`DEMAND_REFRESH`] has passed, or when it differs at all after [`DEMAND_STALE`].
    /// A node that has admitted nothing yet computes its need with the median hold the
    /// other members publish.
    pub(super) fn refresh_demand(&mut self, local: &Local, now: Instant) {
        let due = |after| {
            self.view
                .demand_changed
                .is_none_or(|t| now.saturating_duration_since(t) >= after)
        };
        let (moved_due, stale_due) = (due(DEMAND_REFRESH), due(DEMAND_STALE));
        let mut changed = false;
        for svc in &local.services {
            let Some((smoother, _)) = local.demand.get(&svc.name) else {
                continue;
            };
            // The median of the holds the others proved (a hold a record merely states
            // could be anything). A suspect member holds nothing its hold could be
            // measured by.
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
            let current = smoother.demand(fallback).rounded();
            let publish = match self.view.demand.get(&svc.name) {
                None => true,
                Some(p) => (moved_due && current.moved_from(p)) || (stale_due && current != *p),
            };
            if publish {
                self.view.demand.insert(svc.name.clone(), current);
                changed = true;
            }
        }
        self.view
            .demand
            .retain(|name, _| local.services.iter().any(|s| &s.name == name));
        if changed {
            self.view.demand_changed = Some(now);
        }
    }
}
