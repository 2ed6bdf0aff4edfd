//! Record layouts of the `sock` tracepoints the tracking programs read, as
//! `(field, offset, size)`. The programs read these offsets; the daemon checks them against
//! `/sys/kernel/tracing/events/sock/<name>/format` before attaching, so a kernel with another
//! layout is refused with a clear message instead of being misread.

/// sock:inet_sock_set_state
pub mod state {
    pub const SKADDR: usize = 8;
    pub const OLDSTATE: usize = 16;
    pub const NEWSTATE: usize = 20;
    pub const SPORT: usize = 24;
    pub const DPORT: usize = 26;
    pub const FAMILY: usize = 28;
    pub const PROTOCOL: usize = 30;
    pub const SADDR: usize = 32;
    pub const DADDR: usize = 36;
    pub const SADDR_V6: usize = 40;
    pub const DADDR_V6: usize = 56;
    pub const FIELDS: [(&str, usize, usize); 11] = [
        ("skaddr", SKADDR, 8),
        ("oldstate", OLDSTATE, 4),
        ("newstate", NEWSTATE, 4),
        ("sport", SPORT, 2),
        ("dport", DPORT, 2),
        ("family", FAMILY, 2),
        ("protocol", PROTOCOL, 2),
        ("saddr", SADDR, 4),
        ("daddr", DADDR, 4),
        ("saddr_v6", SADDR_V6, 16),
        ("daddr_v6", DADDR_V6, 16),
    ];
}

/// sock:sk_data_ready (Linux 6.6): data (or a FIN) arrived on a socket.
pub mod data {
    pub const SKADDR: usize = 8;
    pub const FAMILY: usize = 16;
    pub const PROTOCOL: usize = 18;
    pub const FIELDS: [(&str, usize, usize); 3] = [
        ("skaddr", SKADDR, 8),
        ("family", FAMILY, 2),
        ("protocol", PROTOCOL, 2),
    ];
}

/// sock:sock_recv_length and sock:sock_send_length
pub mod length {
    pub const SK: usize = 8;
    pub const PROTOCOL: usize = 18;
    pub const RET: usize = 20;
    pub const FLAGS: usize = 24;
    pub const FIELDS: [(&str, usize, usize); 4] = [
        ("sk", SK, 8),
        ("protocol", PROTOCOL, 2),
        ("ret", RET, 4),
        ("flags", FLAGS, 4),
    ];
}
