//! Writing the maps (the compiled policy, limits, class rules) and reading them back
//! ([`MapReader`], from a loaded [`Shedder`] or from the pins of another process).

use std::{net::IpAddr, path::Path};

use aya::maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key};
use shedder_common::{
    ADDR_KEY_QUIC, ADDR_KEY_TCP, CLASS_L2_BLOCKS, COUNTERS_PER_SERVICE, ClassBlock, ClassRule,
    Globals, HIST_PER_SERVICE, Inflight, NUM_CLASSES, NUM_STATS, NUM_VERDICTS,
    PORT_HAS_ADDR_SERVICES, PORT_SERVICE_MASK, REASON_SLOTS, ServiceAddrKey, ServiceCounters,
    ServiceHist, ServicePolicy, classmap, decision_index, hist, maps,
    tunnel::{DECAP_ENTRIES, TUNNEL_NONE},
};

use super::{Error, Result, Shedder};
use crate::types::{Prefix, Protocol};

/// A random non-zero 64-bit seed from the kernel's generator.
pub(super) fn random_seed() -> Result<u64> {
    use std::io::Read as _;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Io("reading /dev/urandom for the table seed", e))?;
    Ok(u64::from_ne_bytes(b) | 1)
}

pub(super) fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |source| Error::Map { map, source }
}

/// The set and tag of `addr` in the standing table, as the packet path hashes it.
fn standing_slot(seed: u64, addr: IpAddr) -> (u32, u32) {
    use shedder_common::{proof, table};
    let (words, v6) = match addr {
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], 0),
        IpAddr::V6(a) => {
            let o = a.octets();
            (
                std::array::from_fn(|i| {
                    u32::from_ne_bytes(o[4 * i..4 * i + 4].try_into().expect("4 bytes"))
                }),
                1,
            )
        }
    };
    let h = table::hash(seed, &proof::key_words(words, v6));
    (table::set_index(h, proof::STANDING_SETS), proof::tag(h))
}

impl Shedder {
    /// Give `addr` standing now with `tokens`, as a completed handshake would (for tests
    /// and drills: the packet path's tracking earns standing by itself).
    pub fn set_standing(&mut self, addr: IpAddr, tokens: u8) -> Result<()> {
        use shedder_common::proof;
        let g = self.globals()?;
        let (set_index, tag) = standing_slot(g.table_seed, addr);
        let mut set = {
            let m: Array<&MapData, proof::StandingSet> =
                Array::try_from(self.map_named(maps::STANDING)?)
                    .map_err(map_err(maps::STANDING))?;
            m.get(&set_index, 0).map_err(map_err(maps::STANDING))?
        };
        let now = proof::seen_now(self.clock(false)?);
        let found = proof::find(&set, tag);
        let way = if found < proof::STANDING_WAYS {
            found
        } else {
            proof::victim(&set, now)
        };
        set.slot[way] = proof::Standing {
            tag,
            tokens,
            disowned: 0,
            seen: now,
        };
        let mut m: Array<&mut MapData, proof::StandingSet> =
            Array::try_from(self.map_mut(maps::STANDING)?).map_err(map_err(maps::STANDING))?;
        m.set(set_index, set, 0).map_err(map_err(maps::STANDING))
    }

    pub fn set_globals(&mut self, globals: &Globals) -> Result<()> {
        let mut m: Array<&mut MapData, Globals> =
            Array::try_from(self.map_mut(maps::GLOBALS)?).map_err(map_err(maps::GLOBALS))?;
        m.set(0, globals, 0).map_err(map_err(maps::GLOBALS))
    }

    /// Protect TCP `port` with service `service` (any destination address); `None`
    /// unprotects it.
    pub fn set_port(&mut self, port: u16, service: Option<u32>) -> Result<()> {
        self.set_port_in(maps::PORTS, port, service)
    }

    /// Protect UDP `port` as QUIC service `service` (any destination address); `None`
    /// unprotects it.
    pub fn set_quic_port(&mut self, port: u16, service: Option<u32>) -> Result<()> {
        self.set_port_in(maps::QUIC_PORTS, port, service)
    }

    fn set_port_in(&mut self, map: &'static str, port: u16, service: Option<u32>) -> Result<()> {
        let value = match service {
            Some(id) => {
                check_service(id)?;
                id + 1
            }
            None => 0,
        };
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(map)?).map_err(map_err(map))?;
        let old = m.get(&(port as u32), 0).map_err(map_err(map))?;
        m.set(port as u32, (old & PORT_HAS_ADDR_SERVICES) | value, 0)
            .map_err(map_err(map))
    }

    /// Protect `addr:port` of `protocol` with service `service`, taking precedence over
    /// the port's any-address service.
    pub fn set_addr_service(
        &mut self,
        addr: IpAddr,
        port: u16,
        protocol: Protocol,
        service: u32,
    ) -> Result<()> {
        check_service(service)?;
        let key = addr_key(addr, port, protocol);
        let ports = match protocol {
            Protocol::Tcp => maps::PORTS,
            Protocol::Quic => maps::QUIC_PORTS,
        };
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            m.insert(key, service + 1, 0)
                .map_err(map_err(maps::ADDR_SERVICES))?;
        }
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(ports)?).map_err(map_err(ports))?;
        let old = m.get(&(port as u32), 0).map_err(map_err(ports))?;
        m.set(port as u32, old | PORT_HAS_ADDR_SERVICES, 0)
            .map_err(map_err(ports))
    }

    pub fn set_policy(&mut self, service: u32, policy: &ServicePolicy) -> Result<()> {
        check_service(service)?;
        let mut m: Array<&mut MapData, ServicePolicy> =
            Array::try_from(self.map_mut(maps::POLICIES)?).map_err(map_err(maps::POLICIES))?;
        m.set(service, policy, 0).map_err(map_err(maps::POLICIES))
    }

    pub fn set_inflight(&mut self, service: u32, inflight: &Inflight) -> Result<()> {
        check_service(service)?;
        let mut m: Array<&mut MapData, Inflight> =
            Array::try_from(self.map_mut(maps::INFLIGHT)?).map_err(map_err(maps::INFLIGHT))?;
        m.set(service, inflight, 0).map_err(map_err(maps::INFLIGHT))
    }

    /// Insert one rule into the trie of its family (the direct table is rebuilt by
    /// [`Shedder::replace_class_rules`]).
    pub(super) fn insert_class_rule(
        &mut self,
        addr: IpAddr,
        prefix_len: u32,
        class: u32,
    ) -> Result<()> {
        if class as usize >= NUM_CLASSES {
            return Err(Error::Range("class", class.to_string()));
        }
        let rule = ClassRule { class };
        match addr {
            IpAddr::V4(a) => {
                if prefix_len > 32 {
                    return Err(Error::Range("IPv4 prefix length", prefix_len.to_string()));
                }
                let mut m: LpmTrie<&mut MapData, [u8; 4], ClassRule> =
                    LpmTrie::try_from(self.map_mut(maps::CLASS_V4)?)
                        .map_err(map_err(maps::CLASS_V4))?;
                m.insert(&Key::new(prefix_len, a.octets()), rule, 0)
                    .map_err(map_err(maps::CLASS_V4))
            }
            IpAddr::V6(a) => {
                if prefix_len > 128 {
                    return Err(Error::Range("IPv6 prefix length", prefix_len.to_string()));
                }
                let mut m: LpmTrie<&mut MapData, [u8; 16], ClassRule> =
                    LpmTrie::try_from(self.map_mut(maps::CLASS_V6)?)
                        .map_err(map_err(maps::CLASS_V6))?;
                m.insert(&Key::new(prefix_len, a.octets()), rule, 0)
                    .map_err(map_err(maps::CLASS_V6))
            }
        }
    }
}

/// Writing what the daemon decides: the seam between its pure per-service core and the
/// kernel ([`Shedder`]; a recording fake in the core's tests), as [`MapReader`] is for
/// reading.
pub trait MapWriter {
    /// Write service `service`'s policy (its limits), read by the packet path at once.
    fn write_policy(&mut self, service: u32, policy: &ServicePolicy) -> Result<()>;
    /// Write a whole compiled configuration (see [`Shedder::apply`]).
    fn write_compiled(&mut self, compiled: &crate::kernel::policy::Compiled) -> Result<()>;
}

impl MapWriter for Shedder {
    fn write_policy(&mut self, service: u32, policy: &ServicePolicy) -> Result<()> {
        self.set_policy(service, policy)
    }

    fn write_compiled(&mut self, compiled: &crate::kernel::policy::Compiled) -> Result<()> {
        self.apply(compiled)
    }
}

/// Reading the maps, from a loaded [`Shedder`] or from the maps pinned by another process
/// ([`PinnedMaps`]).
pub trait MapReader {
    /// The map called `name`.
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map>;

    fn globals(&self) -> Result<Globals> {
        let m: Array<&MapData, Globals> =
            Array::try_from(self.map_named(maps::GLOBALS)?).map_err(map_err(maps::GLOBALS))?;
        m.get(&0, 0).map_err(map_err(maps::GLOBALS))
    }

    /// The policy in the map for a service.
    fn policy(&self, service: u32) -> Result<ServicePolicy> {
        check_service(service)?;
        let m: Array<&MapData, ServicePolicy> =
            Array::try_from(self.map_named(maps::POLICIES)?).map_err(map_err(maps::POLICIES))?;
        m.get(&service, 0).map_err(map_err(maps::POLICIES))
    }

    /// A decision counter summed over CPUs.
    fn counter(&self, service: u32, class: u32, verdict: u32, reason: u32) -> Result<u64> {
        check_service(service)?;
        if class as usize >= NUM_CLASSES || verdict >= NUM_VERDICTS || reason >= REASON_SLOTS {
            return Err(Error::Range(
                "counter",
                format!("class {class} verdict {verdict} reason {reason}"),
            ));
        }
        Ok(self.counters(service)?[decision_index(class, verdict, reason) as usize])
    }

    /// Every decision counter of a service summed over CPUs, indexed by `decision_index`
    /// (one map lookup).
    fn counters(&self, service: u32) -> Result<[u64; COUNTERS_PER_SERVICE]> {
        Ok(self.service_counters(service)?.n)
    }

    /// All of a service's counters summed over CPUs, in one map lookup: the decision
    /// counters (`n`, unique attempts), the retransmitted SYNs and the retries per class.
    fn service_counters(&self, service: u32) -> Result<ServiceCounters> {
        check_service(service)?;
        let m: PerCpuArray<&MapData, ServiceCounters> =
            PerCpuArray::try_from(self.map_named(maps::COUNTERS)?)
                .map_err(map_err(maps::COUNTERS))?;
        let per_cpu = m.get(&service, 0).map_err(map_err(maps::COUNTERS))?;
        let mut out = ServiceCounters::default();
        let add = |o: &mut [u64], v: &[u64]| o.iter_mut().zip(v).for_each(|(o, v)| *o += v);
        for cpu in per_cpu.iter() {
            add(&mut out.n, &cpu.n);
            add(&mut out.retransmits, &cpu.retransmits);
            add(&mut out.retries, &cpu.retries);
            add(&mut out.unproven, &cpu.unproven);
            add(&mut out.completed_unproven, &cpu.completed_unproven);
            add(&mut out.disowned, &cpu.disowned);
        }
        Ok(out)
    }

    /// The standing of `addr` in the packet path's table (see [`shedder_common::proof`]):
    /// `None` if the table holds nothing for it.
    fn standing(&self, addr: IpAddr) -> Result<Option<shedder_common::proof::Standing>> {
        use shedder_common::proof;
        let (set, tag) = standing_slot(self.globals()?.table_seed, addr);
        let m: Array<&MapData, proof::StandingSet> =
            Array::try_from(self.map_named(maps::STANDING)?).map_err(map_err(maps::STANDING))?;
        let set = m.get(&set, 0).map_err(map_err(maps::STANDING))?;
        let way = proof::find(&set, tag);
        Ok((way < proof::STANDING_WAYS).then(|| set.slot[way]))
    }

    /// Work in flight and established connections per class of a service, as the kernel
    /// counts them (a count below zero read as 0, as the packet path reads it:
    /// [`Inflight::busy`]).
    fn inflight(&self, service: u32) -> Result<Inflight> {
        self.inflight_stored(service).map(|i| i.clamped())
    }

    /// The same counts as stored, a count below zero as the `u32` it wraps to: what shows
    /// whether they drifted from the tracked connections they count.
    fn inflight_stored(&self, service: u32) -> Result<Inflight> {
        check_service(service)?;
        let m: Array<&MapData, Inflight> =
            Array::try_from(self.map_named(maps::INFLIGHT)?).map_err(map_err(maps::INFLIGHT))?;
        m.get(&service, 0).map_err(map_err(maps::INFLIGHT))
    }

    /// A QUIC service's flows per class in `state` (`flow::WAITING` or `flow::ANSWERED`)
    /// last seen within `window` slots up to slot `now` (see [`shedder_common::flow`]).
    fn alive(
        &self,
        service: u32,
        state: usize,
        now: u32,
        window: u32,
    ) -> Result<[u32; NUM_CLASSES]> {
        check_service(service)?;
        let m: Array<&MapData, shedder_common::flow::AliveRing> =
            Array::try_from(self.map_named(maps::ALIVE)?).map_err(map_err(maps::ALIVE))?;
        let ring = m.get(&service, 0).map_err(map_err(maps::ALIVE))?;
        Ok(shedder_common::flow::alive(&ring, state, now, window))
    }

    /// The requests in service of a service by age, and the clock they were read at (see
    /// [`shedder_common::work`]): each CPU's ring read in one lookup, and CLOCK_MONOTONIC
    /// (the clock of `bpf_ktime_get_ns`) read right after.
    fn work(&self, service: u32) -> Result<shedder_common::work::Tally> {
        check_service(service)?;
        let m: PerCpuArray<&MapData, shedder_common::work::Ring> =
            PerCpuArray::try_from(self.map_named(maps::WORK)?).map_err(map_err(maps::WORK))?;
        let rings = m.get(&service, 0).map_err(map_err(maps::WORK))?;
        Ok(shedder_common::work::Tally::of(
            rings.iter(),
            crate::kernel::clock::monotonic_ns(),
        ))
    }

    /// The service's per-class fair-share and retry-budget counts of its last two epochs.
    fn fairness(&self, service: u32) -> Result<shedder_common::fair::Fairness> {
        check_service(service)?;
        let m: Array<&MapData, shedder_common::fair::Fairness> =
            Array::try_from(self.map_named(maps::FAIR)?).map_err(map_err(maps::FAIR))?;
        m.get(&service, 0).map_err(map_err(maps::FAIR))
    }

    /// Admitted attempts not yet established, per epoch slot.
    fn pending(&self, service: u32) -> Result<shedder_common::Pending> {
        check_service(service)?;
        let m: Array<&MapData, shedder_common::Pending> =
            Array::try_from(self.map_named(maps::PENDING)?).map_err(map_err(maps::PENDING))?;
        m.get(&service, 0).map_err(map_err(maps::PENDING))
    }

    /// A service's cumulative histograms summed over CPUs, indexed by `hist::index`
    /// (one map lookup).
    fn histograms(&self, service: u32) -> Result<Vec<u64>> {
        Ok(self.histograms_with_sums(service)?.0)
    }

    /// The histograms and the sum of the observations per kind (µs).
    fn histograms_with_sums(
        &self,
        service: u32,
    ) -> Result<(Vec<u64>, [u64; hist::KINDS as usize])> {
        check_service(service)?;
        let m: PerCpuArray<&MapData, ServiceHist> =
            PerCpuArray::try_from(self.map_named(maps::HIST)?).map_err(map_err(maps::HIST))?;
        let per_cpu = m.get(&service, 0).map_err(map_err(maps::HIST))?;
        let mut out = vec![0u64; HIST_PER_SERVICE];
        let mut sums = [0u64; hist::KINDS as usize];
        for cpu in per_cpu.iter() {
            for (o, v) in out.iter_mut().zip(cpu.b.iter()) {
                *o += v;
            }
            for (o, v) in sums.iter_mut().zip(cpu.sum_us.iter()) {
                *o += v;
            }
        }
        Ok((out, sums))
    }

    /// One of a service's cumulative histograms (`hist::KIND_*`).
    fn histogram(&self, service: u32, kind: u32) -> Result<Vec<u64>> {
        let all = self.histograms(service)?;
        let start = hist::index(kind, 0) as usize;
        Ok(all[start..start + hist::BUCKETS as usize].to_vec())
    }

    /// Node-wide statistics summed over CPUs, indexed by `STAT_*`.
    fn stats(&self) -> Result<[u64; NUM_STATS as usize]> {
        let m: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.map_named(maps::STATS)?).map_err(map_err(maps::STATS))?;
        let mut out = [0; NUM_STATS as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = m
                .get(&(i as u32), 0)
                .map_err(map_err(maps::STATS))?
                .iter()
                .sum();
        }
        Ok(out)
    }
}

impl MapReader for Shedder {
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.map(name)
    }
}

/// The maps pinned under a pin directory, opened without loading any program: what the
/// CLI and the tests read while a daemon runs (or after it was killed).
pub struct PinnedMaps {
    maps: std::collections::HashMap<&'static str, aya::maps::Map>,
}

impl PinnedMaps {
    /// Open every pinned map under `dir/maps/`.
    /// Refused unless they are this version's ([`crate::kernel::layout::check_readable`]).
    pub fn open(dir: &Path) -> Result<Self> {
        crate::kernel::layout::check_readable(dir)?;
        let mut maps = std::collections::HashMap::new();
        for name in maps::ALL {
            let path = dir.join("maps").join(name);
            let data =
                MapData::from_pin(&path).map_err(|source| Error::Map { map: name, source })?;
            let map = aya::maps::Map::from_map_data(data)
                .map_err(|source| Error::Map { map: name, source })?;
            maps.insert(name, map);
        }
        Ok(Self { maps })
    }
}

impl MapReader for PinnedMaps {
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.maps.get(name).ok_or(Error::MissingMap(name))
    }
}

impl Shedder {
    /// Write a compiled policy: service policies and class rules first, then the port and
    /// address maps that switch protection on; entries of a previous policy that are no
    /// longer wanted are removed last. The heartbeat already in the maps is kept.
    /// A QUIC service on a kernel that refused the QUIC programs is refused before anything
    /// is written: it would be listed as protected and shed nothing.
    pub fn apply(&mut self, compiled: &crate::kernel::policy::Compiled) -> Result<()> {
        if let (Some(why), Some(s)) = (
            self.quic_unavailable(),
            compiled
                .services
                .iter()
                .find(|s| s.protocol == Protocol::Quic),
        ) {
            return Err(Error::QuicUnavailable {
                service: s.name.clone(),
                why: why.to_string(),
            });
        }
        for s in &compiled.services {
            self.set_policy(s.id, &s.policy)?;
        }
        self.replace_class_rules(&compiled.class_rules)?;

        // A port map per protocol (SYNs read the TCP one, Initials the QUIC one); the
        // address map tells them apart by the key's protocol.
        let entries = shedder_common::PORT_MAP_ENTRIES as usize;
        let (mut tcp, mut quic) = (vec![0u32; entries], vec![0u32; entries]);
        let mut addr = std::collections::HashMap::new();
        for s in &compiled.services {
            check_service(s.id)?;
            let ports = match s.protocol {
                Protocol::Tcp => &mut tcp,
                Protocol::Quic => &mut quic,
            };
            for &port in &s.ports {
                if s.addresses.is_empty() {
                    ports[port as usize] =
                        (ports[port as usize] & PORT_HAS_ADDR_SERVICES) | (s.id + 1);
                } else {
                    ports[port as usize] |= PORT_HAS_ADDR_SERVICES;
                    for a in &s.addresses {
                        addr.insert(addr_key(*a, port, s.protocol), s.id + 1);
                    }
                }
            }
        }
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            for (k, v) in &addr {
                m.insert(k, v, 0).map_err(map_err(maps::ADDR_SERVICES))?;
            }
        }
        self.write_array(maps::PORTS, &tcp)?;
        self.write_array(maps::QUIC_PORTS, &quic)?;
        let mut decap = vec![TUNNEL_NONE; DECAP_ENTRIES as usize];
        for &(index, kind) in &compiled.decap {
            if let Some(entry) = decap.get_mut(index as usize) {
                *entry = kind;
            }
        }
        self.write_array(maps::DECAP, &decap)?;
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            let stale: Vec<ServiceAddrKey> = m
                .keys()
                .filter_map(|k| k.ok())
                .filter(|k| !addr.contains_key(k))
                .collect();
            for k in stale {
                m.remove(&k).map_err(map_err(maps::ADDR_SERVICES))?;
            }
        }
        let mut globals = compiled.globals;
        let current = self.globals()?;
        globals.heartbeat_jiffies = current.heartbeat_jiffies;
        globals.generation = current.generation.wrapping_add(1);
        // The attempt tables' hash seed: kept while the maps live (a reload or a restart
        // that adopts pinned maps keeps what the tables remember), drawn at random when
        // the maps are new.
        globals.table_seed = match current.table_seed {
            0 => random_seed()?,
            seed => seed,
        };
        self.set_globals(&globals)
    }

    /// Mark decapsulation map entry `index` (a UDP port, or `DECAP_PROTOCOLS` plus an IP
    /// protocol: see `shedder_common::tunnel`) as a tunnel of `kind` the node terminates
    /// (`TUNNEL_NONE`: none).
    pub fn set_decap(&mut self, index: u32, kind: u32) -> Result<()> {
        if index >= DECAP_ENTRIES {
            return Err(Error::Range("decapsulation entry", index.to_string()));
        }
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::DECAP)?).map_err(map_err(maps::DECAP))?;
        m.set(index, kind, 0).map_err(map_err(maps::DECAP))
    }

    /// Make array map `name` of `u32` (a port map, the decapsulation map) hold `want`,
    /// writing only what differs.
    fn write_array(&mut self, name: &'static str, want: &[u32]) -> Result<()> {
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        for (port, want) in want.iter().enumerate() {
            let port = port as u32;
            if m.get(&port, 0).map_err(map_err(name))? != *want {
                m.set(port, want, 0).map_err(map_err(name))?;
            }
        }
        Ok(())
    }

    /// Make the class tries and the IPv4 direct table hold exactly `rules` (prefixes with
    /// host bits clear). New rules go into the tries first, then the direct table is
    /// rewritten (blocks into the half not in use, then the first level), and only then
    /// are stale trie entries removed, so a concurrent lookup never sees a hole.
    pub fn replace_class_rules(&mut self, rules: &[(Prefix, u32)]) -> Result<()> {
        for (p, class) in rules {
            self.insert_class_rule(p.addr, p.len, *class)?;
        }
        self.write_direct_table(rules)?;
        let want: std::collections::HashSet<(IpAddr, u32)> =
            rules.iter().map(|(p, _)| (p.addr, p.len)).collect();
        self.remove_stale_rules::<4>(maps::CLASS_V4, &want, IpAddr::from)?;
        self.remove_stale_rules::<16>(maps::CLASS_V6, &want, IpAddr::from)
    }

    /// Remove the entries of a class trie that `want` does not hold.
    pub(super) fn remove_stale_rules<const N: usize>(
        &mut self,
        name: &'static str,
        want: &std::collections::HashSet<(IpAddr, u32)>,
        to_ip: fn([u8; N]) -> IpAddr,
    ) -> Result<()>
    where
        [u8; N]: aya::Pod,
    {
        let mut m: LpmTrie<&mut MapData, [u8; N], ClassRule> =
            LpmTrie::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        let stale: Vec<Key<[u8; N]>> = m
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !want.contains(&(to_ip(k.data()), k.prefix_len())))
            .collect();
        for k in stale {
            m.remove(&k).map_err(map_err(name))?;
        }
        Ok(())
    }

    pub(super) fn write_direct_table(&mut self, rules: &[(Prefix, u32)]) -> Result<()> {
        let v4: Vec<(std::net::Ipv4Addr, u32, u32)> = rules
            .iter()
            .filter_map(|(p, class)| match p.addr {
                IpAddr::V4(a) => Some((a, p.len, *class)),
                IpAddr::V6(_) => None,
            })
            .collect();
        let current: Vec<u32> = match self.class_l1.take() {
            Some(l1) => l1,
            None => {
                let m: Array<&MapData, u32> =
                    Array::try_from(self.map(maps::CLASS_L1)?).map_err(map_err(maps::CLASS_L1))?;
                m.iter()
                    .collect::<Result<_, _>>()
                    .map_err(map_err(maps::CLASS_L1))?
            }
        };
        let half = CLASS_L2_BLOCKS / 2;
        let upper_in_use = current
            .iter()
            .any(|&e| e & classmap::CLASS_L1_BLOCK != 0 && (e & 0xffff) >= half);
        let base = if upper_in_use { 0 } else { half };
        let table = crate::kernel::classmap::build(&v4, base, half as usize);
        {
            let mut m: Array<&mut MapData, ClassBlock> =
                Array::try_from(self.map_mut(maps::CLASS_L2)?).map_err(map_err(maps::CLASS_L2))?;
            for (i, block) in table.blocks.iter().enumerate() {
                m.set(base + i as u32, block, 0)
                    .map_err(map_err(maps::CLASS_L2))?;
            }
        }
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::CLASS_L1)?).map_err(map_err(maps::CLASS_L1))?;
        for (i, (&want, &have)) in table.l1.iter().zip(&current).enumerate() {
            if want != have {
                // On failure the cache is dropped, so the next write reads the map again.
                m.set(i as u32, want, 0).map_err(map_err(maps::CLASS_L1))?;
            }
        }
        self.class_l1 = Some(table.l1);
        Ok(())
    }
}

pub(super) fn check_service(id: u32) -> Result<()> {
    if id >= shedder_common::MAX_SERVICES || id + 1 > PORT_SERVICE_MASK {
        return Err(Error::Range(
            "service id",
            format!("{id} (at most {})", shedder_common::MAX_SERVICES - 1),
        ));
    }
    Ok(())
}

/// Key of the address-specific service map for `addr:port`.
pub fn addr_key(addr: IpAddr, port: u16, protocol: Protocol) -> ServiceAddrKey {
    let mut key = ServiceAddrKey {
        port,
        proto: match protocol {
            Protocol::Tcp => ADDR_KEY_TCP,
            Protocol::Quic => ADDR_KEY_QUIC,
        },
        ..Default::default()
    };
    match addr {
        IpAddr::V4(a) => {
            key.addr[..4].copy_from_slice(&a.octets());
            key.family = 4;
        }
        IpAddr::V6(a) => {
            key.addr = a.octets();
            key.family = 6;
        }
    }
    key
}
