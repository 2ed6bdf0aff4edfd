//! Reloading the configuration (SIGHUP, or a policy applied over the control socket)
//! without detaching: a configuration that fails validation, or that changes what only a
//! restart can, is refused and the running one stays in force.

use tracing::{info, warn};

use super::{
    Daemon,
    service::{Context, ServiceControl},
    specs,
};
use crate::{
    api::control::ApiError,
    config::Config,
    control::classes::Ladder,
    control::policy::compile,
    fleet,
    kernel::{Attached, MapWriter as _},
    signals::{SignalReader, psi},
};

impl Daemon {
    /// SIGHUP: re-read the configuration file; on any error keep the running one (stale
    /// shedding beats no shedding).
    pub(super) fn reload_file(&mut self) {
        let (cfg, text) = match Config::read(&self.config_path) {
            Ok(read) => read,
            Err(e) => {
                warn!(error = %e, "reload refused; the running configuration stays in force");
                self.endpoints.reload.attempted(false);
                return;
            }
        };
        let applied = self.apply_config(cfg, text);
        self.endpoints.reload.attempted(applied.is_ok());
        match applied {
            Ok(()) => info!(
                services = self.control.services.len(),
                "configuration reloaded"
            ),
            Err(e) => {
                warn!(error = %e.error, "reload refused; the running configuration stays in force")
            }
        }
    }

    /// Put a validated configuration in force without detaching. Settings that need a
    /// restart are refused (and nothing changes).
    pub(super) fn apply_config(&mut self, cfg: Config, text: String) -> Result<(), ApiError> {
        let (old, new) = (&self.cfg.daemon, &cfg.daemon);
        for (field, same) in [
            ("daemon.pin_dir", old.pin_dir == new.pin_dir),
            ("daemon.measure_only", old.measure_only == new.measure_only),
            ("daemon.interfaces", old.interfaces == new.interfaces),
            ("daemon.attach", old.attach == new.attach),
            (
                "daemon.kernel_debug_log",
                old.kernel_debug_log == new.kernel_debug_log,
            ),
            (
                "daemon.metrics_listen",
                old.metrics_listen == new.metrics_listen,
            ),
            (
                "daemon.control_socket",
                old.control_socket == new.control_socket,
            ),
            (
                "daemon.control_group",
                old.control_group == new.control_group,
            ),
            ("fleet", self.cfg.fleet == cfg.fleet),
        ] {
            if !same {
                let mut e = ApiError::bad(format!("{field} changes only with a restart"));
                e.field = Some(field.into());
                return Err(e);
            }
        }
        if cfg.sends_replies() {
            for a in &self.kernel.attach {
                if a.mode != Attached::XdpNative.as_str() {
                    continue;
                }
                if let Some(problem) = crate::kernel::netdev::native_reset_problem(&a.interface) {
                    let (i, s) = cfg
                        .services
                        .iter()
                        .enumerate()
                        .find(|(_, s)| s.action == crate::config::Action::Rst)
                        .expect("a service sends replies");
                    let field = format!("service[{i}] ({}).action", s.name);
                    let mut e = ApiError::bad(format!(
                        "{field}: rst cannot be delivered: {problem}; keep action = \"drop\", or \
                         restart shedder so that attach = \"auto\" chooses tc on a veth"
                    ));
                    e.field = Some(field);
                    return Err(e);
                }
            }
        }
        let ladder = Ladder::from_config(&cfg);
        let mut compiled = compile(&cfg, self.kernel.hz);
        // A measured hold carries over unless the new file sets one.
        let mut hold = super::hold::Hold::new(&cfg, compiled.globals.hold_bits);
        if cfg.daemon.handshake_hold_ms == 0 && self.control.hold.measured.is_some() {
            compiled.globals.hold_bits = self.control.hold.bits;
            hold = self.control.hold.clone();
        }
        if let Some(f) = &self.control.fleet {
            f.set_services(fleet::shared_services(&cfg));
        }
        let ctx = Context {
            ladder: &ladder,
            hz: self.kernel.hz,
            hold: hold.duration(self.kernel.hz),
        };
        let fleet = self.control.fleet.as_ref();
        let mut services =
            ServiceControl::carry_over(&self.control.services, &cfg.services, |name| {
                fleet.and_then(|f| f.cap(name))
            });
        // What is in force from now: a kept override, else the new controller's limit (a
        // fixed controller's new fixed_limit takes effect at once).
        for (i, sc) in services.iter_mut().enumerate() {
            compiled.services[i].policy = sc.initial_policy(ctx);
        }
        if let Err(e) = self.kernel.shedder.write_compiled(&compiled) {
            // The running configuration stays in force, fleet services included.
            if let Some(f) = &self.control.fleet {
                f.set_services(fleet::shared_services(&self.cfg));
            }
            return Err(ApiError::new(500, format!("writing the policy: {e}")));
        }
        let window_ticks = cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize;
        let cgroup_root = psi::cgroup2_mount().ok();
        self.control.reader = SignalReader::new(specs(&cfg, cgroup_root.as_deref()), window_ticks);
        self.control.services = services;
        self.control.ladder = ladder;
        self.control.hold = hold;
        self.control.recall.reload(&cfg);
        self.control.sweep.reload(&cfg);
        self.cfg = cfg;
        self.config_text = text;
        Ok(())
    }
}
