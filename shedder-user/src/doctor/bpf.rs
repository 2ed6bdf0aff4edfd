//! The BPF settings: the JIT and run-time statistics.

use std::{io, path::Path};

use super::Check;

pub(super) const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
pub(super) const BPF_JIT_SYSCTL: &str = "/proc/sys/net/core/bpf_jit_enable";

/// Whether this process is in the initial network namespace (`None`: cannot tell), from a
/// sysctl registered there only (`net.core.netdev_max_backlog`, like `bpf_jit_enable`).
pub(super) fn in_initial_netns() -> Option<bool> {
    let core = Path::new("/proc/sys/net/core");
    core.is_dir()
        .then(|| core.join("netdev_max_backlog").exists())
}

pub(super) fn check_jit(sysctl: io::Result<String>, initial_netns: Option<bool>) -> Check {
    const NAME: &str = "bpf jit";
    let fix = "sysctl -w net.core.bpf_jit_enable=1";
    if let (Err(e), Some(false)) = (&sysctl, initial_netns)
        && e.kind() == io::ErrorKind::NotFound
    {
        return Check::warn(
            NAME,
            "not checked: net.core.bpf_jit_enable exists only in the initial network namespace",
            "run doctor in the initial network namespace to check it",
        );
    }
    match sysctl.as_deref().map(str::trim) {
        Ok("1") => Check::ok(NAME, "enabled"),
        Ok("2") => Check::warn(
            NAME,
            "enabled with debug output to the kernel log (bpf_jit_enable=2)",
            fix,
        ),
        Ok("0") => Check::warn(
            NAME,
            "disabled: programs run interpreted, several times slower",
            fix,
        ),
        Ok(other) => Check::warn(NAME, format!("bpf_jit_enable is `{other}`"), fix),
        Err(e) => Check::warn(
            NAME,
            format!("cannot read {BPF_JIT_SYSCTL}: {e}"),
            "a kernel with CONFIG_BPF_JIT=y",
        ),
    }
}

pub(super) fn check_bpf_stats(sysctl: io::Result<String>, can_enable: bool) -> Check {
    const NAME: &str = "bpf stats";
    match sysctl {
        Ok(v) if v.trim() == "1" => Check::ok(NAME, "enabled (kernel.bpf_stats_enabled=1)"),
        Ok(_) if can_enable => Check::ok(
            NAME,
            "available: the daemon turns them on with BPF_ENABLE_STATS while it runs",
        ),
        Ok(_) => Check::warn(
            NAME,
            "available, but BPF_ENABLE_STATS needs CAP_SYS_ADMIN: no per-program cost metric",
            "grant CAP_SYS_ADMIN, or sysctl -w kernel.bpf_stats_enabled=1",
        ),
        Err(e) => Check::warn(
            NAME,
            format!("{BPF_STATS_SYSCTL}: {e}: no per-program cost metric"),
            "a kernel ≥ 5.8 (BPF run-time statistics)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn sysctl_verdicts() {
        assert_eq!(check_jit(Ok("1\n".into()), Some(true)).status, Status::Ok);
        assert_eq!(check_jit(Ok("0\n".into()), Some(true)).status, Status::Warn);
        assert_eq!(check_jit(Ok("2\n".into()), Some(true)).status, Status::Warn);
        assert_eq!(
            check_jit(Err(io::ErrorKind::NotFound.into()), Some(true)).status,
            Status::Warn
        );
        let elsewhere = check_jit(Err(io::ErrorKind::NotFound.into()), Some(false));
        assert!(
            elsewhere.detail.contains("initial network namespace"),
            "{elsewhere:?}"
        );
        assert_eq!(check_bpf_stats(Ok("0\n".into()), true).status, Status::Ok);
        assert_eq!(
            check_bpf_stats(Ok("0\n".into()), false).status,
            Status::Warn
        );
        assert_eq!(check_bpf_stats(Ok("1\n".into()), false).status, Status::Ok);
        assert_eq!(
            check_bpf_stats(Err(io::ErrorKind::NotFound.into()), true).status,
            Status::Warn
        );
    }
}
