//! Building the IPv4 direct class table (DIR-16-8, see `shedder_common::ClassBlock`) from
//! the class rules, so the packet path resolves most sources with two array loads instead
//! of a trie walk. The table is exact: wherever it cannot answer, it says "ask the trie",
//! which holds every rule.

use std::{collections::BTreeMap, net::Ipv4Addr};

use shedder_common::{
    ClassBlock,
    classmap::{CLASS_CELL_NONE, CLASS_CELL_TRIE, CLASS_L1_BLOCK},
};

/// Both levels of the table; `blocks[i]` is referenced from `l1` as `CLASS_L1_BLOCK | (base + i)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectTable {
    pub l1: Vec<u32>,
    pub blocks: Vec<ClassBlock>,
}

fn cell(class: Option<u32>) -> u32 {
    class.map_or(CLASS_CELL_NONE, |c| c + 1)
}

/// Build the table for `rules` (address, prefix length, class). At most `max_blocks`
/// second-level blocks are used, numbered from `base`; /16s beyond that are left to the trie.
pub fn build(rules: &[(Ipv4Addr, u32, u32)], base: u32, max_blocks: usize) -> DirectTable {
    // Rules by increasing prefix length, so painting longer ones last gives longest-prefix
    // semantics; equal prefixes cannot occur (validation rejects duplicates).
    let mut sorted: Vec<(u32, u32, u32)> = rules
        .iter()
        .map(|&(a, len, class)| (u32::from(a), len.min(32), class))
        .collect();
    sorted.sort_by_key(|&(_, len, _)| len);

    // First level: every rule of /16 or shorter paints its /16s.
    let mut l1 = vec![CLASS_CELL_NONE; 1 << 16];
    for &(addr, len, class) in sorted.iter().filter(|r| r.1 <= 16) {
        let first = (addr >> 16) as usize;
        let count = 1usize << (16 - len);
        let first = first & !(count - 1);
        l1[first..first + count].fill(cell(Some(class)));
    }

    // Longer rules, grouped by their /16.
    let mut inside: BTreeMap<u32, Vec<(u32, u32, u32)>> = BTreeMap::new();
    for &r in sorted.iter().filter(|r| r.1 > 16) {
        inside.entry(r.0 >> 16).or_default().push(r);
    }
    let mut blocks = Vec::new();
    for (slash16, rules) in inside {
        let covering = l1[slash16 as usize];
        if blocks.len() >= max_blocks {
            l1[slash16 as usize] = CLASS_CELL_TRIE;
            continue;
        }
        let mut block = ClassBlock {
            cell: [covering as u8; 256],
        };
        for &(addr, len, class) in &rules {
            let first = ((addr >> 8) & 0xff) as usize;
            if len <= 24 {
                let count = 1usize << (24 - len);
                let first = first & !(count - 1);
                block.cell[first..first + count].fill(cell(Some(class)) as u8);
            } else {
                // Sorted by length: once a /24 holds a longer rule, only the trie knows.
                block.cell[first] = CLASS_CELL_TRIE as u8;
            }
        }
        l1[slash16 as usize] = CLASS_L1_BLOCK | (base + blocks.len() as u32);
        blocks.push(block);
    }
    DirectTable { l1, blocks }
}

impl DirectTable {
    /// What the packet path reads for `addr`: `Some(class or None)`, or `None` for "ask the
    /// trie". (The same decoding as the eBPF program, for tests.)
    pub fn cell(&self, addr: Ipv4Addr, base: u32) -> u32 {
        let a = u32::from(addr);
        let l1 = self.l1[(a >> 16) as usize];
        if l1 & CLASS_L1_BLOCK == 0 {
            return l1;
        }
        let block = &self.blocks[((l1 & 0xffff) - base) as usize];
        block.cell[((a >> 8) & 0xff) as usize] as u32
    }
}

#[cfg(test)]
mod tests {
    use shedder_common::classmap::decode;

    use super::*;

    /// Reference longest-prefix match.
    fn lpm(rules: &[(Ipv4Addr, u32, u32)], addr: Ipv4Addr) -> Option<u32> {
        let a = u32::from(addr);
        rules
            .iter()
            .filter(|&&(p, len, _)| {
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                a & mask == u32::from(p) & mask
            })
            .max_by_key(|r| r.1)
            .map(|r| r.2)
    }

    fn classify(t: &DirectTable, rules: &[(Ipv4Addr, u32, u32)], addr: Ipv4Addr) -> Option<u32> {
        match decode(t.cell(addr, 7)) {
            Some(class) => class,
            None => lpm(rules, addr), // the trie
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn masked(a: u32, len: u32) -> Ipv4Addr {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Ipv4Addr::from(a & mask)
    }

    #[test]
    fn nested_prefixes() {
        let rules = [
            (Ipv4Addr::new(10, 0, 0, 0), 8, 3),
            (Ipv4Addr::new(198, 18, 10, 0), 24, 0),
            (Ipv4Addr::new(198, 18, 10, 128), 25, 3),
            (Ipv4Addr::new(198, 18, 20, 0), 24, 1),
        ];
        let t = build(&rules, 7, 16);
        assert_eq!(t.blocks.len(), 1, "one /16 has rules longer than /16");
        for (addr, want) in [
            ("10.200.1.1", Some(3)),
            ("198.18.10.1", Some(0)),
            ("198.18.10.200", Some(3)),
            ("198.18.20.9", Some(1)),
            ("198.18.0.1", None),
            ("198.19.0.1", None),
        ] {
            let addr: Ipv4Addr = addr.parse().unwrap();
            assert_eq!(classify(&t, &rules, addr), want, "{addr}");
        }
        // The /24 holding the /25 defers to the trie; its neighbours do not.
        assert_eq!(decode(t.cell("198.18.10.1".parse().unwrap(), 7)), None);
        assert_eq!(
            decode(t.cell("198.18.20.1".parse().unwrap(), 7)),
            Some(Some(1))
        );
    }

    #[test]
    fn agrees_with_longest_prefix_match_on_random_rules() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let n = 1 + (rng.next() % 40) as usize;
            let mut rules: Vec<(Ipv4Addr, u32, u32)> = Vec::new();
            // Concentrate addresses in a few /8s so rules nest and overlap.
            for _ in 0..n {
                let a = ((10 + rng.next() % 3) << 24) as u32 | (rng.next() as u32 & 0x00ff_ffff);
                let len = (rng.next() % 33) as u32;
                let p = masked(a, len);
                if rules.iter().any(|r| r.0 == p && r.1 == len) {
                    continue;
                }
                rules.push((p, len, (rng.next() % 4) as u32));
            }
            // Few blocks in some rounds, so the trie fallback of whole /16s is exercised.
            let max_blocks = if round % 3 == 0 { 2 } else { 64 };
            let t = build(&rules, 7, max_blocks);
            for _ in 0..500 {
                let a = ((10 + rng.next() % 3) << 24) as u32 | (rng.next() as u32 & 0x00ff_ffff);
                let addr = Ipv4Addr::from(a);
                assert_eq!(
                    classify(&t, &rules, addr),
                    lpm(&rules, addr),
                    "round {round}: {addr} with {rules:?}"
                );
            }
            // And exactly at every rule's edges.
            for &(p, len, _) in &rules {
                let lo = u32::from(p);
                let hi = lo | if len == 32 { 0 } else { u32::MAX >> len };
                for a in [lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1)] {
                    let addr = Ipv4Addr::from(a);
                    assert_eq!(classify(&t, &rules, addr), lpm(&rules, addr), "edge {addr}");
                }
            }
        }
    }

    #[test]
    fn a_default_route_rule_paints_everything() {
        let rules = [(Ipv4Addr::UNSPECIFIED, 0, 2)];
        let t = build(&rules, 0, 8);
        assert!(t.l1.iter().all(|&c| c == 3));
        assert!(t.blocks.is_empty());
    }
}
