//! What a start will do, decided before it does anything: from the configuration and the
//! facts of the host (what is pinned, whether the pins outlive this process). Pure, so
//! every case is a unit test; [`super::start`] carries the plan out.

use std::time::Duration;

use shedder_common::{POLICY_CONFIGURED, ServicePolicy};

use crate::{
    config::{Config, Service},
    kernel::layout::{self, Plan},
};

/// What a start finds on the host before it changes anything.
#[derive(Clone, Debug, PartialEq)]
pub struct HostFacts {
    /// What the pinned maps are to this version.
    pub layout: Plan,
    /// For each configured interface, in order: whether an earlier run's attachment is
    /// pinned for it.
    pub pinned_attachments: Vec<bool>,
    /// Why the pins die with this process, if they do (a mount namespace of its own).
    pub private_pins: Option<String>,
}

/// How an interface is hooked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// An earlier run's attachment: switched to this daemon's program, never detached.
    Adopt,
    /// Attached anew, in the mode that delivers the configured action (chosen from the
    /// interface's driver when it is attached).
    Attach,
}

/// What a start does, in the order it does it.
#[derive(Clone, Debug, PartialEq)]
pub struct StartPlan {
    /// The pin folder the maps are loaded into: this version's own, or the one a
    /// replacement builds beside the old set.
    pub maps: &'static str,
    /// The pinned maps are this version's: the controllers continue from their limits, and
    /// the work found in service does not raise them.
    pub adopt_maps: bool,
    /// The pinned maps are another version's: count the connections before the
    /// attachments switch to the new maps (and again after), then retire the old set.
    pub replace: bool,
    /// Each configured interface and how it is hooked.
    pub interfaces: Vec<(String, Hook)>,
    /// Lasting limitations, for `status`.
    pub warnings: Vec<String>,
    /// The ticks a signal window spans.
    pub window_ticks: usize,
    /// How long a step may stall before the watchdog says which one.
    pub watchdog_after: Duration,
}

/// Why `cfg` cannot start where the pins die with this process (`private_pins` says why
/// they do): fail-static, on by default, promises that a dead daemon leaves its limits in
/// force. Checked before anything on the host is touched. `None`: it may start.
pub fn fail_static_refusal(cfg: &Config, private_pins: Option<&str>) -> Option<String> {
    let why = private_pins?;
    (cfg.daemon.fail_static && cfg.enforces()).then(|| {
        format!(
            "daemon.fail_static: the pins under {} would die with this process ({why}), so a \
             crashed daemon would leave nothing shed; start it in the host's mount namespace \
             (e.g. `nsenter --net=/var/run/netns/NAME` instead of `ip netns exec`), or set \
             daemon.fail_static = false to run without fail-static",
            cfg.daemon.pin_dir.display()
        )
    })
}

/// The plan for `cfg` on a host with `facts`.
pub fn plan(cfg: &Config, facts: &HostFacts) -> StartPlan {
    let replace = matches!(facts.layout, Plan::Replace { .. });
    let interfaces = cfg
        .daemon
        .interfaces
        .iter()
        .enumerate()
        .map(|(i, iface)| {
            let pinned = facts.pinned_attachments.get(i).copied().unwrap_or(false);
            (
                iface.clone(),
                if pinned { Hook::Adopt } else { Hook::Attach },
            )
        })
        .collect();
    let warnings = facts
        .private_pins
        .iter()
        .map(|why| {
            format!(
                "no fail-static: the pins die with this daemon ({why}); if it dies, nothing \
                 is shed"
            )
        })
        .collect();
    StartPlan {
        maps: if replace { layout::NEXT } else { layout::MAPS },
        adopt_maps: facts.layout == Plan::Adopt,
        replace,
        interfaces,
        warnings,
        window_ticks: cfg.daemon.signal_window_ms.div_ceil(cfg.daemon.tick_ms) as usize,
        // A third of the heartbeat's timeout: said well before the fallback takes over.
        watchdog_after: Duration::from_millis((cfg.daemon.heartbeat_timeout_ms / 3).max(100)),
    }
}

/// The limit `s`'s controller starts from: over adopted maps, the limit in them (what the
/// last run had reached) if they hold a configured policy within the bounds; otherwise the
/// fallback limit.
pub fn initial_limit(s: &Service, adopt_maps: bool, pinned: Option<&ServicePolicy>) -> u32 {
    pinned
        .filter(|_| adopt_maps)
        .filter(|p| p.configured == POLICY_CONFIGURED)
        .map(|p| p.total_limit)
        .filter(|l| (s.min_limit..=s.max_limit).contains(l))
        .unwrap_or(s.fallback_limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::parse(&format!(
            "[daemon]\ninterfaces = [\"eth0\", \"eth1\"]\ntick_ms = 300\n{extra}\n\
             [[service]]\nname = \"a\"\nports = [80]\nmin_limit = 4\nmax_limit = 100\n\
             fallback_limit = 20\n"
        ))
        .expect("config")
    }

    fn facts(layout: Plan) -> HostFacts {
        HostFacts {
            layout,
            pinned_attachments: vec![true, false],
            private_pins: None,
        }
    }

    #[test]
    fn a_fresh_host_attaches_everything_into_this_versions_maps() {
        let p = plan(
            &config(""),
            &HostFacts {
                pinned_attachments: vec![false, false],
                ..facts(Plan::Fresh)
            },
        );
        assert_eq!(p.maps, layout::MAPS);
        assert!(!p.adopt_maps && !p.replace);
        assert_eq!(
            p.interfaces,
            [("eth0".into(), Hook::Attach), ("eth1".into(), Hook::Attach)]
        );
        assert!(p.warnings.is_empty());
        // A 1 s window of 300 ms ticks: four ticks; the watchdog at a third of 3 s.
        assert_eq!(p.window_ticks, 4);
        assert_eq!(p.watchdog_after, Duration::from_secs(1));
    }

    #[test]
    fn a_restart_adopts_what_is_pinned_and_attaches_the_rest() {
        let p = plan(&config(""), &facts(Plan::Adopt));
        assert_eq!(p.maps, layout::MAPS);
        assert!(p.adopt_maps && !p.replace);
        assert_eq!(
            p.interfaces,
            [("eth0".into(), Hook::Adopt), ("eth1".into(), Hook::Attach)]
        );
    }

    #[test]
    fn another_versions_maps_are_replaced_beside_them() {
        let p = plan(
            &config(""),
            &facts(Plan::Replace {
                layout: 1,
                why: vec!["SHEDDER_STATS: 32 entries, not 64".into()],
            }),
        );
        assert_eq!(p.maps, layout::NEXT);
        assert!(p.replace && !p.adopt_maps);
        // The pinned attachment is switched over, not detached.
        assert_eq!(p.interfaces[0].1, Hook::Adopt);
    }

    #[test]
    fn pins_that_die_with_the_process_refuse_fail_static_or_warn() {
        let why = Some("a mount namespace of its own");
        let refused = fail_static_refusal(&config(""), why).expect("on by default");
        assert!(refused.contains("daemon.fail_static"), "{refused}");
        assert_eq!(fail_static_refusal(&config(""), None), None);
        let off = config("fail_static = false");
        assert_eq!(fail_static_refusal(&off, why), None);
        let private = HostFacts {
            private_pins: why.map(String::from),
            ..facts(Plan::Fresh)
        };
        let p = plan(&off, &private);
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].starts_with("no fail-static"));
        // Nothing enforced (measure only): nothing to keep in force, so no refusal.
        let measuring = Config::parse(
            "[daemon]\nmeasure_only = true\n[[service]]\nname = \"a\"\nports = [80]\n",
        )
        .expect("config");
        assert_eq!(fail_static_refusal(&measuring, why), None);
    }

    #[test]
    fn the_controller_continues_from_adopted_maps_within_bounds() {
        let cfg = config("");
        let s = &cfg.services[0];
        let at = |total_limit, configured| ServicePolicy {
            total_limit,
            configured,
            ..ServicePolicy::default()
        };
        assert_eq!(initial_limit(s, true, Some(&at(64, POLICY_CONFIGURED))), 64);
        // Not adopted, not configured, outside the bounds, or unreadable: the fallback.
        assert_eq!(
            initial_limit(s, false, Some(&at(64, POLICY_CONFIGURED))),
            20
        );
        assert_eq!(initial_limit(s, true, Some(&at(64, 0))), 20);
        assert_eq!(
            initial_limit(s, true, Some(&at(500, POLICY_CONFIGURED))),
            20
        );
        assert_eq!(initial_limit(s, true, Some(&at(2, POLICY_CONFIGURED))), 20);
        assert_eq!(initial_limit(s, true, None), 20);
    }
}
