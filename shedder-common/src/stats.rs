//! Node-wide per-CPU statistics of the packet path: one counter per exceptional event.

/// Node-wide per-CPU statistics (exceptional paths and new attempts only; the hot non-SYN
/// path counts nothing).
pub const NUM_STATS: u32 = 32;
/// Decisions taken with the fallback limits because the heartbeat was stale.
pub const STAT_FALLBACK: u32 = 0;
/// A RST could not be built (tail adjust failed); the attempt was passed (fail-open).
pub const STAT_RST_ERROR: u32 = 1;
/// A port was mapped to a service whose policy entry was missing; passed.
pub const STAT_NO_POLICY: u32 = 2;
/// An attempt admitted by a token bucket that another CPU spent from at the same
/// instant (see the packet path's `spend_gcra`): a burst may then pass a token early.
pub const STAT_RATE_CONTENDED: u32 = 3;
/// A connection to a protected service could not be tracked (socket map full): it is
/// missing from the in-flight count.
pub const STAT_UNTRACKED: u32 = 4;
/// A connection was established with no admitted attempt pending for it (e.g. admitted
/// before shedder was attached, or a retransmitted SYN answered by the stack).
pub const STAT_PENDING_MISS: u32 = 5;
/// A kernel debug log line was not written: over the per-CPU budget of
/// [`crate::KLOG_LINES_PER_SECOND`] (only with `daemon.kernel_debug_log`).
pub const STAT_LOG_SUPPRESSED: u32 = 6;
/// A fragment dropped by a rule of [`crate::frag`]: a TCP first fragment too short to hold its
/// TCP header, or an IPv4 TCP fragment at offset 1.
pub const STAT_FRAGMENTS_DROPPED: u32 = 7;
/// An IPv6 packet whose extension-header chain is longer than the walk
/// ([`crate::MAX_IPV6_EXT_HEADERS`]): dropped.
pub const STAT_EXT_CHAIN_DROPPED: u32 = 8;
/// An ESP packet (IPv4, or after an IPv6 chain): encrypted, so no SYN can be read in it;
/// passed.
pub const STAT_ESP_PASSED: u32 = 9;
/// A header shedder does not parse, after which a SYN could still follow: an IPv6 chain
/// ending in a next header that is not TCP, UDP, ICMPv6, "no next header", ESP or a tunnel
/// protocol (an extension header it does not know, or another upper-layer protocol), or a
/// third VLAN tag; passed.
pub const STAT_UNKNOWN_HEADER_PASSED: u32 = 10;
/// A tunnel packet (IP in IP, GRE) of a kind the configuration does not say the node
/// terminates: passed undecided.
pub const STAT_TUNNELS_PASSED: u32 = 11;
/// A packet of a tunnel the node terminates whose encapsulation header shedder does not
/// read (see [`crate::tunnel::Header::Unknown`]): passed undecided.
pub const STAT_TUNNELS_UNPARSED: u32 = 12;
/// A tunnel the node terminates inside another: only one level is parsed; dropped.
pub const STAT_NESTED_TUNNELS_DROPPED: u32 = 13;
/// A new attempt (SYN or QUIC Initial) found inside a tunnel and decided on its inner
/// headers (refused, it is dropped: no reset is built inside a tunnel).
pub const STAT_ATTEMPTS_IN_TUNNELS: u32 = 14;
/// A new attempt found in a first fragment and decided (refused, it is dropped).
pub const STAT_ATTEMPTS_IN_FRAGMENTS: u32 = 15;
/// A refusal of a proven attempt was dropped instead of answered: the node's budget for
/// replies to proven sources was spent (`Globals::reply_interval_ns`).
pub const STAT_REPLY_LIMITED_PROVEN: u32 = 16;
/// The same for unproven attempts (spoofed sources, mostly: the budget that keeps the
/// node from being used as a reflector).
pub const STAT_REPLY_LIMITED_UNPROVEN: u32 = 17;
/// The egress program saw a QUIC server's Initial to an admitted flow and learned the
/// connection ID the server chose (`flow::learn_server`).
pub const STAT_QUIC_SERVER_IDS: u32 = 18;
/// A datagram of an unproven QUIC flow looked like the client's answer (a Handshake packet,
/// an Initial to another ID) but did not prove it (`flow::proves`): forged, or the server's
/// Initial left by a way the egress program does not watch.
pub const STAT_QUIC_ANSWERS_NOT_PROVEN: u32 = 19;
/// A tracked connection the wire never saw end (no FIN or reset from the server, no reset
/// the client's sequence proved) was found gone from the kernel's sockets and ended by the
/// daemon's sweep.
pub const STAT_CONNECTIONS_SWEPT: u32 = 20;
/// A sampled refusal ([`crate::refusal`]) found the ring buffer full: the daemon did not drain it
/// (not running, or stalled), and who was refused then is not known.
pub const STAT_REFUSAL_SAMPLES_LOST: u32 = 21;
pub const STAT_NAMES: [&str; NUM_STATS as usize] = [
    "fallback_decisions",
    "rst_errors",
    "missing_policy",
    "rate_contended",
    "untracked_sockets",
    "pending_miss",
    "log_suppressed",
    "fragments_dropped",
    "ext_chain_dropped",
    "esp_passed",
    "unknown_header_passed",
    "tunnels_passed",
    "tunnels_unparsed",
    "nested_tunnels_dropped",
    "attempts_in_tunnels",
    "attempts_in_fragments",
    "replies_limited_proven",
    "replies_limited_unproven",
    "quic_server_ids_learned",
    "quic_answers_not_proven",
    "connections_swept",
    "refusal_samples_lost",
    "reserved22",
    "reserved23",
    "reserved24",
    "reserved25",
    "reserved26",
    "reserved27",
    "reserved28",
    "reserved29",
    "reserved30",
    "reserved31",
];
