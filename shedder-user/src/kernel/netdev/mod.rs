//! What shedder needs to know about a network interface: its driver, its XDP attachment
//! and features, the driver's XDP transmit errors, and from these the attach mode in which
//! the configured action reaches the client.

pub mod delivery;
pub mod ethtool;
pub mod netlink;

use std::path::Path;

use crate::types::Attach;

/// `NETDEV_XDP_ACT_BASIC`: the driver runs XDP programs natively.
pub const XDP_ACT_BASIC: u64 = 1;
/// `NETDEV_XDP_ACT_NDO_XMIT`: frames can be transmitted from XDP through this interface
/// now. On a veth it is set only while the peer runs XDP or has GRO on (its NAPI is on):
/// otherwise the kernel drops what XDP_TX sends back and counts `xdp_tx_errors`.
pub const XDP_ACT_NDO_XMIT: u64 = 4;

/// The index of interface `iface`, if it exists.
pub fn ifindex(iface: &str) -> Option<u32> {
    let name = std::ffi::CString::new(iface).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// The interface's driver: from the ethtool ioctl, else from sysfs when sysfs shows this
/// network namespace.
pub fn driver(iface: &str) -> Option<String> {
    ethtool::driver(iface).or_else(|| sysfs_driver(iface, ifindex(iface)?))
}

/// The driver from sysfs, when sysfs shows this network namespace (same ifindex).
fn sysfs_driver(iface: &str, ifindex: u32) -> Option<String> {
    let base = Path::new("/sys/class/net").join(iface);
    let index: u32 = std::fs::read_to_string(base.join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if index != ifindex {
        return None;
    }
    let link = std::fs::read_link(base.join("device/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// Whether a driver statistic counts frames that XDP_TX failed to send (veth's
/// `rx_queue_N_xdp_tx_errors`, mlx5's `rx_xdp_tx_err`, …). Not the `xdp_xmit` errors,
/// which count frames redirected into the interface by other programs.
pub fn is_xdp_tx_error(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("xdp") && n.contains("tx_err") && !n.contains("xmit")
}

/// The driver's count of frames XDP_TX failed to send, summed over its queues; `None` when
/// the driver reports no such statistic.
pub fn xdp_tx_errors(iface: &str) -> std::io::Result<Option<u64>> {
    let stats = ethtool::statistics(iface)?;
    let mut found = false;
    let mut sum = 0u64;
    for (name, value) in stats {
        if is_xdp_tx_error(&name) {
            found = true;
            sum = sum.wrapping_add(value);
        }
    }
    Ok(found.then_some(sum))
}

/// What the attach decision needs to know about an interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub driver: Option<String>,
    /// `NETDEV_XDP_ACT_*` (Linux 6.3+; `None` before, or when it cannot be read).
    pub xdp_features: Option<u64>,
}

impl Facts {
    pub fn of(iface: &str) -> Self {
        Self {
            driver: driver(iface),
            xdp_features: ifindex(iface).and_then(|i| netlink::xdp_features(i).ok()),
        }
    }

    pub fn is_veth(&self) -> bool {
        self.driver.as_deref() == Some("veth")
    }

    /// Whether a frame sent back with native XDP_TX is delivered now. `Some(false)` on a
    /// veth whose peer cannot take it; `None` where the kernel does not say (no
    /// xdp-features before 6.3) or the driver is not a veth (physical NICs transmit XDP_TX
    /// on their own queues).
    pub fn native_tx_delivered(&self) -> Option<bool> {
        if !self.is_veth() {
            return None;
        }
        self.xdp_features.map(|f| f & XDP_ACT_NDO_XMIT != 0)
    }

    /// Why native XDP on `iface` cannot send resets now (a veth whose peer takes no
    /// XDP_TX frames), if it cannot.
    pub fn reset_problem(&self, iface: &str) -> Option<String> {
        (self.native_tx_delivered() == Some(false)).then(|| {
            format!("{iface}: resets are dropped: {VETH_NATIVE_TX}, and {PEER_HAS_NEITHER}")
        })
    }
}

/// Why native XDP on a veth cannot send resets, for messages.
pub const VETH_NATIVE_TX: &str = "native XDP on a veth sends its XDP_TX frames (the RST \
     replies) to the peer only while the peer runs an XDP program or has GRO on; otherwise \
     the kernel drops them (the veth's xdp_tx_errors rise) and the client waits for a \
     timeout instead of being refused";

const PEER_HAS_NEITHER: &str = "this veth's peer has neither";

/// Why `auto` leaves native XDP off a veth even when nothing is sent back.
const VETH_NATIVE_COST: &str = "a native XDP program on a veth moves the veth's receive to a \
     NAPI poll of its own, whose price depends on the machine (6-12 µs of CPU per short \
     connection on one measured with a program that does nothing, a faster server on \
     another), while tc leaves the veth as it was; a veth hands XDP a socket buffer that \
     already exists, so native XDP drops little earlier than tc there";

/// Why `attach = auto` attaches a veth with tc, not native XDP.
pub fn auto_on_veth_reason(replies: bool) -> String {
    if replies {
        format!("action = rst and {VETH_NATIVE_TX}")
    } else {
        VETH_NATIVE_COST.to_string()
    }
}

/// [`Facts::reset_problem`] of `iface` as it is now.
pub fn native_reset_problem(iface: &str) -> Option<String> {
    Facts::of(iface).reset_problem(iface)
}

/// The mode to attach `iface` in, so that the configured action reaches the client, and a
/// note when it differs from what was asked.
///
/// `replies`: some enforcing service answers with `rst`, which XDP sends back with XDP_TX.
/// `tcx`: this kernel has tcx (Linux 6.6+); without, `tc` is a netlink cls_bpf filter.
///
/// - `auto` on a veth: `tc`. With replies because native
///   XDP_TX on a veth depends on the peer, which shedder neither sees nor keeps (a
///   container's veth has no XDP program); without, because native XDP changes how a veth
///   receives for a drop little earlier (see [`VETH_NATIVE_COST`]). Elsewhere `auto` is native XDP, else generic.
/// - `native` on a veth with replies whose peer cannot take XDP_TX now: refused.
pub fn choose(
    iface: &str,
    requested: Attach,
    facts: &Facts,
    replies: bool,
    tcx: bool,
) -> Result<(Attach, Option<String>), String> {
    if !facts.is_veth() {
        return Ok((requested, None));
    }
    match requested {
        Attach::Auto => {
            let how = if tcx {
                "tc"
            } else {
                "tc (a netlink filter: no tcx)"
            };
            Ok((
                Attach::Tc,
                Some(format!(
                    "{iface}: attach = auto chose {how}, not native XDP, because {}",
                    auto_on_veth_reason(replies)
                )),
            ))
        }
        Attach::Native if !replies => Ok((Attach::Native, None)),
        Attach::Native => match facts.native_tx_delivered() {
            Some(false) => Err(format!(
                "{iface}: attach = native cannot deliver action = rst here: {VETH_NATIVE_TX}, \
                 and {PEER_HAS_NEITHER}; use attach = \"auto\" (tc on a veth) or \
                 \"tc\", or give the peer an XDP program or GRO (`ethtool -K <peer> gro on`)"
            )),
            Some(true) => Ok((
                Attach::Native,
                Some(format!(
                    "{iface}: native XDP with action = rst works now because the veth's peer \
                     runs XDP or has GRO on; if that changes, resets are dropped \
                     (shedder_xdp_tx_errors_total rises)"
                )),
            )),
            None => Ok((
                Attach::Native,
                Some(format!(
                    "{iface}: cannot tell whether the veth's peer takes XDP_TX frames (no \
                     xdp-features before Linux 6.3): {VETH_NATIVE_TX}"
                )),
            )),
        },
        Attach::Generic | Attach::Tc => Ok((requested, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn veth(features: Option<u64>) -> Facts {
        Facts {
            driver: Some("veth".into()),
            xdp_features: features,
        }
    }

    #[test]
    fn auto_avoids_native_xdp_on_a_veth() {
        let no_peer = veth(Some(XDP_ACT_BASIC));
        let (mode, note) = choose("eth0", Attach::Auto, &no_peer, true, true).unwrap();
        assert_eq!(mode, Attach::Tc);
        assert!(note.unwrap().contains("auto chose tc"));
        let (mode, note) = choose("eth0", Attach::Auto, &no_peer, true, false).unwrap();
        assert_eq!(mode, Attach::Tc, "without tcx: a netlink filter");
        assert!(note.unwrap().contains("netlink filter"));
        // Even while the peer takes XDP_TX: it may stop.
        let peer = veth(Some(XDP_ACT_BASIC | XDP_ACT_NDO_XMIT));
        assert_eq!(
            choose("eth0", Attach::Auto, &peer, true, true).unwrap().0,
            Attach::Tc
        );
        // Drop needs no transmit, but native XDP costs a veth more than it saves.
        let (mode, note) = choose("eth0", Attach::Auto, &no_peer, false, true).unwrap();
        assert_eq!(mode, Attach::Tc);
        assert!(note.unwrap().contains("NAPI poll"));
        assert_eq!(
            choose("eth0", Attach::Auto, &no_peer, false, false)
                .unwrap()
                .0,
            Attach::Tc,
            "without tcx"
        );
        // Asked for by name, native is what a veth gets when nothing is sent back.
        assert_eq!(
            choose("eth0", Attach::Native, &no_peer, false, true).unwrap(),
            (Attach::Native, None)
        );
    }

    #[test]
    fn native_resets_on_a_veth_need_a_peer_that_takes_them() {
        let err = choose(
            "eth0",
            Attach::Native,
            &veth(Some(XDP_ACT_BASIC)),
            true,
            true,
        )
        .unwrap_err();
        assert!(
            err.starts_with("eth0: attach = native cannot deliver action = rst"),
            "{err}"
        );
        let peer = veth(Some(XDP_ACT_BASIC | XDP_ACT_NDO_XMIT));
        assert_eq!(
            choose("eth0", Attach::Native, &peer, true, true).unwrap().0,
            Attach::Native
        );
        assert_eq!(
            choose("eth0", Attach::Native, &veth(None), true, true)
                .unwrap()
                .0,
            Attach::Native
        );
    }

    #[test]
    fn other_drivers_and_modes_are_left_alone() {
        let nic = Facts {
            driver: Some("mlx5_core".into()),
            xdp_features: Some(XDP_ACT_BASIC),
        };
        for mode in [Attach::Auto, Attach::Native, Attach::Generic, Attach::Tc] {
            assert_eq!(
                choose("eth0", mode, &nic, true, true).unwrap(),
                (mode, None)
            );
        }
        let v = veth(Some(XDP_ACT_BASIC));
        for mode in [Attach::Generic, Attach::Tc] {
            assert_eq!(choose("eth0", mode, &v, true, true).unwrap(), (mode, None));
        }
    }

    #[test]
    fn xdp_tx_error_statistics_by_name() {
        for yes in ["rx_queue_0_xdp_tx_errors", "rx_xdp_tx_err", "XDP_TX_ERR"] {
            assert!(is_xdp_tx_error(yes), "{yes}");
        }
        for no in [
            "tx_queue_0_xdp_xmit_errors",
            "rx_queue_0_xdp_tx",
            "tx_errors",
            "rx_xdp_drop",
        ] {
            assert!(!is_xdp_tx_error(no), "{no}");
        }
    }
}
