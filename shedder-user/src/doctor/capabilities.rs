//! The capabilities shedder needs, in this process's effective set.

use super::Check;

/// Capabilities shedder needs: (number, name, what for).
const CAPABILITIES: [(u32, &str, &str); 4] = [
    (39, "CAP_BPF", "loading programs and maps"),
    (
        38,
        "CAP_PERFMON",
        "pointer arithmetic and packet access in programs",
    ),
    (12, "CAP_NET_ADMIN", "attaching to interfaces"),
    (
        21,
        "CAP_SYS_ADMIN",
        "BPF statistics, mounting bpffs/tracefs, reading program info",
    ),
];
pub(super) const CAP_SYS_ADMIN: u32 = 21;
/// Lets the loader lift RLIMIT_MEMLOCK (kernels before 5.11 charge BPF maps to it).
pub(super) const CAP_SYS_RESOURCE: u32 = 24;

/// The `CapEff` mask of a `/proc/<pid>/status` text.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let hex = line.strip_prefix("CapEff:")?.trim();
        u64::from_str_radix(hex, 16).ok()
    })
}

pub(super) fn has_cap(mask: u64, cap: u32) -> bool {
    mask & (1u64 << cap) != 0
}

/// Capabilities of [`CAPABILITIES`] missing from `mask`. CAP_SYS_ADMIN stands in for
/// CAP_BPF and CAP_PERFMON (the kernel accepts either).
pub fn missing_capabilities(mask: u64) -> Vec<&'static str> {
    let admin = has_cap(mask, CAP_SYS_ADMIN);
    CAPABILITIES
        .iter()
        .filter(|&&(cap, name, _)| {
            let implied = admin && matches!(name, "CAP_BPF" | "CAP_PERFMON");
            !has_cap(mask, cap) && !implied
        })
        .map(|&(_, name, _)| name)
        .collect()
}

pub(super) fn check_capabilities(cap_eff: Option<u64>) -> Check {
    const NAME: &str = "capabilities";
    let all: Vec<&str> = CAPABILITIES.iter().map(|c| c.1).collect();
    let unit_fix = format!(
        "run as root, or in the systemd unit: AmbientCapabilities={}",
        all.join(" ")
    );
    let Some(mask) = cap_eff else {
        return Check::fail(NAME, "cannot read CapEff from /proc/self/status", unit_fix);
    };
    let missing = missing_capabilities(mask);
    if missing.is_empty() {
        return Check::ok(NAME, format!("{} (effective)", all.join(" ")));
    }
    let why: Vec<String> = CAPABILITIES
        .iter()
        .filter(|c| missing.contains(&c.1))
        .map(|&(_, name, what)| format!("{name} ({what})"))
        .collect();
    Check::fail(NAME, format!("missing {}", why.join(", ")), unit_fix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tcat\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n";
        let mask = parse_cap_eff(status).expect("CapEff");
        assert_eq!(mask, 0x000001fffeffffff);
        assert!(missing_capabilities(mask).is_empty());
        assert_eq!(check_capabilities(Some(mask)).status, Status::Ok);
        assert_eq!(parse_cap_eff("Name:\tcat\n"), None);
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn missing_capabilities_are_listed() {
        assert_eq!(
            missing_capabilities(0),
            ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"]
        );
        // CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON.
        let admin_net = (1 << 21) | (1 << 12);
        assert!(missing_capabilities(admin_net).is_empty());
        let bpf_only = (1u64 << 39) | (1 << 38) | (1 << 12);
        assert_eq!(missing_capabilities(bpf_only), ["CAP_SYS_ADMIN"]);
        let c = check_capabilities(Some(bpf_only));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("CAP_SYS_ADMIN"), "{}", c.detail);
        assert!(
            c.fix.as_deref().unwrap().contains("AmbientCapabilities="),
            "{c:?}"
        );
        assert_eq!(check_capabilities(None).status, Status::Fail);
    }
}
