//! Accept-queue depth and backlog of listening TCP sockets, from the kernel's sock_diag
//! netlink interface (what `ss -lnt` shows as Recv-Q / Send-Q), for the calling thread's
//! network namespace.

use std::{io, net::IpAddr};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, InetResponseHeader, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

/// One listening socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub addr: IpAddr,
    pub port: u16,
    /// Connections established and waiting for `accept()`.
    pub accept_queue: u32,
    /// The accept queue's capacity (the `listen()` backlog, capped by somaxconn).
    pub backlog: u32,
}

/// Every listening TCP socket (IPv4 and IPv6) of the calling thread's network namespace.
pub fn listeners() -> io::Result<Vec<Listener>> {
    let mut out = Vec::new();
    dump(StateFlags::LISTEN, |h| {
        out.push(Listener {
            addr: h.socket_id.source_address,
            port: h.socket_id.source_port,
            accept_queue: h.recv_queue,
            backlog: h.send_queue,
        })
    })?;
    Ok(out)
}

/// A TCP socket as sock_diag reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: IpAddr,
    pub local_port: u16,
    pub remote: IpAddr,
    pub remote_port: u16,
    /// `TCP_*` state (1 established, 8 close-wait, 10 listen, …).
    pub state: u8,
    /// The socket cookie (`bpf_get_socket_cookie`'s value for the same socket).
    pub cookie: u64,
}

pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_CLOSE_WAIT: u8 = 8;
pub const TCP_LISTEN: u8 = 10;

/// The listening, established and close-wait TCP sockets (IPv4 and IPv6) of the calling
/// thread's network namespace.
pub fn open_sockets() -> io::Result<Vec<TcpSocket>> {
    let mut out = Vec::new();
    dump(
        StateFlags::LISTEN | StateFlags::ESTABLISHED | StateFlags::CLOSE_WAIT,
        |h| {
            let id = &h.socket_id;
            // The kernel writes the cookie as two native-endian 32-bit halves, low first.
            let half = |o: usize| {
                u64::from(u32::from_ne_bytes(
                    id.cookie[o..o + 4].try_into().expect("4 bytes"),
                ))
            };
            out.push(TcpSocket {
                local: id.source_address,
                local_port: id.source_port,
                remote: id.destination_address,
                remote_port: id.destination_port,
                state: h.state,
                cookie: half(0) | half(4) << 32,
            })
        },
    )?;
    Ok(out)
}

/// Dump the TCP sockets in `states` of both families, calling `each` for every one.
fn dump(states: StateFlags, mut each: impl FnMut(&InetResponseHeader)) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    for (family, id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        dump_family(&socket, family, id, states.clone(), &mut each)?;
    }
    Ok(())
}

fn dump_family(
    socket: &Socket,
    family: u8,
    id: SocketId,
    states: StateFlags,
    each: &mut impl FnMut(&InetResponseHeader),
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states,
            socket_id: id,
        })
        .into(),
    );
    crate::kernel::netdev::netlink::send(socket, request)?;

    let mut rx = Vec::with_capacity(64 * 1024);
    loop {
        rx.clear();
        let n = socket.recv(&mut rx, 0)?;
        let mut offset = 0;
        while offset < n {
            let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&rx[offset..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => each(&r.header),
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(io::Error::other(format!("sock_diag: {e:?}")));
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}
