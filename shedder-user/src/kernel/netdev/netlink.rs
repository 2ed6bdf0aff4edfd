//! Netlink requests the daemon and doctor make about interfaces: the XDP attachment
//! (rtnetlink, through netlink-packet-route) and the XDP features (the netdev
//! generic-netlink family, through netlink-packet-generic).

use std::{fmt::Debug, io, os::fd::AsRawFd};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLM_F_REQUEST, NetlinkBuffer, NetlinkDeserializable,
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, Nla, NlaBuffer,
    NlasIterator, Parseable, ParseableParametrized, parse_u32, parse_u64,
};
use netlink_packet_generic::{
    GenlFamily, GenlHeader, GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
};
use netlink_sys::{
    Socket, SocketAddr,
    protocols::{NETLINK_GENERIC, NETLINK_ROUTE},
};

/// `XDP_ATTACHED_DRV`: native XDP.
pub const XDP_ATTACHED_DRV: u8 = 1;
/// The sequence number of every request; replies to anything else are skipped.
const SEQ: u32 = 0x5eed;
/// How long a request waits for its reply. Not a `libc::time_t`: the libc crate marks that
/// alias deprecated on musl (the static build), whose time_t changed width in musl 1.2.
const REPLY_TIMEOUT_SECS: u8 = 2;

/// An XDP program attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpAttachment {
    /// `XDP_ATTACHED_*`: 1 driver, 2 generic, 3 offloaded, 4 several.
    pub mode: u8,
    pub prog_id: u32,
}

impl XdpAttachment {
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            1 => "native XDP",
            2 => "generic XDP",
            3 => "offloaded XDP",
            4 => "XDP in several modes",
            _ => "XDP",
        }
    }
}

/// The XDP program attached to `ifindex`, if any.
pub fn xdp_attachment(ifindex: u32) -> io::Result<Option<XdpAttachment>> {
    let mut link = LinkMessage::default();
    link.header.index = ifindex;
    match request(NETLINK_ROUTE, RouteNetlinkMessage::GetLink(link))? {
        RouteNetlinkMessage::NewLink(link) => Ok(attachment(&link)),
        other => Err(unexpected(&other)),
    }
}

/// The XDP attachment a link message (`RTM_NEWLINK`) reports: the mode and the first
/// program id it names, if both are there.
fn attachment(link: &LinkMessage) -> Option<XdpAttachment> {
    let xdp = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(xdp) => Some(xdp),
        _ => None,
    })?;
    let mut mode = 0;
    let (mut prog, mut drv, mut skb) = (0, 0, 0);
    for a in xdp {
        match a {
            LinkXdp::Attached(m) => mode = mode_number(*m),
            LinkXdp::ProgId(id) => prog = *id,
            LinkXdp::DrvProgId(id) => drv = *id,
            LinkXdp::SkbProgId(id) => skb = *id,
            _ => {}
        }
    }
    let prog_id = [prog, drv, skb].into_iter().find(|&id| id != 0)?;
    (mode != 0).then_some(XdpAttachment { mode, prog_id })
}

/// `XDP_ATTACHED_*` of the crate's name for it.
fn mode_number(mode: XdpAttached) -> u8 {
    match mode {
        XdpAttached::None => 0,
        XdpAttached::Driver => XDP_ATTACHED_DRV,
        XdpAttached::SocketBuffer => 2,
        XdpAttached::Hardware => 3,
        XdpAttached::Multiple => 4,
        XdpAttached::Other(n) => n,
        // A mode named after this was written: attached, shown as plain XDP.
        _ => u8::MAX,
    }
}

/// The interface's `NETDEV_XDP_ACT_*` mask (kernel 6.3+).
pub fn xdp_features(ifindex: u32) -> io::Result<u64> {
    let mut get = GenlMessage::from_payload(NetdevDev {
        attributes: vec![NetdevAttr::Ifindex(ifindex)],
    });
    get.set_resolved_family_id(netdev_family()?);
    let dev = request(NETLINK_GENERIC, get)?.payload;
    first(&dev.attributes, "no xdp-features attribute", |a| match a {
        NetdevAttr::XdpFeatures(f) => Some(*f),
        _ => None,
    })
}

/// The id the kernel gave the netdev generic-netlink family.
fn netdev_family() -> io::Result<u16> {
    let get = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(NetdevDev::family_name().into())],
    });
    let family = request(NETLINK_GENERIC, get)?.payload;
    first(&family.nlas, "no netdev netlink family", |a| match a {
        GenlCtrlAttrs::FamilyId(id) => Some(*id),
        _ => None,
    })
}

/// The value `pick` finds in the first attribute it takes, else `NotFound` with `missing`.
fn first<A, T>(
    attributes: &[A],
    missing: &'static str,
    pick: impl FnMut(&A) -> Option<T>,
) -> io::Result<T> {
    attributes
        .iter()
        .find_map(pick)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, missing))
}

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

/// A `dev-get` request to the netdev family, or its reply (include/uapi/linux/netdev.h).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NetdevDev {
    attributes: Vec<NetdevAttr>,
}

/// The attributes of a netdev `dev` that shedder reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NetdevAttr {
    Ifindex(u32),
    /// `NETDEV_XDP_ACT_*`.
    XdpFeatures(u64),
    Other(DefaultNla),
}

impl Nla for NetdevAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::Ifindex(_) => 4,
            Self::XdpFeatures(_) => 8,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Ifindex(_) => NETDEV_A_DEV_IFINDEX,
            Self::XdpFeatures(_) => NETDEV_A_DEV_XDP_FEATURES,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Ifindex(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
            Self::XdpFeatures(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for NetdevAttr {
    fn parse(nla: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        Ok(match nla.kind() {
            NETDEV_A_DEV_IFINDEX => Self::Ifindex(parse_u32(nla.value())?),
            NETDEV_A_DEV_XDP_FEATURES => Self::XdpFeatures(parse_u64(nla.value())?),
            _ => Self::Other(DefaultNla::parse(nla)?),
        })
    }
}

impl GenlFamily for NetdevDev {
    fn family_name() -> &'static str {
        "netdev"
    }

    fn command(&self) -> u8 {
        NETDEV_CMD_DEV_GET
    }

    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for NetdevDev {
    fn buffer_len(&self) -> usize {
        self.attributes.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attributes.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for NetdevDev {
    fn parse_with_param(buf: &[u8], _: GenlHeader) -> Result<Self, DecodeError> {
        let attributes = NlasIterator::new(buf)
            .map(|nla| nla.and_then(|nla| NetdevAttr::parse(&nla)))
            .collect::<Result<_, _>>()?;
        Ok(Self { attributes })
    }
}

fn unexpected(reply: &impl Debug) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected netlink reply: {reply:?}"),
    )
}

/// Finish `request`'s header and send it on `socket` (shared with [`crate::kernel::diag`]).
pub(crate) fn send<M: NetlinkSerializable + Debug>(
    socket: &Socket,
    mut request: NetlinkMessage<M>,
) -> io::Result<()> {
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0).map(drop)
}

/// Send one request and wait for its reply (at most [`REPLY_TIMEOUT_SECS`]).
fn request<M>(protocol: isize, message: M) -> io::Result<M>
where
    M: NetlinkSerializable + NetlinkDeserializable + Debug,
{
    let mut socket = Socket::new(protocol)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let timeout = libc::timeval {
        tv_sec: REPLY_TIMEOUT_SECS.into(),
        tv_usec: 0,
    };
    // SAFETY: a valid timeval of the size given, on a socket we own.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = SEQ;
    let request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    send(&socket, request)?;
    let mut rx = Vec::with_capacity(64 * 1024);
    loop {
        rx.clear();
        socket.recv(&mut rx, 0)?;
        if let Some(reply) = reply(&rx) {
            return reply;
        }
    }
}

/// The reply to request [`SEQ`] in one datagram of netlink messages, if it holds it: the
/// message, or the error the kernel answered with. Other requests' replies and
/// acknowledgements are skipped.
fn reply<M: NetlinkDeserializable>(mut datagram: &[u8]) -> Option<io::Result<M>> {
    let invalid = |e: DecodeError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
    while !datagram.is_empty() {
        let header = match NetlinkBuffer::new_checked(datagram) {
            Ok(h) => h,
            Err(e) => return Some(Err(invalid(e))),
        };
        let (bytes, len) = (datagram, header.length() as usize);
        datagram = &datagram[len.next_multiple_of(4).min(datagram.len())..];
        if header.sequence_number() != SEQ {
            continue;
        }
        let message = match NetlinkMessage::<M>::deserialize(&bytes[..len]) {
            Ok(m) => m,
            Err(e) => return Some(Err(invalid(e))),
        };
        match message.payload {
            NetlinkPayload::InnerMessage(m) => return Some(Ok(m)),
            NetlinkPayload::Error(e) if e.code.is_some() => return Some(Err(e.to_io())),
            NetlinkPayload::Done(_) => {
                return Some(Err(io::Error::new(io::ErrorKind::NotFound, "empty reply")));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `payload` as the kernel would send it in reply to request `seq`.
    fn datagram<M: NetlinkSerializable + Debug>(seq: u32, payload: NetlinkPayload<M>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        let mut message = NetlinkMessage::new(header, payload);
        message.finalize();
        let mut buf = vec![0; message.buffer_len()];
        message.serialize(&mut buf);
        buf
    }

    fn new_link(xdp: Vec<LinkXdp>) -> Vec<u8> {
        let mut link = LinkMessage::default();
        link.header.index = 7;
        link.attributes = vec![
            LinkAttribute::IfName("veth0".into()),
            LinkAttribute::Mtu(1500),
            LinkAttribute::Xdp(xdp),
        ];
        datagram(
            SEQ,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)),
        )
    }

    fn attachment_in(datagram: &[u8]) -> Option<XdpAttachment> {
        match reply::<RouteNetlinkMessage>(datagram) {
            Some(Ok(RouteNetlinkMessage::NewLink(link))) => attachment(&link),
            other => panic!("not a link: {other:?}"),
        }
    }

    #[test]
    fn a_link_reply_gives_its_xdp_attachment() {
        let native = new_link(vec![
            LinkXdp::Attached(XdpAttached::Driver),
            LinkXdp::DrvProgId(42),
            LinkXdp::ProgId(42),
        ]);
        assert_eq!(
            attachment_in(&native),
            Some(XdpAttachment {
                mode: XDP_ATTACHED_DRV,
                prog_id: 42
            })
        );
        let generic = new_link(vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::SkbProgId(9),
        ]);
        let a = attachment_in(&generic).expect("attached");
        assert_eq!((a.mode, a.prog_id, a.mode_name()), (2, 9, "generic XDP"));
        // Nothing attached: the kernel says mode none and no program.
        let none = new_link(vec![LinkXdp::Attached(XdpAttached::None)]);
        assert_eq!(attachment_in(&none), None);
        // A mode without a program id is not an attachment.
        let no_id = new_link(vec![LinkXdp::Attached(XdpAttached::Driver)]);
        assert_eq!(attachment_in(&no_id), None);
    }

    #[test]
    fn replies_to_other_requests_and_acks_are_skipped() {
        let mut buf = new_link(vec![LinkXdp::Attached(XdpAttached::None)]);
        let other = buf.clone();
        // The same message answering another request, then an ack, then ours.
        buf[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
        buf.extend(datagram::<RouteNetlinkMessage>(
            SEQ,
            NetlinkPayload::Error(Default::default()),
        ));
        buf.extend(&other);
        assert!(matches!(
            reply::<RouteNetlinkMessage>(&buf),
            Some(Ok(RouteNetlinkMessage::NewLink(_)))
        ));
        assert!(reply::<RouteNetlinkMessage>(&buf[..other.len()]).is_none());
    }

    #[test]
    fn errors_and_truncation() {
        let mut error = netlink_packet_core::ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-libc::ENODEV);
        let buf = datagram::<RouteNetlinkMessage>(SEQ, NetlinkPayload::Error(error));
        let e = reply::<RouteNetlinkMessage>(&buf).unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
        let done = datagram::<RouteNetlinkMessage>(SEQ, NetlinkPayload::Done(Default::default()));
        let e = reply::<RouteNetlinkMessage>(&done).unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let link = new_link(vec![LinkXdp::Attached(XdpAttached::None)]);
        let e = reply::<RouteNetlinkMessage>(&link[..link.len() - 4])
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_netdev_reply_gives_the_xdp_features() {
        let dev = NetdevDev {
            attributes: vec![
                NetdevAttr::Ifindex(7),
                NetdevAttr::XdpFeatures(0b101),
                // xdp-zc-max-segs, which shedder does not read.
                NetdevAttr::Other(DefaultNla::new(4, 1u32.to_ne_bytes().to_vec())),
            ],
        };
        let mut message = GenlMessage::from_payload(dev.clone());
        message.set_resolved_family_id(0x20);
        let buf = datagram(SEQ, NetlinkPayload::InnerMessage(message));
        assert_eq!(&buf[4..6], &0x20u16.to_ne_bytes(), "the family's id");
        let got = reply::<GenlMessage<NetdevDev>>(&buf).unwrap().unwrap();
        assert_eq!(got.payload, dev);
    }
}
