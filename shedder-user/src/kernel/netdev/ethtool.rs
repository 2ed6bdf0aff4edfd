//! The ethtool ioctl (SIOCETHTOOL): an interface's driver and its statistics. Works in the
//! calling thread's network namespace, where sysfs may show another one.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// More statistics than any driver has; bounds what is allocated for a reply.
const MAX_STATS: u32 = 1 << 16;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    pad: [u8; 16],
}

/// Run one ethtool command on `iface`; `buf` starts with the command's `cmd` word and is
/// filled in by the kernel.
fn ioctl(iface: &str, buf: &mut [u8]) -> io::Result<()> {
    if iface.is_empty() || iface.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an interface name",
        ));
    }
    // SAFETY: plain socket call; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: buf.as_mut_ptr().cast(),
        pad: [0; 16],
    };
    req.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: req points at `buf`, which is as long as the command's reply needs.
    if unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// The interface's driver name (`ethtool -i`).
pub fn driver(iface: &str) -> Option<String> {
    // struct ethtool_drvinfo: cmd, then driver[32] …, 196 bytes in all.
    let mut buf = [0u8; 196];
    buf[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    ioctl(iface, &mut buf).ok()?;
    let name = &buf[4..4 + 32];
    let end = name.iter().position(|&b| b == 0).unwrap_or(32);
    let name = String::from_utf8_lossy(&name[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// The driver's statistics (`ethtool -S`): name and value of each.
pub fn statistics(iface: &str) -> io::Result<Vec<(String, u64)>> {
    // struct ethtool_sset_info: cmd, reserved, sset_mask (u64), then one u32 per set asked.
    let mut info = [0u8; 20];
    info[..4].copy_from_slice(&ETHTOOL_GSSET_INFO.to_ne_bytes());
    info[8..16].copy_from_slice(&(1u64 << ETH_SS_STATS).to_ne_bytes());
    ioctl(iface, &mut info)?;
    let mask = u64::from_ne_bytes(info[8..16].try_into().expect("8 bytes"));
    if mask & (1 << ETH_SS_STATS) == 0 {
        return Ok(Vec::new());
    }
    let n = u32_at(&info, 16).min(MAX_STATS);
    // struct ethtool_gstrings: cmd, string_set, len, then len × 32 bytes.
    let mut strings = vec![0u8; 12 + n as usize * ETH_GSTRING_LEN];
    strings[..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
    strings[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
    strings[8..12].copy_from_slice(&n.to_ne_bytes());
    ioctl(iface, &mut strings)?;
    // struct ethtool_stats: cmd, n_stats, then n_stats × u64.
    let mut stats = vec![0u8; 8 + n as usize * 8];
    stats[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
    stats[4..8].copy_from_slice(&n.to_ne_bytes());
    ioctl(iface, &mut stats)?;
    let got = u32_at(&stats, 4).min(n) as usize;
    Ok((0..got)
        .map(|i| {
            let raw = &strings[12 + i * ETH_GSTRING_LEN..12 + (i + 1) * ETH_GSTRING_LEN];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(ETH_GSTRING_LEN);
            let name = String::from_utf8_lossy(&raw[..end]).into_owned();
            let value = u64::from_ne_bytes(stats[8 + i * 8..16 + i * 8].try_into().expect("8"));
            (name, value)
        })
        .collect())
}
