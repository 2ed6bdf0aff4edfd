//! Names of the programs in the eBPF object.

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
/// The empty TC classifier of the baseline object (passes on to the next program, as
/// shedder's do): what benchmarks measure the egress program against.
pub const BASELINE_TC: &str = "baseline_tc";
/// A TC classifier of the baseline object that returns TC_ACT_OK, which ends a tcx chain:
/// another tool's program, which tests put on an interface beside shedder's.
pub const BASELINE_TC_END: &str = "baseline_tc_end";
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
