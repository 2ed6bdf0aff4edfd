//! Who is refused: the heaviest sources and prefixes among a service's sampled refusals
//! (`shedder_common::refusal`), in a summary of fixed size.
//!
//! Each service keeps [`ENTRIES`] counters for single sources and as many for prefixes (a
//! /24 for IPv4, a /48 for IPv6), each keyed with the class and whether the source had
//! proven its address. They follow the Space-Saving algorithm (Metwally, Agrawal and El
//! Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data Streams", 2005): a
//! key not in the table replaces the smallest counter and inherits its count, so any key
//! with more than 1/[`ENTRIES`] of the samples is in the table, and a count overstates a
//! key by at most the count it inherited ([`Heavy::error`]). Counts decay with a half-life
//! of [`HALF_LIFE_S`] seconds, so the view follows an incident as it changes.
//!
//! Pure: the samples and the clock come in from the daemon.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use shedder_common::refusal::Sample;

/// Counters per table (sources, prefixes) per service.
pub const ENTRIES: usize = 32;
/// Counts halve over this many seconds.
pub const HALF_LIFE_S: f64 = 30.0;

/// What one counter counts: a source or a prefix, in a class, proven or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub addr: IpAddr,
    /// The prefix length (32 or 128 for a single source).
    pub len: u8,
    pub class: u8,
    pub proven: bool,
}

/// A heavy hitter: its estimated count of samples and the most that is overstated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Heavy {
    pub key: Key,
    pub count: f64,
    pub error: f64,
}

/// One Space-Saving table.
#[derive(Clone, Debug, Default)]
struct Table {
    entries: Vec<Heavy>,
}

impl Table {
    fn add(&mut self, key: Key) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            e.count += 1.0;
            return;
        }
        if self.entries.len() < ENTRIES {
            self.entries.push(Heavy {
                key,
                count: 1.0,
                error: 0.0,
            });
            return;
        }
        let min = self
            .entries
            .iter_mut()
            .min_by(|a, b| a.count.total_cmp(&b.count))
            .expect("a full table has entries");
        *min = Heavy {
            key,
            count: min.count + 1.0,
            error: min.count,
        };
    }

    fn decay(&mut self, factor: f64) {
        for e in &mut self.entries {
            e.count *= factor;
            e.error *= factor;
        }
        // What decayed below half a sample is forgotten, so a quiet service's table empties.
        self.entries.retain(|e| e.count >= 0.5);
    }

    fn top(&self, n: usize) -> Vec<Heavy> {
        let mut v = self.entries.clone();
        v.sort_by(|a, b| b.count.total_cmp(&a.count).then(a.key.cmp(&b.key)));
        v.truncate(n);
        v
    }
}

/// The prefix `addr` falls in: a /24 of IPv4, a /48 of IPv6.
pub fn prefix_of(addr: IpAddr) -> (IpAddr, u8) {
    match addr {
        IpAddr::V4(a) => (IpAddr::V4(Ipv4Addr::from(u32::from(a) & 0xffff_ff00)), 24),
        IpAddr::V6(a) => {
            let mut s = a.segments();
            s[3..].fill(0);
            (IpAddr::V6(Ipv6Addr::from(s)), 48)
        }
    }
}

/// A sample's source address.
pub fn source(s: &Sample) -> IpAddr {
    if s.v6 == 1 {
        let mut b = [0u8; 16];
        for (i, w) in s.addr.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        IpAddr::V4(Ipv4Addr::from(s.addr[0].to_ne_bytes()))
    }
}

/// One service's heavy hitters.
#[derive(Clone, Debug, Default)]
pub struct Refused {
    sources: Table,
    prefixes: Table,
    /// Samples seen (decayed as the counts are).
    samples: f64,
}

impl Refused {
    pub fn add(&mut self, s: &Sample) {
        let addr = source(s);
        let (class, proven) = (s.class, s.proven == 1);
        let len = if addr.is_ipv4() { 32 } else { 128 };
        self.sources.add(Key {
            addr,
            len,
            class,
            proven,
        });
        let (prefix, len) = prefix_of(addr);
        self.prefixes.add(Key {
            addr: prefix,
            len,
            class,
            proven,
        });
        self.samples += 1.0;
    }

    /// Let `seconds` pass.
    pub fn decay(&mut self, seconds: f64) {
        let f = 0.5f64.powf(seconds / HALF_LIFE_S);
        self.sources.decay(f);
        self.prefixes.decay(f);
        self.samples *= f;
        if self.samples < 0.5 {
            self.samples = 0.0;
        }
    }

    /// The `n` heaviest sources and prefixes, heaviest first.
    pub fn top(&self, n: usize) -> (Vec<Heavy>, Vec<Heavy>) {
        (self.sources.top(n), self.prefixes.top(n))
    }

    /// Samples seen, decayed: what a count's share is of.
    pub fn samples(&self) -> f64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(a: [u8; 4], class: u8, proven: u8) -> Sample {
        Sample {
            addr: [u32::from_ne_bytes(a), 0, 0, 0],
            class,
            proven,
            ..Sample::default()
        }
    }

    #[test]
    fn the_heaviest_sources_and_their_prefix_come_first() {
        let mut r = Refused::default();
        for _ in 0..50 {
            r.add(&sample([198, 18, 0, 7], 3, 1));
        }
        for i in 0..20 {
            r.add(&sample([198, 18, 0, 100 + i], 3, 1));
        }
        r.add(&sample([198, 19, 5, 5], 2, 0));
        let (sources, prefixes) = r.top(3);
        assert_eq!(sources[0].key.addr, "198.18.0.7".parse::<IpAddr>().unwrap());
        assert_eq!(sources[0].count, 50.0);
        assert_eq!(
            prefixes[0].key.addr,
            "198.18.0.0".parse::<IpAddr>().unwrap()
        );
        assert_eq!((prefixes[0].key.len, prefixes[0].count), (24, 70.0));
        assert_eq!(
            prefixes[1].key.addr,
            "198.19.5.0".parse::<IpAddr>().unwrap()
        );
        assert!(!prefixes[1].key.proven);
        assert_eq!(r.samples(), 71.0);
    }

    #[test]
    fn a_spread_of_forged_sources_never_evicts_a_heavy_one_and_the_table_stays_bounded() {
        let mut r = Refused::default();
        let mut n = 0u32;
        for round in 0..200 {
            // A heavy proven source sends a tenth of the refusals ...
            r.add(&sample([198, 18, 1, 1], 1, 1));
            // ... among nine forged ones, each new.
            for _ in 0..9 {
                n += 1;
                let b = n.to_be_bytes();
                r.add(&sample([198, 19, b[2], b[3]], 1, 0));
            }
            assert!(r.sources.entries.len() <= ENTRIES, "round {round}");
        }
        let (sources, _) = r.top(1);
        assert_eq!(sources[0].key.addr, "198.18.1.1".parse::<IpAddr>().unwrap());
        assert!(sources[0].key.proven);
        // Its count is exact to within what it inherited.
        assert!(sources[0].count - sources[0].error <= 200.0 && sources[0].count >= 200.0);
    }

    #[test]
    fn counts_halve_over_the_half_life_and_quiet_entries_are_forgotten() {
        let mut r = Refused::default();
        for _ in 0..8 {
            r.add(&sample([198, 18, 0, 1], 0, 1));
        }
        r.add(&sample([198, 18, 9, 9], 0, 1));
        r.decay(HALF_LIFE_S);
        let (sources, _) = r.top(5);
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].count, 4.0);
        r.decay(HALF_LIFE_S);
        // 0.25 of a sample: forgotten.
        assert_eq!(r.top(5).0.len(), 1);
        r.decay(10.0 * HALF_LIFE_S);
        assert!(r.top(5).0.is_empty());
        assert_eq!(r.samples(), 0.0);
    }

    #[test]
    fn ipv6_sources_group_by_their_48() {
        let a: Ipv6Addr = "2001:db8:1:2::5".parse().unwrap();
        let b = a.octets();
        let words = [0, 1, 2, 3]
            .map(|i| u32::from_ne_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]));
        let s = Sample {
            addr: words,
            v6: 1,
            ..Sample::default()
        };
        assert_eq!(source(&s), IpAddr::V6(a));
        assert_eq!(
            prefix_of(IpAddr::V6(a)),
            ("2001:db8:1::".parse().unwrap(), 48)
        );
    }
}
