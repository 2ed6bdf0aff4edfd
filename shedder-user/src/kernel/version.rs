//! Kernel versions: the oldest shedder supports, the first with what a feature needs, and
//! the running one.

use std::io;

/// The documented minimum: the oldest kernel `cargo xtask vm-test` passes on (every program
/// loads, the fixture table and a network-namespace test pass; docs/kernels.md). Below it:
/// Fail.
pub const MIN_KERNEL: KernelVersion = KernelVersion::new(5, 10, 0);
/// The first kernel with tcx (bpf-link TC attachments); before it, TC programs are attached
/// as netlink cls_bpf filters.
pub const TCX_KERNEL: KernelVersion = KernelVersion::new(6, 6, 0);
/// The oldest kernel whose verifier was seen to accept the QUIC programs (6.1's gives up at
/// its limit of processed instructions; docs/kernels.md).
pub const QUIC_KERNEL: KernelVersion = KernelVersion::new(6, 12, 0);
/// The kernels `cargo xtask vm-test` runs on.
pub const TESTED_KERNEL: &str = "5.10, 6.1, 6.12 and 6.18";
/// From this kernel BPF memory is charged to the memory cgroup and RLIMIT_MEMLOCK no longer
/// applies.
pub const MEMCG_BPF_KERNEL: KernelVersion = KernelVersion::new(5, 11, 0);

/// A kernel release's leading `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KernelVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// `6.18.44-fc-v782` → 6.18.44; `5.15.0-91-generic` → 5.15.0; `6.1` → 6.1.0.
pub fn parse_kernel_release(release: &str) -> Option<KernelVersion> {
    let end = release
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(release.len());
    let mut parts = release[..end].split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(KernelVersion::new(major, minor, patch))
}

/// The running kernel's version, if its release string parses.
pub fn running_kernel() -> Option<KernelVersion> {
    kernel_release().ok().and_then(|r| parse_kernel_release(&r))
}

pub fn kernel_release() -> io::Result<String> {
    // SAFETY: utsname is plain data; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(
            parse_kernel_release("6.18.44-fc-v782"),
            Some(KernelVersion::new(6, 18, 44))
        );
        assert_eq!(
            parse_kernel_release("5.15.0-91-generic"),
            Some(KernelVersion::new(5, 15, 0))
        );
        assert_eq!(
            parse_kernel_release("6.1"),
            Some(KernelVersion::new(6, 1, 0))
        );
        assert_eq!(
            parse_kernel_release("6.8.0-rc3+"),
            Some(KernelVersion::new(6, 8, 0))
        );
        assert_eq!(
            parse_kernel_release("4.19.0"),
            Some(KernelVersion::new(4, 19, 0))
        );
        assert_eq!(parse_kernel_release("6"), None);
        assert_eq!(parse_kernel_release("linux"), None);
        assert_eq!(parse_kernel_release(""), None);
    }
}
