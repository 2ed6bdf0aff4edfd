//! The shared shed decision and the maps it reads. Both the XDP and the TC program call
//! [`run`] through the [`Frame`] abstraction.

use aya_ebpf::{
    helpers::generated::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
};
use shedder_common::{
    ACTION_RST, Bucket, COUNTER_ENTRIES, ClassRule, DEFAULT_PENDING_WINDOW_NS, Globals, Inflight,
    MAX_ADDR_SERVICES, MAX_CLASS_RULES, MAX_SERVICES, MODE_DRY_RUN, NUM_CLASSES, NUM_STATS,
    PORT_HAS_ADDR_SERVICES, PORT_MAP_ENTRIES, PORT_SERVICE_MASK, Pending, STAT_FALLBACK,
    STAT_NO_POLICY, STAT_RATE_CONTENDED, STAT_RST_ERROR, ServiceAddrKey, ServicePolicy,
    VERDICT_DROP, VERDICT_DRY_RUN, VERDICT_PASS, VERDICT_RST,
    admit::decide,
    counter_index,
    csum::{
        RST_TTL, TCP_ACK, TCP_RST, ipv4_rst_header_checksum, pseudo_v4, pseudo_v6, rst_ack_number,
        tcp_rst_checksum,
    },
    gcra,
};

use crate::{
    atomic,
    parse::{Syn, parse_syn, ptr_at},
};

#[map]
static SHEDDER_GLOBALS: Array<Globals> = Array::with_max_entries(1, 0);
#[map]
static SHEDDER_PORTS: Array<u32> = Array::with_max_entries(PORT_MAP_ENTRIES, 0);
#[map]
static SHEDDER_ADDR_SVC: HashMap<ServiceAddrKey, u32> =
    HashMap::with_max_entries(MAX_ADDR_SERVICES, 0);
#[map]
static SHEDDER_POLICY: Array<ServicePolicy> = Array::with_max_entries(MAX_SERVICES, 0);
#[map]
static SHEDDER_INFLIGHT: Array<Inflight> = Array::with_max_entries(MAX_SERVICES, 0);
#[map]
static SHEDDER_PENDING: Array<Pending> = Array::with_max_entries(MAX_SERVICES, 0);
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
static SHEDDER_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);
#[map]
static SHEDDER_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NUM_STATS, 0);

/// What the entry point should do with the frame.
pub enum Outcome {
    Pass,
    Drop,
    /// The frame was rewritten into a RST|ACK to send back where it came from.
    Reply,
}

/// The program-type specific parts of a frame.
pub trait Frame {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Shrink the frame to `new_len` bytes; false if the kernel refused.
    fn truncate(&self, new_len: usize) -> bool;
}

#[inline(always)]
fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = map.get_ptr_mut(index) {
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
pub fn run<F: Frame>(frame: &F) -> Outcome {
    let Some(syn) = parse_syn(frame.data(), frame.data_end()) else {
        return Outcome::Pass;
    };
    let Some(service) = lookup_service(&syn) else {
        return Outcome::Pass;
    };
    let Some(policy) = SHEDDER_POLICY.get(service) else {
        bump(&SHEDDER_STATS, STAT_NO_POLICY);
        return Outcome::Pass;
    };
    let Some(globals) = SHEDDER_GLOBALS.get(0) else {
        return Outcome::Pass;
    };
    let class = classify(&syn, policy);
    let now = unsafe { bpf_ktime_get_ns() };
    let stale = globals.heartbeat_ns == 0
        || now.saturating_sub(globals.heartbeat_ns) > globals.heartbeat_timeout_ns;
    if stale {
        bump(&SHEDDER_STATS, STAT_FALLBACK);
    }

    let window = if globals.pending_window_ns == 0 {
        DEFAULT_PENDING_WINDOW_NS
    } else {
        globals.pending_window_ns
    };
    let epoch = now / window;
    let Some(pending) = SHEDDER_PENDING.get_ptr_mut(service) else {
        return Outcome::Pass;
    };
    let mut occupancy = match SHEDDER_INFLIGHT.get(service) {
        Some(inflight) => inflight.class,
        None => [0; NUM_CLASSES],
    };
    for (c, occ) in occupancy.iter_mut().enumerate() {
        *occ = occ.saturating_add(unsafe { (*pending).count(c, epoch) });
    }

    let mut decision = decide(policy, class, &occupancy, stale);
    if decision.admit == 1 && !take_token(service, class, policy, now) {
        decision.admit = 0;
        decision.reason = shedder_common::REASON_RATE;
    }

    if decision.admit == 1 {
        count_pending(pending, class, epoch);
        bump(
            &SHEDDER_COUNTERS,
            counter_index(service, class, VERDICT_PASS, decision.reason),
        );
        return Outcome::Pass;
    }
    if policy.mode == MODE_DRY_RUN {
        bump(
            &SHEDDER_COUNTERS,
            counter_index(service, class, VERDICT_DRY_RUN, decision.reason),
        );
        return Outcome::Pass;
    }
    if policy.action == ACTION_RST {
        if write_rst(frame, &syn) {
            bump(
                &SHEDDER_COUNTERS,
                counter_index(service, class, VERDICT_RST, decision.reason),
            );
            return Outcome::Reply;
        }
        // Fail open: the reset could not be built, the attempt goes through.
        bump(&SHEDDER_STATS, STAT_RST_ERROR);
        bump(
            &SHEDDER_COUNTERS,
            counter_index(service, class, VERDICT_PASS, decision.reason),
        );
        return Outcome::Pass;
    }
    bump(
        &SHEDDER_COUNTERS,
        counter_index(service, class, VERDICT_DROP, decision.reason),
    );
    Outcome::Drop
}

/// Service id of the attempt's destination, `None` if it is not protected.
#[inline(always)]
fn lookup_service(syn: &Syn) -> Option<u32> {
    let entry = *SHEDDER_PORTS.get(syn.dport as u32)?;
    let mut id_plus_one = entry & PORT_SERVICE_MASK;
    if entry & PORT_HAS_ADDR_SERVICES != 0 {
        let key = ServiceAddrKey {
            addr: syn.dst,
            port: syn.dport,
            family: if syn.v6 == 1 { 6 } else { 4 },
            _pad: 0,
        };
        if let Some(v) = unsafe { SHEDDER_ADDR_SVC.get(&key) } {
            id_plus_one = *v & PORT_SERVICE_MASK;
        }
    }
    if id_plus_one == 0 {
        return None;
    }
    Some(id_plus_one - 1)
}

/// Class of the source: longest-prefix match, else the service's default.
#[inline(always)]
fn classify(syn: &Syn, policy: &ServicePolicy) -> u32 {
    let rule = if syn.v6 == 1 {
        SHEDDER_CLASS_V6.get(Key::new(128, syn.src))
    } else {
        SHEDDER_CLASS_V4.get(Key::new(
            32,
            [syn.src[0], syn.src[1], syn.src[2], syn.src[3]],
        ))
    };
    let class = match rule {
        Some(rule) => rule.class,
        None => policy.default_class as u32,
    };
    class & (NUM_CLASSES as u32 - 1)
}

/// Take one token from the (service, class) bucket; true if admitted or there is no bucket.
#[inline(always)]
fn take_token(service: u32, class: u32, policy: &ServicePolicy, now: u64) -> bool {
    let cp = &policy.classes[(class as usize) & (NUM_CLASSES - 1)];
    if cp.rate_interval_ns == 0 {
        return true;
    }
    let Some(bucket) = SHEDDER_BUCKETS.get_ptr_mut(service * NUM_CLASSES as u32 + class) else {
        return true;
    };
    let tat = unsafe { &raw mut (*bucket).tat_ns };
    let mut seen = unsafe { core::ptr::read_volatile(tat) };
    // A few attempts under contention; then fail open.
    let mut tries = 0;
    while tries < 3 {
        let Some(next) = gcra::conform(seen, now, cp.rate_interval_ns, cp.burst_ns) else {
            return false;
        };
        let found = unsafe { atomic::compare_exchange(tat, seen, next) };
        if found == seen {
            return true;
        }
        seen = found;
        tries += 1;
    }
    bump(&SHEDDER_STATS, STAT_RATE_CONTENDED);
    true
}

/// Count an admitted attempt in the current epoch's slot of its class.
#[inline(always)]
fn count_pending(pending: *mut Pending, class: u32, epoch: u64) {
    let index = ((class as usize) * 2 + (epoch & 1) as usize) & (NUM_CLASSES * 2 - 1);
    unsafe {
        let slot = &raw mut (*pending).slots[index];
        if (*slot).epoch != epoch {
            // A new epoch reuses the slot two epochs old. Racing CPUs may both reset it;
            // at worst an attempt admitted in the same instant is forgotten one epoch early.
            (*slot).epoch = epoch;
            (*slot).count = 0;
        }
        atomic::add(&raw mut (*slot).count, 1);
    }
}

const ETH_ALEN: usize = 6;

/// Rewrite the SYN in place into the RST|ACK answering it: MACs and addresses swapped,
/// IP and TCP headers without options, checksums computed from scratch.
#[inline(always)]
fn write_rst<F: Frame>(frame: &F, syn: &Syn) -> bool {
    let ip_len = if syn.v6 == 1 { 40 } else { 20 };
    let new_len = syn.l3_off + ip_len + 20;
    // Everything the reset needs is already in `syn`; shrinking first means a refusal leaves
    // the SYN untouched, so the caller can still pass it.
    if !frame.truncate(new_len) {
        return false;
    }
    let data = frame.data();
    let data_end = frame.data_end();
    let Some(macs) = ptr_at::<[u8; 2 * ETH_ALEN]>(data, data_end, 0) else {
        return false;
    };
    let Some(tcp) = ptr_at::<[u8; 20]>(data, data_end, syn.l3_off + ip_len) else {
        return false;
    };
    let ack = rst_ack_number(syn.seq, syn.payload_len);
    let pseudo = if syn.v6 == 1 {
        let Some(ip) = ptr_at::<[u8; 40]>(data, data_end, syn.l3_off) else {
            return false;
        };
        let mut h = [0u8; 40];
        h[0] = 0x60;
        h[5] = 20;
        h[6] = 6;
        h[7] = RST_TTL;
        h[8..24].copy_from_slice(&syn.dst);
        h[24..40].copy_from_slice(&syn.src);
        unsafe { *(ip as *mut [u8; 40]) = h };
        pseudo_v6(&syn.dst, &syn.src)
    } else {
        let Some(ip) = ptr_at::<[u8; 20]>(data, data_end, syn.l3_off) else {
            return false;
        };
        let src = u32::from_be_bytes([syn.dst[0], syn.dst[1], syn.dst[2], syn.dst[3]]);
        let dst = u32::from_be_bytes([syn.src[0], syn.src[1], syn.src[2], syn.src[3]]);
        let csum = ipv4_rst_header_checksum(src, dst).to_be_bytes();
        let s = src.to_be_bytes();
        let d = dst.to_be_bytes();
        let h = [
            0x45, 0, 0, 40, 0, 0, 0x40, 0, RST_TTL, 6, csum[0], csum[1], s[0], s[1], s[2], s[3],
            d[0], d[1], d[2], d[3],
        ];
        unsafe { *(ip as *mut [u8; 20]) = h };
        pseudo_v4(src, dst)
    };
    unsafe {
        let macs = macs as *mut [u8; 2 * ETH_ALEN];
        let m = *macs;
        *macs = [
            m[6], m[7], m[8], m[9], m[10], m[11], m[0], m[1], m[2], m[3], m[4], m[5],
        ];
    }
    let csum = tcp_rst_checksum(pseudo, syn.dport, syn.sport, 0, ack).to_be_bytes();
    let sp = syn.dport.to_be_bytes();
    let dp = syn.sport.to_be_bytes();
    let a = ack.to_be_bytes();
    unsafe {
        *(tcp as *mut [u8; 20]) = [
            sp[0],
            sp[1],
            dp[0],
            dp[1],
            0,
            0,
            0,
            0,
            a[0],
            a[1],
            a[2],
            a[3],
            0x50,
            TCP_RST | TCP_ACK,
            0,
            0,
            csum[0],
            csum[1],
            0,
            0,
        ]
    };
    true
}
