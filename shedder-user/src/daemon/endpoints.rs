//! The daemon's endpoints: what the metrics endpoint publishes, the control socket's
//! requests, and how the last reload went.

use std::sync::mpsc;

use crate::api::{control::Request, metrics};

pub(super) struct Endpoints {
    pub(super) metrics: metrics::Shared,
    pub(super) requests: mpsc::Receiver<Request>,
    /// How the last reload went, for the metrics.
    pub(super) reload: metrics::Reload,
}
