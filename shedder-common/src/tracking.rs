//! The tracking programs' record of each connection of a protected service, and the
//! seeding of the connections open before the packet path was attached.

/// Connections of protected services tracked at once (socket map entries, allocated as
/// connections come: the map is not preallocated, so an idle node pays for none); when it
/// is full new connections go uncounted (and `STAT_UNTRACKED` says so). Each service's
/// `max_connections` is at most this.
pub const DEFAULT_TRACKED_SOCKETS: u32 = 262_144;

/// Per-connection state of the tracking programs, keyed by the kernel socket address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// ktime (ns) the handshake completed (the client's acknowledgement arrived), or the
    /// daemon counted the connection.
    pub established_ns: u64,
    /// ktime (ns) the request in service arrived; 0 if none.
    pub read_ns: u64,
    pub service: u16,
    pub class: u8,
    /// [`SOCK_AGE_SEEN`], [`SOCK_BUSY`], [`SOCK_PENDING`], [`SOCK_POOL_UNPROVEN`].
    pub flags: u8,
    /// While [`SOCK_BUSY`]: the [`crate::work::epoch`] its request arrived in.
    pub busy_epoch: u32,
    /// The sequence number after the client's last byte (and FIN) seen: new data starts
    /// beyond it, and a reset is the client's only at exactly it (RFC 5961 §3.2).
    pub client_next: u32,
    /// The server's initial sequence number: a SYN-ACK with another one on the same
    /// addresses and ports answers a new connection (the old one is over).
    pub server_isn: u32,
}

/// [`SockState::flags`]: the first response (end of the wait before service) was seen.
pub const SOCK_AGE_SEEN: u8 = 1;
/// [`SockState::flags`]: the connection is counted as work in flight ([`crate::work`]).
pub const SOCK_BUSY: u8 = 2;
/// [`SockState::flags`]: born, its first request not yet arrived: the attempt admitted for
/// it stays pending (in its hold slot) until then, so that the packet path never sees the
/// slot free between the handshake and the request ([`crate::work`]).
pub const SOCK_PENDING: u8 = 4;
/// [`SockState::flags`]: with [`SOCK_PENDING`], its attempt is held with the unproven
/// ones.
pub const SOCK_POOL_UNPROVEN: u8 = 8;
/// [`SockState::flags`]: `client_next` is known (seen from the handshake on; not for a
/// connection the daemon counted, whose next data is taken as new).
pub const SOCK_SEQ_KNOWN: u8 = 16;

/// A connection that was open before the packet path was attached, listed by the daemon
/// with sock_diag and handed to `shedder_seed`, which counts it as the packet path would
/// have when its handshake completed: same service lookup, same classification. Addresses
/// are in network byte order as read (IPv4 in the first word), ports in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeedSock {
    pub local: [u32; 4],
    pub remote: [u32; 4],
    pub local_port: u16,
    pub remote_port: u16,
    /// 1 for IPv6 (not v4-mapped), else 0.
    pub v6: u8,
    /// 1: it holds a request not yet answered (data received after the last sent), per
    /// sock_diag's `tcp_info`; the daemon decides, as [`crate::work`] would have.
    pub busy: u8,
    pub _pad: [u8; 2],
    /// While `busy`: how long ago that request arrived, in milliseconds.
    pub busy_ms: u32,
}

/// What `shedder_seed` writes back over its input.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeedResult {
    pub service: u16,
    pub class: u8,
    /// One of the `SEED_*` outcomes.
    pub outcome: u8,
    pub _pad: u32,
}

/// [`SeedResult::outcome`]: counted now.
pub const SEED_COUNTED: u8 = 1;
/// Already tracked (seen on the wire since attach, or counted by an earlier run).
pub const SEED_KNOWN: u8 = 2;
/// Not a connection of a configured service (the port or address is not protected).
pub const SEED_UNPROTECTED: u8 = 3;
/// The tracked-connection table is full: not counted (as the packet path would not).
pub const SEED_TABLE_FULL: u8 = 4;

const _: () = {
    assert!(size_of::<SockState>() == 32);
    assert!(size_of::<SeedSock>() == 44);
    assert!(size_of::<SeedResult>() == 8);
};
