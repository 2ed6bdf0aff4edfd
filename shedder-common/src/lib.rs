//! The kernel/user contract of shedder: map keys and values, counter indices, class and
//! verdict ids, capacities, and the pure arithmetic both sides run (admission decision,
//! token bucket, RST checksums).
//!
//! Every map value is `#[repr(C)]` with explicit padding fields, holds no `bool` or
//! `Option`, and has a size asserted at compile time, so the eBPF object and the daemon
//! can never disagree about a layout silently.
#![no_std]
// Inline assembly on BPF (see `mask`) is behind this feature; the eBPF build is on nightly.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(test)]
extern crate std;

pub mod admit;
pub mod csum;
pub mod fair;
pub mod flow;
pub mod frag;
pub mod gcra;
pub mod handshake;
pub mod hist;
pub mod mask;
pub mod proof;
pub mod quic;
pub mod refusal;
pub mod table;
pub mod tunnel;
pub mod work;

/// Services one node can protect. Sizes the policy, in-flight and counter maps.
pub const MAX_SERVICES: u32 = 256;
/// Entries of a port → service array (one per TCP port, and one per UDP port for QUIC).
pub const PORT_MAP_ENTRIES: u32 = 65536;
/// Address-specific service entries (service bound to one destination address).
pub const MAX_ADDR_SERVICES: u32 = 1024;
/// Source-prefix class rules, per address family.
pub const MAX_CLASS_RULES: u32 = 16384;
/// Connections of protected services tracked at once (socket map entries, allocated as
/// connections come: the map is not preallocated, so an idle node pays for none); when it
/// is full new connections go uncounted (and `STAT_UNTRACKED` says so). Each service's
/// `max_connections` is at most this.
pub const DEFAULT_TRACKED_SOCKETS: u32 = 262_144;
/// IPv4 class lookup table, first level: one entry per /16.
pub const CLASS_L1_ENTRIES: u32 = 65536;
/// IPv4 class lookup table, second level: blocks of 256 /24 cells, in two halves that
/// alternate between policy generations (so a reader never sees a block rewritten under it).
pub const CLASS_L2_BLOCKS: u32 = 2048;
/// Sets of recent SYNs remembered to recognise retransmits, one entry per (4-tuple,
/// initial sequence number): 65,536 entries in sets of [`table::WAYS`] (1 MiB), so a flood of
/// new attempts replaces the oldest entries of their sets (a retransmit of a replaced
/// attempt then counts as a new attempt) and never anything else. See [`table`].
pub const SYN_SETS: u32 = 16384;
/// Sets of demoted attempts admitted and not yet born as connections, so the tracking path
/// counts each connection in the class it was admitted in: 16,384 entries (replacement
/// makes a demoted connection count in its source's own class).
pub const DEMOTED_SETS: u32 = 4096;
/// How long after a service's last demoted admission its completed handshakes still look
/// for a demoted attempt of their own: a handshake completes within the server's SYN-ACK
/// retransmissions (about 63 s at Linux's default `tcp_synack_retries` of 5). Past it
/// (and on a service that never demoted) the tracking path skips the demoted table, whose
/// look-up at a random set is a cache miss every new connection would pay otherwise.
pub const DEMOTED_RECENT_NS: u64 = 64_000_000_000;
/// The stamp of a service's last demoted admission is rewritten only once it is this old,
/// so the window above runs 63–64 s from the last demotion.
pub const DEMOTED_RESTAMP_NS: u64 = 1_000_000_000;

/// Whether a handshake completing at `now_ns` may belong to a demoted attempt of a service
/// whose last demoted admission was at `last_ns` (0: never).
#[inline(always)]
pub fn demotion_recent(last_ns: u64, now_ns: u64) -> bool {
    // (Signed: another CPU may have written it just after this one read its clock.)
    last_ns != 0 && (now_ns.wrapping_sub(last_ns) as i64) <= DEMOTED_RECENT_NS as i64
}
/// Longest IPv6 extension-header chain the packet path walks; a longer one is dropped
/// ([`STAT_EXT_CHAIN_DROPPED`]). RFC 8200 §4.1 has each extension header occur once, the
/// destination options at most twice: hop-by-hop, destination options twice, routing,
/// fragment, authentication, mobility, HIP, shim6 and the two experimental values make
/// eleven, so a longer chain is not one a conforming sender builds.
pub const MAX_IPV6_EXT_HEADERS: usize = 12;

/// The four-level criticality ladder (CRITICAL, HIGH, MEDIUM, SHEDDABLE, as Google's SRE
/// book names them). Lower id = more important.
pub const NUM_CLASSES: usize = 4;
pub const CLASS_CRITICAL: u32 = 0;
pub const CLASS_HIGH: u32 = 1;
pub const CLASS_MEDIUM: u32 = 2;
pub const CLASS_SHEDDABLE: u32 = 3;
pub const CLASS_NAMES: [&str; NUM_CLASSES] = ["critical", "high", "medium", "sheddable"];

/// What happened to a new connection attempt.
pub const NUM_VERDICTS: u32 = 4;
/// Admitted and passed to the stack.
pub const VERDICT_PASS: u32 = 0;
/// Shed with XDP_DROP / TC_ACT_SHOT.
pub const VERDICT_DROP: u32 = 1;
/// Shed by answering RST|ACK (XDP_TX / TC redirect).
pub const VERDICT_RST: u32 = 2;
/// Would have been shed, passed because the service is in dry-run mode.
pub const VERDICT_DRY_RUN: u32 = 3;
pub const VERDICT_NAMES: [&str; NUM_VERDICTS as usize] = ["pass", "drop", "rst", "dry_run"];

/// Why the verdict was reached. Admissions: under the limits, below the class's floor, or
/// CRITICAL. Refusals, in the order the decision meets them: the class's ceiling; its
/// share ("priority": what the classes above it are given and the floors in use below it
/// leave); the service's total, counting this class and every class above it in full and
/// the classes below it only up to their floors ("service_limit", or "floors_below" when
/// the total is reached only because of those floors); the class's token bucket; the
/// source's fair share within its class; the class's retry budget.
pub const NUM_REASONS: u32 = 16;
/// Under the class and service limits.
pub const REASON_UNDER_LIMIT: u32 = 0;
/// The class was below its floor: admitted whatever the service's pressure.
pub const REASON_FLOOR: u32 = 1;
/// CRITICAL is never shed by pressure (only by its ceiling).
pub const REASON_CRITICAL: u32 = 2;
/// The class reached its hard ceiling.
pub const REASON_CEILING: u32 = 3;
/// The class reached its share: the rest of the limit is given to classes of higher
/// priority, or held by the floors in use below it.
pub const REASON_PRIORITY: u32 = 4;
/// The service is full with this class and the classes above it (and the floors in use
/// of the classes below).
pub const REASON_SERVICE_LIMIT: u32 = 5;
/// The class's new-connection token bucket was empty.
pub const REASON_RATE: u32 = 6;
/// A retry over the class's retry budget.
pub const REASON_RETRY_BUDGET: u32 = 7;
/// The source is over its fair share of its class while the class is contended.
pub const REASON_FAIR_SHARE: u32 = 8;
/// The service is full only because of the floors in use of the classes below this one.
pub const REASON_FLOORS_BELOW: u32 = 9;
/// An attempt from a source without standing ([`proof`]) while the class already holds its
/// cap of such attempts (`ClassPolicy::unproven_cap`).
pub const REASON_UNPROVEN: u32 = 10;
/// The service holds its ceiling of established connections (`ServicePolicy::max_connections`):
/// a safety bound on what the node keeps open, busy or idle, not the controller's limit.
pub const REASON_CONNECTIONS: u32 = 11;
pub const REASON_NAMES: [&str; NUM_REASONS as usize] = [
    "under_limit",
    "floor",
    "critical",
    "ceiling",
    "priority",
    "service_limit",
    "rate",
    "retry_budget",
    "fair_share",
    "floors_below",
    "unproven",
    "connections",
    "reserved12",
    "reserved13",
    "reserved14",
    "reserved15",
];
/// Reasons that are used (the rest of [`REASON_NAMES`] are reserved and never counted).
pub const REASONS_IN_USE: u32 = 12;

/// The refusals that mean a class wants more of the service than it got, one bit per
/// reason: its share, the service's total, the floors below it, a source's fair share. Not
/// the ceiling, a token bucket or the retry budget, which are limits of their own. The
/// packet path re-decides these for fair shares and counts them per class; the daemon reads
/// them as demand.
pub const PRESSURE_REASONS: u32 = (1 << REASON_PRIORITY)
    | (1 << REASON_SERVICE_LIMIT)
    | (1 << REASON_FLOORS_BELOW)
    | (1 << REASON_FAIR_SHARE);

/// 1 if `reason` is one of [`PRESSURE_REASONS`], else 0 (a shift, not a comparison).
#[inline(always)]
pub const fn is_pressure(reason: u32) -> u32 {
    (PRESSURE_REASONS >> (reason & (NUM_REASONS - 1))) & 1
}

/// Decision counters of one service: one per (class, verdict, reason).
pub const COUNTERS_PER_SERVICE: usize = NUM_CLASSES * NUM_VERDICTS as usize * NUM_REASONS as usize;

/// Index of (class, verdict, reason) within [`ServiceCounters`].
#[inline(always)]
pub const fn decision_index(class: u32, verdict: u32, reason: u32) -> u32 {
    (class * NUM_VERDICTS + verdict) * NUM_REASONS + reason
}

/// A flat numbering of every decision counter of every service (service-major), for
/// callers that keep all counters in one vector.
#[inline(always)]
pub const fn counter_index(service: u32, class: u32, verdict: u32, reason: u32) -> u32 {
    service * COUNTERS_PER_SERVICE as u32 + decision_index(class, verdict, reason)
}

/// The per-CPU decision counters of one service (one map entry per service, so the daemon
/// reads a service's counters with one lookup).
///
/// `n` counts *unique* attempts: a retransmitted SYN (same 4-tuple and initial sequence
/// number within the retransmit window) is counted in `retransmits` only, so the sum of
/// `n` is the offered load the controller sees.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceCounters {
    pub n: [u64; COUNTERS_PER_SERVICE],
    /// Attempts from sources without standing ([`proof`]), laid out as `n` (and right after
    /// it: the packet path indexes both as one array). They are not in `n`: they count
    /// neither as demand nor as offered load until proven.
    pub unproven: [u64; COUNTERS_PER_SERVICE],
    /// Retransmitted SYNs, by the class of the attempt they repeat.
    pub retransmits: [u64; NUM_CLASSES],
    /// New attempts from a source shed for this service within its retry window, by the
    /// class before demotion (each is also a unique attempt in `n`, under the class it was
    /// decided in).
    pub retries: [u64; NUM_CLASSES],
    /// Connections born of unproven attempts (the tracking path counts them): what the
    /// unproven attempts turned out to be worth.
    pub completed_unproven: [u64; NUM_CLASSES],
    /// Admitted proven attempts their source disowned: a reset from the source answering
    /// the server's SYN-ACK, so the SYN was spoofed in its name. The attempt is retired at
    /// once and its token refunded.
    pub disowned: [u64; NUM_CLASSES],
}

impl Default for ServiceCounters {
    fn default() -> Self {
        Self {
            n: [0; COUNTERS_PER_SERVICE],
            unproven: [0; COUNTERS_PER_SERVICE],
            retransmits: [0; NUM_CLASSES],
            retries: [0; NUM_CLASSES],
            completed_unproven: [0; NUM_CLASSES],
            disowned: [0; NUM_CLASSES],
        }
    }
}

impl ServiceCounters {
    /// Attempts of `class` refused for `reason`: dropped, reset, or (dry-run) that would
    /// have been.
    pub fn refused(&self, class: u32, reason: u32) -> u64 {
        [VERDICT_DROP, VERDICT_RST, VERDICT_DRY_RUN]
            .iter()
            .map(|&v| self.n[decision_index(class, v, reason) as usize])
            .sum()
    }

    /// Unproven attempts of `class` with `verdict`, every reason.
    pub fn unproven_verdict(&self, class: u32, verdict: u32) -> u64 {
        (0..NUM_REASONS)
            .map(|r| self.unproven[decision_index(class, verdict, r) as usize])
            .sum()
    }
}

/// The class a retry is decided in: one level below the attempt's own (CRITICAL → HIGH →
/// MEDIUM → SHEDDABLE; SHEDDABLE stays), so under load first attempts win and a retry storm
/// sheds itself first.
/// `class` is taken modulo [`NUM_CLASSES`], as everywhere on the packet path.
#[inline(always)]
pub fn demote(class: u32) -> u32 {
    // Without a branch, so the packet path carries one range of classes, [0, 3], into the
    // decision: with `if class < 3 { class + 1 } else { 3 }` the verifier would explore
    // the decision once for the range and once for the constant. For 0..=3,
    // (6 - class) >> 2 is 1, 1, 1, 0.
    let class = class & (NUM_CLASSES as u32 - 1);
    (class + ((6 - class) >> 2)) & (NUM_CLASSES as u32 - 1)
}

/// Histogram buckets of one service: `b[kind * hist::BUCKETS + bucket]`.
pub const HIST_PER_SERVICE: usize = (hist::KINDS * hist::BUCKETS) as usize;

/// The per-CPU histograms of one service, with the sum of the observations (µs) per kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceHist {
    pub b: [u64; HIST_PER_SERVICE],
    pub sum_us: [u64; hist::KINDS as usize],
}

impl Default for ServiceHist {
    fn default() -> Self {
        Self {
            b: [0; HIST_PER_SERVICE],
            sum_us: [0; hist::KINDS as usize],
        }
    }
}

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
/// [`KLOG_LINES_PER_SECOND`] (only with `daemon.kernel_debug_log`).
pub const STAT_LOG_SUPPRESSED: u32 = 6;
/// A fragment dropped by a rule of [`frag`]: a TCP first fragment too short to hold its
/// TCP header, or an IPv4 TCP fragment at offset 1.
pub const STAT_FRAGMENTS_DROPPED: u32 = 7;
/// An IPv6 packet whose extension-header chain is longer than the walk
/// ([`MAX_IPV6_EXT_HEADERS`]): dropped.
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
/// read (see [`tunnel::Header::Unknown`]): passed undecided.
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
/// A sampled refusal ([`refusal`]) found the ring buffer full: the daemon did not drain it
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

/// With `daemon.kernel_debug_log`, each CPU writes at most this many kernel log lines a
/// second; the rest are counted in [`STAT_LOG_SUPPRESSED`].
pub const KLOG_LINES_PER_SECOND: u32 = 20;

/// A CPU's kernel-log budget: lines written in the current second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBudget {
    /// `bpf_ktime_get_ns() / 1e9` of the current window.
    pub second: u64,
    pub used: u32,
    pub _pad: u32,
}

/// Per-service action when an attempt is shed.
pub const ACTION_DROP: u8 = 0;
pub const ACTION_RST: u8 = 1;
/// Marks a written [`ServicePolicy`].
pub const POLICY_CONFIGURED: u8 = 0xa5;

/// Per-service mode.
pub const MODE_ENFORCE: u8 = 0;
pub const MODE_DRY_RUN: u8 = 1;
/// Off: every attempt passes, counted as passed; refusals are neither made nor sampled
/// (`shedder mode SERVICE off`). Any mode the packet path does not know is taken as off.
pub const MODE_OFF: u8 = 2;

/// Port-map value: low bits hold `service id + 1` of the service listening on any address
/// (0 = the port is not protected).
pub const PORT_SERVICE_MASK: u32 = 0xffff;
/// Port-map value flag: services bound to specific destination addresses exist on this
/// port; look the (address, port) pair up in the address map first.
pub const PORT_HAS_ADDR_SERVICES: u32 = 1 << 31;

/// The layout of the pinned maps: which maps there are, their types, sizes and what their
/// values mean. A daemon adopts the maps an earlier run pinned only when that run's layout
/// is this one and every map's shape agrees; any other set is replaced (docs/operations.md,
/// *Upgrades and rollbacks*). Bump it whenever a map is added, removed or resized, or a
/// value's meaning changes: a unit test of the daemon holds the maps' shapes against the
/// layout they were recorded under, and fails until this is bumped.
///
/// Layout 1 is also what an unmarked set of pins is (versions before the marker).
pub const LAYOUT: u32 = 1;

/// Names of the maps, as the daemon pins them under `/sys/fs/bpf/shedder/`.
pub mod maps {
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
}

/// Names of the programs in the eBPF object.
pub mod programs {
    pub const XDP: &str = "shedder_xdp";
    pub const TC: &str = "shedder_tc";
    /// The QUIC halves of the two packet programs, reached by tail call (see
    /// [`super::maps::QUIC_XDP`]).
    pub const XDP_QUIC: &str = "shedder_xdp_quic";
    pub const TC_QUIC: &str = "shedder_tc_quic";
    /// TC egress: a protected TCP service's SYN-ACKs, responses and closes (see
    /// `wire`), attached beside either packet hook.
    pub const EGRESS: &str = "shedder_egress";
    /// The QUIC half of the egress program (see [`super::maps::QUIC_EGRESS`]): learns the
    /// connection ID a QUIC server chose, which proves the client that answers to it (see
    /// `flow::learn_server`). Loaded with the QUIC halves.
    pub const EGRESS_QUIC: &str = "shedder_egress_quic";
    /// The empty XDP program of the baseline object (returns XDP_PASS): what benchmarks
    /// measure shedder's programs against.
    pub const BASELINE_XDP: &str = "baseline_xdp";
    /// The empty TC classifier of the baseline object (returns TC_ACT_OK): what benchmarks
    /// measure the egress program against.
    pub const BASELINE_TC: &str = "baseline_tc";
    /// Stamps jiffies into the globals; run by the daemon with BPF_PROG_TEST_RUN, never
    /// attached.
    pub const CLOCK: &str = "shedder_clock";
    /// The tracking halves of the two packet programs, reached by tail call for a segment
    /// of a protected TCP port that is not an attempt: handshakes completed, requests
    /// arriving, resets (see [`super::maps::TRACK_XDP`]).
    pub const XDP_TRACK: &str = "shedder_xdp_track";
    pub const TC_TRACK: &str = "shedder_tc_track";
    /// Ends a tracked connection the daemon found gone from the kernel's sockets (run with
    /// BPF_PROG_TEST_RUN on the connection's key, never attached).
    pub const SWEEP: &str = "shedder_sweep";
    /// Counts a connection that was open before the packet path was attached (run with
    /// BPF_PROG_TEST_RUN on a [`crate::SeedSock`] the daemon listed, never attached).
    pub const SEED: &str = "shedder_seed";
}

/// Node-wide settings and the daemon's heartbeat (single-entry array).
///
/// Time on the packet path is `jiffies` (`bpf_jiffies64`, which the verifier inlines into a
/// single load; every helper call costs tens of nanoseconds on machines with return-thunk
/// mitigations). Userspace cannot read jiffies directly, so the heartbeat is stamped by the
/// kernel: the daemon runs the `shedder_clock` program (BPF_PROG_TEST_RUN) each tick, which
/// writes the current jiffies into `heartbeat_jiffies` (and always into `clock_jiffies`,
/// which the daemon also uses to calibrate HZ for converting milliseconds).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Globals {
    /// Jiffies of the daemon's last tick (0 = never: the fallback limits are in force).
    pub heartbeat_jiffies: u64,
    /// A heartbeat older than this many jiffies puts the fallback limits in force.
    pub heartbeat_timeout_jiffies: u64,
    /// Jiffies at the last run of the clock program.
    pub clock_jiffies: u64,
    /// Epochs (of the fair shares, the retry budget and the floors in admissions) are
    /// `2^shift` jiffies long; 0 selects [`DEFAULT_EPOCH_SHIFT`].
    pub epoch_bits: u32,
    /// The kernel's HZ as calibrated by the daemon (informational).
    pub hz: u32,
    /// Bumped by the daemon whenever it rewrites the policy; informational.
    pub generation: u64,
    /// A SYN repeating a remembered attempt (same 4-tuple and initial sequence number) this
    /// many jiffies after it is a retransmit; 0 disables retransmit recognition.
    pub retransmit_window_jiffies: u64,
    /// Seed of the attempt tables' hash ([`table::hash`]): random per daemon start, so
    /// senders cannot pick keys that collide in one set.
    pub table_seed: u64,
    /// Admitted attempts are held (counted as occupancy until their connection is born, or
    /// their source disowns them) in slots of `2^hold_bits` jiffies, for one to two slots:
    /// at least as long as a handshake takes, which the daemon measures ([`Globals::hold_slot`]).
    pub hold_bits: u32,
    /// An address proven this many units of [`proof::SEEN_SHIFT`] jiffies ago or less has
    /// standing ([`proof`]); 0: only an address proven in the current unit.
    pub standing_window: u32,
    /// The node's budgets for answering refused attempts (resets, Version Negotiation),
    /// `[proven, unproven]`: a token bucket each (nanoseconds per reply, and the burst in
    /// nanoseconds); an interval of 0 answers without a bound. Above a budget a refusal is
    /// dropped instead, so refusals cannot be used as a reflector.
    pub reply_interval_ns: [u64; 2],
    pub reply_burst_ns: [u64; 2],
}

impl Globals {
    /// The length of an epoch as a power of two of jiffies: `epoch_bits`, or
    /// [`DEFAULT_EPOCH_SHIFT`] when that is 0 or over [`MAX_EPOCH_SHIFT`].
    #[inline(always)]
    pub fn epoch_shift(&self) -> u32 {
        // With a mask, not a branch (see [`mask`]): the shift is carried on into the
        // fair-share arithmetic, where two values of it would double what the verifier
        // walks.
        let s = self.epoch_bits;
        let bad = (mask::zero(s as u64) | mask::sign(MAX_EPOCH_SHIFT as i64 - s as i64)) as u32;
        (s & !bad) | (DEFAULT_EPOCH_SHIFT & bad)
    }

    /// The epoch of `jiffies` (fair shares, the retry budget, floors in admissions).
    #[inline(always)]
    pub fn epoch(&self, jiffies: u64) -> u64 {
        jiffies >> self.epoch_shift()
    }

    /// The hold slot of `jiffies`: the shed path counts an admitted attempt in it, the
    /// tracking path retires it from it or the previous one, and it counts while the
    /// current slot is it or the next ([`Pending::count`]). `hold_bits` is capped at
    /// [`MAX_HOLD_BITS`].
    #[inline(always)]
    pub fn hold_slot(&self, jiffies: u64) -> u64 {
        jiffies >> mask::min(self.hold_bits as u64, MAX_HOLD_BITS as u64)
    }
}

/// The longest hold slot: 2^8 jiffies (0.26 s at HZ 1000, 1 s at HZ 250), so an attempt
/// whose handshake never completes is held at most about two seconds.
pub const MAX_HOLD_BITS: u32 = 8;

/// The longest epoch: 2^24 jiffies (4.7 hours at HZ=1000), far past the second the daemon
/// picks; it keeps the fair-share arithmetic, in 1/256 jiffies, within 64 bits.
pub const MAX_EPOCH_SHIFT: u32 = 24;

/// 2^8 jiffies: 1.024 s at HZ=250, 0.256 s at HZ=1000, 2.56 s at HZ=100. The daemon picks
/// the shift for about one second from the calibrated HZ.
pub const DEFAULT_EPOCH_SHIFT: u32 = 8;

/// First byte of the clock program's input: also stamp the heartbeat.
pub const CLOCK_STAMP_HEARTBEAT: u8 = 1;

/// Limits of one class of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassPolicy {
    /// The class's share of the service limit, written by the controller each tick.
    pub limit: u32,
    /// The class's share when the heartbeat is stale.
    pub fallback_limit: u32,
    /// Occupancy below the floor is admitted whatever the service's pressure.
    pub floor: u32,
    /// The floor in force when the heartbeat is stale.
    pub fallback_floor: u32,
    /// Hard cap on the class's occupancy in every mode (finite for CRITICAL too).
    pub ceiling: u32,
    /// A source's admissions per epoch within its fair share; 0: the equal share of the
    /// previous epoch ([`fair::quota`]).
    pub source_quota: u32,
    /// Token bucket: nanoseconds per token (1e9 / rate); 0 disables the bucket.
    pub rate_interval_ns: u64,
    /// Token bucket: burst × interval, the most a full bucket can hold, in nanoseconds.
    pub burst_ns: u64,
    /// What makes a source of this class: the address ANDed with these masks (network
    /// byte order, as the address is read), IPv4 in the first word.
    pub source_mask_v4: u32,
    pub source_mask_v6: [u32; 4],
    /// The floor as a share of the service's admissions over the window (this epoch and
    /// the last), in 1/[`fair::BUDGET_ONE`]: while `floor` is 0 (the floor is less than one
    /// connection), a class that has had less is admitted whatever the pressure. At small
    /// limits a floor of a few percent is a fraction of one connection, which `floor` cannot
    /// hold; this holds it in admissions instead.
    pub floor_share: u32,
    /// Connections of the service's limit held free for the classes above this one: the
    /// class sees the service full at `total_limit - reserve` (a trunk reservation, see
    /// [`admit`]); not applied with a stale heartbeat.
    pub reserve: u32,
    /// Admitted attempts from sources without standing ([`proof`]) the class holds at
    /// most (its *bounded unproven part*); more are refused ([`REASON_UNPROVEN`]).
    pub unproven_cap: u32,
}

/// Everything the packet path needs to decide for one service (one array lookup).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServicePolicy {
    pub classes: [ClassPolicy; NUM_CLASSES],
    /// Concurrency limit of the whole service (the controller's output).
    pub total_limit: u32,
    /// Concurrency limit of the whole service when the heartbeat is stale.
    pub fallback_total: u32,
    /// [`ACTION_DROP`] or [`ACTION_RST`].
    pub action: u8,
    /// [`MODE_ENFORCE`] or [`MODE_DRY_RUN`].
    pub mode: u8,
    /// Class of sources no prefix rule matches.
    pub default_class: u8,
    /// [`POLICY_CONFIGURED`] once userspace has written this entry. The policy array starts
    /// zeroed; a port mapped to an unwritten entry passes (fail open) instead of meeting
    /// all-zero limits.
    pub configured: u8,
    /// A new attempt from a source shed for this service within this many jiffies is a
    /// retry; 0 disables retry recognition.
    pub retry_window_jiffies: u32,
    /// 1: retries are decided one class lower ([`demote`]); 0: only counted.
    pub demote_retries: u32,
    /// 1: sources share each class fairly ([`fair`]); 0: first come, first served.
    pub fair_share: u32,
    /// Admitted retries per class are held to this fraction (in 1/[`fair::BUDGET_ONE`])
    /// of admitted first attempts over the window, plus `retry_budget_min`; a fraction of
    /// 0 turns the budget off.
    pub retry_budget: u32,
    pub retry_budget_min: u32,
    /// Established connections (busy or idle) the service may hold: an attempt beyond is
    /// refused ([`REASON_CONNECTIONS`]) in every class and mode. A safety bound on what
    /// idle pools may pin, far above the limit on work; 0: none (the daemon always writes
    /// one).
    pub max_connections: u32,
    pub _pad: u32,
}

/// Work in flight per class of one service: for TCP the busy connections ([`work`]: a
/// request received and not yet answered). Written by the tracking programs (or by the
/// daemon's seeding and sweep, or a test); a QUIC service's,
/// by the daemon from its flows (see [`flow`]) and by the packet path as it admits them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    pub class: [u32; NUM_CLASSES],
    /// Of `class`, the unproven QUIC flows ([`flow::UNPROVEN`]), which their class's
    /// unproven cap bounds. 0 for TCP: an unproven SYN is held in [`PendingSlot`] until its
    /// connection is born, and then it is proven.
    pub unproven: [u32; NUM_CLASSES],
    /// Established TCP connections, busy or idle: what the connection ceiling
    /// (`ServicePolicy::max_connections`) bounds.
    pub connections: [u32; NUM_CLASSES],
}

impl Inflight {
    /// Work in flight of class `c`. A count below zero reads 0: a request's start and end
    /// are counted by the packets of both directions, on whichever CPUs carry them, and
    /// without compare-and-swap (the TCP path loads on kernels without it) two CPUs can
    /// both end one request; read as a `u32`, that -1 would be four billion requests,
    /// and the class refused at its ceiling from then on.
    #[inline(always)]
    pub fn busy(&self, c: usize) -> u32 {
        not_below_zero(self.class[c & (NUM_CLASSES - 1)])
    }

    /// Established connections of every class (each class's count below zero reads 0, as
    /// in [`Inflight::busy`]).
    #[inline(always)]
    pub fn connections_total(&self) -> u32 {
        not_below_zero(self.connections[0])
            + not_below_zero(self.connections[1])
            + not_below_zero(self.connections[2])
            + not_below_zero(self.connections[3])
    }

    /// This reading with every count below zero read as 0 (see [`Inflight::busy`]).
    pub fn clamped(&self) -> Self {
        Self {
            class: self.class.map(not_below_zero),
            unproven: self.unproven.map(not_below_zero),
            connections: self.connections.map(not_below_zero),
        }
    }
}

/// A count kept by atomic additions of 1 and -1: below zero (as `i32`) reads 0.
#[inline(always)]
const fn not_below_zero(v: u32) -> u32 {
    if (v as i32) < 0 { 0 } else { v }
}

/// One hold slot's count of admitted-but-not-yet-established attempts of one service, by
/// class: `[0]` proven attempts, `[1]` unproven ones ([`proof`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSlot {
    pub slot: u64,
    pub class: [[u64; NUM_CLASSES]; 2],
}

/// Admitted attempts of one service in two hold slots, `slots[slot & 1]`
/// ([`Globals::hold_slot`]). An attempt is counted from its admission until the
/// establishment path retires it, its source disowns it, or for at most two slots, about
/// as long as a handshake takes: an attempt that never completes (a spoofed SYN) holds
/// capacity no longer than a real one would.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub slots: [PendingSlot; 2],
}

impl Pending {
    /// Attempts of each class still pending at hold slot `now` (this slot's and the
    /// previous one's): `[proven, unproven]`.
    ///
    /// Without a branch: a slot counts when `now - slot.slot` is 0 or 1, tested by a
    /// mask, so the packet path (which reads all four classes) hands the verifier one path
    /// instead of one per slot and class. A counter is taken down without compare-and-swap
    /// (the TCP path loads on kernels without it), so two racing retirements may leave it
    /// at -1 as `i64`: a sum below zero reads 0.
    #[inline(always)]
    pub fn count(&self, now: u64) -> [[u64; NUM_CLASSES]; 2] {
        let mut out = [[0u64; NUM_CLASSES]; 2];
        let mut i = 0;
        while i < 2 {
            let slot = &self.slots[i];
            let mask = mask::zero(now.wrapping_sub(slot.slot) >> 1);
            let mut c = 0;
            while c < NUM_CLASSES {
                out[0][c] = out[0][c].wrapping_add(slot.class[0][c] & mask);
                out[1][c] = out[1][c].wrapping_add(slot.class[1][c] & mask);
                c += 1;
            }
            i += 1;
        }
        let mut c = 0;
        while c < NUM_CLASSES {
            out[0][c] = mask::non_negative(out[0][c]);
            out[1][c] = mask::non_negative(out[1][c]);
            c += 1;
        }
        out
    }
}

/// Token-bucket state of one (service, class): the GCRA theoretical arrival time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub tat_ns: u64,
}

/// Key of the address-specific service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceAddrKey {
    /// IPv4 addresses in the first four bytes, the rest zero.
    pub addr: [u8; 16],
    /// Destination port, host byte order.
    pub port: u16,
    /// 4 or 6.
    pub family: u8,
    /// [`ADDR_KEY_TCP`] or [`ADDR_KEY_QUIC`]: a TCP and a QUIC service may share an
    /// address and port number (HTTP/2 and HTTP/3 on 443).
    pub proto: u8,
}

/// [`ServiceAddrKey::proto`] of a TCP service (0, as the field was padding before QUIC).
pub const ADDR_KEY_TCP: u8 = 0;
/// [`ServiceAddrKey::proto`] of a QUIC service (UDP's protocol number).
pub const ADDR_KEY_QUIC: u8 = 17;

/// IPv4 classes by direct lookup (DIR-16-8), an exact accelerator of the IPv4 trie: the
/// first level has one `u32` per /16 source prefix, the second level blocks of 256 `u8`
/// cells, one per /24. A first-level entry or a cell is
/// - [`CLASS_CELL_NONE`]: no rule covers any of it (the service default applies);
/// - `1 + class`: every address in it has that class;
/// - [`CLASS_CELL_TRIE`]: it holds a rule longer than the table resolves: ask the trie;
///
/// and a first-level entry with [`CLASS_L1_BLOCK`] set points at second-level block
/// `entry & 0xffff`. Userspace builds both levels from the same rules as the trie.
pub mod classmap {
    pub const CLASS_CELL_NONE: u32 = 0;
    pub const CLASS_CELL_TRIE: u32 = 0xff;
    pub const CLASS_L1_BLOCK: u32 = 1 << 16;

    /// What a cell says: `Some(Some(class))`, `Some(None)` (no rule: the default), or
    /// `None` (ask the trie).
    #[inline(always)]
    pub fn decode(cell: u32) -> Option<Option<u32>> {
        // One range test rather than a match, so the packet path carries the class as a
        // range [0, 3], not four constants the verifier would explore separately.
        let class = cell.wrapping_sub(1);
        if class < 4 {
            Some(Some(class))
        } else if cell == CLASS_CELL_NONE {
            Some(None)
        } else {
            None
        }
    }
}

/// A second-level block of the IPv4 class table: one cell per /24.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassBlock {
    pub cell: [u8; 256],
}

impl Default for ClassBlock {
    fn default() -> Self {
        Self { cell: [0; 256] }
    }
}

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
    /// While [`SOCK_BUSY`]: the [`work::epoch`] its request arrived in.
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
/// [`SockState::flags`]: the connection is counted as work in flight ([`work`]).
pub const SOCK_BUSY: u8 = 2;
/// [`SockState::flags`]: born, its first request not yet arrived: the attempt admitted for
/// it stays pending (in its hold slot) until then, so that the packet path never sees the
/// slot free between the handshake and the request ([`work`]).
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
    /// sock_diag's `tcp_info`; the daemon decides, as [`work`] would have.
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

/// Value of the class tries: the class id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassRule {
    pub class: u32,
}

const _: () = {
    assert!(core::mem::offset_of!(ServiceCounters, unproven) == 8 * COUNTERS_PER_SERVICE);
    assert!(size_of::<Globals>() == 96);
    assert!(size_of::<ClassPolicy>() == 72);
    assert!(size_of::<ServicePolicy>() == 328);
    assert!(size_of::<table::Set>() == 64);
    assert!(size_of::<Inflight>() == 48);
    assert!(size_of::<PendingSlot>() == 72);
    assert!(size_of::<Pending>() == 144);
    assert!(size_of::<Bucket>() == 8);
    assert!(size_of::<ServiceAddrKey>() == 20);
    assert!(size_of::<ClassRule>() == 4);
    assert!(size_of::<ClassBlock>() == 256);
    assert!(size_of::<SockState>() == 32);
    assert!(size_of::<SeedSock>() == 44);
    assert!(size_of::<work::Ring>() == 8 * work::SLOTS as usize + 8);
    assert!(size_of::<SeedResult>() == 8);
    assert!(COUNTERS_PER_SERVICE.is_power_of_two());
    assert!(NUM_CLASSES.is_power_of_two());
};

#[cfg(feature = "user")]
// SAFETY (every impl below): all of these are #[repr(C)] plain integers with explicit
// padding fields, so every bit pattern is valid and there are no uninitialised bytes.
#[allow(clippy::undocumented_unsafe_blocks)]
mod pod {
    use super::*;
    unsafe impl aya::Pod for Globals {}
    unsafe impl aya::Pod for ClassPolicy {}
    unsafe impl aya::Pod for ServicePolicy {}
    unsafe impl aya::Pod for Inflight {}
    unsafe impl aya::Pod for PendingSlot {}
    unsafe impl aya::Pod for Pending {}
    unsafe impl aya::Pod for Bucket {}
    unsafe impl aya::Pod for ServiceAddrKey {}
    unsafe impl aya::Pod for ClassRule {}
    unsafe impl aya::Pod for ClassBlock {}
    unsafe impl aya::Pod for SockState {}
    unsafe impl aya::Pod for SeedSock {}
    unsafe impl aya::Pod for SeedResult {}
    unsafe impl aya::Pod for ServiceCounters {}
    unsafe impl aya::Pod for ServiceHist {}
    unsafe impl aya::Pod for table::Set {}
    unsafe impl aya::Pod for fair::SourceSet {}
    unsafe impl aya::Pod for fair::Fairness {}
    unsafe impl aya::Pod for proof::StandingSet {}
    unsafe impl aya::Pod for flow::FlowKey {}
    unsafe impl aya::Pod for flow::Flow {}
    unsafe impl aya::Pod for flow::AliveRing {}
    unsafe impl aya::Pod for work::Ring {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_taken_below_zero_reads_zero() {
        let mut i = Inflight::default();
        // Two CPUs ended one request: 0 - 1 stored as u32.
        i.class[2] = 0u32.wrapping_sub(1);
        i.class[1] = 3;
        i.connections = [1, 0u32.wrapping_sub(2), 4, 0];
        assert_eq!((i.busy(2), i.busy(1)), (0, 3));
        assert_eq!(i.connections_total(), 5);
        let c = i.clamped();
        assert_eq!(c.class, [0, 3, 0, 0]);
        assert_eq!(c.connections, [1, 0, 4, 0]);
    }

    #[test]
    fn a_demotion_is_recent_for_a_handshake_s_lifetime() {
        let t = 5_000_000_000_000;
        assert!(!demotion_recent(0, t), "never demoted");
        assert!(demotion_recent(t, t));
        assert!(demotion_recent(t, t + DEMOTED_RECENT_NS));
        assert!(!demotion_recent(t, t + DEMOTED_RECENT_NS + 1));
        // Written by another CPU just after this one read its clock.
        assert!(demotion_recent(t + 10, t));
    }

    #[test]
    fn epochs_use_the_shift_or_the_default() {
        let g = |shift| Globals {
            epoch_bits: shift,
            ..Default::default()
        };
        assert_eq!(g(10).epoch(5 << 10), 5);
        assert_eq!(g(0).epoch(3 << DEFAULT_EPOCH_SHIFT), 3);
        assert_eq!(g(64).epoch(3 << DEFAULT_EPOCH_SHIFT), 3);
        assert_eq!(g(MAX_EPOCH_SHIFT).epoch_shift(), MAX_EPOCH_SHIFT);
        assert_eq!(g(MAX_EPOCH_SHIFT + 1).epoch_shift(), DEFAULT_EPOCH_SHIFT);
    }

    #[test]
    fn hold_slots_use_their_bits_capped() {
        let g = |bits| Globals {
            hold_bits: bits,
            ..Default::default()
        };
        assert_eq!(g(0).hold_slot(5), 5);
        assert_eq!(g(2).hold_slot(9), 2);
        assert_eq!(g(40).hold_slot(3 << MAX_HOLD_BITS), 3);
    }

    #[test]
    fn pending_attempts_count_for_two_slots() {
        let mut p = Pending::default();
        p.slots[0].slot = 10;
        p.slots[0].class[0][1] = 3;
        p.slots[0].class[1][2] = 5;
        p.slots[1].slot = 11;
        p.slots[1].class[0][1] = 1;
        assert_eq!(p.count(11), [[0, 4, 0, 0], [0, 0, 5, 0]]);
        assert_eq!(p.count(12), [[0, 1, 0, 0], [0; 4]]);
        assert_eq!(p.count(13), [[0; 4]; 2]);
        // Two racing retirements took a slot to -1: it offsets the other slot's count,
        // and a sum below zero reads 0.
        p.slots[1].class[0][1] = u64::MAX;
        assert_eq!(p.count(11)[0][1], 2);
        assert_eq!(p.count(12)[0][1], 0);
    }

    #[test]
    fn retries_are_demoted_one_class() {
        assert_eq!(demote(CLASS_CRITICAL), CLASS_HIGH);
        assert_eq!(demote(CLASS_HIGH), CLASS_MEDIUM);
        assert_eq!(demote(CLASS_MEDIUM), CLASS_SHEDDABLE);
        assert_eq!(demote(CLASS_SHEDDABLE), CLASS_SHEDDABLE);
        // Out-of-range input is taken modulo NUM_CLASSES and never leaves the range.
        assert_eq!(demote(NUM_CLASSES as u32 + CLASS_HIGH), CLASS_MEDIUM);
        for class in [4, 7, 255, u32::MAX] {
            assert!(demote(class) < NUM_CLASSES as u32);
        }
    }
}
