//! shedder's packet path: an XDP program and a TC ingress classifier sharing one decision,
//! each with a QUIC half it tail-calls for UDP to a port with a QUIC service.
//!
//! For every frame: parse; anything that is not a fully parsed TCP SYN (without ACK, RST or
//! FIN) or QUIC client Initial to a protected service passes untouched. For a new attempt: look up the service by
//! destination port (and optionally address), the class by longest-prefix match of the
//! source, decide against the limits in the maps (fallback limits when the daemon's heartbeat
//! is stale), count the decision per CPU, and PASS, DROP, answer RST|ACK, or (dry-run) PASS.
//! Every error path passes.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]
// Every map access, helper call and packet read here is `unsafe` by the API's design, and
// each is proven safe by the kernel verifier at load time (bounds against `data_end`,
// null checks on lookups); a comment on each would repeat that. The bounds checks
// themselves are in `parse.rs`.
#![allow(clippy::undocumented_unsafe_blocks)]

mod atomic;
mod egress;
mod opaque;
mod parse;
mod shed;
mod track;
mod wire;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action},
    helpers::generated::{
        bpf_jiffies64, bpf_redirect, bpf_skb_change_tail, bpf_skb_pull_data, bpf_skb_store_bytes,
        bpf_xdp_adjust_tail, bpf_xdp_store_bytes,
    },
    macros::{classifier, map, xdp},
    maps::ProgramArray,
    programs::{TcContext, XdpContext},
};

use shedder_common::CLOCK_STAMP_HEARTBEAT;

use crate::shed::{Frame, Outcome};

struct XdpFrame<'a>(&'a XdpContext);

impl Frame for XdpFrame<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        self.0.data()
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        self.0.data_end()
    }
    #[inline(always)]
    fn truncate(&self, new_len: usize) -> bool {
        let delta = new_len as i64 - (self.data_end() - self.data()) as i64;
        delta == 0 || unsafe { bpf_xdp_adjust_tail(self.0.ctx.cast(), delta as i32) } == 0
    }
    #[inline(always)]
    fn store_bytes(&self, off: usize, from: *const u8, len: u32) -> bool {
        unsafe {
            bpf_xdp_store_bytes(self.0.ctx.cast(), off as u32, from.cast_mut().cast(), len) == 0
        }
    }
}

/// The QUIC programs, reached by tail call: one slot each (see
/// [`shedder_common::maps::QUIC_XDP`]). A program array serves one program type, hence two.
#[map]
static SHEDDER_QUIC_XDP: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
static SHEDDER_QUIC_TC: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
static SHEDDER_QUIC_EGRESS: ProgramArray = ProgramArray::with_max_entries(1, 0);
/// The tracking programs, reached by tail call for a segment of a protected TCP port (see
/// [`shedder_common::maps::TRACK_XDP`]).
#[map]
static SHEDDER_TRACK_XDP: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
static SHEDDER_TRACK_TC: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// A datagram of a possible QUIC flow is news for the tracking path; it passes.
#[inline(always)]
fn quic_flow(outcome: Outcome) -> Outcome {
    if let Outcome::Flow(d) = &outcome {
        track::quic_flow(d);
    }
    outcome
}

#[inline(always)]
fn xdp_verdict(outcome: Outcome) -> u32 {
    match outcome {
        Outcome::Pass
        | Outcome::ToQuic
        | Outcome::ToTrack
        | Outcome::Flow(_)
        | Outcome::Negotiate
        | Outcome::PassRefused => xdp_action::XDP_PASS,
        Outcome::Drop => xdp_action::XDP_DROP,
        Outcome::Reply => xdp_action::XDP_TX,
    }
}

/// XDP entry point (native, or generic where the driver has no XDP support). Inlined
/// into the section's entry, as each entry point below: left to LLVM, a body this large
/// becomes a BPF-to-BPF call, which costs every packet several nanoseconds.
#[xdp]
#[inline(always)]
pub fn shedder_xdp(ctx: XdpContext) -> u32 {
    let outcome = shed::run::<_, false>(&XdpFrame(&ctx));
    // Each returns only if its slot is empty (the program not loaded): the frame passes.
    match outcome {
        Outcome::ToQuic => unsafe { SHEDDER_QUIC_XDP.tail_call(&ctx, 0) },
        Outcome::ToTrack => unsafe { SHEDDER_TRACK_XDP.tail_call(&ctx, 0) },
        _ => {}
    }
    xdp_verdict(outcome)
}

/// The tracking half of [`shedder_xdp`]: a segment of a protected TCP port (see `wire`).
/// Every frame passes.
#[xdp]
#[inline(always)]
pub fn shedder_xdp_track(ctx: XdpContext) -> u32 {
    wire::ingress(ctx.data(), ctx.data_end());
    xdp_action::XDP_PASS
}

/// The QUIC half of [`shedder_xdp`]: decides a datagram to a QUIC port.
#[xdp]
#[inline(always)]
pub fn shedder_xdp_quic(ctx: XdpContext) -> u32 {
    xdp_verdict(quic_flow(shed::run::<_, true>(&XdpFrame(&ctx))))
}

struct TcFrame<'a>(&'a TcContext);

impl Frame for TcFrame<'_> {
    #[inline(always)]
    fn data(&self) -> usize {
        self.0.data()
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        self.0.data_end()
    }
    #[inline(always)]
    fn truncate(&self, new_len: usize) -> bool {
        unsafe { bpf_skb_change_tail(self.0.skb.skb, new_len as u32, 0) == 0 }
    }
    #[inline(always)]
    fn store_bytes(&self, off: usize, from: *const u8, len: u32) -> bool {
        unsafe { bpf_skb_store_bytes(self.0.skb.skb, off as u32, from.cast(), len, 0) == 0 }
    }
}

/// Headers shedder reads fit in this many bytes (two VLAN tags, IPv6 with a few extension
/// headers, TCP with options); a non-linear skb is pulled this far before parsing.
const TC_PULL_LEN: u32 = 256;

/// Make the first [`TC_PULL_LEN`] bytes of a non-linear skb linear. Failure leaves the skb
/// as it was; parsing then passes what it cannot see.
#[inline(always)]
fn pull_headers(ctx: &TcContext) {
    let linear = (ctx.data_end() - ctx.data()) as u32;
    let len = ctx.len();
    if linear < len && linear < TC_PULL_LEN {
        let want = if len < TC_PULL_LEN { len } else { TC_PULL_LEN };
        unsafe { bpf_skb_pull_data(ctx.skb.skb, want) };
    }
}

/// TC ingress entry point (for interfaces without XDP, or where XDP is owned by another tool).
#[classifier]
#[inline(always)]
pub fn shedder_tc(ctx: TcContext) -> i32 {
    // Most frames are established segments, whose headers the stack or GRO left in the
    // linear part and whose payload (in pages) nothing here reads: pulling it in would
    // copy every data segment of every port. Attempts, resets, tunnels, fragments and
    // datagrams are pulled, as their options and payloads are read.
    if !wire::established_in_place(ctx.data(), ctx.data_end()) {
        pull_headers(&ctx);
    }
    let outcome = shed::run::<_, false>(&TcFrame(&ctx));
    match outcome {
        Outcome::ToQuic => unsafe { SHEDDER_QUIC_TC.tail_call(&ctx, 0) },
        Outcome::ToTrack => unsafe { SHEDDER_TRACK_TC.tail_call(&ctx, 0) },
        _ => {}
    }
    tc_verdict(&ctx, outcome)
}

/// The tracking half of [`shedder_tc`] (see [`shedder_xdp_track`]).
#[classifier]
#[inline(always)]
pub fn shedder_tc_track(ctx: TcContext) -> i32 {
    wire::ingress(ctx.data(), ctx.data_end());
    TC_PASS
}

/// The QUIC half of [`shedder_tc`]. A datagram is judged by its whole length (an Initial
/// fills at least 1,200 bytes), which must be in the skb's linear part: a NIC's driver
/// leaves most of the payload in pages, and a batch sent with UDP segmentation offload
/// reaches a veth peer as one skb of many datagrams. So the skb is made linear first (the
/// batch is then judged by its first datagram, whose headers it starts with).
#[classifier]
#[inline(always)]
pub fn shedder_tc_quic(ctx: TcContext) -> i32 {
    let len = ctx.len();
    if ((ctx.data_end() - ctx.data()) as u32) < len {
        // Failure leaves the skb as it was; parsing then passes what it cannot see.
        unsafe { bpf_skb_pull_data(ctx.skb.skb, len) };
    }
    tc_verdict(&ctx, quic_flow(shed::run::<_, true>(&TcFrame(&ctx))))
}

/// TC egress, beside either packet hook: a protected TCP service's SYN-ACKs, responses and
/// closes (see `wire`). Any other frame goes on to the QUIC half ([`shedder_egress_quic`]),
/// when it is loaded. Every frame passes.
#[classifier]
pub fn shedder_egress(ctx: TcContext) -> i32 {
    // A TCP segment is read where it lies: the stack builds its headers in the socket
    // buffer's linear part and keeps a response's payload in pages, and pulling that
    // payload in (a copy of every response, and at times a new head) would cost every
    // connection on the host. Only a frame whose headers run past the linear part is
    // pulled, and read again.
    let tcp = match wire::egress(ctx.data(), ctx.data_end()) {
        Ok(()) => true,
        Err(wire::Miss::Short) => {
            pull_headers(&ctx);
            wire::egress(ctx.data(), ctx.data_end()).is_ok()
        }
        Err(wire::Miss::Other) => false,
    };
    if !tcp {
        // An empty slot (QUIC not loaded) returns here.
        unsafe { SHEDDER_QUIC_EGRESS.tail_call(&ctx, 0) };
    }
    TC_PASS
}

/// The QUIC half of [`shedder_egress`]: a QUIC server's Initial to an admitted flow's
/// client, which tells the connection ID the server chose (see `egress`). Its IDs lie past
/// the headers, so the frame is pulled first. Every frame passes.
#[classifier]
pub fn shedder_egress_quic(ctx: TcContext) -> i32 {
    pull_headers(&ctx);
    egress::server_packet(ctx.data(), ctx.data_end());
    TC_PASS
}

/// Not attached anywhere: the daemon runs it with BPF_PROG_TEST_RUN on a
/// [`shedder_common::flow::FlowKey`] followed by the connection's `established_ns` (u64),
/// to end a tracked connection whose socket it found gone (see `track::sweep`).
#[xdp]
pub fn shedder_sweep(ctx: XdpContext) -> u32 {
    let at = parse::ptr_at::<[u8; 32]>(ctx.data(), ctx.data_end(), 0);
    if let Some(p) = at {
        let key = unsafe { core::ptr::read_unaligned(p.cast::<shedder_common::flow::FlowKey>()) };
        let born = unsafe { core::ptr::read_unaligned(p.cast::<u8>().add(24).cast::<u64>()) };
        if track::sweep(&key, born) {
            shed::bump(&shed::SHEDDER_STATS, shedder_common::STAT_CONNECTIONS_SWEPT);
        }
    }
    xdp_action::XDP_PASS
}

/// A frame TC lets through: on to the next program of the interface's tcx chain (TCX_NEXT;
/// for a netlink filter, the next filter), and past the last one into the stack. Never
/// TC_ACT_OK, which in tcx also skips the programs after this one: shedder is attached
/// first, and a CNI's or a firewall's programs behind it must still see what it passes.
const TC_PASS: i32 = TC_ACT_UNSPEC;

#[inline(always)]
fn tc_verdict(ctx: &TcContext, outcome: Outcome) -> i32 {
    match outcome {
        Outcome::Pass
        | Outcome::ToQuic
        | Outcome::ToTrack
        | Outcome::Flow(_)
        | Outcome::Negotiate
        | Outcome::PassRefused => TC_PASS,
        Outcome::Drop => TC_ACT_SHOT,
        // Send the answer back out of the interface the attempt arrived on.
        Outcome::Reply => unsafe {
            let ifindex = (*ctx.skb.skb).ifindex;
            bpf_redirect(ifindex, 0) as i32
        },
    }
}

/// Not attached anywhere: the daemon runs it with BPF_PROG_TEST_RUN to read the kernel's
/// jiffies and, when the input's first byte is [`CLOCK_STAMP_HEARTBEAT`], to stamp the
/// heartbeat in the packet path's clock.
#[xdp]
pub fn shedder_clock(ctx: XdpContext) -> u32 {
    let now = unsafe { bpf_jiffies64() };
    let stamp = match parse::ptr_at::<[u8; 14]>(ctx.data(), ctx.data_end(), 0) {
        Some(p) => (unsafe { (*p)[0] }) == CLOCK_STAMP_HEARTBEAT,
        None => false,
    };
    if let Some(g) = shed::SHEDDER_GLOBALS.get_ptr_mut(0) {
        unsafe {
            (*g).clock_jiffies = now;
            if stamp {
                (*g).heartbeat_jiffies = now;
            }
        }
    }
    xdp_action::XDP_PASS
}

/// Not attached anywhere: the daemon runs it with BPF_PROG_TEST_RUN on a
/// [`shedder_common::SeedSock`], a connection open before tracking began, to count it (see
/// [`track::seed`]); the [`shedder_common::SeedResult`] is written over the input's first
/// bytes, which the daemon reads back.
#[xdp]
pub fn shedder_seed(ctx: XdpContext) -> u32 {
    type Sock = shedder_common::SeedSock;
    if let Some(p) = parse::ptr_at::<Sock>(ctx.data(), ctx.data_end(), 0) {
        let sock = unsafe { core::ptr::read_unaligned(p) };
        let result = track::seed(&sock);
        unsafe {
            core::ptr::write_unaligned(p as *mut shedder_common::SeedResult, result);
        }
    }
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
