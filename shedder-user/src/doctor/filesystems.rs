//! The pseudo-filesystem shedder pins in: bpffs.

use super::Check;

/// `(mount point, filesystem type)` of each line of a `/proc/mounts` text.
pub fn parse_mounts(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            Some((unescape_mount(dir), fstype.to_string()))
        })
        .collect()
}

/// `/proc/mounts` writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = bytes.get(i + 1..i + 4)
            && oct.iter().all(|b| (b'0'..=b'7').contains(b))
            && let Ok(v) = u8::try_from(oct.iter().fold(0u32, |a, b| a * 8 + u32::from(b - b'0')))
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn is_mounted(mounts: &[(String, String)], dir: &str, fstype: &str) -> bool {
    mounts.iter().any(|(d, t)| d == dir && t == fstype)
}

#[derive(Clone, Copy)]
pub(super) struct MountSpec {
    pub(super) name: &'static str,
    pub(super) dir: &'static str,
    pub(super) fstype: &'static str,
    needed_for: &'static str,
}

impl MountSpec {
    pub(super) const BPFFS: Self = Self {
        name: "bpffs",
        dir: crate::kernel::sysfs::BPFFS,
        fstype: "bpf",
        needed_for: "pinned maps and links",
    };
}

pub(super) fn check_mount(mounts: &[(String, String)], spec: MountSpec, can_mount: bool) -> Check {
    let MountSpec {
        name,
        dir,
        fstype,
        needed_for,
    } = spec;
    let fix = format!("mount -t {fstype} {fstype} {dir}");
    if is_mounted(mounts, dir, fstype) {
        Check::ok(name, format!("mounted at {dir}"))
    } else if let Some((_, other)) = mounts.iter().rev().find(|(d, _)| d == dir) {
        Check::fail(
            name,
            format!("{dir} holds a {other} filesystem, not {fstype} ({needed_for})"),
            format!("umount {dir}; {fix}"),
        )
    } else if can_mount {
        Check::warn(
            name,
            format!("not mounted at {dir} ({needed_for}); shedder mounts it when it starts"),
            fix,
        )
    } else {
        Check::fail(
            name,
            format!(
                "not mounted at {dir} ({needed_for}), and shedder cannot mount it without CAP_SYS_ADMIN"
            ),
            fix,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    const MOUNTS: &str = "\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
bpf /sys/fs/bpf bpf rw,relatime 0 0
none /mnt/with\\040space tmpfs rw 0 0
";

    #[test]
    fn parses_mounts() {
        let m = parse_mounts(MOUNTS);
        assert_eq!(m.len(), 5);
        assert!(is_mounted(&m, "/sys/fs/bpf", "bpf"));
        assert!(!is_mounted(&m, "/sys/kernel/tracing", "tracefs"));
        assert!(!is_mounted(&m, "/sys/fs/bpf", "tmpfs"));
        assert!(is_mounted(&m, "/mnt/with space", "tmpfs"));
        assert_eq!(unescape_mount("a\\134b"), "a\\b");
        assert_eq!(unescape_mount("trailing\\"), "trailing\\");
        assert_eq!(unescape_mount("short\\04"), "short\\04");
    }

    #[test]
    fn mount_verdicts() {
        let m = parse_mounts(MOUNTS);
        assert_eq!(check_mount(&m, MountSpec::BPFFS, false).status, Status::Ok);
        let missing = parse_mounts("sysfs /sys sysfs rw 0 0\n");
        let t = check_mount(&missing, MountSpec::BPFFS, true);
        assert_eq!(t.status, Status::Warn);
        assert_eq!(t.fix.as_deref(), Some("mount -t bpf bpf /sys/fs/bpf"));
        assert_eq!(
            check_mount(&missing, MountSpec::BPFFS, false).status,
            Status::Fail
        );
        let shadowed = parse_mounts("tmpfs /sys/fs/bpf tmpfs rw 0 0\n");
        assert_eq!(
            check_mount(&shadowed, MountSpec::BPFFS, true).status,
            Status::Fail
        );
    }
}
