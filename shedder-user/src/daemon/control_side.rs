//! The daemon's control side: each service's controller and the readers of its signals,
//! and the work done beside the ticks (the hold, recalls, the sweep, the fleet).

use std::time::Instant;

use super::{hold::Hold, recall::Recall, service::ServiceControl, sweep::Sweep};
use crate::{control::classes::Ladder, fleet, signals::SignalReader};

pub(super) struct ControlSide {
    pub(super) services: Vec<ServiceControl>,
    pub(super) ladder: Ladder,
    pub(super) reader: SignalReader,
    /// How long the packet path holds an admitted attempt (see [`super::hold`]).
    pub(super) hold: Hold,
    /// Recalling keep-alive connections of refused classes (see [`super::recall`]).
    pub(super) recall: Recall,
    /// Checking the tracked connections against the kernel's sockets (see [`super::sweep`]).
    pub(super) sweep: Sweep,
    /// Fleet mode's etcd agent (`None` without `[fleet]`).
    pub(super) fleet: Option<fleet::Handle>,
    /// When the summaries of who is refused were last aged.
    pub(super) refused_aged: Instant,
}
