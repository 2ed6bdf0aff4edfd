//! Sockets as the kernel's sock_diag netlink interface reports them, for the calling
//! thread's network namespace: the accept queues of listening TCP sockets (what `ss -lnt`
//! shows as Recv-Q / Send-Q), open TCP sockets, and the receive queues and drops of UDP
//! sockets (what `ss -lnum` shows).

use std::{io, net::IpAddr, os::fd::AsRawFd};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags, nlas::Nla},
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
    dump(
        IPPROTO_TCP,
        StateFlags::LISTEN,
        ExtensionFlags::empty(),
        |r| {
            let h = &r.header;
            out.push(Listener {
                addr: h.socket_id.source_address,
                port: h.socket_id.source_port,
                accept_queue: h.recv_queue,
                backlog: h.send_queue,
            })
        },
    )?;
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
    /// Bytes received and not yet read by the application.
    pub unread: u32,
    /// `tcp_info`'s milliseconds since data was last received and last sent (`None`
    /// when the kernel sent no `tcp_info`).
    pub since_data: Option<(u32, u32)>,
    /// `tcp_info`'s data segments received and sent (`None` without `tcp_info`).
    pub data_segs: Option<(u32, u32)>,
    /// The device the socket is bound to (0: none), as the kernel's lookup needs it back.
    pub interface: u32,
}

impl TcpSocket {
    /// Whether it holds a request not yet answered, as `shedder_common::work` counts one:
    /// bytes not yet read, data received and nothing ever sent, or data received after the
    /// last data it sent. Its age (ms) if it does. The kernel keeps those times in jiffies:
    /// a later request that came in the same jiffy as the last answer, and was read at
    /// once, is taken for idle (the times do not tell them apart).
    pub fn busy_for_ms(&self) -> Option<u32> {
        let recv = self.since_data.map_or(0, |(recv, _)| recv);
        let answered_nothing = self.data_segs.is_some_and(|(i, o)| i > 0 && o == 0);
        let later = self.since_data.is_some_and(|(recv, sent)| recv < sent);
        (self.unread > 0 || answered_nothing || later).then_some(recv)
    }

    /// Whether it has answered a request (sent data): a keep-alive connection if it is
    /// still open. Unknown without `tcp_info`: taken for no.
    pub fn answered(&self) -> bool {
        self.data_segs.is_some_and(|(_, out)| out > 0)
    }
}

pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_CLOSE_WAIT: u8 = 8;
pub const TCP_LISTEN: u8 = 10;

/// The listening, established and close-wait TCP sockets (IPv4 and IPv6) of the calling
/// thread's network namespace.
pub fn open_sockets() -> io::Result<Vec<TcpSocket>> {
    let mut out = Vec::new();
    dump(
        IPPROTO_TCP,
        StateFlags::LISTEN | StateFlags::ESTABLISHED | StateFlags::CLOSE_WAIT,
        ExtensionFlags::INFO,
        |r| {
            let h = &r.header;
            let field = |b: &[u8], at: usize| {
                b.get(at..at + 4)
                    .map(|v| u32::from_ne_bytes(v.try_into().expect("4 bytes")))
            };
            let data_segs = r.nlas.iter().find_map(|n| match n {
                Nla::TcpInfo(b) => field(b, TCPI_DATA_SEGS_IN).zip(field(b, TCPI_DATA_SEGS_OUT)),
                _ => None,
            });
            let since_data = r.nlas.iter().find_map(|n| match n {
                Nla::TcpInfo(b) => field(b, TCPI_LAST_DATA_RECV).zip(field(b, TCPI_LAST_DATA_SENT)),
                _ => None,
            });
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
                unread: h.recv_queue,
                since_data,
                data_segs,
                interface: id.interface_id,
            })
        },
    )?;
    Ok(out)
}

/// `SOCK_DESTROY`: the sock_diag request that closes one socket (the same body as a
/// lookup, `SOCK_DIAG_BY_FAMILY` + 1).
const SOCK_DESTROY: u16 = 21;

/// Closes TCP connections through sock_diag (`SOCK_DESTROY`, Linux 4.5 with
/// `CONFIG_INET_DIAG_DESTROY`, which Debian's kernels set): the kernel aborts the
/// connection as `tcp_abort` does, a reset to the peer and `ECONNABORTED` to the
/// application, the same as `bpf_sock_destroy` from a socket iterator (Linux 6.5) without
/// needing one. Needs CAP_NET_ADMIN in the socket's network namespace.
pub struct Destroyer {
    socket: Socket,
}

impl Destroyer {
    pub fn new() -> io::Result<Self> {
        Ok(Self { socket: open()? })
    }

    /// Close `s`, found by its addresses, ports and cookie: a socket that closed since the
    /// listing (its cookie gone, or reused by another) is not touched, `ENOENT` or
    /// `ESTALE`. `EOPNOTSUPP`: the kernel was built without `CONFIG_INET_DIAG_DESTROY`.
    pub fn destroy(&self, s: &TcpSocket) -> io::Result<()> {
        let family = if s.local.is_ipv4() { AF_INET } else { AF_INET6 };
        let mut cookie = [0u8; 8];
        cookie[..4].copy_from_slice(&(s.cookie as u32).to_ne_bytes());
        cookie[4..].copy_from_slice(&((s.cookie >> 32) as u32).to_ne_bytes());
        let request = InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: s.local_port,
                destination_port: s.remote_port,
                source_address: s.local,
                destination_address: s.remote,
                interface_id: s.interface,
                cookie,
            },
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut msg = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        // The crate knows the lookup's message type only; the destroy request is that body
        // under another type (the header's bytes 4..6).
        buf[4..6].copy_from_slice(&SOCK_DESTROY.to_ne_bytes());
        self.socket.send(&buf, 0)?;
        let mut rx = Vec::with_capacity(4096);
        self.socket.recv(&mut rx, 0)?;
        let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&rx)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        match msg.payload {
            NetlinkPayload::Error(e) if e.code.is_none() => Ok(()),
            NetlinkPayload::Error(e) => Err(e.to_io()),
            other => Err(io::Error::other(format!(
                "sock_diag destroy: unexpected reply {other:?}"
            ))),
        }
    }
}

/// Whether this kernel closes TCP connections on request ([`Destroyer`]): asks it to close a
/// connection that cannot exist, which a kernel that can answers `ENOENT` (the lookup runs
/// before any capability check) and one built without `CONFIG_INET_DIAG_DESTROY`
/// `EOPNOTSUPP`.
pub fn destroy_supported() -> io::Result<bool> {
    let nothing = TcpSocket {
        local: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        local_port: 0,
        remote: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        remote_port: 0,
        state: TCP_ESTABLISHED,
        cookie: 0,
        unread: 0,
        since_data: None,
        data_segs: None,
        interface: 0,
    };
    match Destroyer::new()?.destroy(&nothing) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(true),
        Ok(()) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Offset of `tcpi_rtt` (smoothed round-trip time, µs) in the kernel's `struct tcp_info`:
/// after 8 bytes of states and flags, 13 32-bit counters and times, `tcpi_pmtu` and
/// `tcpi_rcv_ssthresh`. The struct only grows at its end, so the offset holds on every
/// kernel since 2.6.
const TCPI_RTT: usize = 68;
/// Offsets of `tcpi_last_data_sent` and `tcpi_last_data_recv` (ms since) in `struct
/// tcp_info`: the first and third of its times, after the 8 bytes of states and flags and
/// nine 32-bit counters.
const TCPI_LAST_DATA_SENT: usize = 44;
const TCPI_LAST_DATA_RECV: usize = 52;
/// Offsets of `tcpi_data_segs_in` and `tcpi_data_segs_out` (Linux 4.6): after the 64-bit
/// pacing rates and byte counts that follow the round-trip times.
const TCPI_DATA_SEGS_IN: usize = 152;
const TCPI_DATA_SEGS_OUT: usize = 156;

/// The smoothed round-trip times (µs) of the established TCP connections whose local port
/// is one of `ports`, at most `limit` of them (a sample, in the kernel's order). On a
/// passive connection the first sample is its handshake's: the SYN-ACK to the client's
/// answer.
pub fn round_trips(ports: &[u16], limit: usize) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    dump(
        IPPROTO_TCP,
        StateFlags::ESTABLISHED,
        ExtensionFlags::INFO,
        |r| {
            if out.len() >= limit || !ports.contains(&r.header.socket_id.source_port) {
                return;
            }
            let info = r.nlas.iter().find_map(|n| match n {
                Nla::TcpInfo(bytes) => bytes.get(TCPI_RTT..TCPI_RTT + 4),
                _ => None,
            });
            if let Some(b) = info {
                out.push(u32::from_ne_bytes(b.try_into().expect("4 bytes")));
            }
        },
    )?;
    Ok(out)
}

/// A UDP socket bound to a local port, as sock_diag reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpSocket {
    pub addr: IpAddr,
    pub port: u16,
    /// Bytes queued for the application to read (the datagrams' buffer sizes, as charged
    /// against the receive buffer).
    pub receive_queue: u32,
    /// The receive buffer (`SO_RCVBUF`, what the queue may hold before datagrams drop).
    pub receive_buffer: u32,
    /// Datagrams dropped at this socket since it was opened (receive buffer full, and
    /// the socket's other drops).
    pub drops: u32,
    /// Connected to one peer (a per-connection socket), not a listening one.
    pub connected: bool,
}

/// Every UDP socket (IPv4 and IPv6) of the calling thread's network namespace, with its
/// receive queue and drops.
pub fn udp_sockets() -> io::Result<Vec<UdpSocket>> {
    let mut out = Vec::new();
    dump(
        IPPROTO_UDP,
        StateFlags::all(),
        ExtensionFlags::SKMEMINFO,
        |r| {
            let h = &r.header;
            let mem = r.nlas.iter().find_map(|n| match n {
                Nla::MemInfo(m) => Some(m),
                _ => None,
            });
            out.push(UdpSocket {
                addr: h.socket_id.source_address,
                port: h.socket_id.source_port,
                receive_queue: h.recv_queue,
                receive_buffer: mem.map_or(0, |m| m.receive_queue_max),
                drops: mem.map_or(0, |m| m.drops),
                connected: h.state == TCP_ESTABLISHED,
            })
        },
    )?;
    Ok(out)
}

/// How long a reply may take: the daemon's tick waits on it, and a tick that stalls lets
/// the heartbeat go stale.
const REPLY_TIMEOUT: libc::timeval = libc::timeval {
    tv_sec: 1,
    tv_usec: 0,
};

/// A sock_diag socket whose receives time out after [`REPLY_TIMEOUT`] (`WouldBlock`).
fn open() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let timeout = REPLY_TIMEOUT;
    // SAFETY: a valid timeval of the size given, on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// Dump the sockets of `protocol` in `states` of both families with the attributes
/// `extensions` asks for, calling `each` for every one.
fn dump(
    protocol: u8,
    states: StateFlags,
    extensions: ExtensionFlags,
    mut each: impl FnMut(&InetResponse),
) -> io::Result<()> {
    let socket = open()?;
    for (family, id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        let request = InetRequest {
            family,
            protocol,
            extensions: extensions.clone(),
            states: states.clone(),
            socket_id: id,
        };
        dump_family(&socket, request, &mut each)?;
    }
    Ok(())
}

fn dump_family(
    socket: &Socket,
    request: InetRequest,
    each: &mut impl FnMut(&InetResponse),
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let request = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
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
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => each(&r),
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

#[cfg(test)]
mod busy_tests {
    use super::*;

    fn sock(unread: u32, since: Option<(u32, u32)>, segs: Option<(u32, u32)>) -> TcpSocket {
        TcpSocket {
            local: "198.18.0.2".parse().unwrap(),
            local_port: 80,
            remote: "198.18.0.1".parse().unwrap(),
            remote_port: 40000,
            state: TCP_ESTABLISHED,
            cookie: 1,
            unread,
            since_data: since,
            data_segs: segs,
            interface: 0,
        }
    }

    #[test]
    fn a_connection_is_busy_while_what_it_received_is_unanswered() {
        // Opened, nothing exchanged: idle (both times are its birth).
        assert_eq!(sock(0, Some((900, 900)), Some((0, 0))).busy_for_ms(), None);
        // A request 40 ms ago, never answered, read at once in its birth's jiffy.
        assert_eq!(
            sock(0, Some((40, 40)), Some((1, 0))).busy_for_ms(),
            Some(40)
        );
        // Keep-alive: answered 5 s ago after a request 5.02 s ago: idle.
        assert_eq!(
            sock(0, Some((5020, 5000)), Some((3, 3))).busy_for_ms(),
            None
        );
        // Its next request, 30 ms ago, in service.
        assert_eq!(
            sock(0, Some((30, 5000)), Some((4, 3))).busy_for_ms(),
            Some(30)
        );
        // Bytes waiting unread are a request whatever the times say.
        assert_eq!(
            sock(16, Some((70, 70)), Some((4, 4))).busy_for_ms(),
            Some(70)
        );
        assert_eq!(sock(16, None, None).busy_for_ms(), Some(0));
        assert_eq!(sock(0, None, None).busy_for_ms(), None);
    }
}
