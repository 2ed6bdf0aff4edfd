//! Attaching the packet path (XDP or TC, with TC egress beside it), adopting pinned
//! attachments, and removing every pin.

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType, XdpMode,
    links::{FdLink, Link as _, LinkType, PinnedLink},
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
};
use shedder_common::programs;

use super::{Error, Result, Shedder};

/// How to attach to an interface: the configuration's `daemon.attach`. [`Shedder::attach`]
/// does what it names (`Auto`: native XDP, else generic); which one delivers the configured
/// action is [`crate::kernel::netdev::choose`]'s decision.
pub use crate::types::Attach as AttachMode;

/// How a program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    XdpNative,
    XdpGeneric,
    Tc,
}

impl Attached {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
            Self::Tc => "tc",
        }
    }
}

impl Shedder {
    pub fn tc(&mut self) -> Result<&mut SchedClassifier> {
        self.program(programs::TC)
    }

    /// The egress program (loaded with the QUIC halves).
    pub fn egress(&mut self) -> Result<&mut SchedClassifier> {
        self.program(programs::EGRESS)
    }

    /// Attach to `iface` in the calling thread's network namespace. With a pin directory,
    /// the link is pinned at `dir/links/<iface>` so it outlives this process.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<Attached> {
        let attach_err = |mode| attach_error(iface, mode);
        let (attached, link): (Attached, FdLink) = match mode {
            AttachMode::Native | AttachMode::Generic | AttachMode::Auto => {
                let xdp = self.xdp()?;
                let (attached, id) = match mode {
                    AttachMode::Generic => (
                        Attached::XdpGeneric,
                        xdp.attach(iface, XdpMode::Skb)
                            .map_err(attach_err("xdp generic"))?,
                    ),
                    AttachMode::Native => (
                        Attached::XdpNative,
                        xdp.attach(iface, XdpMode::Driver)
                            .map_err(attach_err("xdp native"))?,
                    ),
                    _ => match xdp.attach(iface, XdpMode::Driver) {
                        Ok(id) => (Attached::XdpNative, id),
                        Err(_) => (
                            Attached::XdpGeneric,
                            xdp.attach(iface, XdpMode::Skb)
                                .map_err(attach_err("xdp generic after native failed"))?,
                        ),
                    },
                };
                let link = xdp.take_link(id).map_err(attach_err("xdp"))?;
                let link: FdLink =
                    link.try_into()
                        .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                            path: PathBuf::from(iface),
                            reason: format!("XDP attached through netlink, not a bpf link: {e}"),
                        })?;
                (attached, link)
            }
            AttachMode::Tc => {
                match self.attach_tcx(iface, Hook::Ingress)? {
                    Ok(link) => (Attached::Tc, link),
                    // No tcx (before Linux 6.6): a cls_bpf filter through netlink.
                    Err(tcx_error) => {
                        self.attach_netlink(iface, Hook::Ingress)
                            .map_err(|e| with_tcx_error(e, &tcx_error))?;
                        self.attach_egress(iface);
                        return Ok(Attached::Tc);
                    }
                }
            }
        };
        self.keep_link(iface, link)?;
        self.attach_egress(iface);
        Ok(attached)
    }

    /// Attach the egress program to `iface` (see [`programs::EGRESS`]); with a pin directory
    /// the link is pinned at `links/egress-<iface>`, and one an earlier run pinned there is
    /// taken over as [`Shedder::adopt`] does. A failure leaves the packet path deciding
    /// attempts as before, but blind to what the services behind `iface` send: no handshake
    /// there is seen complete, so their connections are counted only by the daemon's sweep,
    /// from the kernel's sockets, with no latency or requests measured; and QUIC clients
    /// cannot prove their addresses. It is logged and kept for `status`
    /// ([`Shedder::egress_problems`]).
    fn attach_egress(&mut self, iface: &str) {
        if let Err(e) = self.try_attach_egress(iface) {
            let why = format!(
                "{iface}: the egress program did not attach ({e}): the TCP services behind \
                 {iface} are measured only from the kernel's sockets (connections counted by \
                 the sweep, no request latency or work in flight), and QUIC clients cannot \
                 prove their addresses (held within their class's unproven cap)"
            );
            tracing::warn!("{why}");
            self.egress_problems.push(why);
        }
    }

    fn try_attach_egress(&mut self, iface: &str) -> Result<()> {
        let pin_name = egress_pin_name(iface);
        let pinned = self
            .pin_dir
            .as_ref()
            .map(|d| d.join("links").join(&pin_name))
            .filter(|p| p.exists());
        let attach_err = |mode| attach_error(iface, mode);
        let prog: &mut SchedClassifier = self.program(programs::EGRESS)?;
        if let Some(path) = pinned {
            let link: FdLink = PinnedLink::from_pin(&path)
                .map_err(|e| Error::Pin {
                    path: path.clone(),
                    reason: e.to_string(),
                })?
                .into();
            let link = link
                .try_into()
                .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            let id = prog
                .attach_to_link(link)
                .map_err(attach_err("tc egress link update"))?;
            drop(prog.take_link(id));
            return Ok(());
        }
        match self.attach_tcx(iface, Hook::Egress)? {
            Ok(link) => self.keep_link(&pin_name, link),
            // No tcx (before Linux 6.6): a cls_bpf filter through netlink.
            Err(tcx_error) => self
                .attach_netlink(iface, Hook::Egress)
                .map_err(|e| with_tcx_error(e, &tcx_error)),
        }
    }

    /// Attach `hook`'s program to `iface` as a tcx link, first in the interface's chain; the
    /// attach error where the kernel has no tcx (before Linux 6.6), for
    /// [`Shedder::attach_netlink`] to follow. First: a program ahead of it that returns
    /// TC_ACT_OK ends the chain, and shedder would then see nothing (its own programs pass
    /// with TCX_NEXT, so those behind it still see all it lets through).
    fn attach_tcx(
        &mut self,
        iface: &str,
        hook: Hook,
    ) -> Result<std::result::Result<FdLink, ProgramError>> {
        // tcx needs no qdisc; a netlink filter needs clsact.
        let _ = tc::qdisc_add_clsact(iface);
        let prog: &mut SchedClassifier = self.program(hook.program())?;
        let tcx = prog.attach_with_options(
            iface,
            hook.attach_type(),
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        );
        let id = match tcx {
            Ok(id) => id,
            Err(e) => return Ok(Err(e)),
        };
        let link = prog
            .take_link(id)
            .map_err(attach_error(iface, hook.tcx_mode()))?;
        link.try_into()
            .map(Ok)
            .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                path: PathBuf::from(iface),
                reason: format!("{} attached without tcx: {e}", hook.tcx_mode()),
            })
    }

    /// Attach `hook`'s program as a netlink cls_bpf filter (no tcx), at shedder's own
    /// priority and handle: one an earlier run left there is replaced in place (the kernel
    /// swaps the filter's program atomically, so no packet meets neither), else one is
    /// created. With a pin directory the filter outlives the daemon as a pinned link would
    /// (fail-static), its marker under `links/` ([`Hook::marker`]) says so, and
    /// [`unpin_all`] removes it; without one it is detached with this instance.
    fn attach_netlink(&mut self, iface: &str, hook: Hook) -> Result<()> {
        let marker = self
            .pin_dir
            .as_ref()
            .map(|d| d.join("links").join(hook.marker(iface)));
        let attach_err = |mode| attach_error(iface, mode);
        let prog: &mut SchedClassifier = self.program(hook.program())?;
        let replaced = hook
            .filter(iface)
            .ok()
            .and_then(|link| prog.attach_to_link(link).ok());
        let id = match replaced {
            Some(id) => id,
            None => prog
                .attach_with_options(
                    iface,
                    hook.attach_type(),
                    TcAttachOptions::Netlink(NlOptions {
                        priority: hook.priority(),
                        handle: NETLINK_HANDLE,
                        classid: None,
                    }),
                )
                .map_err(attach_err(hook.netlink_mode()))?,
        };
        let link = prog
            .take_link(id)
            .map_err(attach_err(hook.netlink_mode()))?;
        match marker {
            Some(marker) => {
                let pin_err = |e: &dyn std::fmt::Display| Error::Pin {
                    path: marker.clone(),
                    reason: e.to_string(),
                };
                std::fs::create_dir_all(marker.parent().unwrap_or(Path::new("/")))
                    .map_err(|e| pin_err(&e))?;
                // The marker is the program itself, pinned: a bpf filesystem holds only BPF
                // objects (a plain file there is refused with EACCES), and the pin also
                // keeps the program loaded while the filter outlives this process. An
                // earlier run's marker is replaced.
                match std::fs::remove_file(&marker) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(pin_err(&e)),
                }
                prog.pin(&marker).map_err(|e| pin_err(&e))?;
                // Kept attached past this process, as a pinned link is.
                std::mem::forget(link);
            }
            None => self.netlink_links.push(link),
        }
        Ok(())
    }

    /// What went wrong attaching the egress program, one line per interface.
    pub fn egress_problems(&self) -> &[String] {
        &self.egress_problems
    }

    /// The reader of the packet path's log records (written only when loaded with
    /// `kernel_log`); forward it with [`crate::kernel::klog::forward`].
    pub fn kernel_logger(&mut self) -> Result<aya_log::EbpfLogger<crate::kernel::klog::KernelLog>> {
        aya_log::EbpfLogger::init_with_logger(&mut self.ebpf, crate::kernel::klog::KernelLog)
            .map_err(|e| Error::Tracing(format!("kernel log: {e}")))
    }

    /// Take over the attachment pinned at `links/<iface>` by an earlier run: the link is
    /// pointed at this instance's program with BPF_LINK_UPDATE, atomically, so no packet
    /// goes unprotected, and the program that runs is the one this daemon loaded (its
    /// version, its log level, its run-time statistics).
    pub fn adopt(&mut self, iface: &str) -> Result<Attached> {
        let how = self.adopt_ingress(iface)?;
        self.attach_egress(iface);
        Ok(how)
    }

    fn adopt_ingress(&mut self, iface: &str) -> Result<Attached> {
        let dir = self.pin_dir.clone().ok_or_else(|| Error::Pin {
            path: PathBuf::from(iface),
            reason: "adopting needs a pin directory".into(),
        })?;
        if dir.join("links").join(Hook::Ingress.marker(iface)).exists() {
            // A netlink filter an earlier run left (no tcx): its program is replaced in
            // place, as a link update would.
            self.attach_netlink(iface, Hook::Ingress)?;
            return Ok(Attached::Tc);
        }
        let path = dir.join("links").join(iface);
        let pin_err = |reason: String| Error::Pin {
            path: path.clone(),
            reason,
        };
        let link: FdLink = PinnedLink::from_pin(&path)
            .map_err(|e| pin_err(e.to_string()))?
            .into();
        let kind = link
            .info()
            .and_then(|i| i.link_type())
            .map_err(|e| pin_err(e.to_string()))?;
        let attach_err = |mode| attach_error(iface, mode);
        let wrong = |e: aya::programs::links::LinkError| pin_err(e.to_string());
        match kind {
            LinkType::Xdp => {
                let xdp = self.xdp()?;
                let id = xdp
                    .attach_to_link(link.try_into().map_err(wrong)?)
                    .map_err(attach_err("xdp link update"))?;
                // The pin holds the attachment; our handle can go.
                drop(xdp.take_link(id));
                let native = crate::kernel::netdev::ifindex(iface)
                    .and_then(|i| {
                        crate::kernel::netdev::netlink::xdp_attachment(i)
                            .ok()
                            .flatten()
                    })
                    .is_some_and(|a| a.mode == crate::kernel::netdev::netlink::XDP_ATTACHED_DRV);
                Ok(if native {
                    Attached::XdpNative
                } else {
                    Attached::XdpGeneric
                })
            }
            LinkType::Tcx => {
                let tc = self.tc()?;
                let id = tc
                    .attach_to_link(link.try_into().map_err(wrong)?)
                    .map_err(attach_err("tc link update"))?;
                drop(tc.take_link(id));
                Ok(Attached::Tc)
            }
            other => Err(pin_err(format!(
                "a {other:?} link, not an XDP or TC attachment"
            ))),
        }
    }

    pub(super) fn keep_link(&mut self, iface: &str, link: FdLink) -> Result<()> {
        match &self.pin_dir {
            Some(dir) => {
                let links = dir.join("links");
                std::fs::create_dir_all(&links).map_err(|e| Error::Pin {
                    path: links.clone(),
                    reason: e.to_string(),
                })?;
                let path = links.join(iface);
                let pinned: PinnedLink = link.pin(&path).map_err(|e| Error::Pin {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                // The pin holds the attachment; our copy of the fd can go.
                drop(pinned);
            }
            None => {
                // Unpinned: the attachment lives as long as this process holds the fd.
                self.links.push(link);
            }
        }
        Ok(())
    }
}

/// The name of `iface`'s egress link under `links/`.
pub fn egress_pin_name(iface: &str) -> String {
    format!("{EGRESS_PIN_PREFIX}{iface}")
}

/// Names of egress links under `links/` begin with this (an older version's tracepoints'
/// with `tp-`).
pub const EGRESS_PIN_PREFIX: &str = "egress-";
/// Under `links/`, the marker of an egress program attached through netlink (no tcx): the
/// program pinned, not a link (a netlink filter has none), and the filter stays attached
/// past the daemon as a pinned link would.
pub const EGRESS_NETLINK_PREFIX: &str = "egress-netlink-";
/// Under `links/`, the marker of the TC ingress program attached through netlink (no tcx),
/// as [`EGRESS_NETLINK_PREFIX`] for egress.
pub const INGRESS_NETLINK_PREFIX: &str = "ingress-netlink-";

/// The pin under `dir/links` that keeps `iface`'s packet path attached past the daemon, if
/// an earlier run left one: its link, or the marker of its netlink filter.
pub fn pinned_ingress(dir: &Path, iface: &str) -> Option<PathBuf> {
    [iface.to_string(), Hook::Ingress.marker(iface)]
        .into_iter()
        .map(|name| dir.join("links").join(name))
        .find(|p| p.exists())
}

/// The handle of shedder's netlink filters (no tcx).
const NETLINK_HANDLE: TcHandle = TcHandle::new(0, 0x5ed);

/// A TC hook shedder attaches a netlink cls_bpf filter to, where the kernel has no tcx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    /// The packet path (`attach = "tc"`).
    Ingress,
    /// The egress program, beside any packet path.
    Egress,
}

impl Hook {
    fn program(self) -> &'static str {
        match self {
            Self::Ingress => programs::TC,
            Self::Egress => programs::EGRESS,
        }
    }

    fn attach_type(self) -> TcAttachType {
        match self {
            Self::Ingress => TcAttachType::Ingress,
            Self::Egress => TcAttachType::Egress,
        }
    }

    /// shedder's own priority on the hook. Ingress: early (a low number runs first), so
    /// that the decision comes before filters that end the chain, yet after the priority 1
    /// that other tools commonly take; egress only reads frames, so its place does not
    /// matter.
    fn priority(self) -> u16 {
        match self {
            Self::Ingress => 0x5ed,
            Self::Egress => 0xc5ed,
        }
    }

    fn tcx_mode(self) -> &'static str {
        match self {
            Self::Ingress => "tc ingress",
            Self::Egress => "tc egress",
        }
    }

    fn netlink_mode(self) -> &'static str {
        match self {
            Self::Ingress => "tc ingress (netlink)",
            Self::Egress => "tc egress (netlink)",
        }
    }

    /// The name of the filter's marker under `links/`.
    fn marker(self, iface: &str) -> String {
        match self {
            Self::Ingress => format!("{INGRESS_NETLINK_PREFIX}{iface}"),
            Self::Egress => format!("{EGRESS_NETLINK_PREFIX}{iface}"),
        }
    }

    /// The hook whose marker `name` is, and its interface.
    fn of_marker(name: &str) -> Option<(Self, &str)> {
        [Self::Ingress, Self::Egress].into_iter().find_map(|h| {
            let prefix = match h {
                Self::Ingress => INGRESS_NETLINK_PREFIX,
                Self::Egress => EGRESS_NETLINK_PREFIX,
            };
            name.strip_prefix(prefix).map(|iface| (h, iface))
        })
    }

    /// shedder's filter on `iface`'s hook (whether there is one is found when it is used).
    fn filter(self, iface: &str) -> std::io::Result<SchedClassifierLink> {
        SchedClassifierLink::attached(
            iface,
            self.attach_type(),
            self.priority(),
            NETLINK_HANDLE,
            None,
        )
    }
}

/// A netlink attachment's error, with why tcx was not used first.
fn with_tcx_error(e: Error, tcx_error: &ProgramError) -> Error {
    match e {
        Error::Attach {
            iface,
            mode,
            source,
        } => Error::Attach {
            iface,
            mode,
            source: ProgramError::IOError(std::io::Error::other(format!(
                "tcx: {tcx_error}; netlink: {source}"
            ))),
        },
        other => other,
    }
}

/// Remove everything pinned under `dir`: the links first (which detaches the programs),
/// then the maps. Returns the interfaces that were detached. The kernel releases a link
/// whose last pin is gone from a work queue, a moment later (a TC link waits out an RCU
/// grace period): this waits (up to [`DETACH_WAIT`]) until the programs the links held
/// are gone, so that traffic right after no longer meets them.
pub fn unpin_all(dir: &Path) -> std::io::Result<Vec<String>> {
    let programs = pinned_link_programs(&dir.join("links"));
    let detached = remove_pins(dir)?;
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    while std::time::Instant::now() < deadline
        && aya::programs::loaded_programs()
            .flatten()
            .any(|p| programs.contains(&p.id()))
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok(detached)
}

/// How long [`unpin_all`] waits for the kernel to release what it unpinned.
pub const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The kernel's IDs of the programs the links pinned in `links` hold (our handles on the
/// links closed again at once).
pub(super) fn pinned_link_programs(links: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(links) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let marker = e.file_name().to_str().and_then(Hook::of_marker).is_some();
            if marker {
                // A netlink filter's marker: the program itself.
                aya::programs::ProgramInfo::from_pin(e.path())
                    .ok()
                    .map(|i| i.id())
            } else {
                let link = PinnedLink::from_pin(e.path()).ok()?;
                FdLink::from(link).info().ok().map(|i| i.program_id())
            }
        })
        .collect()
}

fn remove_pins(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut detached = Vec::new();
    for sub in ["links", super::layout::MAPS, super::layout::NEXT] {
        let d = dir.join(sub);
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if let Some((hook, iface)) = entry.file_name().to_str().and_then(Hook::of_marker) {
                // Gone already (the interface with it) is as good as detached.
                if let Ok(link) = hook.filter(iface) {
                    let _ = link.detach();
                }
            }
            std::fs::remove_file(entry.path())?;
            if sub == "links" {
                let name = entry.file_name().to_string_lossy().into_owned();
                detached.push(match Hook::of_marker(&name) {
                    Some((Hook::Ingress, iface)) => iface.to_string(),
                    _ => name,
                });
            }
        }
        std::fs::remove_dir(&d)?;
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(detached)
}

/// Wraps a program error from attaching to `iface` in `mode`.
pub(super) fn attach_error(iface: &str, mode: &'static str) -> impl Fn(ProgramError) -> Error {
    let iface = iface.to_string();
    move |source| Error::Attach {
        iface: iface.clone(),
        mode,
        source,
    }
}
