//! Netlink requests the daemon and doctor make about interfaces: the XDP attachment
//! (rtnetlink) and the XDP features (the netdev generic-netlink family).

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `XDP_ATTACHED_DRV`: native XDP.
pub const XDP_ATTACHED_DRV: u8 = 1;
const SEQ: u32 = 0x5eed;

const RTM_GETLINK: u16 = 18;
const IFINFOMSG_LEN: usize = 16;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;

const GENL_ID_CTRL: u16 = 0x10;
const GENL_HDR: usize = 4;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

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
    let mut body = vec![0u8; IFINFOMSG_LEN];
    body[0] = libc::AF_UNSPEC as u8;
    body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    let reply = request(libc::NETLINK_ROUTE, RTM_GETLINK, &body)?;
    let Some(xdp) = attrs(reply.get(IFINFOMSG_LEN..).unwrap_or_default())
        .into_iter()
        .find_map(|(t, v)| (t == IFLA_XDP).then_some(v))
    else {
        return Ok(None);
    };
    let mut mode = 0;
    let (mut prog, mut drv, mut skb) = (0, 0, 0);
    for (t, v) in attrs(xdp) {
        match t {
            IFLA_XDP_ATTACHED => mode = v.first().copied().unwrap_or(0),
            IFLA_XDP_PROG_ID => prog = u32_of(v),
            IFLA_XDP_DRV_PROG_ID => drv = u32_of(v),
            IFLA_XDP_SKB_PROG_ID => skb = u32_of(v),
            _ => {}
        }
    }
    let prog_id = [prog, drv, skb].into_iter().find(|&id| id != 0);
    Ok(match (mode, prog_id) {
        (0, _) | (_, None) => None,
        (mode, Some(prog_id)) => Some(XdpAttachment { mode, prog_id }),
    })
}

/// The interface's `NETDEV_XDP_ACT_*` mask (kernel 6.3+).
pub fn xdp_features(ifindex: u32) -> io::Result<u64> {
    let mut body = vec![CTRL_CMD_GETFAMILY, 1, 0, 0];
    push_attr(&mut body, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
    let reply = request(libc::NETLINK_GENERIC, GENL_ID_CTRL, &body)?;
    let family = attrs(reply.get(GENL_HDR..).unwrap_or_default())
        .into_iter()
        .find_map(|(t, v)| {
            (t == CTRL_ATTR_FAMILY_ID && v.len() >= 2).then(|| u16::from_ne_bytes([v[0], v[1]]))
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no netdev netlink family"))?;
    let mut body = vec![NETDEV_CMD_DEV_GET, 1, 0, 0];
    push_attr(&mut body, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let reply = request(libc::NETLINK_GENERIC, family, &body)?;
    attrs(reply.get(GENL_HDR..).unwrap_or_default())
        .into_iter()
        .find_map(|(t, v)| {
            (t == NETDEV_A_DEV_XDP_FEATURES && v.len() >= 8)
                .then(|| u64::from_ne_bytes(v[..8].try_into().unwrap_or_default()))
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no xdp-features attribute"))
}

fn u32_of(v: &[u8]) -> u32 {
    v.get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len() + (len.next_multiple_of(4) - len), 0);
}

/// The attributes of a netlink attribute stream: (type without flags, payload).
pub fn attrs(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            break;
        }
        out.push((ty, &buf[4..len]));
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

/// Send one request and return the payload of its reply (after the netlink header).
fn request(protocol: libc::c_int, msg_type: u16, body: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: plain socket call; the fd is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let len = NLMSG_HDR + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&msg_type.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&SEQ.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(body);
    // SAFETY: all-zero is a valid sockaddr_nl (the kernel as destination).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: msg and addr are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let ty = u16::from_ne_bytes([rest[4], rest[5]]);
            let seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
            if len < NLMSG_HDR || len > rest.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "truncated netlink reply",
                ));
            }
            let payload = &rest[NLMSG_HDR..len];
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            if seq != SEQ {
                continue;
            }
            match ty {
                NLMSG_ERROR => {
                    let errno = payload
                        .get(..4)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    if errno != 0 {
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                }
                NLMSG_DONE => {
                    return Err(io::Error::new(io::ErrorKind::NotFound, "empty reply"));
                }
                _ => return Ok(payload.to_vec()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netlink_attributes_round_trip() {
        let mut buf = Vec::new();
        netlink_push(&mut buf, 2, &[1]);
        netlink_push(&mut buf, 0x8000 | 4, &7u32.to_ne_bytes());
        let a = attrs(&buf);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], (2, &[1u8][..]));
        assert_eq!(a[1].0, 4, "the nested flag is masked");
        assert_eq!(a[1].1, &7u32.to_ne_bytes()[..]);
        // A length past the end stops the walk instead of panicking.
        assert!(attrs(&[200, 0, 1, 0, 0]).is_empty());
    }

    fn netlink_push(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        buf.extend_from_slice(&(len as u16).to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(data);
        buf.resize(buf.len() + (len.next_multiple_of(4) - len), 0);
    }
}
