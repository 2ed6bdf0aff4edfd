//! The kernel: its version, and the locked-memory limit older kernels charge BPF maps to.

use super::Check;
use crate::kernel::version::{
    KernelVersion, MEMCG_BPF_KERNEL, MIN_KERNEL, TESTED_KERNEL, parse_kernel_release,
};

/// Below [`MEMCG_BPF_KERNEL`], a locked-memory limit under this is reported.
const MIN_MEMLOCK_BYTES: u64 = 64 << 20;

pub(super) fn check_kernel(release: Result<&str, String>) -> Check {
    const NAME: &str = "kernel";
    let release = match release {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("uname failed: {e}"),
                "cannot tell the kernel version",
            );
        }
    };
    let Some(v) = parse_kernel_release(release) else {
        return Check::warn(
            NAME,
            format!("{release}: cannot parse the version"),
            format!("shedder needs Linux {MIN_KERNEL} or newer; check it by hand"),
        );
    };
    if v < MIN_KERNEL {
        Check::fail(
            NAME,
            format!(
                "{release}: older than {MIN_KERNEL}, the oldest kernel shedder is tested on \
                 (tested: {TESTED_KERNEL}; see docs/kernels.md)"
            ),
            format!("run a kernel ≥ {MIN_KERNEL}"),
        )
    } else {
        Check::ok(NAME, format!("{release} (tested: {TESTED_KERNEL})"))
    }
}

/// Before Linux 5.11 BPF maps count against RLIMIT_MEMLOCK. shedder lifts its own limit
/// when it loads (`raise` true: it has CAP_SYS_RESOURCE, or the hard limit allows); a low
/// limit it cannot lift is a warning.
pub(super) fn check_memlock(
    kernel: Option<KernelVersion>,
    limit: Option<u64>,
    raise: bool,
) -> Option<Check> {
    let v = kernel?;
    let limit = limit?;
    (v < MEMCG_BPF_KERNEL && limit < MIN_MEMLOCK_BYTES && !raise).then(|| {
        Check::warn(
            "memlock",
            format!(
                "RLIMIT_MEMLOCK is {} KiB, kernel {v} charges BPF maps to it, and shedder cannot \
                 raise it without CAP_SYS_RESOURCE: loading may fail with EPERM",
                limit >> 10
            ),
            "LimitMEMLOCK=infinity in the systemd unit, or `ulimit -l unlimited` before starting shedder",
        )
    })
}

/// The soft locked-memory limit in bytes (`u64::MAX` when unlimited).
pub(super) fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return None;
    }
    // RLIM_INFINITY is u64::MAX.
    Some(rl.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn kernel_thresholds() {
        let status = |r: &str| check_kernel(Ok(r)).status;
        assert_eq!(status("4.19.0"), Status::Fail);
        assert_eq!(status("5.4.0-150-generic"), Status::Fail);
        assert_eq!(status("5.9.16"), Status::Fail);
        assert_eq!(status("5.10.200"), Status::Ok);
        assert_eq!(status("5.14.0-427.el9.x86_64"), Status::Ok);
        assert_eq!(status("5.15.0-91-generic"), Status::Ok);
        assert_eq!(status("6.0.19"), Status::Ok);
        assert_eq!(status("6.1.0-28-amd64"), Status::Ok);
        assert_eq!(status("6.12.9"), Status::Ok);
        assert_eq!(status("6.18.44-fc-v782"), Status::Ok);
        assert_eq!(status("7.0"), Status::Ok);
        assert_eq!(status("weird"), Status::Warn);
        assert_eq!(check_kernel(Err("EFAULT".into())).status, Status::Fail);
        assert!(check_kernel(Ok("5.4.0")).fix.is_some());
    }

    #[test]
    fn memlock_only_matters_before_memcg_accounting() {
        let old = Some(KernelVersion::new(5, 10, 0));
        let new = Some(KernelVersion::new(5, 11, 0));
        assert_eq!(
            check_memlock(old, Some(64 << 10), false).map(|c| c.status),
            Some(Status::Warn)
        );
        // shedder lifts the limit itself when it may.
        assert_eq!(check_memlock(old, Some(64 << 10), true), None);
        assert_eq!(check_memlock(old, Some(u64::MAX), false), None);
        assert_eq!(check_memlock(new, Some(64 << 10), false), None);
        assert_eq!(check_memlock(None, Some(0), false), None);
    }
}
