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
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
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
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut out = Vec::new();
    for (family, id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        dump(&socket, family, id, &mut out)?;
    }
    Ok(out)
}

fn dump(socket: &Socket, family: u8, id: SocketId, out: &mut Vec<Listener>) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::LISTEN,
            socket_id: id,
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;

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
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    out.push(Listener {
                        addr: r.header.socket_id.source_address,
                        port: r.header.socket_id.source_port,
                        accept_queue: r.header.recv_queue,
                        backlog: r.header.send_queue,
                    });
                }
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
