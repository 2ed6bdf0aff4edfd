//! cgroup v2, pressure stall information, and each configured service's cgroup.

use std::path::Path;

use super::Check;
use crate::config::Config;

const PSI_CPU: &str = "/proc/pressure/cpu";

/// cgroup v2, PSI and the configured services' cgroups; `mounts` (the mount table, when it
/// could be read) tells a hybrid host.
pub(super) fn check_cgroups(
    config: Option<&Config>,
    mounts: Option<&[(String, String)]>,
) -> Vec<Check> {
    let services: Vec<(&str, &str)> = config
        .map(|c| {
            c.services
                .iter()
                .filter_map(|s| Some((s.name.as_str(), s.cgroup.as_deref()?)))
                .collect()
        })
        .unwrap_or_default();
    // A missing signal fails when a service needs it (names a cgroup), else warns.
    let missing = |name, detail: String, fix| {
        if services.is_empty() {
            Check::warn(name, detail, fix)
        } else {
            Check::fail(name, detail, fix)
        }
    };
    let mut out = Vec::new();
    let mount = crate::signals::psi::cgroup2_mount();
    out.push(match &mount {
        Ok(m) => {
            let hybrid = mounts.is_some_and(|m| m.iter().any(|(_, t)| t == "cgroup"));
            let note = if hybrid {
                " (hybrid: v1 controllers mounted too)"
            } else {
                ""
            };
            Check::ok("cgroup v2", format!("mounted at {}{note}", m.display()))
        }
        Err(e) => {
            let detail = format!("{e}: cgroup pressure and throttling signals unavailable");
            let fix = "mount -t cgroup2 none /sys/fs/cgroup (or boot with systemd.unified_cgroup_hierarchy=1)";
            missing("cgroup v2", detail, fix)
        }
    });
    let psi = std::fs::read_to_string(PSI_CPU);
    out.push(match &psi {
        Ok(_) => Check::ok("psi", "pressure stall information enabled"),
        Err(e) => {
            let detail = format!("{PSI_CPU}: {e}: no CPU pressure signal");
            missing("psi", detail, "boot with psi=1 (kernel with CONFIG_PSI=y)")
        }
    });
    if let Ok(mount) = &mount {
        for (service, cgroup) in services {
            out.push(check_service_cgroup(
                service,
                &mount.join(cgroup),
                psi.is_ok(),
            ));
        }
    }
    out
}

fn check_service_cgroup(service: &str, dir: &Path, psi: bool) -> Check {
    const NAME: &str = "cgroup";
    if !dir.is_dir() {
        return Check::fail(
            NAME,
            format!("{service}: {} does not exist", dir.display()),
            format!(
                "set service.cgroup of `{service}` to its cgroup relative to the cgroup v2 mount (for a systemd unit: system.slice/<unit>.service; `systemctl status <unit>` shows it)"
            ),
        );
    }
    let unreadable: Vec<String> = ["cpu", "memory", "io"]
        .iter()
        .filter_map(|r| {
            let file = format!("{r}.pressure");
            std::fs::read_to_string(dir.join(&file))
                .err()
                .map(|e| format!("{file} ({e})"))
        })
        .collect();
    if !unreadable.is_empty() {
        let fix = if psi {
            "run doctor as the daemon's user; check the cgroup's files are readable".to_string()
        } else {
            "boot with psi=1 (kernel with CONFIG_PSI=y)".to_string()
        };
        return Check::fail(
            NAME,
            format!("{service}: cannot read {}", unreadable.join(", ")),
            fix,
        );
    }
    let throttling = std::fs::read_to_string(dir.join("cpu.stat"))
        .ok()
        .and_then(|t| crate::signals::psi::parse_throttling(&t));
    if throttling.is_none() {
        return Check::warn(
            NAME,
            format!(
                "{service}: {}: pressure ok, but the cpu controller is not enabled for this cgroup in the v2 hierarchy (hybrid host?): CPU throttling is not reported",
                dir.display()
            ),
            "enable it on every parent: echo +cpu > <parent>/cgroup.subtree_control (a hybrid host binds cpu to v1: boot with systemd.unified_cgroup_hierarchy=1)",
        );
    }
    Check::ok(
        NAME,
        format!("{service}: {}: pressure and throttling", dir.display()),
    )
}
