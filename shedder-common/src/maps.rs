//! Names of the maps, as the daemon pins them under `/sys/fs/bpf/shedder/`.

/// The marker of the pinned maps' layout ([`crate::LAYOUT`]): a one-entry array of `u32`
/// the daemon creates beside the object's maps. Not in the eBPF object, so not in
/// [`ALL`].
pub const LAYOUT: &str = "SHEDDER_LAYOUT";
/// Sampled refusals ([`crate::refusal`]): a ring buffer private to one load (not
/// pinned, not in [`ALL`]), read by the daemon that loaded it.
pub const REFUSALS: &str = "SHEDDER_REFUSALS";
pub const GLOBALS: &str = "SHEDDER_GLOBALS";
pub const PORTS: &str = "SHEDDER_PORTS";
/// UDP port → QUIC service, laid out as [`PORTS`] is for TCP.
pub const QUIC_PORTS: &str = "SHEDDER_QUIC_PORTS";
pub const ADDR_SERVICES: &str = "SHEDDER_ADDR_SVC";
pub const POLICIES: &str = "SHEDDER_POLICY";
pub const INFLIGHT: &str = "SHEDDER_INFLIGHT";
pub const PENDING: &str = "SHEDDER_PENDING";
pub const BUCKETS: &str = "SHEDDER_BUCKETS";
pub const CLASS_V4: &str = "SHEDDER_CLASS_V4";
pub const CLASS_V6: &str = "SHEDDER_CLASS_V6";
pub const CLASS_L1: &str = "SHEDDER_CLASS_L1";
pub const CLASS_L2: &str = "SHEDDER_CLASS_L2";
/// Tracked TCP connections of protected services, by the client's address and port and
/// the service's port ([`crate::flow::FlowKey`] → [`crate::SockState`]).
pub const CONNS: &str = "SHEDDER_CONNS";
/// Handshakes a protected service answered (its SYN-ACK seen on the way out), waiting
/// for the client's acknowledgement: the sequence number it must carry, in sets
/// ([`crate::handshake`]).
pub const HANDSHAKES: &str = "SHEDDER_HANDSHAKE_SETS";
/// The tracking programs, one per program type, which the packet programs tail-call for
/// a segment of a protected TCP port that is not an attempt.
pub const TRACK_XDP: &str = "SHEDDER_TRACK_XDP";
pub const TRACK_TC: &str = "SHEDDER_TRACK_TC";
pub const HIST: &str = "SHEDDER_HIST";
pub const COUNTERS: &str = "SHEDDER_COUNTERS";
pub const STATS: &str = "SHEDDER_STATS";
pub const SYNS: &str = "SHEDDER_SYNS";
/// Sources per service: admissions this epoch and retry credits ([`crate::fair`]).
pub const SOURCES: &str = "SHEDDER_SOURCES";
/// Per-class counts of the fair shares and retry budget, per service and epoch.
pub const FAIR: &str = "SHEDDER_FAIR";
pub const DEMOTED: &str = "SHEDDER_DEMOTED";
/// Per service, the monotonic time (ns) of its last demoted admission
/// ([`crate::demotion_recent`]).
pub const DEMOTED_AT: &str = "SHEDDER_DEMOTED_AT";
/// The QUIC packet programs, one per program type, which the TCP programs tail-call
/// for a datagram to a QUIC port (a program of its own keeps each within the
/// verifier's budget and leaves the TCP path's cost as it was).
pub const QUIC_XDP: &str = "SHEDDER_QUIC_XDP";
pub const QUIC_TC: &str = "SHEDDER_QUIC_TC";
/// The QUIC half of the egress program, which it tail-calls for a frame that is not a
/// TCP segment (a program of its own, for the same reasons: on a kernel whose verifier
/// refuses the QUIC programs, the TCP egress program still loads).
pub const QUIC_EGRESS: &str = "SHEDDER_QUIC_EGRESS";
/// Admitted QUIC flows ([`crate::flow::Flow`]), an LRU hash.
pub const FLOWS: &str = "SHEDDER_FLOWS";
/// Per service, the QUIC flows last seen per slot ([`crate::flow::AliveRing`]).
pub const ALIVE: &str = "SHEDDER_ALIVE";
/// The tunnels the node terminates, by UDP port and IP protocol
/// ([`crate::tunnel::DECAP_ENTRIES`]).
pub const DECAP: &str = "SHEDDER_DECAP";
/// Addresses that completed a handshake recently ([`crate::proof`]).
pub const STANDING: &str = "SHEDDER_STANDING";
/// The node's reply budgets' token buckets (`[proven, unproven]`, [`crate::Bucket`]).
pub const REPLIES: &str = "SHEDDER_REPLIES";
/// Per service and CPU, the requests in service by the slot they started in
/// ([`crate::work::Ring`]).
pub const WORK: &str = "SHEDDER_WORK";
pub const ALL: [&str; 33] = [
    GLOBALS,
    PORTS,
    QUIC_PORTS,
    ADDR_SERVICES,
    POLICIES,
    INFLIGHT,
    PENDING,
    BUCKETS,
    CLASS_V4,
    CLASS_V6,
    CLASS_L1,
    CLASS_L2,
    CONNS,
    HANDSHAKES,
    TRACK_XDP,
    TRACK_TC,
    HIST,
    COUNTERS,
    STATS,
    SYNS,
    SOURCES,
    FAIR,
    DEMOTED,
    DEMOTED_AT,
    QUIC_XDP,
    QUIC_TC,
    QUIC_EGRESS,
    FLOWS,
    ALIVE,
    DECAP,
    STANDING,
    REPLIES,
    WORK,
];
