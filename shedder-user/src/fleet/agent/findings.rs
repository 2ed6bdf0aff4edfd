//! What was not believed of the records under the prefix: records ignored whole, values
//! held within bounds; counted for the metrics and logged once each (pure).

use tracing::warn;

use super::{local::Local, protocol::Protocol};
use crate::fleet::trust::{self, Field};

impl Protocol {
    /// A member's new record (or its key gone): what was found in the old one is counted
    /// again if the new one has it too.
    pub(super) fn forget_findings(&mut self, node: &str) {
        self.view.noted.retain(|(n, _)| n != node);
    }

    /// A record ignored whole: counted, logged once per key and error.
    pub(super) fn rejected(
        &mut self,
        local: &mut Local,
        kind: &str,
        key: &str,
        e: &trust::Rejected,
    ) {
        *local.state.rejected.entry(kind.to_string()).or_default() += 1;
        if self.view.logged.insert(format!("rejected {key} {e}")) {
            warn!(key, error = %e, "fleet: ignoring a {kind} record");
        }
    }

    /// Values of `node`'s current record not believed as published: counted once per
    /// record, logged once per member and field.
    pub(super) fn clamped(&mut self, local: &mut Local, node: &str, found: &[Field]) {
        for f in found {
            if !self.view.noted.insert((node.to_string(), *f)) {
                continue;
            }
            *local
                .state
                .clamped
                .entry(f.as_str().to_string())
                .or_default() += 1;
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
}
