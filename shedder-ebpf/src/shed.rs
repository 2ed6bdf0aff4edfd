//! The shared shed decision and the maps it reads. Both the XDP and the TC program call
//! [`run`] through the [`Frame`] abstraction.

use aya_ebpf::{
    helpers::generated::{bpf_jiffies64, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf, lpm_trie::Key},
};
use aya_log_ebpf::{
    debug,
    macro_support::{Level, level_enabled},
    warn,
};
use shedder_common::{
    ACTION_RST, ADDR_KEY_QUIC, ADDR_KEY_TCP, Bucket, CLASS_L1_ENTRIES, CLASS_L2_BLOCKS,
    COUNTERS_PER_SERVICE, ClassBlock, ClassRule, DEMOTED_RESTAMP_NS, DEMOTED_SETS, Globals,
    Inflight, KLOG_LINES_PER_SECOND, LogBudget, MAX_ADDR_SERVICES, MAX_CLASS_RULES, MAX_SERVICES,
    MODE_DRY_RUN, MODE_ENFORCE, NUM_CLASSES, NUM_STATS, POLICY_CONFIGURED, PORT_HAS_ADDR_SERVICES,
    PORT_MAP_ENTRIES, PORT_SERVICE_MASK, Pending, STAT_FALLBACK, STAT_LOG_SUPPRESSED,
    STAT_NO_POLICY, STAT_RATE_CONTENDED, STAT_REFUSAL_SAMPLES_LOST, STAT_REPLY_LIMITED_PROVEN,
    STAT_REPLY_LIMITED_UNPROVEN, STAT_RST_ERROR, SYN_SETS, ServiceAddrKey, ServiceCounters,
    ServicePolicy, VERDICT_DROP, VERDICT_DRY_RUN, VERDICT_PASS, VERDICT_RST,
    admit::{self, Attempt, decide},
    classmap,
    csum::{
        IPPROTO_TCP, IPPROTO_UDP, PSEUDO_UDP_ADJUST, RST_TTL, TCP_ACK, TCP_OPT_NOP, TCP_RST,
        ipv4_reply_header_checksum, pseudo_v4, pseudo_v6, rst_ack_number, tcp_rst_checksum,
        udp_checksum,
    },
    decision_index, demote,
    fair::{self, ClassEpoch, Fairness, SOURCE_SETS, SOURCE_WAYS, SourceSet},
    flow::{
        self, ALIVE_RING, AliveRing, Entry, FLOW_ENTRIES, FLOW_UNPROVEN, Flow, FlowKey,
        SEEN_INITIAL, UNPROVEN, WAITING, ring_index,
    },
    gcra, is_pressure, mask,
    proof::{self, STANDING_SETS, STANDING_WAYS, StandingSet},
    quic::{
        CID_WINDOW, CidWords, FIXED_BIT, HEADER_FORM_LONG, mask_cid, reserved_version,
        version_negotiation_len, version_negotiation_sum,
    },
    refusal,
    table::{self, Set, WAYS},
};

use crate::{
    atomic, opaque,
    parse::{Datagram, Parsed, Reset, Syn, load, parse, ptr_at},
};

#[map]
pub static SHEDDER_GLOBALS: Array<Globals> = Array::with_max_entries(1, 0);
#[map]
static SHEDDER_PORTS: Array<u32> = Array::with_max_entries(PORT_MAP_ENTRIES, 0);
/// UDP port → QUIC service, as [`SHEDDER_PORTS`] for TCP.
#[map]
static SHEDDER_QUIC_PORTS: Array<u32> = Array::with_max_entries(PORT_MAP_ENTRIES, 0);
#[map]
static SHEDDER_ADDR_SVC: HashMap<ServiceAddrKey, u32> =
    HashMap::with_max_entries(MAX_ADDR_SERVICES, 0);
#[map]
pub static SHEDDER_POLICY: Array<ServicePolicy> = Array::with_max_entries(MAX_SERVICES, 0);
#[map]
pub static SHEDDER_INFLIGHT: Array<Inflight> = Array::with_max_entries(MAX_SERVICES, 0);
#[map]
pub static SHEDDER_PENDING: Array<Pending> = Array::with_max_entries(MAX_SERVICES, 0);
#[map]
static SHEDDER_BUCKETS: Array<Bucket> =
    Array::with_max_entries(MAX_SERVICES * NUM_CLASSES as u32, 0);
#[map]
static SHEDDER_CLASS_V4: LpmTrie<[u8; 4], ClassRule> =
    LpmTrie::with_max_entries(MAX_CLASS_RULES, 0);
#[map]
static SHEDDER_CLASS_V6: LpmTrie<[u8; 16], ClassRule> =
    LpmTrie::with_max_entries(MAX_CLASS_RULES, 0);
#[map]
static SHEDDER_CLASS_L1: Array<u32> = Array::with_max_entries(CLASS_L1_ENTRIES, 0);
#[map]
static SHEDDER_CLASS_L2: Array<ClassBlock> = Array::with_max_entries(CLASS_L2_BLOCKS, 0);
#[map]
pub static SHEDDER_COUNTERS: PerCpuArray<ServiceCounters> =
    PerCpuArray::with_max_entries(MAX_SERVICES, 0);
#[map]
pub static SHEDDER_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NUM_STATS, 0);
/// Recent attempts, to recognise a retransmitted SYN (same 4-tuple and initial sequence
/// number): the class it was decided in and whether it was admitted. Only SYNs to protected
/// services with a policy touch it, and only while `retransmit_window_jiffies` is not 0.
/// A table of sets (see [`shedder_common::table`]), like the two below.
#[map]
static SHEDDER_SYNS: Array<Set> = Array::with_max_entries(SYN_SETS, 0);
/// Sources per service: admissions in the current epoch (fair shares) and retry credits
/// (see [`shedder_common::fair`]). Only touched for services with fair shares or a retry
/// window.
#[map]
static SHEDDER_SOURCES: Array<SourceSet> = Array::with_max_entries(SOURCE_SETS, 0);
/// Per-class counts of each service's last two epochs: admissions, sources, over-share and
/// preempting admissions, first attempts and retries admitted.
#[map]
pub static SHEDDER_FAIR: Array<Fairness> = Array::with_max_entries(MAX_SERVICES, 0);
/// Demoted attempts admitted, for the tracking path: a connection counts in the class it
/// was admitted in (the one its limits were checked against), not its source's own.
#[map]
pub static SHEDDER_DEMOTED: Array<Set> = Array::with_max_entries(DEMOTED_SETS, 0);
/// Per service, when it last admitted a demoted attempt (see
/// [`shedder_common::demotion_recent`]).
#[map]
pub static SHEDDER_DEMOTED_AT: Array<u64> = Array::with_max_entries(MAX_SERVICES, 0);
/// Addresses that completed a handshake recently, and their tokens (see
/// [`shedder_common::proof`]): the packet path spends tokens, the tracking path earns them.
#[map]
pub static SHEDDER_STANDING: Array<StandingSet> = Array::with_max_entries(STANDING_SETS, 0);
/// The node's reply budgets, `[proven, unproven]` (see `Globals::reply_interval_ns`).
#[map]
static SHEDDER_REPLIES: Array<Bucket> = Array::with_max_entries(2, 0);
/// What the packet path remembers about the SYN being decided, between the lookups before
/// the decision and the writes after it (per CPU, private to one run, rewritten for every
/// SYN to a protected service).
#[repr(C)]
struct Memo {
    /// 1: the SYN table is in use (`retransmit_window_jiffies` was not 0).
    syns: u32,
    /// 1: the source table is in use (fair shares on, or a retry window).
    sources: u32,
    /// 1: a new attempt (0: a retransmit).
    fresh: u32,
    /// The source's slot in its set, or `SOURCE_WAYS` if it has none yet.
    way: u32,
    syn_set: u32,
    source_set: u32,
    syn_tag: u64,
    source_tag: u32,
    /// 1: the source was over its fair share when the attempt arrived.
    over: u32,
    /// 1: admitted over a full class or service in place of an over-share admission.
    preempt: u32,
    /// 1: a retry.
    retry: u32,
    /// 1: the source has not been refused yet in this epoch.
    unrefused: u32,
    /// 1: a retry that may fill idle room (first attempts are not being refused for want
    /// of room; see `fair::may_fill`).
    fill: u32,
    /// The source's share clock as the attempt found it, and what an admission within its
    /// share moves it on by (see `fair::clock`).
    clock: u32,
    interval: u32,
    /// Handed to the updates after the decision through this map value, whose contents the
    /// verifier does not track, so that every path through the decision reaches them in
    /// one state: the class decided in, 1 if admitted, 1 for a new attempt, 1 if refused
    /// for pressure.
    class: u32,
    admitted: u32,
    unique: u32,
    pressed: u32,
    /// 1: the class counts are kept (see `remember_source`).
    counted: u32,
    /// The reason a QUIC attempt answered with Version Negotiation was refused for.
    reason: u32,
    /// Whose counters that refusal counts in: 0 the proven attempts', 1 the unproven ones'.
    pool: u32,
    /// An unproven attempt's view of the service (see `unproven`): its attempts in
    /// handshake and its connections, here rather than on the stack, which the QUIC
    /// program's Version Negotiation needs.
    held: [[u64; NUM_CLASSES]; 2],
    inflight: [u32; NUM_CLASSES],
    /// The service's established connections, read with `inflight`.
    open: u32,
    /// Where the source's standing is (see `standing`), for an admission to spend a token.
    standing: u32,
    /// What that answer needs of the attempt.
    answer: Answer,
    /// A refused QUIC attempt's connection IDs, destination then source, copied here before
    /// its answer overwrites them (the stack has no room for them).
    cids: [CidWords; 2],
    /// Room past the windows for a copy length masked to 31 bytes (see
    /// `write_version_negotiation`).
    _room: [u8; 12],
    /// A QUIC attempt's flow, and what an admission remembers of it.
    flow_key: FlowKey,
    flow: Flow,
    /// A refusal to offer the sampler once the decision is done ([`offer_sample`]): 1 when
    /// `sample` holds one, with the service's mode and action to name its verdict by.
    /// Taken there, after every path has joined, so that the sampler's branches do not
    /// multiply what the verifier explores after the decision.
    sampling: u32,
    sample_mode: u32,
    sample_action: u32,
    sample: refusal::Sample,
}
/// Admitted QUIC flows (see [`shedder_common::flow`]).
#[map]
pub static SHEDDER_FLOWS: LruHashMap<FlowKey, Flow> = LruHashMap::with_max_entries(FLOW_ENTRIES, 0);
/// Per service, the QUIC flows last seen in each slot.
#[map]
pub static SHEDDER_ALIVE: Array<AliveRing> = Array::with_max_entries(MAX_SERVICES, 0);
const _: () = assert!(ALIVE_RING.is_power_of_two());

/// Holds the [`Memo`] in a map value rather than on the stack: the verifier does not track
/// what a map value holds, so the keys (whose form differs between the parse paths) and the
/// flags do not multiply the states it explores between the lookups before the decision
/// and the updates after it (on the stack, they cost the XDP program about 40% more
/// verified instructions).
#[map]
static SHEDDER_MEMO: PerCpuArray<Memo> = PerCpuArray::with_max_entries(1, 0);
/// Sampled refusals for the daemon ([`shedder_common::refusal`]); private to one load, as
/// the daemon that loaded the programs is the one that reads it.
#[map]
static SHEDDER_REFUSALS: RingBuf = RingBuf::with_byte_size(refusal::RING_BYTES, 0);
/// Each CPU's sampling budget (private to one load).
#[map]
static SHEDDER_SAMPLER: PerCpuArray<refusal::Sampler> = PerCpuArray::with_max_entries(1, 0);

/// Note a refusal of `syn`'s source for the sampler ([`offer_sample`]): stores only, no
/// branch.
#[inline(always)]
fn note_refusal(
    syn: &Syn,
    service: u32,
    class: u32,
    policy: &ServicePolicy,
    reason: u32,
    proven: u32,
) {
    let Some(m) = SHEDDER_MEMO.get_ptr_mut(0) else {
        return;
    };
    let sample = refusal::Sample {
        addr: syn.src,
        service: service as u16,
        class: class as u8,
        reason: reason as u8,
        verdict: 0,
        v6: syn.v6 as u8,
        proven: proven as u8,
        _pad: 0,
    };
    unsafe {
        core::ptr::write_volatile(&raw mut (*m).sample, sample);
        core::ptr::write_volatile(&raw mut (*m).sample_mode, policy.mode as u32);
        core::ptr::write_volatile(&raw mut (*m).sample_action, policy.action as u32);
        core::ptr::write_volatile(&raw mut (*m).sampling, 1);
    }
}

/// Hand the daemon the refusal [`note_refusal`] noted, if any, within this CPU's sampling
/// budget ([`shedder_common::refusal`]). A service switched off refuses nobody: nothing to
/// sample.
#[inline(always)]
fn offer_sample() {
    let Some(m) = SHEDDER_MEMO.get_ptr_mut(0) else {
        return;
    };
    if unsafe { core::ptr::read_volatile(&raw const (*m).sampling) } == 0 {
        return;
    }
    unsafe { core::ptr::write_volatile(&raw mut (*m).sampling, 0) };
    let (mode, action) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*m).sample_mode),
            core::ptr::read_volatile(&raw const (*m).sample_action),
        )
    };
    let verdict = verdict_of(mode, action);
    if verdict == VERDICT_PASS {
        return;
    }
    let Some(s) = SHEDDER_SAMPLER.get_ptr_mut(0) else {
        return;
    };
    if !unsafe { (*s).take(bpf_ktime_get_ns()) } {
        return;
    }
    let mut sample = unsafe { core::ptr::read_volatile(&raw const (*m).sample) };
    sample.verdict = verdict as u8;
    if SHEDDER_REFUSALS
        .output::<refusal::Sample>(&sample, 0)
        .is_err()
    {
        bump(&SHEDDER_STATS, STAT_REFUSAL_SAMPLES_LOST);
    }
}

/// The verdict a refusal meets under `policy`.
#[inline(always)]
fn refusal_verdict(policy: &ServicePolicy) -> u32 {
    verdict_of(policy.mode as u32, policy.action as u32)
}

/// The verdict a refusal meets under a service's mode and action.
#[inline(always)]
fn verdict_of(mode: u32, action: u32) -> u32 {
    if mode == MODE_DRY_RUN as u32 {
        VERDICT_DRY_RUN
    } else if mode != MODE_ENFORCE as u32 {
        // Off (`MODE_OFF`), or a mode this version does not know: passed, fail-open.
        VERDICT_PASS
    } else if action == ACTION_RST as u32 {
        VERDICT_RST
    } else {
        VERDICT_DROP
    }
}

/// Per-CPU kernel-log budget (private to one load; only touched with logging enabled).
#[map]
static SHEDDER_LOG_BUDGET: PerCpuArray<LogBudget> = PerCpuArray::with_max_entries(1, 0);

/// Whether a kernel log line at `level` may be written now. The level is a load-time
/// constant (aya-log's `AYA_LOG_LEVEL`, off unless `daemon.kernel_debug_log`), so with
/// logging off the verifier prunes every log site and the packet path pays nothing. With
/// it on, each CPU writes at most [`KLOG_LINES_PER_SECOND`] lines a second and counts the
/// rest in [`STAT_LOG_SUPPRESSED`].
#[inline(always)]
fn may_log(level: Level) -> bool {
    if !level_enabled(level) {
        return false;
    }
    let Some(b) = SHEDDER_LOG_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let second = unsafe { bpf_ktime_get_ns() } / 1_000_000_000;
    unsafe {
        if (*b).second != second {
            (*b).second = second;
            (*b).used = 0;
        }
        if (*b).used >= KLOG_LINES_PER_SECOND {
            bump(&SHEDDER_STATS, STAT_LOG_SUPPRESSED);
            return false;
        }
        (*b).used += 1;
    }
    true
}

/// What the entry point should do with the frame.
pub enum Outcome {
    Pass,
    Drop,
    /// The frame was rewritten into a RST|ACK (or, for QUIC, a Version Negotiation packet)
    /// to send back where it came from.
    Reply,
    /// A datagram for the QUIC program (the TCP program's answer only).
    ToQuic,
    /// A segment of a protected TCP port for the tracking program (the TCP program's
    /// answer only): it passes.
    ToTrack,
    /// A datagram to a QUIC port that is not a new attempt (the QUIC program's answer
    /// only): it passes, and may be news of an admitted flow (see `track::quic_flow`).
    Flow(Datagram),
    /// A refused QUIC Initial to answer with Version Negotiation ([`run`] does, and never
    /// returns this).
    Negotiate,
    /// A refusal that passes (dry-run, off): [`run`] offers it to the sampler and returns
    /// [`Outcome::Pass`], never this.
    PassRefused,
}

/// The program-type specific parts of a frame.
pub trait Frame {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Shrink the frame to `new_len` bytes; false if the kernel refused.
    fn truncate(&self, new_len: usize) -> bool;
    /// Copy `len` bytes (1 or more) from `from` into the frame at `off`, by the kernel's
    /// helper: one call instead of a loop over bytes at offsets the verifier must follow.
    fn store_bytes(&self, off: usize, from: *const u8, len: u32) -> bool;
}

/// A source slot's index, masked where the verifier sees it (see `opaque`): inside `way <
/// SOURCE_WAYS` LLVM drops a plain mask, and Linux 6.1's verifier loses the bound that
/// comparison gave. The plain mask after it keeps the index provably in range for LLVM
/// (no panic path).
#[inline(always)]
fn source_way(way: usize) -> usize {
    opaque::mask(way as u64, SOURCE_WAYS as u64 - 1) as usize & (SOURCE_WAYS - 1)
}

/// Count a proven attempt's decision in the service's per-CPU counters: `unique` is 1 for
/// a new attempt, 0 for a retransmit (decided again, but not another attempt).
#[inline(always)]
fn count_decision(service: u32, class: u32, verdict: u32, reason: u32, unique: u64) {
    count_in(service, 0, class, verdict, reason, unique);
}

/// Count a decision in `n` (`unproven` 0) or in `unproven`, which follows it.
#[inline(always)]
fn count_in(service: u32, unproven: u32, class: u32, verdict: u32, reason: u32, unique: u64) {
    if let Some(c) = SHEDDER_COUNTERS.get_ptr_mut(service) {
        let i = opaque::mask(
            (unproven * COUNTERS_PER_SERVICE as u32 + decision_index(class, verdict, reason))
                as u64,
            2 * COUNTERS_PER_SERVICE as u64 - 1,
        ) as usize;
        // Indexed by pointer: the mask bounds `i`, which LLVM cannot see through, and a
        // checked index would add a panic path, which BPF cannot have.
        unsafe { *(&raw mut (*c).n).cast::<u64>().add(i) += unique };
    }
}

/// Count a retransmitted SYN (`retry == false`) or a retry (`retry == true`) of `class`.
#[inline(always)]
fn count_repeat(service: u32, class: u32, retry: bool) {
    if let Some(c) = SHEDDER_COUNTERS.get_ptr_mut(service) {
        let i = (class as usize) & (NUM_CLASSES - 1);
        unsafe {
            if retry {
                (*c).retries[i] += 1;
            } else {
                (*c).retransmits[i] += 1;
            }
        }
    }
}

#[inline(always)]
pub fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = map.get_ptr_mut(index) {
        unsafe { *slot += 1 };
    }
}

/// Decide one frame. `QUIC` picks the program: the TCP one decides SYNs and answers
/// [`Outcome::ToQuic`] for a datagram to a UDP port with a QUIC service, for its caller to
/// tail-call the QUIC one, which decides Initials. A refused Initial is answered here, in
/// one place for the proven and the unproven paths (see `answer_quic`).
#[inline(always)]
pub fn run<F: Frame, const QUIC: bool>(frame: &F) -> Outcome {
    // Only a refusal offers a sample: the frames that are no attempt, and the attempts
    // admitted, pay nothing for it.
    match decide_frame::<F, QUIC>(frame) {
        Outcome::Negotiate => {
            let outcome = match SHEDDER_MEMO.get_ptr_mut(0) {
                Some(memo) => answer_quic(frame, memo),
                None => Outcome::Pass,
            };
            offer_sample();
            outcome
        }
        Outcome::PassRefused => {
            offer_sample();
            Outcome::Pass
        }
        refused @ (Outcome::Drop | Outcome::Reply) => {
            offer_sample();
            refused
        }
        other => other,
    }
}

/// [`run`]'s decision, a refused QUIC Initial left as [`Outcome::Negotiate`] with what its
/// answer needs in the memo.
#[inline(always)]
fn decide_frame<F: Frame, const QUIC: bool>(frame: &F) -> Outcome {
    let syn = match parse::<QUIC>(frame.data(), frame.data_end()) {
        Parsed::Attempt(syn) => syn,
        Parsed::Udp(port) => {
            return if is_quic_port(port) {
                Outcome::ToQuic
            } else {
                Outcome::Pass
            };
        }
        Parsed::Datagram(d) => return Outcome::Flow(d),
        // A documented drop rule of the parser (counted there).
        Parsed::Drop => return Outcome::Drop,
        Parsed::Reset(r) => {
            if !QUIC {
                disown(&r);
            }
            return Outcome::Pass;
        }
        Parsed::Segment => return Outcome::ToTrack,
        Parsed::Other => return Outcome::Pass,
    };
    if QUIC {
        // The flow an admission would remember, kept in the memo (whose contents the
        // verifier does not track) until the decision's paths have joined.
        let Some(memo) = SHEDDER_MEMO.get_ptr_mut(0) else {
            return Outcome::Pass;
        };
        unsafe {
            (*memo).flow_key = flow_key(&syn);
            (*memo).flow = Flow {
                dcid: syn.dcid,
                scid: syn.seq,
                ..Flow::default()
            };
        }
        // A later Initial of an admitted handshake (same client ID, from the same socket:
        // a retransmit, or the client's acknowledgement of the server's Initial, sent to
        // the ID the server chose) is part of that flow, not an attempt.
        #[allow(clippy::needless_borrows_for_generic_args)] // by value would copy the key
        let known =
            unsafe { SHEDDER_FLOWS.get(&(*memo).flow_key) }.is_some_and(|f| f.scid == syn.seq);
        if known {
            return Outcome::Flow(Datagram {
                key: flow_key(&syn),
                kind: SEEN_INITIAL,
                dcid: syn.dcid,
            });
        }
    }
    let Some(service) = lookup_service(syn.dport, syn.dst, syn.v6, syn.quic) else {
        return Outcome::Pass;
    };
    let policy = match SHEDDER_POLICY.get(service) {
        Some(p) if p.configured == POLICY_CONFIGURED => p,
        _ => {
            bump(&SHEDDER_STATS, STAT_NO_POLICY);
            if may_log(Level::Warn) {
                warn!(
                    &(),
                    "port={} service={} has no policy: passed (fail-open)", syn.dport, service
                );
            }
            return Outcome::Pass;
        }
    };
    let Some(globals) = SHEDDER_GLOBALS.get(0) else {
        return Outcome::Pass;
    };
    // The source's own class; a retry may be decided (and, admitted, counted) one lower.
    let own_class = classify(syn.src, syn.v6, policy);
    let mut class = own_class;
    let now = unsafe { bpf_jiffies64() };
    let epoch = globals.epoch(now);
    let hold = globals.hold_slot(now);
    // An attempt from a source without standing is decided apart (see `unproven`).
    let at = standing(&syn, globals, now);
    if at >> 31 == 0 {
        return unproven::<F, QUIC>(
            frame,
            &syn,
            service,
            policy,
            globals,
            own_class,
            (now, epoch, hold),
        );
    }
    let Some(memo) = SHEDDER_MEMO.get_ptr_mut(0) else {
        return Outcome::Pass;
    };
    // Kept in the memo: carried in a register through the decision, the verifier walked
    // it once per value it could tell apart.
    unsafe { core::ptr::write_volatile(&raw mut (*memo).standing, at) };
    // The service's per-class counts of its last two epochs (quotas, floors in admissions,
    // preemption, the retry budget).
    let counts = SHEDDER_FAIR.get(service);
    // What the attempt memory says. A note on its shape: a flag the verifier knows to be a
    // constant on some paths, tested again after the decision, is tracked precisely through
    // the whole decision, which is then verified once per combination of flags (six times
    // the instructions). So after this block `unique` and `retry` are only data (added to a
    // counter, logged), the updates after the decision test the flags the block left in
    // the memo, whose values the verifier does not know, and `demote` has no branch.
    //
    // 1 for a new attempt, 0 for a retransmit.
    let mut unique: u64 = 1;
    // 1 for a retry.
    let mut retry: u32 = 0;
    'memory: {
        let m = unsafe { &mut *memo };
        let window = globals.retransmit_window_jiffies;
        let retry_window = policy.retry_window_jiffies as u64;
        m.syns = (window != 0) as u32;
        m.sources = (retry_window != 0 || policy.fair_share == 1) as u32;
        m.fresh = 1;
        m.way = SOURCE_WAYS as u32;
        m.over = 0;
        m.preempt = 0;
        m.retry = 0;
        m.fill = 0;
        m.unrefused = 1;
        let seed = globals.table_seed;
        // A retransmitted SYN repeats an attempt already decided: it is counted as a
        // retransmit, not as a new attempt. Admitted once, it is admitted again at once
        // (the stack has begun that connection); otherwise it is decided again in its
        // class, without retry detection or demotion.
        let mut retransmit = false;
        if window != 0 {
            let h = table::hash(
                seed,
                // The last word also keeps a TCP attempt and a QUIC one apart.
                &table::syn_words(
                    syn.src,
                    syn.dst,
                    syn.sport,
                    syn.dport,
                    syn.seq,
                    syn.v6 | syn.quic << 1,
                ),
            );
            m.syn_tag = table::tag(h);
            m.syn_set = table::set_index(h, SYN_SETS);
            if let Some(set) = SHEDDER_SYNS.get(m.syn_set) {
                let way = table::find(set, m.syn_tag);
                if way < WAYS {
                    let word = set.slot[way & (WAYS - 1)].word;
                    if table::within(now, word, window) {
                        class = table::class_of(word);
                        count_repeat(service, class, false);
                        if table::flag_of(word) {
                            return Outcome::Pass;
                        }
                        unique = 0;
                        m.fresh = 0;
                        retransmit = true;
                    }
                }
            }
        }
        if m.sources == 0 {
            break 'memory;
        }
        // The source, as its own class counts sources: the address masked to a prefix.
        let cp = &policy.classes[(own_class as usize) & (NUM_CLASSES - 1)];
        let key = if syn.v6 == 1 {
            [
                syn.src[0] & cp.source_mask_v6[0],
                syn.src[1] & cp.source_mask_v6[1],
                syn.src[2] & cp.source_mask_v6[2],
                syn.src[3] & cp.source_mask_v6[3],
            ]
        } else {
            [syn.src[0] & cp.source_mask_v4, 0, 0, 0]
        };
        let h = table::hash(seed, &table::source_words(key, service, syn.v6));
        m.source_tag = fair::tag(h);
        m.source_set = table::set_index(h, SOURCE_SETS);
        let Some(set) = SHEDDER_SOURCES.get_ptr_mut(m.source_set) else {
            m.sources = 0;
            break 'memory;
        };
        let set = unsafe { &mut *set };
        let way = fair::find(set, m.source_tag);
        m.way = way as u32;
        let fine = fair::fine(now);
        let shift = globals.epoch_shift();
        let (paid, absent, credits) = if way < SOURCE_WAYS {
            let slot = &set.slot[source_way(way)];
            m.unrefused = (globals.epoch(slot.refused_jiffies as u64)
                != globals.epoch(now as u32 as u64)) as u32;
            (slot.paid, 0, fair::credits_now(slot, now, retry_window))
        } else {
            (0, u32::MAX, 0)
        };
        // Over its share: its share clock is more than its tolerance ahead of now.
        let fair = policy.fair_share == 1;
        let quota = match counts {
            Some(f) if fair => fair::quota(
                &f.previous(class as usize, epoch),
                policy.classes[(class as usize) & (NUM_CLASSES - 1)].source_quota,
            ),
            _ => u32::MAX,
        };
        m.interval = fair::interval(quota, shift);
        m.clock = fair::clock(paid, absent, fine, shift);
        let over = fair::over(m.clock, fine, fair::tolerance(m.interval, shift));
        m.over = over as u32;
        // A new attempt from a source that holds a retry credit (one of its attempts was
        // refused within the retry window) is a retry when the source is over its share, or
        // without fair shares always: it spends the credit, is counted by its own class, and
        // is decided one class lower if the policy says so. A source within its share is not
        // taken for a retrier.
        if !retransmit && retry_window != 0 && credits > 0 && (over || !fair) {
            retry = 1;
            m.retry = 1;
            m.fill = counts.is_some_and(|f| fair::may_fill(f, epoch)) as u32;
            count_repeat(service, class, true);
            if policy.demote_retries == 1 {
                class = demote(class);
            }
            let slot = &mut set.slot[source_way(way)];
            slot.credits = (credits - 1) as u16;
        }
    }

    let stale = heartbeat_stale(globals, now);

    let Some(pending) = SHEDDER_PENDING.get_ptr_mut(service) else {
        return Outcome::Pass;
    };
    // Proven attempts see the connections and the proven attempts in handshake only
    // (`admit::occupancy`); the stack cannot hold the unproven counts as well.
    let mut occ = unsafe { (*pending).count(hold)[0] };
    let mut open = 0;
    if let Some(inflight) = SHEDDER_INFLIGHT.get(service) {
        let mut c = 0;
        while c < NUM_CLASSES {
            occ[c] += inflight.busy(c) as u64;
            c += 1;
        }
        open = inflight.connections_total();
    }

    // The class's floor also as a share of the service's admissions (a fraction of one
    // connection at small limits).
    // Only where the floor is less than one whole connection: a floor of whole connections
    // holds by itself, and a large floor held in admissions too would admit its class past
    // the limit until it had that share of everything admitted.
    let cp = &policy.classes[(class as usize) & (NUM_CLASSES - 1)];
    let floor_share = cp.floor_share;
    let whole = if stale { cp.fallback_floor } else { cp.floor };
    let below_floor_share = floor_share != 0
        && whole == 0
        && counts
            .is_some_and(|f| fair::below_share(&f.admitted(epoch), class as usize, floor_share));
    let m = unsafe { &mut *memo };
    let attempt = Attempt {
        class,
        below_floor_share,
        // Read back from the memo, not carried from the memory block, so the decision is
        // not verified once for a retry and once for a first attempt.
        fills_idle: unsafe { core::ptr::read_volatile(&raw const (*memo).fill) } != 0,
        origin: own_class,
    };
    let mut decision = decide(policy, &attempt, &occ, stale);
    if m.sources != 0
        && let Some(f) = counts
    {
        let limit = if stale {
            policy.fallback_total
        } else {
            policy.total_limit
        } as u64;
        let sharing = admit::Sharing {
            fair: policy.fair_share == 1,
            over: m.over != 0,
            retry: m.retry != 0,
            retry_budget: policy.retry_budget,
            retry_budget_min: policy.retry_budget_min,
        };
        let (settled, preempt) = admit::share(decision, &sharing, class, &occ, limit, || {
            f.window(class as usize, epoch)
        });
        decision = settled;
        m.preempt = preempt as u32;
    }
    if decision.admit == 1 && at_connection_ceiling(open, policy) {
        decision.admit = 0;
        decision.reason = shedder_common::Reason::Connections as u32;
    }
    if decision.admit == 1 && !take_token(service, class, policy) {
        decision.admit = 0;
        decision.reason = shedder_common::Reason::Rate as u32;
    }
    let admitted = decision.admit == 1;
    // Dry run, or off: a refusal passes (counted as a dry-run refusal, or as a pass).
    let dry_run = policy.mode != MODE_ENFORCE;
    // 1 for a disputed address (`pool_of`): an admission is held with the unproven
    // attempts, and a refusal counted with theirs: its refusals are mostly forged copies,
    // which as proven refusals would read as its class's pressure.
    let pool = pool_of(unsafe { core::ptr::read_volatile(&raw const (*memo).standing) }) as u32;
    let outcome = 'act: {
        if admitted {
            // A QUIC admission is counted in flight at once instead (see `flow_admitted`).
            if !QUIC {
                count_pending(pending, pool as usize, class, hold);
            }
            count_decision(service, class, VERDICT_PASS, decision.reason, unique);
            break 'act Outcome::Pass;
        }
        note_refusal(
            &syn,
            service,
            class,
            policy,
            decision.reason,
            (pool == 0) as u32,
        );
        if may_log(Level::Debug) {
            let verdict = refusal_verdict(policy);
            debug!(
                &(),
                "shed port={} service={} class={} verdict={} reason={} class_inflight={} inflight={} limit={} stale={} retransmit={} retry={}",
                syn.dport,
                service,
                class,
                verdict,
                decision.reason,
                occ[(class as usize) & (NUM_CLASSES - 1)],
                occ[0] + occ[1] + occ[2] + occ[3],
                policy.total_limit,
                stale as u32,
                1 - unique,
                retry
            );
        }
        if dry_run {
            count_in(
                service,
                pool,
                class,
                refusal_verdict(policy),
                decision.reason,
                unique,
            );
            break 'act Outcome::PassRefused;
        }
        // An attempt in a fragment or a tunnel is dropped, not answered (see `parse`).
        let answer = policy.action == ACTION_RST && syn.reply == 1;
        if answer && !reply_allowed(globals, 0) {
            // Over the node's budget for replies: dropped instead (see `reply_allowed`).
            count_in(service, pool, class, VERDICT_DROP, decision.reason, unique);
            break 'act Outcome::Drop;
        }
        if answer {
            if syn.quic == 1 {
                // Answered last, once nothing of the decision is left to tell its paths
                // apart (see `answer_quic`).
                unsafe {
                    core::ptr::write_volatile(&raw mut (*memo).reason, decision.reason);
                    core::ptr::write_volatile(&raw mut (*memo).pool, 0);
                }
                break 'act Outcome::Reply;
            }
            if write_rst(frame, &syn) {
                count_in(service, pool, class, VERDICT_RST, decision.reason, unique);
                break 'act Outcome::Reply;
            }
            // Fail open: the reset could not be built, the attempt goes through.
            bump(&SHEDDER_STATS, STAT_RST_ERROR);
            if may_log(Level::Warn) {
                warn!(
                    &(),
                    "port={} service={}: could not build the RST: passed (fail-open)",
                    syn.dport,
                    service
                );
            }
            count_in(service, pool, class, VERDICT_PASS, decision.reason, unique);
            break 'act Outcome::Pass;
        }
        count_in(service, pool, class, VERDICT_DROP, decision.reason, unique);
        Outcome::Drop
    };

    // Remember the attempt, after every outcome has joined. A dry-run shed passes the SYN,
    // so the stack begins the connection: the attempt is remembered as admitted (its
    // retransmits pass) while its source is remembered as shed, so that retries are
    // counted and decided as enforcing would. A failed update only means that a later
    // retransmit counts as a new attempt, or a later retry as a first attempt.
    let passed = admitted | dry_run;
    if m.syns != 0
        && let Some(set) = SHEDDER_SYNS.get_ptr_mut(m.syn_set)
    {
        let set = unsafe { &mut *set };
        if m.fresh != 0 {
            table::insert(
                set,
                m.syn_tag,
                table::pack(now, class, passed, 1, m.syn_tag),
                now,
            );
        } else if passed {
            // A retransmit admitted on its second decision. Its entry keeps the jiffies of
            // the attempt's first SYN: the window runs from the attempt.
            let way = table::find(set, m.syn_tag);
            if way < WAYS {
                let slot = &mut set.slot[way & (WAYS - 1)];
                slot.word = table::with_flag(slot.word);
            }
        }
    }
    if QUIC && passed {
        // Remember the admitted flow and count it in flight (see `shedder_common::flow`).
        // A failed insertion only leaves it unmeasured.
        let slot = flow::slot(now, globals.epoch_shift());
        remember_flow(memo, service, class, slot);
        flow_admitted(service, class, slot, WAITING);
    }
    if admitted {
        spend_token(unsafe { core::ptr::read_volatile(&raw const (*memo).standing) });
    }
    if admitted && class != own_class && syn.quic == 0 {
        // Admitted in a class other than its source's: tell the tracking path, which
        // classifies a new connection by its source, where to count it (a TCP one: QUIC
        // connections have no socket the tracking path sees).
        let h = table::hash(
            globals.table_seed,
            &table::demoted_words(syn.src, syn.sport, syn.dport, syn.v6),
        );
        if let Some(set) = SHEDDER_DEMOTED.get_ptr_mut(table::set_index(h, DEMOTED_SETS)) {
            let tag = table::tag(h);
            table::insert(
                unsafe { &mut *set },
                tag,
                table::pack(now, class, false, 1, tag),
                now,
            );
            // Restamped once a second at most: every CPU's demoted admissions would
            // otherwise write the one cache line the stamps of eight services share.
            if let Some(at) = SHEDDER_DEMOTED_AT.get_ptr_mut(service) {
                let t = unsafe { bpf_ktime_get_ns() };
                if t.wrapping_sub(unsafe { core::ptr::read_volatile(at) }) > DEMOTED_RESTAMP_NS {
                    unsafe { *at = t };
                }
            }
        }
    }
    unsafe {
        core::ptr::write_volatile(&raw mut (*memo).class, class);
        core::ptr::write_volatile(&raw mut (*memo).admitted, admitted as u32);
        core::ptr::write_volatile(&raw mut (*memo).unique, unique as u32);
        // The class counts are kept where something reads them: the source memory, or a
        // floor held in admissions.
        let floors = policy.classes[1].floor_share
            | policy.classes[2].floor_share
            | policy.classes[3].floor_share;
        core::ptr::write_volatile(
            &raw mut (*memo).counted,
            ((*memo).sources != 0 || floors != 0) as u32,
        );
        // Refused for pressure, as bits rather than comparisons (no branch here, where
        // every path through the decision has joined).
        core::ptr::write_volatile(
            &raw mut (*memo).pressed,
            (1 - (admitted as u32)) & is_pressure(decision.reason) & (1 - pool),
        );
    }
    remember_source(service, (now, epoch), pool, memo);
    if syn.quic == 1
        && let Outcome::Reply = outcome
    {
        // Everything the answer needs goes through the memo, whose contents the verifier
        // does not track, so every path through the decision reaches the writer in one
        // state (see `answer_quic`).
        unsafe {
            let a = &raw mut (*memo).answer;
            core::ptr::write_volatile(
                a,
                Answer::of(&syn, service, (globals.table_seed as u32) ^ now as u32),
            );
        }
        return Outcome::Negotiate;
    }
    outcome
}

/// What the Version Negotiation answer needs of the attempt (see [`answer_quic`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct Answer {
    src: [u32; 4],
    dst: [u32; 4],
    sport: u32,
    dport: u32,
    l3_off: u32,
    v6: u32,
    plain_ip: u32,
    cids: u32,
    service: u32,
    seed: u32,
}

impl Answer {
    #[inline(always)]
    fn of(syn: &Syn, service: u32, seed: u32) -> Self {
        Self {
            src: syn.src,
            dst: syn.dst,
            sport: syn.sport as u32,
            dport: syn.dport as u32,
            l3_off: syn.l3_off as u32,
            v6: syn.v6,
            plain_ip: syn.plain_ip,
            cids: syn.cids,
            service,
            seed,
        }
    }

    /// The attempt again, its offset bounded where the verifier sees it (the memo gives
    /// it back as any number): an Ethernet header and two VLAN tags at most.
    #[inline(always)]
    fn syn(&self) -> Syn {
        Syn {
            l3_off: opaque::mask(self.l3_off as u64, 31) as usize,
            v6: self.v6 & 1,
            src: self.src,
            dst: self.dst,
            sport: self.sport as u16,
            dport: self.dport as u16,
            seq: 0,
            dcid: 0,
            payload_len: 0,
            plain_ip: self.plain_ip,
            tcp_len: 20,
            quic: 1,
            cids: self.cids,
            reply: 1,
        }
    }
}

/// Refuse a QUIC attempt with Version Negotiation and count the verdict; fail open (pass,
/// counted) if the answer cannot be built. Called at the very end of the decision: the
/// writer is long (each ID byte by byte), and every distinct path the verifier walks into
/// it walks it again, so it is entered where the decision's registers are dead and the
/// class, reason and attempt kind come back from the memo. Inlined once, at the end of
/// [`run`], where it reuses the decision's stack: as a BPF subprogram its stack would add
/// to the caller's, past the 512 bytes a program may have.
#[inline(always)]
fn answer_quic<F: Frame>(frame: &F, memo: *mut Memo) -> Outcome {
    let (class, reason, unique, answer, pool) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*memo).class),
            core::ptr::read_volatile(&raw const (*memo).reason),
            core::ptr::read_volatile(&raw const (*memo).unique),
            core::ptr::read_volatile(&raw const (*memo).answer),
            core::ptr::read_volatile(&raw const (*memo).pool) & 1,
        )
    };
    let syn = &answer.syn();
    let service = answer.service;
    if write_version_negotiation(frame, syn, answer.seed, unsafe { &mut (*memo).cids }) {
        count_in(service, pool, class, VERDICT_RST, reason, unique as u64);
        return Outcome::Reply;
    }
    bump(&SHEDDER_STATS, STAT_RST_ERROR);
    if may_log(Level::Warn) {
        warn!(
            &(),
            "port={} service={}: could not build the Version Negotiation: passed (fail-open)",
            syn.dport,
            service
        );
    }
    count_in(service, pool, class, VERDICT_PASS, reason, unique as u64);
    Outcome::Pass
}

/// Insert the admitted QUIC flow whose key and IDs the memo holds (a failed insertion
/// only leaves it unmeasured).
#[inline(always)]
fn remember_flow(memo: *mut Memo, service: u32, class: u32, slot: u32) {
    unsafe {
        let f = &raw mut (*memo).flow;
        (*f).admitted_ns = bpf_ktime_get_ns();
        (*f).service = service as u16;
        (*f).class = class as u8;
        (*f).slot = slot;
        #[allow(clippy::needless_borrows_for_generic_args)] // by value would copy them
        let _ = SHEDDER_FLOWS.insert(&(*memo).flow_key, &*f, 0);
    }
}

/// `class`'s counts of `service` in `epoch`, the slot two epochs old reset first.
#[inline(always)]
fn class_counts(service: u32, epoch: u64, class: usize) -> Option<*mut ClassEpoch> {
    Some(counts_in(SHEDDER_FAIR.get_ptr_mut(service)?, epoch, class))
}

/// [`class_counts`] in a service's entry already looked up.
#[inline(always)]
fn counts_in(fs: *mut Fairness, epoch: u64, class: usize) -> *mut ClassEpoch {
    let slot = unsafe { &raw mut (*fs).slots[(epoch & 1) as usize] };
    unsafe {
        if (*slot).epoch != epoch {
            // A new epoch reuses the slot two epochs old (racing CPUs may both reset it: at
            // worst an attempt of the same instant goes uncounted).
            (*slot).class = [ClassEpoch::default(); NUM_CLASSES];
            (*slot).epoch = epoch;
        }
        &raw mut (*slot).class[class & (NUM_CLASSES - 1)]
    }
}

/// After the decision: the class's counts (always: the floors in admissions need them),
/// and, with the source memory on, the source's admissions and credits. The slot is
/// rewritten with masks rather than branches (see [`shedder_common::mask`]): this
/// runs after every path through the decision, so each branch here would multiply them.
/// `pool` is the one the attempt was decided in (`pool_of`: 1 for a disputed address).
#[inline(always)]
fn remember_source(service: u32, (now, epoch): (u64, u64), pool: u32, memo: *mut Memo) {
    let m = unsafe { &*memo };
    if unsafe { core::ptr::read_volatile(&raw const (*memo).counted) } == 0 {
        return;
    }
    let (class, admitted, unique) = unsafe {
        (
            (core::ptr::read_volatile(&raw const (*memo).class) as usize) & (NUM_CLASSES - 1),
            core::ptr::read_volatile(&raw const (*memo).admitted),
            core::ptr::read_volatile(&raw const (*memo).unique),
        )
    };
    let Some(counts) = class_counts(service, epoch, class) else {
        return;
    };
    let a = admitted & 1;
    fair::record(
        unsafe { &mut *counts },
        &fair::Decided {
            admitted: a,
            pressed: unsafe { core::ptr::read_volatile(&raw const (*memo).pressed) },
            unique,
            over: m.over,
            preempt: m.preempt,
            retry: m.retry,
            unrefused: m.unrefused,
        },
    );
    if unsafe { core::ptr::read_volatile(&raw const (*memo).sources) } == 0 {
        return;
    }
    let Some(set) = SHEDDER_SOURCES.get_ptr_mut(m.source_set) else {
        return;
    };
    let set = unsafe { &mut *set };
    // The source's slot as found before the decision, else the one it takes.
    let found = unsafe { core::ptr::read_volatile(&raw const (*memo).way) } as u64;
    let absent = mask::zero(found ^ SOURCE_WAYS as u64);
    let way = if absent != 0 {
        fair::victim(set, epoch) as u64
    } else {
        found
    };
    let s = &mut set.slot[(way as usize) & (SOURCE_WAYS - 1)];
    let absent = absent as u32;
    // An admission within the share moves the source's share clock on.
    let paid = m
        .clock
        .wrapping_add(m.interval & 0u32.wrapping_sub(a & (1 - m.over)));
    // A disputed address's refusal (`pool` 1) earns no retry credit: mostly it is a
    // forged copy's.
    let earns = 1 - (pool & (1 - a));
    let (next, first) = fair::next(
        s,
        (m.source_tag, absent),
        (now, epoch),
        (a, unique & earns),
        paid,
    );
    *s = next;
    unsafe { (*counts).sources = (*counts).sources.wrapping_add(first) };
}

/// A QUIC admission: counted in flight at once (the daemon's recount from the ring replaces
/// the count every tick), and in the ring in `state`: waiting for the server's answer, or
/// unproven (then also in flight's unproven part). A function of its own (a BPF
/// subprogram), verified once rather than once per path of the decision.
#[inline(never)]
fn flow_admitted(service: u32, class: u32, slot: u32, state: usize) {
    let c = (class as usize) & (NUM_CLASSES - 1);
    if let Some(inflight) = SHEDDER_INFLIGHT.get_ptr_mut(service) {
        unsafe {
            atomic::add32(&raw mut (*inflight).class[c], 1);
            if state == UNPROVEN {
                atomic::add32(&raw mut (*inflight).unproven[c], 1);
            }
        };
    }
    if let Some(ring) = SHEDDER_ALIVE.get_ptr_mut(service) {
        alive_add(ring, slot, state, class, 1);
    }
}

/// The service holds its ceiling of established connections (`open`, busy or idle):
/// every class is refused, whatever the work in flight. A ceiling of 0 is none (a policy
/// written without one: fail open).
#[inline(always)]
fn at_connection_ceiling(open: u32, policy: &ServicePolicy) -> bool {
    policy.max_connections != 0 && open >= policy.max_connections
}

/// Add `by` (1, or -1 as `u32::MAX`) to the flows of `class` in `state` last seen in
/// `slot`, shared by the CPUs (see [`shedder_common::flow::add`], whose rule this is, with
/// atomics).
#[inline(always)]
pub fn alive_add(ring: *mut AliveRing, slot: u32, state: usize, class: u32, by: u32) {
    let e = unsafe { &raw mut (*ring).slots[ring_index(slot)] };
    let held = unsafe { core::ptr::read_volatile(&raw const (*e).slot) };
    match flow::entry(held, slot) {
        Entry::Skip => return,
        Entry::Reset => {
            // The first CPU to claim the entry for `slot` clears its counts; one that
            // finds it claimed by another slot meanwhile gives up (a count lost, not a
            // wrong one).
            let found = unsafe { atomic::compare_exchange(e.cast(), held as u64, slot as u64) };
            if found == held as u64 {
                unsafe { (*e).n = [[0; NUM_CLASSES]; flow::STATES] };
            } else if found != slot as u64 {
                return;
            }
        }
        Entry::Add => {}
    }
    if state >= flow::STATES {
        return;
    }
    unsafe {
        atomic::add32(
            (&raw mut (*e).n[state][(class as usize) & (NUM_CLASSES - 1)]).cast::<u32>(),
            by,
        )
    };
}

/// The flow of a QUIC attempt: the client's address and port, the service's port.
#[inline(always)]
pub fn flow_key(syn: &Syn) -> FlowKey {
    FlowKey {
        addr: syn.src,
        sport: syn.sport,
        dport: syn.dport,
        v6: syn.v6,
    }
}

/// Whether the daemon's heartbeat is stale (never stamped, or older than its timeout): the
/// decision then takes the fallback limits, and it is counted.
#[inline(always)]
fn heartbeat_stale(globals: &Globals, now: u64) -> bool {
    let stale = globals.heartbeat_jiffies == 0
        || now.saturating_sub(globals.heartbeat_jiffies) > globals.heartbeat_timeout_jiffies;
    if stale {
        bump(&SHEDDER_STATS, STAT_FALLBACK);
    }
    stale
}

/// Whether some TCP service is protected on `port` (on some address).
#[inline(always)]
pub fn is_tcp_service_port(port: u16) -> bool {
    matches!(SHEDDER_PORTS.get(port as u32), Some(&e) if e != 0)
}

/// Whether some QUIC service listens on UDP `port` (on some address).
#[inline(always)]
pub fn is_quic_port(port: u16) -> bool {
    matches!(SHEDDER_QUIC_PORTS.get(port as u32), Some(&e) if e != 0)
}

/// Service id of the attempt's destination, `None` if it is not protected.
#[inline(always)]
pub fn lookup_service(port: u16, addr: [u32; 4], v6: u32, quic: u32) -> Option<u32> {
    let entry = if quic == 1 {
        *SHEDDER_QUIC_PORTS.get(port as u32)?
    } else {
        *SHEDDER_PORTS.get(port as u32)?
    };
    let mut id_plus_one = entry & PORT_SERVICE_MASK;
    if entry & PORT_HAS_ADDR_SERVICES != 0 {
        let key = ServiceAddrKey {
            addr: as_bytes(addr),
            port,
            family: if v6 == 1 { 6 } else { 4 },
            proto: if quic == 1 {
                ADDR_KEY_QUIC
            } else {
                ADDR_KEY_TCP
            },
        };
        if let Some(v) = unsafe { SHEDDER_ADDR_SVC.get(key) } {
            id_plus_one = *v & PORT_SERVICE_MASK;
        }
    }
    if id_plus_one == 0 {
        return None;
    }
    Some(id_plus_one - 1)
}

/// Class of the source: longest-prefix match, else the service's default. IPv4 sources are
/// resolved by the direct table (two inlined array loads) unless their /24 holds a longer
/// rule; the tries answer the rest.
#[inline(always)]
pub fn classify(src: [u32; 4], v6: u32, policy: &ServicePolicy) -> u32 {
    let found = if v6 == 1 {
        SHEDDER_CLASS_V6
            .get(Key::new(128, as_bytes(src)))
            .map(|r| r.class)
    } else {
        match classmap::decode(direct_cell(u32::from_be(src[0]))) {
            Some(class) => class,
            None => SHEDDER_CLASS_V4
                .get(Key::new(32, src[0].to_ne_bytes()))
                .map(|r| r.class),
        }
    };
    let class = match found {
        Some(class) => class,
        None => policy.default_class as u32,
    };
    class & (NUM_CLASSES as u32 - 1)
}

/// The IPv4 direct table's cell for `src` (host byte order).
#[inline(always)]
fn direct_cell(src: u32) -> u32 {
    let Some(&l1) = SHEDDER_CLASS_L1.get(src >> 16) else {
        return classmap::CLASS_CELL_TRIE;
    };
    if l1 & classmap::CLASS_L1_BLOCK == 0 {
        return l1;
    }
    match SHEDDER_CLASS_L2.get(l1 & 0xffff) {
        Some(block) => block.cell[((src >> 8) & 0xff) as usize] as u32,
        None => classmap::CLASS_CELL_TRIE,
    }
}

/// Take one token from the (service, class) bucket; true if admitted or there is no bucket.
#[inline(always)]
fn take_token(service: u32, class: u32, policy: &ServicePolicy) -> bool {
    let cp = &policy.classes[(class as usize) & (NUM_CLASSES - 1)];
    if cp.rate_interval_ns == 0 {
        return true;
    }
    // The bucket is kept in nanoseconds (interval, burst and TAT), so it needs a nanosecond
    // clock: jiffies would make it refill 10^6-10^7 times too slowly. The helper call is
    // only paid on the admitted attempts of classes that have a bucket.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(bucket) = SHEDDER_BUCKETS.get_ptr_mut(service * NUM_CLASSES as u32 + class) else {
        return true;
    };
    let tat = unsafe { &raw mut (*bucket).tat_ns };
    match spend_gcra(tat, now, cp.rate_interval_ns, cp.burst_ns) {
        Spent::Refused => false,
        Spent::Admitted => true,
        Spent::Contended => {
            bump(&SHEDDER_STATS, STAT_RATE_CONTENDED);
            true
        }
    }
}

/// What [`spend_gcra`] did.
enum Spent {
    /// The bucket was empty.
    Refused,
    Admitted,
    /// Admitted while another CPU spent from the same bucket.
    Contended,
}

/// Spend a token of the GCRA bucket whose theoretical arrival time is at `tat`.
///
/// Without compare-and-swap, which needs Linux 5.12 (the TCP path loads on 5.10): a bucket
/// in debt (its TAT ahead of `now`, as under load) is advanced by an atomic addition, so
/// racing admissions each pay their interval and the rate holds; an idle one is set by a
/// store, where CPUs admitting in the same instant may each take the first token of a
/// burst. An addition that finds another CPU's between its read and its write is counted
/// as contended.
#[inline(always)]
fn spend_gcra(tat: *mut u64, now: u64, interval_ns: u64, burst_ns: u64) -> Spent {
    let seen = unsafe { core::ptr::read_volatile(tat) };
    let Some(next) = gcra::conform(seen, now, interval_ns, burst_ns) else {
        return Spent::Refused;
    };
    if seen <= now {
        unsafe { core::ptr::write_volatile(tat, next) };
        return Spent::Admitted;
    }
    unsafe { atomic::add(tat, next - seen) };
    if unsafe { core::ptr::read_volatile(tat) } == next {
        Spent::Admitted
    } else {
        Spent::Contended
    }
}

/// Count an admitted attempt in the current hold slot: `pool` 0 for a proven attempt, 1
/// for an unproven one.
#[inline(always)]
fn count_pending(pending: *mut Pending, pool: usize, class: u32, hold: u64) {
    unsafe {
        let slot = &raw mut (*pending).slots[(hold & 1) as usize];
        if (*slot).slot != hold {
            // A new slot reuses the one two slots old. Racing CPUs may both reset it; at
            // worst an attempt admitted in the same instant is forgotten one slot early.
            (*slot).class = [[0; NUM_CLASSES]; 2];
            (*slot).slot = hold;
        }
        atomic::add(
            &raw mut (*slot).class[pool & 1][(class as usize) & (NUM_CLASSES - 1)],
            1,
        );
    }
}

/// Whether a refusal may be answered (a RST, or a QUIC Version Negotiation): the node's
/// budget for replies to proven sources (`unproven` 0), or to unproven ones and QUIC
/// (`unproven` 1), has a token. A reply goes to the attempt's source address, which for an
/// unproven attempt may be anyone's: unbounded, refusals would turn the node into a
/// reflector of spoofed floods, as the kernel bounds its own resets and ICMP errors for
/// the same reason. An interval of 0: no bound.
#[inline(always)]
fn reply_allowed(globals: &Globals, unproven: u32) -> bool {
    let kind = unproven & 1;
    let interval = globals.reply_interval_ns[kind as usize];
    if interval == 0 {
        return true;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(bucket) = SHEDDER_REPLIES.get_ptr_mut(kind) else {
        return true;
    };
    let tat = unsafe { &raw mut (*bucket).tat_ns };
    let allowed = !matches!(
        spend_gcra(tat, now, interval, globals.reply_burst_ns[kind as usize]),
        Spent::Refused
    );
    if !allowed {
        bump(
            &SHEDDER_STATS,
            if kind == 0 {
                STAT_REPLY_LIMITED_PROVEN
            } else {
                STAT_REPLY_LIMITED_UNPROVEN
            },
        );
    }
    allowed
}

/// Whether the source of `syn` has standing (`shedder_common::proof`): 1 if its address
/// proved itself within the standing window and holds a token, which this attempt spends.
#[inline(always)]
fn standing(syn: &Syn, globals: &Globals, now: u64) -> u32 {
    let h = table::hash(globals.table_seed, &proof::key_words(syn.src, syn.v6));
    let index = table::set_index(h, STANDING_SETS);
    let Some(set) = SHEDDER_STANDING.get(index) else {
        return 0;
    };
    let way = proof::find(set, proof::tag(h));
    if way >= STANDING_WAYS {
        return 0;
    }
    let slot = &set.slot[way & (STANDING_WAYS - 1)];
    let units = proof::seen_now(now);
    let proven = proof::proven(slot, units, globals.standing_window as u16);
    // Where the slot is, for the admission to spend its token (`spend_token`): the set
    // below 2^13, the way in the low 3 bits, bit 31 set; bit 30 if the address is
    // disputed (its admission is held in the unproven pool, `pool_of`).
    (proven << 31) | (proof::disputed(slot, units) << 30) | (index << 3) | way as u32
}

/// The pool an admitted proven attempt is held in (`standing`'s answer, `at`): 0, or 1
/// (with the unproven attempts) for a disputed address (`shedder_common::proof`).
#[inline(always)]
fn pool_of(at: u32) -> usize {
    ((at >> 30) & 1) as usize
}

/// An admitted proven attempt spends a token of its source's standing (`standing`'s
/// answer, `at`).
#[inline(always)]
fn spend_token(at: u32) {
    if at >> 31 == 0 {
        return;
    }
    if let Some(set) = SHEDDER_STANDING.get_ptr_mut((at >> 3) & (STANDING_SETS - 1)) {
        let slot = unsafe { &mut (*set).slot[(at & 7) as usize & (STANDING_WAYS - 1)] };
        slot.tokens = proof::spend(slot);
    }
}

/// Decide an attempt from a source without standing (`shedder_common::proof`) with
/// `admit::unproven`: against every connection and every attempt in handshake, proven or
/// not, and within the class's cap of unproven attempts. Nothing of it is remembered but
/// its count in the hold slot (no source memory, no attempt table, no class counts, no
/// token bucket: none of what it says is proven), and, for a QUIC Initial, its flow marked
/// unproven (not counted in flight until the server's answer shows the client is real); it
/// counts in the service's `unproven` counters, not in the offered load. A path of its
/// own: merged into the proven attempts' (with the proof as data), the verifier walked
/// twice as much.
#[inline(always)]
fn unproven<F: Frame, const QUIC: bool>(
    frame: &F,
    syn: &Syn,
    service: u32,
    policy: &ServicePolicy,
    globals: &Globals,
    class: u32,
    (now, epoch, hold): (u64, u64, u64),
) -> Outcome {
    let stale = heartbeat_stale(globals, now);
    let Some(pending) = SHEDDER_PENDING.get_ptr_mut(service) else {
        return Outcome::Pass;
    };
    let Some(memo) = SHEDDER_MEMO.get_ptr_mut(0) else {
        return Outcome::Pass;
    };
    // Unproven QUIC flows are in flight (see `flow::UNPROVEN`): within the cap they are
    // counted with the unproven attempts held, and apart from the other connections.
    unsafe {
        (*memo).held = (*pending).count(hold);
        (*memo).inflight = [0; NUM_CLASSES];
        (*memo).open = 0;
        if let Some(i) = SHEDDER_INFLIGHT.get(service) {
            (*memo).open = i.connections_total();
            let mut c = 0;
            while c < NUM_CLASSES {
                let busy = i.busy(c);
                let u = if i.unproven[c] < busy {
                    i.unproven[c]
                } else {
                    busy
                };
                (*memo).inflight[c] = busy - u;
                (*memo).held[1][c] += u as u64;
                c += 1;
            }
        }
    }
    let counts = SHEDDER_FAIR.get_ptr_mut(service);
    let decision = admit::unproven(
        policy,
        class,
        unsafe { &(*memo).held },
        unsafe { &(*memo).inflight },
        stale,
        policy.fair_share == 1 && counts.is_some(),
        || {
            counts.map_or(ClassEpoch::default(), |f| unsafe {
                (*f).window(class as usize, epoch)
            })
        },
    );
    let mut decision = decision;
    if decision.admit == 1
        && at_connection_ceiling(
            unsafe { core::ptr::read_volatile(&raw const (*memo).open) },
            policy,
        )
    {
        decision.admit = 0;
        decision.reason = shedder_common::Reason::Connections as u32;
    }
    // The unproven attempts are one source among the class's (`fair::record_unproven`).
    // Only an admission or a refusal for pressure changes what that records: a flood's
    // refusals for the cap, most of its SYNs, leave alone the entry every CPU shares (and
    // its cache line, which each write would take from the other CPUs).
    if policy.fair_share == 1
        && (decision.admit | is_pressure(decision.reason)) != 0
        && let Some(f) = counts
    {
        let c = counts_in(f, epoch, class as usize);
        fair::record_unproven(unsafe { &mut *c }, decision.admit, decision.reason);
    }
    if decision.admit == 1 {
        count_in(service, 1, class, VERDICT_PASS, decision.reason, 1);
        if !QUIC {
            count_pending(pending, 1, class, hold);
            return Outcome::Pass;
        }
        // The flow, to recognise the client's answer (the flow key and IDs were put in the
        // memo as the program began), counted in flight as unproven from now.
        let slot = flow::slot(now, globals.epoch_shift());
        unsafe { (*memo).flow.state = FLOW_UNPROVEN };
        remember_flow(memo, service, class, slot);
        flow_admitted(service, class, slot, UNPROVEN);
        return Outcome::Pass;
    }
    note_refusal(syn, service, class, policy, decision.reason, 0);
    if policy.mode != MODE_ENFORCE {
        count_in(
            service,
            1,
            class,
            refusal_verdict(policy),
            decision.reason,
            1,
        );
        return Outcome::PassRefused;
    }
    if QUIC && policy.action == ACTION_RST && syn.reply == 1 && reply_allowed(globals, 1) {
        unsafe {
            core::ptr::write_volatile(&raw mut (*memo).class, class);
            core::ptr::write_volatile(&raw mut (*memo).reason, decision.reason);
            core::ptr::write_volatile(&raw mut (*memo).unique, 1);
            core::ptr::write_volatile(&raw mut (*memo).pool, 1);
            core::ptr::write_volatile(
                &raw mut (*memo).answer,
                Answer::of(syn, service, (globals.table_seed as u32) ^ now as u32),
            );
        }
        return Outcome::Negotiate;
    }
    if !QUIC && policy.action == ACTION_RST && syn.reply == 1 && reply_allowed(globals, 1) {
        if write_rst(frame, syn) {
            count_in(service, 1, class, VERDICT_RST, decision.reason, 1);
            return Outcome::Reply;
        }
        bump(&SHEDDER_STATS, STAT_RST_ERROR);
        count_in(service, 1, class, VERDICT_PASS, decision.reason, 1);
        return Outcome::Pass;
    }
    count_in(service, 1, class, VERDICT_DROP, decision.reason, 1);
    Outcome::Drop
}

/// A reset to a protected service: if it answers the server's SYN-ACK for an admitted
/// proven attempt (no ACK, and its sequence number is that attempt's initial one plus one),
/// the source disowns the attempt, which was spoofed in its name. The attempt stops holding
/// capacity at once, the token it spent goes back to the source, and the source is
/// disputed for a while (`shedder_common::proof`). Resets pass whatever they say.
#[inline(always)]
fn disown(r: &Reset) {
    let Some(globals) = SHEDDER_GLOBALS.get(0) else {
        return;
    };
    if globals.retransmit_window_jiffies == 0 {
        return;
    }
    let Some(service) = lookup_service(r.dport, r.dst, r.v6, 0) else {
        return;
    };
    let h = table::hash(
        globals.table_seed,
        &table::syn_words(r.src, r.dst, r.sport, r.dport, r.seq.wrapping_sub(1), r.v6),
    );
    let tag = table::tag(h);
    let Some(set) = SHEDDER_SYNS.get_ptr_mut(table::set_index(h, SYN_SETS)) else {
        return;
    };
    let set = unsafe { &mut *set };
    let way = table::find(set, tag);
    if way >= WAYS {
        return;
    }
    let slot = &mut set.slot[way & (WAYS - 1)];
    let word = slot.word;
    let now = unsafe { bpf_jiffies64() };
    let born = globals.hold_slot(now.wrapping_sub(table::age(now, word)));
    // Admitted and proven. One whose hold has lapsed (its reset slower than the hold, on a
    // loaded node) holds nothing any more, but its token still comes back, its address is
    // disputed, and it is counted: otherwise it would stay in the class's demand.
    if !table::flag_of(word) || table::proven_of(word) == 0 {
        return;
    }
    slot.word = table::without_flag(word);
    let class = table::class_of(word);
    // The token back, and the address disputed from now (`shedder_common::proof`). The
    // attempt was held in the pool its address's dispute put it in when admitted: read
    // before this reset renews it.
    let mut pool = 0usize;
    let h = table::hash(globals.table_seed, &proof::key_words(r.src, r.v6));
    if let Some(set) = SHEDDER_STANDING.get_ptr_mut(table::set_index(h, STANDING_SETS)) {
        let set = unsafe { &mut *set };
        let way = proof::find(set, proof::tag(h));
        if way < STANDING_WAYS {
            let s = &mut set.slot[way & (STANDING_WAYS - 1)];
            let units = proof::seen_now(now);
            pool = proof::disputed(s, units) as usize;
            s.tokens = proof::refund(s);
            s.disowned = proof::disowned_at(units);
        }
    }
    if let Some(pending) = SHEDDER_PENDING.get_ptr_mut(service) {
        let s = unsafe { &raw mut (*pending).slots[(born & 1) as usize] };
        if unsafe { (*s).slot } == born {
            unsafe {
                atomic::decrement_if_positive(
                    &raw mut (*s).class[pool & 1][(class as usize) & (NUM_CLASSES - 1)],
                )
            };
        }
    }
    if let Some(c) = SHEDDER_COUNTERS.get_ptr_mut(service) {
        unsafe { (*c).disowned[(class as usize) & (NUM_CLASSES - 1)] += 1 };
    }
}

/// Address words as the bytes they hold in the packet.
#[inline(always)]
fn as_bytes(words: [u32; 4]) -> [u8; 16] {
    // SAFETY: [u32; 4] and [u8; 16] have the same size and every bit pattern is valid.
    unsafe { core::mem::transmute(words) }
}

#[inline(always)]
unsafe fn store<T>(base: *const u8, off: usize, value: T) {
    unsafe { core::ptr::write(base.add(off).cast_mut().cast::<T>(), value) }
}

/// Rewrite the SYN in place into the RST|ACK answering it: MACs and addresses swapped, no
/// IP options or extension headers, checksums computed from scratch.
///
/// In the common case — no IP options or extension headers, no data in the SYN — the reset
/// takes the SYN's place byte for byte: same TCP header length, the option space filled
/// with NOPs, the frame length unchanged, so no helper call is needed. Otherwise the frame
/// is cut to a reset with a 20-byte TCP header.
#[inline(always)]
fn write_rst<F: Frame>(frame: &F, syn: &Syn) -> bool {
    let ip_len = if syn.v6 == 1 { 40 } else { 20 };
    let in_place = syn.payload_len == 0 && syn.plain_ip == 1;
    let tcp_len = if in_place { syn.tcp_len } else { 20 };
    // Everything the reset needs is already in `syn`; cutting first means a refusal leaves
    // the SYN untouched, so the caller can still pass it.
    if !in_place && !frame.truncate(syn.l3_off + ip_len + 20) {
        return false;
    }
    let data = frame.data();
    let data_end = frame.data_end();
    let Some(eth) = ptr_at::<[u8; 12]>(data, data_end, 0) else {
        return false;
    };
    let l4_off = syn.l3_off + ip_len;
    let Some(tcp) = ptr_at::<[u8; 20]>(data, data_end, l4_off) else {
        return false;
    };
    // Option space (at most 40 bytes): NOP-filled word by word to the end of the frame,
    // which in place is the end of the SYN's TCP header (plus any Ethernet padding, which
    // lies outside the IP datagram), and when cut is the end of the bare header. Bounding
    // the loop by the frame rather than by the header length keeps that length out of the
    // verifier's pointer arithmetic.
    let mut off = 20;
    while off < 60 {
        let Some(word) = ptr_at::<[u8; 4]>(data, data_end, l4_off + off) else {
            break;
        };
        unsafe { store(word.cast(), 0, u32::from_ne_bytes([TCP_OPT_NOP; 4])) };
        off += 4;
    }
    let ack = rst_ack_number(syn.seq, syn.payload_len);
    let Some(pseudo) = write_reply_ip(data, data_end, syn, tcp_len as u32, IPPROTO_TCP) else {
        return false;
    };
    let [c0, c1] =
        tcp_rst_checksum(pseudo, syn.dport, syn.sport, 0, ack, tcp_len as u32).to_be_bytes();
    let tcp = tcp.cast::<u8>();
    swap_macs(eth.cast::<u8>());
    unsafe {
        store(tcp, 0, syn.dport.to_be());
        store(tcp, 2, syn.sport.to_be());
        store(tcp, 4, 0u32);
        store(tcp, 8, ack.to_be());
        store(
            tcp,
            12,
            u32::from_ne_bytes([((tcp_len / 4) as u8) << 4, TCP_RST | TCP_ACK, 0, 0]),
        );
        store(tcp, 16, u32::from_ne_bytes([c0, c1, 0, 0]));
    }
    true
}

/// Write the IP header of a reply to `syn` over the attempt's own: addresses swapped, no
/// IPv4 options or IPv6 extension headers, IPv4 id 0 with DF and TTL [`RST_TTL`] / IPv6 hop
/// limit [`RST_TTL`], carrying `l4_len` bytes of protocol `proto`. Returns the
/// pseudo-header sum (with TCP's protocol number, as `pseudo_v4` and `pseudo_v6` count it).
#[inline(always)]
fn write_reply_ip(data: usize, data_end: usize, syn: &Syn, l4_len: u32, proto: u8) -> Option<u32> {
    if syn.v6 == 1 {
        let ip = ptr_at::<[u8; 40]>(data, data_end, syn.l3_off)?.cast::<u8>();
        let [l0, l1] = (l4_len as u16).to_be_bytes();
        unsafe {
            store(ip, 0, u32::from_ne_bytes([0x60, 0, 0, 0]));
            store(ip, 4, u32::from_ne_bytes([l0, l1, proto, RST_TTL]));
            let mut i = 0;
            while i < 4 {
                store(ip, 8 + 4 * i, syn.dst[i]);
                store(ip, 24 + 4 * i, syn.src[i]);
                i += 1;
            }
        }
        Some(pseudo_v6(&as_bytes(syn.dst), &as_bytes(syn.src), l4_len))
    } else {
        let ip = ptr_at::<[u8; 20]>(data, data_end, syn.l3_off)?.cast::<u8>();
        let (src, dst) = (u32::from_be(syn.dst[0]), u32::from_be(syn.src[0]));
        let total = (20 + l4_len) as u16;
        let [c0, c1] = ipv4_reply_header_checksum(src, dst, total, proto).to_be_bytes();
        let [t0, t1] = total.to_be_bytes();
        unsafe {
            store(ip, 0, u32::from_ne_bytes([0x45, 0, t0, t1]));
            store(ip, 4, u32::from_ne_bytes([0, 0, 0x40, 0]));
            store(ip, 8, u32::from_ne_bytes([RST_TTL, proto, c0, c1]));
            store(ip, 12, syn.dst[0]);
            store(ip, 16, syn.src[0]);
        }
        Some(pseudo_v4(src, dst, l4_len))
    }
}

/// Swap the destination and source MAC addresses of the Ethernet header at `eth`.
#[inline(always)]
fn swap_macs(eth: *const u8) {
    unsafe {
        let (d0, d1): (u32, u16) = (load(eth, 0), load(eth, 4));
        let (s0, s1): (u16, u32) = (load(eth, 6), load(eth, 8));
        store(eth, 0, s0);
        store(eth, 2, s1);
        store(eth, 6, d0);
        store(eth, 10, d1);
    }
}

/// Rewrite a QUIC client's Initial into the Version Negotiation packet refusing it (see
/// [`shedder_common::quic::write_version_negotiation`], whose bytes these are): MACs,
/// addresses and ports swapped, no IP options or extension headers, the client's
/// connection IDs swapped, and one reserved version, `reserved_version(seed)`, which no
/// client speaks. The frame is cut first, so a refusal leaves the Initial untouched for
/// the caller to pass; an Initial behind IP options or extension headers is not answered.
#[inline(always)]
fn write_version_negotiation<F: Frame>(
    frame: &F,
    syn: &Syn,
    seed: u32,
    cids: &mut [CidWords; 2],
) -> bool {
    if syn.plain_ip == 0 {
        return false;
    }
    let ip_len = if syn.v6 == 1 { 40 } else { 20 };
    let q = syn.l3_off + ip_len + 8;
    let dcid_len = (syn.cids & 0xff) as usize;
    let scid_len = ((syn.cids >> 8) & 0xff) as usize;
    if dcid_len > CID_WINDOW || scid_len > CID_WINDOW {
        return false;
    }
    // Both IDs, copied before anything is written (the Initial is at least 1,200 bytes, so
    // the windows lie inside it).
    let (data, data_end) = (frame.data(), frame.data_end());
    let Some(d) = ptr_at::<CidWords>(data, data_end, q + 6) else {
        return false;
    };
    let Some(s) = ptr_at::<CidWords>(data, data_end, q + 7 + dcid_len) else {
        return false;
    };
    unsafe {
        cids[0] = load(d.cast(), 0);
        cids[1] = load(s.cast(), 0);
    }
    mask_cid(&mut cids[0], dcid_len as u32);
    mask_cid(&mut cids[1], scid_len as u32);
    let version = reserved_version(seed);
    let vn_len = version_negotiation_len(dcid_len, scid_len);
    let udp_len = (8 + vn_len) as u32;
    let sum = version_negotiation_sum(
        &cids[0],
        dcid_len as u32,
        &cids[1],
        scid_len as u32,
        version,
    );
    if !frame.truncate(q + vn_len) {
        return false;
    }
    // The IDs first, by the helper: the client's source ID from q + 6, then its
    // destination ID after its length byte. An empty ID is written as one (zero) byte, as
    // the helper copies at least one; the byte written after it (a length, the version)
    // lands on the same place. Every offset is inside the cut frame by construction.
    let s_copy = copy_len(scid_len);
    let d_copy = copy_len(dcid_len);
    if !frame.store_bytes(q + 6, cids[1].as_ptr().cast(), s_copy)
        || !frame.store_bytes(q + 7 + scid_len, cids[0].as_ptr().cast(), d_copy)
    {
        return false;
    }
    let data = frame.data();
    let data_end = frame.data_end();
    let Some(eth) = ptr_at::<[u8; 12]>(data, data_end, 0) else {
        return false;
    };
    let Some(udp) = ptr_at::<[u8; 8]>(data, data_end, q - 8) else {
        return false;
    };
    let Some(pseudo) = write_reply_ip(data, data_end, syn, udp_len, IPPROTO_UDP) else {
        return false;
    };
    let sum = pseudo + PSEUDO_UDP_ADJUST + syn.dport as u32 + syn.sport as u32 + udp_len + sum;
    let udp = udp.cast::<u8>();
    swap_macs(eth.cast::<u8>());
    unsafe {
        store(udp, 0, syn.dport.to_be());
        store(udp, 2, syn.sport.to_be());
        store(udp, 4, (udp_len as u16).to_be());
        store(udp, 6, udp_checksum(sum).to_be());
    }
    // The fixed bytes: first byte, version 0 and the first length, the second length, and
    // the one version offered.
    let Some(head) = ptr_at::<[u8; 6]>(data, data_end, q) else {
        return false;
    };
    unsafe {
        store(head.cast::<u8>(), 0, HEADER_FORM_LONG | FIXED_BIT);
        store(head.cast::<u8>(), 1, 0u32);
        store(head.cast::<u8>(), 5, scid_len as u8);
    }
    let Some(b) = inner_byte(data, data_end, q + 6 + scid_len) else {
        return false;
    };
    unsafe { *b = dcid_len as u8 };
    let Some(v) = ptr_at::<[u8; 4]>(data, data_end, q + 7 + scid_len + dcid_len) else {
        return false;
    };
    unsafe { store(v.cast::<u8>(), 0, version.to_be()) };
    true
}

/// How many bytes of an ID of `len` (at most 20) the store helper copies: at least one,
/// as it takes no empty copy, and bounded where the verifier sees it (1 to 32): Linux
/// 6.1's keeps no bound on the length here and checks the copy as if 255 bytes long. The
/// memo has room past the windows for 32.
#[inline(always)]
fn copy_len(len: usize) -> u32 {
    let at_least_one = if len == 0 { 1 } else { len as u64 };
    (opaque::mask(at_least_one - 1, 31) + 1) as u32
}

/// A byte of the frame that is never its last (here: every byte of a Version Negotiation
/// packet before its version), checked as two bytes: LLVM turns a one-byte check into
/// `end > p`, from which the verifier learns no range when `p` has a variable offset.
#[inline(always)]
fn inner_byte(data: usize, data_end: usize, off: usize) -> Option<*mut u8> {
    ptr_at::<[u8; 2]>(data, data_end, off).map(|p| p.cast_mut().cast::<u8>())
}
