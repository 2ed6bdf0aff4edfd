//! The whole file: its sections, and what the configuration as a whole implies.

use serde::Deserialize;

use super::{
    classes::Classes,
    daemon::Daemon,
    fleet::Fleet,
    service::{Action, Mode, Service},
};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: Daemon,
    #[serde(default)]
    pub classes: Classes,
    #[serde(default, rename = "service")]
    pub services: Vec<Service>,
    /// Fleet mode: share each service's `global_limit` with the other nodes registered in
    /// etcd (see [`crate::fleet`]). Absent: every node sheds on its own view.
    pub fleet: Option<Fleet>,
}

impl Config {
    /// Whether the daemon would refuse attempts at all: some interface to attach to and
    /// some service that enforces (not dry-run).
    pub fn enforces(&self) -> bool {
        !self.daemon.interfaces.is_empty() && self.services.iter().any(|s| s.mode == Mode::Enforce)
    }

    /// Whether some enforcing service answers refused attempts with a reset, which the
    /// packet path sends back out of the interface (XDP_TX, or a TC redirect).
    pub fn sends_replies(&self) -> bool {
        self.services
            .iter()
            .any(|s| s.action == Action::Rst && s.mode == Mode::Enforce)
    }

    /// Each service's name and ports, by service id: what the connections open before
    /// tracking began are counted for.
    pub fn ports_by_service(&self) -> Vec<(&str, &[u16])> {
        self.services
            .iter()
            .map(|s| (s.name.as_str(), s.ports.as_slice()))
            .collect()
    }
}
