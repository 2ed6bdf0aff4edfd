//! Fleet mode in a build without the `fleet` feature: nothing to start, nothing to probe.
//!
//! [`Config::validate`](crate::config::Config::validate) refuses a `[fleet]` section in
//! such a build, so the daemon never asks for a [`Handle`]; if something did, it would get
//! [`UNAVAILABLE`] as an error, not a fleet that silently does nothing.

use anyhow::{Result, bail};

use super::{Cap, FleetState, Report, SharedService, UNAVAILABLE};
use crate::config::Fleet;

/// The daemon's handle on the fleet agent: no value of it exists in this build.
pub enum Handle {}

impl Handle {
    /// Always fails: this build has no etcd client.
    pub fn start(_f: &Fleet, _services: Vec<SharedService>) -> Result<Self> {
        bail!("{UNAVAILABLE}")
    }

    pub fn set_services(&self, _services: Vec<SharedService>) {
        match *self {}
    }

    pub fn report(&self, _service: &str, _report: Report) {
        match *self {}
    }

    pub fn cap(&self, _service: &str) -> Option<Cap> {
        match *self {}
    }

    pub fn state(&self) -> FleetState {
        match *self {}
    }
}

/// `shedder doctor`'s etcd check: fails, saying why.
pub fn probe(_f: &Fleet) -> Result<String> {
    bail!("{UNAVAILABLE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_starts_and_the_error_says_why() {
        let f: Fleet =
            toml::from_str("endpoints = [\"http://198.18.0.21:2379\"]\nmax_nodes = 3\n").unwrap();
        let err = Handle::start(&f, Vec::new()).err().unwrap().to_string();
        assert!(err.starts_with("this build has no fleet mode"), "{err}");
        let err = probe(&f).unwrap_err().to_string();
        assert!(err.starts_with("this build has no fleet mode"), "{err}");
    }
}
