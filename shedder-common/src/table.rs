//! The packet path's memory of recent attempts, shed sources and demoted admissions: tables
//! of fixed size in BPF array maps, each entry a set of [`WAYS`] slots.
//!
//! Why not LRU hash maps: inserting into a full BPF LRU hash map (the normal state under a
//! SYN flood, which is when this memory matters) takes the map's locks and evicts entries
//! from the hash table: on the project's machines a new attempt cost about 620 ns with
//! the LRU maps against 170 ns without them, over the packet path's target. A set here is
//! one inlined array lookup; finding, inserting or refreshing an entry is a few loads and
//! two stores, with no lock and no allocation.
//!
//! - **Bounded**: the table never grows; a new entry replaces an empty slot of its set, or
//!   else the least recently written one (LRU within the set), so a flood of new keys
//!   evicts older entries and nothing else.
//! - **Keys**: an entry holds a 64-bit seeded hash of its key ([`hash`]), not the key. The
//!   set is chosen by 32 of its bits and the slot must match all 63 others (bit 0 marks a
//!   slot in use), so two different keys are confused only if their hashes are equal:
//!   probability 2^-63 per pair, at most `WAYS × 2^-63` (4.3 × 10^-19) per lookup. That is
//!   the false-positive bound: a first attempt counted as a retry, or a new attempt as a
//!   retransmit. The seed is random per daemon start ([`crate::Globals::table_seed`]), so
//!   a sender cannot choose keys that land in one set.
//! - **Values**: one 64-bit word written after the tag, holding the jiffies of the write
//!   (40 bits, wrapping after 2^40 jiffies: 34 years at HZ 1000), a check of 20 bits of
//!   the tag, a class, a flag, and whether the attempt was proven ([`crate::proof`]). Two CPUs writing one set at once can lose one of the
//!   writes, or leave a slot whose word belongs to another key; the check catches that
//!   (a mismatch reads as a miss), bar a 2^-20 chance. A lost or torn entry only makes a
//!   retransmit count as a new attempt, a retry as a first attempt, or a demoted
//!   connection count in its source's class.

/// Slots per set.
pub const WAYS: usize = 4;

/// Sets of recent SYNs remembered to recognise retransmits, one entry per (4-tuple,
/// initial sequence number): 65,536 entries in sets of [`WAYS`] (1 MiB), so a flood of
/// new attempts replaces the oldest entries of their sets (a retransmit of a replaced
/// attempt then counts as a new attempt) and never anything else.
pub const SYN_SETS: u32 = 16384;

/// One slot: the key's tag (0: empty) and the packed value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub tag: u64,
    pub word: u64,
}

/// One array element: a set of [`WAYS`] slots (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Set {
    pub slot: [Slot; WAYS],
}

const _: () = assert!(size_of::<Set>() == 64);

const JIFFIES_BITS: u32 = 40;
const JIFFIES_MASK: u64 = (1 << JIFFIES_BITS) - 1;
const CHECK_BITS: u32 = 20;
const CHECK_MASK: u64 = (1 << CHECK_BITS) - 1;
const PROVEN_BIT: u32 = JIFFIES_BITS + CHECK_BITS;
const FLAG_BIT: u32 = PROVEN_BIT + 1;
const CLASS_SHIFT: u32 = FLAG_BIT + 1;

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xff51_afd7_ed55_8ccd;
const K3: u64 = 0xc4ce_b9fe_1a85_ec53;

/// Seeded 64-bit hash of `words`: two words per 64-bit multiply-xorshift round, the rounds
/// alternating between two independent lanes, then a 64-bit finaliser over both. The chain
/// of dependent multiplies is the hash's latency, and the packet path hashes two keys per
/// new attempt: one word per round in one lane took a SYN's 11 words through 11 dependent
/// rounds, this takes 3.
#[inline(always)]
pub fn hash<const N: usize>(seed: u64, words: &[u32; N]) -> u64 {
    let mut lane = [seed ^ K1.wrapping_mul(N as u64 + 1), seed ^ K2];
    let mut i = 0;
    while i < N {
        let hi = if i + 1 < N { words[i + 1] } else { 0 };
        let w = words[i] as u64 | ((hi as u64) << 32);
        let l = &mut lane[(i / 2) & 1];
        *l = (*l ^ w).wrapping_mul(K1);
        *l ^= *l >> 29;
        i += 2;
    }
    let mut h = lane[0] ^ lane[1].rotate_left(32).wrapping_mul(K3);
    h ^= h >> 33;
    h = h.wrapping_mul(K2);
    h ^= h >> 33;
    h = h.wrapping_mul(K3);
    h ^ (h >> 33)
}

/// The set of a hash in a table of `sets` sets (a power of two).
#[inline(always)]
pub fn set_index(h: u64, sets: u32) -> u32 {
    ((h >> 32) as u32) & (sets - 1)
}

/// The tag a slot holds for a hash (never 0).
#[inline(always)]
pub fn tag(h: u64) -> u64 {
    h | 1
}

/// The value word for a write at `now`: `class` (2 bits), `flag` and `proven` (0 or 1),
/// checked against `tag`.
#[inline(always)]
pub fn pack(now: u64, class: u32, flag: bool, proven: u32, tag: u64) -> u64 {
    (now & JIFFIES_MASK)
        | (((tag >> 1) & CHECK_MASK) << JIFFIES_BITS)
        | (((proven & 1) as u64) << PROVEN_BIT)
        | ((flag as u64) << FLAG_BIT)
        | (((class & 3) as u64) << CLASS_SHIFT)
}

/// 1 if the word's attempt was proven, else 0.
#[inline(always)]
pub fn proven_of(word: u64) -> u32 {
    ((word >> PROVEN_BIT) & 1) as u32
}

/// The word with its flag cleared (jiffies, check, class and proof kept).
#[inline(always)]
pub fn without_flag(word: u64) -> u64 {
    word & !(1 << FLAG_BIT)
}

/// Whether `word` was written for `tag`.
#[inline(always)]
pub fn checks(word: u64, tag: u64) -> bool {
    (word >> JIFFIES_BITS) & CHECK_MASK == (tag >> 1) & CHECK_MASK
}

/// Jiffies since the write of `word` (modulo 2^40).
#[inline(always)]
pub fn age(now: u64, word: u64) -> u64 {
    now.wrapping_sub(word) & JIFFIES_MASK
}

/// Whether `word` was written within `window` jiffies before `now` (a zero window: never).
#[inline(always)]
pub fn within(now: u64, word: u64, window: u64) -> bool {
    window != 0 && age(now, word) <= window
}

#[inline(always)]
pub fn class_of(word: u64) -> u32 {
    ((word >> CLASS_SHIFT) & 3) as u32
}

#[inline(always)]
pub fn flag_of(word: u64) -> bool {
    (word >> FLAG_BIT) & 1 == 1
}

/// The word with its flag set (jiffies, check and class kept).
#[inline(always)]
pub fn with_flag(word: u64) -> u64 {
    word | (1 << FLAG_BIT)
}

/// The slot of `set` holding `tag`, or [`WAYS`] if none.
#[inline(always)]
pub fn find(set: &Set, tag: u64) -> usize {
    let mut way = WAYS;
    let mut i = 0;
    while i < WAYS {
        let s = &set.slot[i];
        if s.tag == tag && checks(s.word, tag) {
            way = i;
        }
        i += 1;
    }
    way
}

/// Of `N` slots, the one of highest `rank` (the first of equals): how every table here
/// picks the slot a new entry takes.
#[inline(always)]
pub fn highest<const N: usize>(rank: impl Fn(usize) -> u64) -> usize {
    let mut way = 0;
    let mut best = 0u64;
    let mut i = 0;
    while i < N {
        let r = rank(i);
        if r > best || i == 0 {
            best = r;
            way = i;
        }
        i += 1;
    }
    way
}

/// A slot's rank for a new entry ([`highest`]): the key's own slot, then an empty one, then
/// by `age` (below `u64::MAX - 1`), the oldest first.
#[inline(always)]
pub fn rank(own: bool, empty: bool, age: u64) -> u64 {
    if own {
        u64::MAX
    } else if empty {
        u64::MAX - 1
    } else {
        age
    }
}

/// The slot a new entry for `tag` takes: the one already holding it, else an empty one,
/// else the least recently written.
#[inline(always)]
pub fn victim(set: &Set, tag: u64, now: u64) -> usize {
    highest::<WAYS>(|i| {
        let s = &set.slot[i & (WAYS - 1)];
        // Ages are at most 2^40 - 1.
        rank(s.tag == tag, s.tag == 0, age(now, s.word))
    })
}

/// Write an entry for `tag` with value `word` (see [`pack`]) into the slot [`victim`] picks.
/// The word is stored before the tag, so a reader on another CPU sees either the old tag
/// with the new word or the new tag with the old word in between, both of which fail the
/// check: a miss, never another key's value.
#[inline(always)]
pub fn insert(set: &mut Set, tag: u64, word: u64, now: u64) {
    let slot = &mut set.slot[victim(set, tag, now) & (WAYS - 1)];
    // SAFETY: both pointers come from a live `&mut`; volatile keeps the order of the stores.
    unsafe {
        core::ptr::write_volatile(&raw mut slot.word, word);
        core::ptr::write_volatile(&raw mut slot.tag, tag);
    }
}

/// Key words of an attempt: its 4-tuple and initial sequence number.
#[inline(always)]
pub fn syn_words(
    src: [u32; 4],
    dst: [u32; 4],
    sport: u16,
    dport: u16,
    isn: u32,
    v6: u32,
) -> [u32; 11] {
    [
        src[0],
        src[1],
        src[2],
        src[3],
        dst[0],
        dst[1],
        dst[2],
        dst[3],
        ((sport as u32) << 16) | dport as u32,
        isn,
        v6,
    ]
}

/// Key words of a source shed for a service.
#[inline(always)]
pub fn source_words(src: [u32; 4], service: u32, v6: u32) -> [u32; 6] {
    [src[0], src[1], src[2], src[3], service, v6]
}

/// Key words of a demoted admission: the client's address and port and the server's port
/// (what both the packet path and the `inet_sock_set_state` tracepoint see). Distinct from
/// [`source_words`] by the last word, though the tables are separate anyway.
#[inline(always)]
pub fn demoted_words(client: [u32; 4], client_port: u16, server_port: u16, v6: u32) -> [u32; 6] {
    [
        client[0],
        client[1],
        client[2],
        client[3],
        ((client_port as u32) << 16) | server_port as u32,
        v6 | 0x100,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(set: &mut Set, tag: u64, now: u64, class: u32, flag: bool) {
        insert(set, tag, pack(now, class, flag, 0, tag), now);
    }

    #[test]
    fn pack_round_trips() {
        let t = tag(hash(7, &[1, 2, 3]));
        let w = pack(5_000_000_123, 2, true, 1, t);
        assert!(checks(w, t));
        assert_eq!((class_of(w), flag_of(w), proven_of(w)), (2, true, 1));
        assert_eq!(age(5_000_000_223, w), 100);
        let cleared = without_flag(w);
        assert_eq!(
            (class_of(cleared), flag_of(cleared), proven_of(cleared)),
            (2, false, 1)
        );
        assert!(checks(cleared, t));
        let w = pack(17, 3, false, 0, t);
        assert_eq!((class_of(w), flag_of(w), proven_of(w)), (3, false, 0));
        assert!(flag_of(with_flag(w)) && class_of(with_flag(w)) == 3 && checks(with_flag(w), t));
        // A word written for another key does not check against this tag (bar 2^-20).
        let other = tag(hash(7, &[1, 2, 4]));
        assert!(!checks(pack(17, 3, false, 0, other), t));
    }

    #[test]
    fn windows_and_wrapping() {
        let t = 0x1234_5679;
        let w = pack(1000, 0, false, 0, t);
        assert!(within(1000, w, 10) && within(1010, w, 10));
        assert!(!within(1011, w, 10));
        assert!(!within(1000, w, 0), "a zero window: never");
        // A stamp from the future (another CPU's jiffies raced ahead) is not recent.
        assert!(!within(999, w, 10));
        // Across the 2^40 wrap of the stored jiffies.
        let near = (1u64 << 40) - 5 + (7 << 40);
        let w = pack(near, 0, false, 0, t);
        assert_eq!(age(near + 10, w), 10);
        assert!(within(near + 10, w, 10));
    }

    #[test]
    fn seeded_hash_spreads_and_differs_by_seed() {
        let a = hash(1, &syn_words([1, 0, 0, 0], [2, 0, 0, 0], 1000, 80, 42, 0));
        let b = hash(1, &syn_words([1, 0, 0, 0], [2, 0, 0, 0], 1000, 80, 43, 0));
        let c = hash(2, &syn_words([1, 0, 0, 0], [2, 0, 0, 0], 1000, 80, 42, 0));
        assert!(a != b && a != c && b != c);
        // Consecutive sources fill the sets evenly: 65,536 keys into 16,384 sets of 4.
        let mut load = [0u32; 16384];
        for i in 0..65536u32 {
            let h = hash(0x5eed, &source_words([0xc612_0000 + i, 0, 0, 0], 0, 0));
            load[set_index(h, 16384) as usize] += 1;
        }
        let max = *load.iter().max().unwrap();
        let empty = load.iter().filter(|&&n| n == 0).count();
        // Poisson with mean 4: a set over 16 or more than 5% of sets empty would mean a
        // poor spread (expected about 1.8% empty).
        assert!(max <= 16 && empty < 16384 / 20, "max {max}, empty {empty}");
        // Swapping the ports is another key.
        assert_ne!(
            hash(0, &demoted_words([1, 0, 0, 0], 80, 1000, 0)),
            hash(0, &demoted_words([1, 0, 0, 0], 1000, 80, 0))
        );
    }

    #[test]
    fn find_insert_and_lru_replacement() {
        let mut set = Set::default();
        assert_eq!(find(&set, 3), WAYS);
        for (i, t) in [3u64, 5, 7, 9].into_iter().enumerate() {
            put(&mut set, t, 100 + i as u64, 1, false);
        }
        assert_eq!(find(&set, 7), 2);
        // Writing an existing key reuses its slot.
        put(&mut set, 5, 200, 2, true);
        assert_eq!(find(&set, 5), 1);
        assert!(flag_of(set.slot[1].word));
        // Full: the least recently written (tag 3, at 100) goes.
        put(&mut set, 11, 201, 0, false);
        assert_eq!(find(&set, 3), WAYS);
        assert_eq!(find(&set, 11), 0);
        // Then tag 7 (102), not 5 (rewritten at 200).
        put(&mut set, 13, 202, 0, false);
        assert_eq!((find(&set, 7), find(&set, 5)), (WAYS, 1));
        // An empty slot (tag 0) is the next to be reused.
        set.slot[3].tag = 0;
        assert_eq!(find(&set, 9), WAYS);
        put(&mut set, 15, 203, 0, false);
        assert_eq!(find(&set, 15), 3);
    }

    #[test]
    fn a_torn_slot_reads_as_a_miss() {
        let mut set = Set::default();
        put(&mut set, 21, 100, 1, true);
        // Another CPU wrote its word into the slot but not (yet) its tag.
        set.slot[0].word = pack(101, 0, false, 0, 23);
        assert_eq!(find(&set, 21), WAYS);
        assert_eq!(find(&set, 23), WAYS);
    }
}
