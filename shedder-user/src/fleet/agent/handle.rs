//! The daemon's handle on the fleet agent: it starts the driver on the side-I/O runtime,
//! hands the daemon's reports in and the ceilings out, through the state they share.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::Result;
use tracing::info;

use super::{driver::Agent, local::Local, protocol::Protocol};
use crate::{
    config::Fleet,
    fleet::{Cap, FleetState, Report, SharedService, settings::Settings},
};

/// The daemon's handle on the fleet agent.
pub struct Handle {
    local: Arc<Mutex<Local>>,
    stop: Arc<AtomicBool>,
    /// Answers (or closes) once the agent has left the fleet.
    done: std::sync::mpsc::Receiver<()>,
    settings: Settings,
}

impl Handle {
    /// Start the fleet agent. It never fails for want of etcd: an unreachable etcd is
    /// reported and retried, and the node holds a ceiling of 0, then its static share.
    pub fn start(f: &Fleet, services: Vec<SharedService>) -> Result<Self> {
        let settings = Settings::from_config(f)?;
        let local = Local::new(f, &settings, services, Instant::now());
        let local = Arc::new(Mutex::new(local));
        let stop = Arc::new(AtomicBool::new(false));
        // The agent is a task on the side-I/O runtime; `done` says when it has left.
        let (finished, done) = std::sync::mpsc::channel();
        let agent = Agent::new(local.clone(), stop.clone(), Protocol::new(settings.clone()));
        crate::runtime::handle().spawn(async move {
            agent.run().await;
            let _ = finished.send(());
        });
        info!(node = %settings.node, endpoints = ?settings.endpoints, key = %settings.key, "fleet mode: registering with etcd");
        Ok(Self {
            local,
            stop,
            done,
            settings,
        })
    }

    /// The services the fleet shares (after a reload).
    pub fn set_services(&self, services: Vec<SharedService>) {
        if let Ok(mut local) = self.local.lock() {
            local.set_services(services);
        }
    }

    /// This tick's limit, occupancy and demand of a shared service.
    pub fn report(&self, service: &str, report: Report) {
        if let Ok(mut local) = self.local.lock() {
            local.report(service, report, Instant::now());
        }
    }

    /// The ceiling in force for a shared service and its static share (`None`: not
    /// shared); the static share without an answer from etcd for longer than
    /// `fail_static`, whatever the agent is doing.
    pub fn cap(&self, service: &str) -> Option<Cap> {
        let local = self.local.lock().ok()?;
        local.cap(&self.settings, service, Instant::now())
    }

    pub fn state(&self) -> FleetState {
        let Ok(local) = self.local.lock() else {
            return FleetState::default();
        };
        local.state(&self.settings, Instant::now())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Leaving is bounded by the etcd timeout; this waits for it, as a join would.
        let _ = self.done.recv();
    }
}
