//! The configured interfaces: XDP support, the attach mode the daemon would choose, what is
//! attached now, and the driver's count of resets it failed to send.

use std::io;

use super::Check;
use crate::{
    config::{Attach, Config},
    kernel::{
        netdev::{XDP_ACT_BASIC, ifindex},
        version::{TCX_KERNEL, running_kernel},
    },
};

/// Drivers known to have native XDP, used when the kernel cannot tell (before 6.3, which
/// added the netdev family's `xdp-features`). A heuristic: the list is not exhaustive.
const NATIVE_XDP_DRIVERS: &[&str] = &[
    "veth",
    "virtio_net",
    "tun",
    "bonding",
    "i40e",
    "ice",
    "ixgbe",
    "ixgbevf",
    "igb",
    "igc",
    "mlx4_en",
    "mlx5_core",
    "bnxt_en",
    "nfp",
    "qede",
    "ena",
    "gve",
    "hv_netvsc",
    "sfc",
    "mvneta",
    "mvpp2",
    "fec",
];

pub(super) fn check_interface(cfg: &Config, iface: &str, start: &str) -> Vec<Check> {
    let Some(ifindex) = ifindex(iface) else {
        return vec![Check::fail(
            "interface",
            format!("{iface}: no such interface in this network namespace"),
            "fix daemon.interfaces (`ip link` lists the interfaces), or run doctor in the daemon's network namespace",
        )];
    };
    let driver = crate::kernel::netdev::driver(iface).unwrap_or_else(|| "virtual".to_string());
    let features = crate::kernel::netdev::netlink::xdp_features(ifindex).ok();
    let native = match features {
        Some(f) => Some(f & XDP_ACT_BASIC != 0),
        None if NATIVE_XDP_DRIVERS.contains(&driver.as_str()) => Some(true),
        None => None,
    };
    let support = match (native, features.is_some()) {
        (Some(true), true) => "native XDP",
        (Some(true), false) => "native XDP likely",
        (Some(false), _) => "no native XDP",
        (None, _) => "native XDP unknown",
    };
    let head = format!("{iface}: {driver}, {support}");
    let mut out = Vec::new();
    let tcx = running_kernel().map(|v| v >= TCX_KERNEL);
    let facts = crate::kernel::netdev::Facts {
        driver: Some(driver.clone()),
        xdp_features: features,
    };
    // The mode the daemon would choose so that the configured action is delivered.
    let chosen = crate::kernel::netdev::choose(
        iface,
        cfg.daemon.attach,
        &facts,
        cfg.sends_replies(),
        tcx != Some(false),
    );
    let attach = match &chosen {
        Ok((mode, _)) => *mode,
        Err(_) => cfg.daemon.attach,
    };
    let asked = cfg.daemon.attach.as_str();
    out.push(match (&chosen, attach, native) {
        (Err(why), _, _) => Check::fail(
            "interface",
            format!("{head}; {why}"),
            "set daemon.attach = \"auto\" or \"tc\" (or action = \"drop\")",
        ),
        (Ok((_, Some(_))), Attach::Tc | Attach::Generic, _) if asked == "auto" => Check::ok(
            "interface",
            format!(
                "{head}; attach = auto → {}, because {}",
                if attach == Attach::Tc {
                    "tc"
                } else {
                    "generic XDP"
                },
                crate::kernel::netdev::auto_on_veth_reason(cfg.sends_replies())
            ),
        ),
        (Ok(_), Attach::Tc, _) if tcx == Some(false) => Check::ok(
            "interface",
            format!(
                "{head}; attach = tc, as a netlink cls_bpf filter (no tcx before Linux \
                 {TCX_KERNEL})"
            ),
        ),
        (Ok(_), Attach::Tc, _) => Check::ok("interface", format!("{head}; attach = tc")),
        (Ok(_), Attach::Generic, _) => Check::ok("interface", format!("{head}; attach = generic")),
        (Ok(_), Attach::Native, Some(false)) => Check::fail(
            "interface",
            format!("{head}; attach = native cannot work"),
            "set daemon.attach = \"auto\" (generic XDP fallback) or \"tc\"",
        ),
        (Ok(_), Attach::Native, None) => Check::warn(
            "interface",
            format!("{head}; attach = native may fail"),
            "if attaching fails, set daemon.attach = \"auto\" or \"tc\"",
        ),
        (Ok((_, Some(note))), Attach::Native, Some(true)) => Check::warn(
            "interface",
            format!("{head}; attach = native: {note}"),
            "set daemon.attach = \"auto\" (tc on a veth)",
        ),
        (Ok(_), Attach::Native, Some(true)) => {
            Check::ok("interface", format!("{head}; attach = native"))
        }
        (Ok(_), Attach::Auto, Some(false)) => {
            Check::ok("interface", format!("{head}; attach = auto → generic XDP"))
        }
        (Ok(_), Attach::Auto, _) => {
            Check::ok("interface", format!("{head}; attach = auto → native"))
        }
    });
    let xdp = crate::kernel::netdev::netlink::xdp_attachment(ifindex);
    let ours = match &xdp {
        Ok(Some(a)) => {
            let name = program_name(a.prog_id);
            let ours = name.as_deref() == Some(shedder_common::programs::XDP);
            Some((*a, name, ours))
        }
        _ => None,
    };
    out.push(check_attachment(cfg, iface, &xdp, ours.as_ref(), start));
    // What runs now: shedder's native XDP program on a veth whose peer takes no XDP_TX
    // frames drops every reset it sends.
    if cfg.sends_replies()
        && matches!(&ours, Some((a, _, true)) if a.mode == crate::kernel::netdev::netlink::XDP_ATTACHED_DRV)
        && let Some(problem) = facts.reset_problem(iface)
    {
        out.push(Check::fail(
            "resets",
            problem,
            format!(
                "shedder detach, then {start} with daemon.attach = \"auto\" (tc on a veth), or give the peer an XDP program"
            ),
        ));
    }
    match crate::kernel::netdev::xdp_tx_errors(iface) {
        Ok(Some(n)) if n > 0 => out.push(Check::warn(
            "resets",
            format!(
                "{iface}: the driver counts {n} frames XDP_TX failed to send (xdp_tx_errors): resets that never reached a client, now or earlier"
            ),
            "watch shedder_xdp_tx_errors_total; on a veth use daemon.attach = \"auto\" or \"tc\"",
        )),
        _ => {}
    }
    out
}

/// shedder's attachment to `iface`: the pinned link against the XDP program the kernel
/// reports (`attached`: the attachment, the program's name, whether it is shedder's).
fn check_attachment(
    cfg: &Config,
    iface: &str,
    xdp: &io::Result<Option<crate::kernel::netdev::netlink::XdpAttachment>>,
    attached: Option<&(
        crate::kernel::netdev::netlink::XdpAttachment,
        Option<String>,
        bool,
    )>,
    start: &str,
) -> Check {
    const NAME: &str = "attachment";
    let pin = crate::kernel::pinned_ingress(&cfg.daemon.pin_dir, iface)
        .unwrap_or_else(|| cfg.daemon.pin_dir.join("links").join(iface));
    let pinned = match std::fs::metadata(&pin) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Check::warn(
                NAME,
                format!("{iface}: cannot look for {}: {e}", pin.display()),
                "run doctor as root",
            );
        }
        Err(_) => false,
    };
    let is_shedder = attached.is_some_and(|a| a.2);
    let prog = attached.map(|(a, name, _)| (a, name.clone()));
    let describe = |(a, name): &(
        &crate::kernel::netdev::netlink::XdpAttachment,
        Option<String>,
    )| {
        format!(
            "{} (prog id {}, {})",
            a.mode_name(),
            a.prog_id,
            name.as_deref().unwrap_or("name unknown")
        )
    };
    match (pinned, &prog, cfg.daemon.attach) {
        (true, Some(p), _) if is_shedder => Check::ok(
            NAME,
            format!("{iface}: {}, link pinned at {}", describe(p), pin.display()),
        ),
        (true, None, Attach::Tc) => {
            Check::ok(NAME, format!("{iface}: tc pinned at {}", pin.display()))
        }
        (true, Some(p), _) => Check::warn(
            NAME,
            format!(
                "{iface}: link pinned at {}, but the XDP program attached is {}",
                pin.display(),
                describe(p)
            ),
            format!(
                "bpftool net show dev {iface}; if stale: shedder detach --pin-dir {}, then {start}",
                cfg.daemon.pin_dir.display()
            ),
        ),
        (true, None, _) => Check::warn(
            NAME,
            format!(
                "{iface}: link pinned at {} but no XDP program attached (interface re-created, or attached with tc)",
                pin.display()
            ),
            format!(
                "shedder detach --pin-dir {}, then {start}",
                cfg.daemon.pin_dir.display()
            ),
        ),
        (false, Some(p), _) if is_shedder => Check::warn(
            NAME,
            format!(
                "{iface}: {} attached but not pinned under {}",
                describe(p),
                cfg.daemon.pin_dir.display()
            ),
            "another pin directory or a process holds it: check daemon.pin_dir",
        ),
        (false, Some(p), Attach::Tc) => Check::warn(
            NAME,
            format!(
                "{iface}: not attached; another XDP program runs before shedder's TC program: {}",
                describe(p)
            ),
            format!("bpftool net show dev {iface} shows it; then {start}"),
        ),
        (false, Some(p), _) => Check::fail(
            NAME,
            format!(
                "{iface}: another XDP program is attached, shedder cannot attach next to it: {}",
                describe(p)
            ),
            format!(
                "find its owner (`bpftool net show dev {iface}`) and remove it, or set daemon.attach = \"tc\""
            ),
        ),
        (false, None, _) => {
            let note = match xdp {
                Err(e) => format!(" (XDP state unknown: {e})"),
                Ok(_) => String::new(),
            };
            Check::warn(
                NAME,
                format!("{iface}: shedder is not attached{note}"),
                start,
            )
        }
    }
}

/// The name of the loaded BPF program `id`.
fn program_name(id: u32) -> Option<String> {
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == id)
        .and_then(|p| p.name_as_str().map(str::to_string))
}
