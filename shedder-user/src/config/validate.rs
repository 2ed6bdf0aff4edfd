//! The rules a value that parsed may still break: ranges, the relations between keys, and
//! the capacities of the kernel's maps. Every problem found is reported, in the order of
//! the file's sections, so that an operator fixes a file in one pass.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use shedder_common::{CLASS_NAMES, MAX_ADDR_SERVICES, MAX_CLASS_RULES, MAX_SERVICES};

use super::{
    Prefix, Protocol,
    decapsulate::MAX_TUNNEL_PORTS,
    document::Config,
    error::{ConfigError, err},
    service::MAX_ACTIVE_WINDOW_MS,
};

/// Largest concurrency limit accepted: far above any real service, far below overflow.
pub const LIMIT_CEILING: u32 = 1 << 24;
/// Most recalls a second a service may ask for: each is a reset a client must recover
/// from, and each costs the daemon a netlink round trip.
pub const MAX_RECALL_PER_SECOND: u32 = 10_000;

/// Longest `daemon.standing_window_s`: a day. Standing is the proof that an address
/// receives what is sent to it; a day-old proof says little about who holds it now.
pub const MAX_STANDING_WINDOW_S: u64 = 86_400;
/// Longest `daemon.handshake_hold_ms`: about what the packet path can hold (two hold slots
/// of 2^8 jiffies at HZ 250).
pub const MAX_HANDSHAKE_HOLD_MS: u64 = 1_000;
/// Longest `daemon.syn_retransmit_window_ms`: ten minutes, well past the last SYN a Linux
/// client retransmits (63 s after the first with the default `tcp_syn_retries` of 6).
pub const MAX_SYN_RETRANSMIT_WINDOW_MS: u64 = 600_000;

/// Longest `retry_window_ms` of a service: an hour. The kernel holds the window in 32-bit
/// jiffies: an hour is 3.6 million at HZ 1000, far below `u32::MAX`.
pub const MAX_RETRY_WINDOW_MS: u64 = 3_600_000;

/// A name that can be a metric label or an etcd key component: 1 to 64 characters from
/// `[A-Za-z0-9._-]`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

impl Config {
    /// Check every value; every problem is returned, the first with the others in
    /// [`ConfigError::also`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = self.problems();
        if errs.is_empty() {
            return Ok(());
        }
        let mut first = errs.remove(0);
        first.also = errs.into();
        Err(first)
    }

    /// Every problem, in the order of the file's sections.
    pub(super) fn problems(&self) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        self.validate_daemon(&mut errs);
        self.validate_classes(&mut errs);
        self.validate_services(&mut errs);
        self.validate_decapsulate(&mut errs);
        self.validate_fleet(&mut errs);
        // Last: the other mistakes of a file come first.
        self.validate_measure_only(&mut errs);
        errs
    }

    fn validate_daemon(&self, errs: &mut Vec<ConfigError>) {
        let d = &self.daemon;
        if d.tick_ms < 10 || d.tick_ms > 60_000 {
            errs.push(err(
                "daemon.tick_ms",
                format!("{} is outside 10..=60000", d.tick_ms),
            ));
        }
        if d.heartbeat_timeout_ms < 2 * d.tick_ms {
            errs.push(err(
                "daemon.heartbeat_timeout_ms",
                format!(
                    "{} must be at least twice tick_ms ({}), or every late tick drops to the fallback limits",
                    d.heartbeat_timeout_ms, d.tick_ms
                ),
            ));
        }
        if d.signal_window_ms < d.tick_ms || d.signal_window_ms > 60_000 {
            errs.push(err(
                "daemon.signal_window_ms",
                format!(
                    "{} must be between tick_ms ({}) and 60000",
                    d.signal_window_ms, d.tick_ms
                ),
            ));
        }
        if d.heartbeat_timeout_ms > 3_600_000 {
            errs.push(err(
                "daemon.heartbeat_timeout_ms",
                format!("{} is longer than an hour", d.heartbeat_timeout_ms),
            ));
        }
        if d.metrics_listen.parse::<std::net::SocketAddr>().is_err() {
            errs.push(err(
                "daemon.metrics_listen",
                format!(
                    "`{}` is not an address:port (e.g. 127.0.0.1:9464)",
                    d.metrics_listen
                ),
            ));
        }
        if let Some(g) = &d.control_group
            && (g.is_empty() || g.contains(['/', ':', ' ']))
        {
            errs.push(err(
                "daemon.control_group",
                format!("`{g}` is not a group name"),
            ));
        }
        if d.syn_retransmit_window_ms > MAX_SYN_RETRANSMIT_WINDOW_MS {
            errs.push(err(
                "daemon.syn_retransmit_window_ms",
                format!(
                    "{} is outside 0..={MAX_SYN_RETRANSMIT_WINDOW_MS} (0 disables retransmit recognition)",
                    d.syn_retransmit_window_ms
                ),
            ));
        }
        if !(1..=MAX_STANDING_WINDOW_S).contains(&d.standing_window_s) {
            errs.push(err(
                "daemon.standing_window_s",
                format!(
                    "{} is outside 1..={MAX_STANDING_WINDOW_S}",
                    d.standing_window_s
                ),
            ));
        }
        if d.handshake_hold_ms > MAX_HANDSHAKE_HOLD_MS {
            errs.push(err(
                "daemon.handshake_hold_ms",
                format!(
                    "{} is outside 0..={MAX_HANDSHAKE_HOLD_MS} (0 measures it)",
                    d.handshake_hold_ms
                ),
            ));
        }
        for (key, v) in [
            (
                "daemon.max_replies_proven_per_s",
                d.max_replies_proven_per_s,
            ),
            (
                "daemon.max_replies_unproven_per_s",
                d.max_replies_unproven_per_s,
            ),
        ] {
            if v > 1_000_000_000 {
                errs.push(err(
                    key,
                    format!("{v} is outside 0..=1000000000 (0: no bound)"),
                ));
            }
        }
        for (i, iface) in d.interfaces.iter().enumerate() {
            if iface.is_empty() || iface.len() > 15 || iface.contains('/') {
                errs.push(err(
                    format!("daemon.interfaces[{i}]"),
                    format!("`{iface}` is not a valid interface name"),
                ));
            }
        }
    }

    /// Tunnel ports: each a port, at most [`MAX_TUNNEL_PORTS`] a kind, one kind a port, and
    /// none a QUIC service's (a datagram to it is either a tunnel's or an attempt).
    fn validate_decapsulate(&self, errs: &mut Vec<ConfigError>) {
        let mut seen: HashMap<u16, &str> = HashMap::new();
        for (key, ports, _) in self.daemon.decapsulate.port_lists() {
            let field = format!("daemon.decapsulate.{key}");
            if ports.len() > MAX_TUNNEL_PORTS {
                errs.push(err(
                    &field,
                    format!("{} ports; at most {MAX_TUNNEL_PORTS}", ports.len()),
                ));
            }
            for (j, &port) in ports.iter().enumerate() {
                let field = format!("{field}[{j}]");
                if port == 0 {
                    errs.push(err(field, "port 0 is not a port"));
                    continue;
                }
                if let Some(other) = seen.insert(port, key) {
                    errs.push(err(
                        &field,
                        format!(
                            "{port} is listed twice (also in {other}): a UDP port carries one kind of tunnel"
                        ),
                    ));
                }
                if let Some(s) = self
                    .services
                    .iter()
                    .find(|s| s.protocol == Protocol::Quic && s.ports.contains(&port))
                {
                    errs.push(err(
                        field,
                        format!(
                            "UDP port {port} is a port of QUIC service `{}`: a datagram to it \
                             would be both a tunnel's and a connection attempt",
                            s.name
                        ),
                    ));
                }
            }
        }
    }

    /// A file without interfaces would shed nothing: refused unless it says so.
    fn validate_measure_only(&self, errs: &mut Vec<ConfigError>) {
        let d = &self.daemon;
        match (d.measure_only, d.interfaces.is_empty()) {
            (false, true) => errs.push(err(
                "daemon.interfaces",
                "no interface is listed, so nothing would be shed; list the interfaces that \
                 receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set \
                 daemon.measure_only = true to measure, run the controllers and serve status \
                 and metrics without shedding",
            )),
            (true, false) => errs.push(err(
                "daemon.measure_only",
                format!(
                    "true attaches to no interface, but daemon.interfaces lists {:?}; remove \
                     measure_only to shed on them, or the interfaces to measure only",
                    d.interfaces
                ),
            )),
            _ => {}
        }
    }

    fn validate_fleet(&self, errs: &mut Vec<ConfigError>) {
        // A build without the etcd client refuses fleet settings rather than run without
        // the global bound they ask for.
        if !super::FLEET_AVAILABLE {
            if self.fleet.is_some() {
                errs.push(err("fleet", super::FLEET_UNAVAILABLE));
            }
            if let Some((i, s)) = self
                .services
                .iter()
                .enumerate()
                .find(|(_, s)| s.global_limit.is_some())
            {
                errs.push(err(
                    format!("service[{i}] ({}).global_limit", s.name),
                    super::FLEET_UNAVAILABLE,
                ));
            }
            return;
        }
        let Some(f) = &self.fleet else {
            if let Some((i, s)) = self
                .services
                .iter()
                .enumerate()
                .find(|(_, s)| s.global_limit.is_some())
            {
                errs.push(err(
                    format!("service[{i}] ({}).global_limit", s.name),
                    "needs a [fleet] section (the etcd cluster the fleet shares it through)",
                ));
            }
            return;
        };
        if f.endpoints.is_empty() {
            errs.push(err(
                "fleet.endpoints",
                "at least one etcd endpoint is needed",
            ));
        }
        for (i, e) in f.endpoints.iter().enumerate() {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains('/')) {
                errs.push(err(
                    format!("fleet.endpoints[{i}]"),
                    format!(
                        "`{e}` is not an etcd client URL (http://host:port or https://host:port)"
                    ),
                ));
            }
        }
        if let Some(n) = &f.node
            && !valid_name(n)
        {
            errs.push(err(
                "fleet.node",
                format!("`{n}`: use 1 to 64 characters from [A-Za-z0-9._-]"),
            ));
        }
        if !f.prefix.starts_with('/')
            || f.prefix.len() < 2
            || f.prefix.ends_with('/')
            || f.prefix.contains(char::is_whitespace)
        {
            errs.push(err(
                "fleet.prefix",
                format!(
                    "`{}` must start with `/`, not end with one, and hold no spaces",
                    f.prefix
                ),
            ));
        }
        if !(3..=300).contains(&f.lease_ttl_s) {
            errs.push(err(
                "fleet.lease_ttl_s",
                format!("{} is outside 3..=300", f.lease_ttl_s),
            ));
        }
        if !(f.safety > 0.0 && f.safety <= 1.0) {
            errs.push(err(
                "fleet.safety",
                format!("{} is outside (0, 1]", f.safety),
            ));
        }
        if !(1..=100_000).contains(&f.max_nodes) {
            errs.push(err(
                "fleet.max_nodes",
                format!("{} is outside 1..=100000", f.max_nodes),
            ));
        }
        let fail_static = f.fail_static().as_millis() as u64;
        let lease_ms = f.etcd_lease_ttl().as_millis() as u64;
        if fail_static < self.daemon.tick_ms || fail_static >= lease_ms {
            errs.push(err(
                "fleet.fail_static_ms",
                format!(
                    "{fail_static} must be at least tick_ms ({}) and below the etcd lease \
                     (lease_ttl_s less 1 s: {lease_ms} ms): a partitioned node must let go of \
                     its share before its lease expires",
                    self.daemon.tick_ms,
                ),
            ));
        }
        if f.reserve_departed_s < f.lease_ttl_s || f.reserve_departed_s > 30 * 86_400 {
            errs.push(err(
                "fleet.reserve_departed_s",
                format!(
                    "{} is outside lease_ttl_s ({})..=2592000 (30 days)",
                    f.reserve_departed_s, f.lease_ttl_s
                ),
            ));
        }
        if self.daemon.heartbeat_timeout_ms >= lease_ms {
            errs.push(err(
                "daemon.heartbeat_timeout_ms",
                format!(
                    "{} must be below the etcd lease (fleet.lease_ttl_s less 1 s: {lease_ms} ms) in \
                     fleet mode: a node whose daemon died must be on its fallback limit (its static \
                     share) before its lease expires and the others take its share",
                    self.daemon.heartbeat_timeout_ms
                ),
            ));
        }
        if !(100..=60_000).contains(&f.timeout_ms) {
            errs.push(err(
                "fleet.timeout_ms",
                format!("{} is outside 100..=60000", f.timeout_ms),
            ));
        }
        // Keys that go together: the one left out is named.
        let pairs = [
            (
                ("username", f.username.is_some()),
                ("password_file", f.password_file.is_some()),
                "etcd authentication needs both username and password_file",
            ),
            (
                ("cert_file", f.cert_file.is_some()),
                ("key_file", f.key_file.is_some()),
                "a client certificate needs both cert_file and key_file",
            ),
        ];
        for ((a, has_a), (b, has_b), message) in pairs {
            if has_a != has_b {
                let missing = if has_a { b } else { a };
                errs.push(err(format!("fleet.{missing}"), message));
            }
        }
        // etcd's password authentication sends the password in the clear to every endpoint
        // (and a token on every request after), so it needs TLS.
        if f.password_file.is_some()
            && let Some(e) = f.endpoints.iter().find(|e| e.starts_with("http://"))
        {
            errs.push(err(
                "fleet.password_file",
                format!(
                    "an etcd password would cross the network in the clear to `{e}`; use https:// \
                     endpoints (with ca_file for a private CA)"
                ),
            ));
        }
        if (f.cert_file.is_some() || f.ca_file.is_some())
            && f.endpoints.iter().any(|e| e.starts_with("http://"))
        {
            errs.push(err(
                "fleet.endpoints",
                "TLS files are set but an endpoint is http://; use https:// endpoints",
            ));
        }
        for (i, s) in self.services.iter().enumerate() {
            if let Some(g) = s.global_limit
                && (g == 0 || g > LIMIT_CEILING)
            {
                errs.push(err(
                    format!("service[{i}] ({}).global_limit", s.name),
                    format!("{g} is outside 1..={LIMIT_CEILING}"),
                ));
            }
        }
    }

    fn validate_classes(&self, errs: &mut Vec<ConfigError>) {
        let mut seen: HashMap<Prefix, &str> = HashMap::new();
        let (mut v4, mut v6) = (0u32, 0u32);
        let mut floors = 0.0;
        for (id, class) in self.classes.by_id().into_iter().enumerate() {
            let name = CLASS_NAMES[id];
            let field = |f: &str| format!("classes.{name}.{f}");
            if id == 0 {
                if class.floor.is_some() {
                    errs.push(err(
                        field("floor"),
                        "critical is never shed by pressure, so it has no floor; bound it with `ceiling`",
                    ));
                }
                match class.ceiling {
                    Some(c) if c > 0.0 && c <= 1.0 => {}
                    Some(c) => {
                        errs.push(err(field("ceiling"), format!("{c} is outside (0, 1]")));
                    }
                    None => {
                        errs.push(err(
                            field("ceiling"),
                            "critical needs a finite ceiling (never shed by pressure is not unbounded: a flood marked critical must still stop somewhere)",
                        ));
                    }
                }
            } else {
                if let Some(f) = class.floor {
                    if !(0.0..=1.0).contains(&f) {
                        errs.push(err(field("floor"), format!("{f} is outside [0, 1]")));
                    }
                    floors += f;
                }
                if let Some(c) = class.ceiling
                    && !(c > 0.0 && c <= 1.0)
                {
                    errs.push(err(field("ceiling"), format!("{c} is outside (0, 1]")));
                }
                if let (Some(f), Some(c)) = (class.floor, class.ceiling)
                    && f > c
                {
                    errs.push(err(
                        field("floor"),
                        format!("floor {f} is above the class ceiling {c}"),
                    ));
                }
            }
            if class.source_prefix_v4 > 32 {
                errs.push(err(
                    field("source_prefix_v4"),
                    format!("{} is outside 0..=32", class.source_prefix_v4),
                ));
            }
            if class.source_prefix_v6 > 128 {
                errs.push(err(
                    field("source_prefix_v6"),
                    format!("{} is outside 0..=128", class.source_prefix_v6),
                ));
            }
            for (i, s) in class.sources.iter().enumerate() {
                let p = match Prefix::parse(s) {
                    Ok(p) => p,
                    Err(m) => {
                        errs.push(err(format!("{}[{i}]", field("sources")), m));
                        continue;
                    }
                };
                if let Some(other) = seen.insert(p, name) {
                    errs.push(err(
                        format!("{}[{i}]", field("sources")),
                        format!("{p} is already listed under classes.{other}"),
                    ));
                }
                if p.addr.is_ipv4() {
                    v4 += 1;
                } else {
                    v6 += 1;
                }
            }
        }
        if floors > 1.0 + 1e-9 {
            errs.push(err(
                "classes",
                format!("the floors add up to {floors:.2}, more than the whole limit"),
            ));
        }
        for (family, n) in [("IPv4", v4), ("IPv6", v6)] {
            if n > MAX_CLASS_RULES {
                errs.push(err(
                    "classes",
                    format!("{n} {family} source prefixes; the class map holds {MAX_CLASS_RULES}"),
                ));
            }
        }
    }

    fn validate_services(&self, errs: &mut Vec<ConfigError>) {
        if self.services.len() > MAX_SERVICES as usize {
            errs.push(err(
                "service",
                format!(
                    "{} services; the maps hold {MAX_SERVICES}",
                    self.services.len()
                ),
            ));
        }
        let mut names = HashSet::new();
        // (protocol, address or None for any, port) → service name: a TCP and a QUIC
        // service may share an address and port number (one is TCP's, the other UDP's).
        let mut bound: HashMap<(Protocol, Option<IpAddr>, u16), &str> = HashMap::new();
        // (protocol, port) → the first service bound to it on some address, and the one
        // bound on any address: an empty `addresses` covers every address, so the two
        // would claim the same attempts.
        let mut on_address: HashMap<(Protocol, u16), (&str, IpAddr)> = HashMap::new();
        let mut on_any: HashMap<(Protocol, u16), &str> = HashMap::new();
        let mut addr_entries = 0u32;
        for (i, s) in self.services.iter().enumerate() {
            let field = |f: &str| format!("service[{i}].{f}");
            if !valid_name(&s.name) {
                errs.push(err(
                    field("name"),
                    format!(
                        "`{}`: use 1 to 64 characters from [A-Za-z0-9._-] (it becomes a metric label)",
                        s.name
                    ),
                ));
            }
            let field = |f: &str| format!("service[{i}] ({}).{f}", s.name);
            if !names.insert(s.name.as_str()) {
                errs.push(err(field("name"), "another service has this name"));
            }
            if s.ports.is_empty() {
                errs.push(err(field("ports"), "at least one port is needed"));
            }
            for (j, &port) in s.ports.iter().enumerate() {
                if port == 0 {
                    errs.push(err(
                        format!("{}[{j}]", field("ports")),
                        "port 0 is not a port",
                    ));
                    continue;
                }
                let targets: Vec<Option<IpAddr>> = if s.addresses.is_empty() {
                    vec![None]
                } else {
                    s.addresses.iter().copied().map(Some).collect()
                };
                for t in targets {
                    if let Some(other) = bound.insert((s.protocol, t, port), &s.name) {
                        let at = t.map_or("any address".to_string(), |a| a.to_string());
                        errs.push(err(
                            format!("{}[{j}]", field("ports")),
                            format!(
                                "{} port {port} on {at} is already protected by service `{other}`",
                                s.protocol.transport()
                            ),
                        ));
                    }
                    let overlap = match t {
                        Some(a) => {
                            on_address.entry((s.protocol, port)).or_insert((&s.name, a));
                            on_any
                                .get(&(s.protocol, port))
                                .map(|any| (*any, s.name.as_str(), a))
                        }
                        None => {
                            on_any.entry((s.protocol, port)).or_insert(&s.name);
                            on_address
                                .get(&(s.protocol, port))
                                .map(|&(bound, a)| (s.name.as_str(), bound, a))
                        }
                    };
                    if let Some((any, bound, a)) = overlap
                        && any != bound
                    {
                        errs.push(err(
                            format!("{}[{j}]", field("ports")),
                            format!(
                                "{transport} port {port} is protected on any address by service \
                                 `{any}` and on {a} by service `{bound}`: an empty `addresses` \
                                 covers every address, so both would claim the same attempts; \
                                 give `{any}` its addresses, or make them one service",
                                transport = s.protocol.transport()
                            ),
                        ));
                    }
                    if t.is_some() {
                        addr_entries += 1;
                    }
                }
            }
            if let Some(ms) = s.active_window_ms {
                if s.protocol != Protocol::Quic {
                    errs.push(err(
                        field("active_window_ms"),
                        "only a QUIC service (protocol = \"quic\") has an active window",
                    ));
                }
                if !(100..=MAX_ACTIVE_WINDOW_MS).contains(&ms) {
                    errs.push(err(
                        field("active_window_ms"),
                        format!("{ms} is outside 100..={MAX_ACTIVE_WINDOW_MS}"),
                    ));
                }
            }
            if s.min_limit == 0 {
                errs.push(err(
                    field("min_limit"),
                    "must be at least 1, so some traffic always flows and the controller can learn",
                ));
            }
            if s.max_limit > LIMIT_CEILING {
                errs.push(err(
                    field("max_limit"),
                    format!("{} is above the supported {LIMIT_CEILING}", s.max_limit),
                ));
            }
            if s.max_limit < s.min_limit {
                errs.push(err(
                    field("max_limit"),
                    format!("{} is below min_limit ({})", s.max_limit, s.min_limit),
                ));
            }
            if s.max_connections > shedder_common::DEFAULT_TRACKED_SOCKETS {
                errs.push(err(
                    field("max_connections"),
                    format!(
                        "{} is above the {} connections the node tracks",
                        s.max_connections,
                        shedder_common::DEFAULT_TRACKED_SOCKETS
                    ),
                ));
            }
            if s.max_connections < s.max_limit.min(shedder_common::DEFAULT_TRACKED_SOCKETS) {
                errs.push(err(
                    field("max_connections"),
                    format!(
                        "{} is below max_limit ({}): every request in service holds a \
                         connection, so the ceiling on connections must be at least the limit \
                         on work",
                        s.max_connections, s.max_limit
                    ),
                ));
            }
            if s.recall_per_second > MAX_RECALL_PER_SECOND {
                errs.push(err(
                    field("recall_per_second"),
                    format!(
                        "{} is above the supported {MAX_RECALL_PER_SECOND} (0 turns recall off)",
                        s.recall_per_second
                    ),
                ));
            }
            // Against bounds that contradict each other, these would only repeat that.
            let bounds_ok = s.min_limit >= 1 && s.min_limit <= s.max_limit;
            if bounds_ok && (s.fallback_limit < s.min_limit || s.fallback_limit > s.max_limit) {
                errs.push(err(
                    field("fallback_limit"),
                    format!(
                        "{} is outside [min_limit, max_limit] = [{}, {}]",
                        s.fallback_limit, s.min_limit, s.max_limit
                    ),
                ));
            }
            if let Some(f) = s.fixed_limit
                && bounds_ok
                && (f < s.min_limit || f > s.max_limit)
            {
                errs.push(err(
                    field("fixed_limit"),
                    format!(
                        "{f} is outside [min_limit, max_limit] = [{}, {}]",
                        s.min_limit, s.max_limit
                    ),
                ));
            }
            if let Some(r) = s.target_rps
                && !(r > 0.0 && r.is_finite())
            {
                errs.push(err(
                    field("target_rps"),
                    format!("{r} must be a positive number"),
                ));
            }
            if s.target_latency_ms == 0 || s.target_latency_ms > 600_000 {
                errs.push(err(
                    field("target_latency_ms"),
                    format!("{} is outside 1..=600000", s.target_latency_ms),
                ));
            }
            if let Some(cg) = &s.cgroup
                && (cg.is_empty() || cg.split('/').any(|c| c == ".."))
            {
                errs.push(err(
                    field("cgroup"),
                    format!("`{cg}` must be a path relative to the cgroup v2 mount, without `..`"),
                ));
            }
            if s.retry_window_ms > MAX_RETRY_WINDOW_MS {
                errs.push(err(
                    field("retry_window_ms"),
                    format!(
                        "{} is outside 0..={MAX_RETRY_WINDOW_MS} (0 disables retry recognition)",
                        s.retry_window_ms
                    ),
                ));
            }
            if s.retry_window_ms == 0 && s.demote_retries == Some(true) {
                errs.push(err(
                    field("demote_retries"),
                    "true has no effect with retry_window_ms = 0 (no attempt is recognised as a retry); \
                     give retry_window_ms a window or remove demote_retries",
                ));
            }
            if !(0.0..=1.0).contains(&s.retry_budget) {
                errs.push(err(
                    field("retry_budget"),
                    format!(
                        "{} is outside [0, 1] (a fraction of first attempts; 0 turns the budget off)",
                        s.retry_budget
                    ),
                ));
            }
            if !(s.unproven_share > 0.0 && s.unproven_share <= 1.0) {
                errs.push(err(
                    field("unproven_share"),
                    format!(
                        "{} is outside (0, 1] (a part of each class's share; attempts from sources \
                         without standing need some of it to become clients)",
                        s.unproven_share
                    ),
                ));
            }
            for (class, rate) in &s.rate {
                let f = format!("{}.{class}", field("rate"));
                if !CLASS_NAMES.contains(&class.as_str()) {
                    errs.push(err(f, format!("unknown class; use one of {CLASS_NAMES:?}")));
                    continue;
                }
                if shedder_common::gcra::BucketParams::new(rate.per_second, rate.burst).is_none() {
                    errs.push(err(
                        f,
                        format!(
                            "per_second must be 1..=1e9 and burst at least 1 (got {} and {})",
                            rate.per_second, rate.burst
                        ),
                    ));
                }
            }
        }
        if addr_entries > MAX_ADDR_SERVICES {
            errs.push(err(
                "service",
                format!(
                    "{addr_entries} (address, port) pairs; the address map holds {MAX_ADDR_SERVICES}"
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::fixtures::*, *};

    #[test]
    fn retry_settings() {
        let svc = |extra: &str| {
            Config::parse(&format!(
                "{IFACE}syn_retransmit_window_ms = 0\n[[service]]\nname = \"a\"\nports = [80]\n{extra}"
            ))
            .unwrap()
        };
        let c = svc("retry_window_ms = 5000\ndemote_retries = false\n");
        assert_eq!(
            c.daemon.syn_retransmit_window_ms, 0,
            "0 disables, and is valid"
        );
        assert_eq!(c.services[0].retry_window_ms, 5000);
        assert!(!c.services[0].demotes_retries());
        // Retry recognition off: nothing is a retry, so nothing is demoted.
        let c = svc("retry_window_ms = 0\n");
        assert!(!c.services[0].demotes_retries());
        let c = svc("retry_window_ms = 0\ndemote_retries = false\n");
        assert!(!c.services[0].demotes_retries());
        // The bounds themselves are accepted.
        let c = Config::parse(&format!(
            "{IFACE}syn_retransmit_window_ms = 600000\n\
             [[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 3600000\n",
        ))
        .unwrap();
        assert_eq!(c.services[0].retry_window_ms, MAX_RETRY_WINDOW_MS);
    }

    #[test]
    #[cfg(not(feature = "fleet"))]
    fn a_build_without_fleet_mode_refuses_fleet_settings() {
        let refusal = |text: &str| Config::parse(text).unwrap_err().to_string();
        let e = refusal(&format!("{IFACE}{FLEET}{SHARED}"));
        assert!(
            e.starts_with("line 3, column 1: fleet: this build has no fleet mode"),
            "{e}"
        );
        assert!(
            e.contains(
                "\nline 10, column 16: service[0] (db).global_limit: this build has no fleet mode"
            ),
            "{e}"
        );
        // A global_limit alone says the same, not "needs a [fleet] section".
        let e = refusal(&format!("{IFACE}{SHARED}"));
        assert!(
            e.starts_with(
                "line 6, column 16: service[0] (db).global_limit: this build has no fleet mode"
            ),
            "{e}"
        );
        // Without either, nothing changes.
        Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"db\"\nports = [5432]\n"
        ))
        .unwrap();
    }

    #[test]
    #[cfg(feature = "fleet")]
    fn bad_fleet_settings_name_the_field() {
        let cases: &[(String, &str)] = &[
            (
                SHARED.to_string(),
                "line 4, column 16: service[0] (db).global_limit: needs a [fleet] section (the etcd cluster the fleet shares it through)",
            ),
            (
                format!("{FLEET}lease_ttl_s = 4\nfail_static_ms = 3000\n"),
                "line 6, column 18: fleet.fail_static_ms: 3000 must be at least tick_ms (200) and below the etcd lease (lease_ttl_s less 1 s: 3000 ms): a partitioned node must let go of its share before its lease expires",
            ),
            (
                format!("[daemon]\nheartbeat_timeout_ms = 3000\n{FLEET}lease_ttl_s = 4\n"),
                "line 2, column 24: daemon.heartbeat_timeout_ms: 3000 must be below the etcd lease (fleet.lease_ttl_s less 1 s: 3000 ms) in fleet mode: a node whose daemon died must be on its fallback limit (its static share) before its lease expires and the others take its share",
            ),
            (
                "[fleet]\nendpoints = []\nmax_nodes = 3\n".to_string(),
                "line 2, column 13: fleet.endpoints: at least one etcd endpoint is needed",
            ),
            (
                "[fleet]\nendpoints = [\"198.18.0.21:2379\"]\nmax_nodes = 3\n".to_string(),
                "line 2, column 14: fleet.endpoints[0]: `198.18.0.21:2379` is not an etcd client URL (http://host:port or https://host:port)",
            ),
            (
                format!("{FLEET}safety = 1.5\n"),
                "line 5, column 10: fleet.safety: 1.5 is outside (0, 1]",
            ),
            (
                format!(
                    "{FLEET}username = \"shedder\"\npassword_file = \"/etc/shedder/etcd.pw\"\n"
                ),
                "line 6, column 17: fleet.password_file: an etcd password would cross the network in the clear to `http://198.18.0.21:2379`; use https:// endpoints (with ca_file for a private CA)",
            ),
            (
                format!("{FLEET}username = \"shedder\"\n"),
                "line 1, column 1: fleet.password_file: etcd authentication needs both username and password_file",
            ),
            (
                format!("{FLEET}password_file = \"/etc/shedder/etcd.pw\"\n"),
                "line 1, column 1: fleet.username: etcd authentication needs both username and password_file",
            ),
            (
                format!("{FLEET}key_file = \"/etc/shedder/etcd.key\"\n"),
                "line 1, column 1: fleet.cert_file: a client certificate needs both cert_file and key_file",
            ),
            (
                format!("{FLEET}ca_file = \"/etc/ca.pem\"\n"),
                "line 2, column 13: fleet.endpoints: TLS files are set but an endpoint is http://; use https:// endpoints",
            ),
            (
                format!("{FLEET}prefix = \"shedder/\"\n"),
                "line 5, column 10: fleet.prefix: `shedder/` must start with `/`, not end with one, and hold no spaces",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\n".to_string(),
                "line 1, column 1: fleet.max_nodes: missing (this key has no default)",
            ),
            (
                format!("{FLEET}[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 0\n"),
                "line 8, column 16: service[0] (db).global_limit: 0 is outside 1..=16777216",
            ),
        ];
        for (toml, want) in cases {
            assert_eq!(&error_of(toml), want, "{toml}");
        }
    }

    /// A table of bad files and the exact message each gets: line and column, field, what is
    /// wrong.
    #[test]
    fn bad_files_name_the_line_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "[daemon]\ntick_ms = 5\n",
                "line 2, column 11: daemon.tick_ms: 5 is outside 10..=60000",
            ),
            (
                "[daemon]\ntick_ms = 200\nheartbeat_timeout_ms = 300\n",
                "line 3, column 24: daemon.heartbeat_timeout_ms: 300 must be at least twice tick_ms (200), or every late tick drops to the fallback limits",
            ),
            (
                "[classes]\ncritical = { floor = 0.1, ceiling = 0.05 }\n",
                "line 2, column 22: classes.critical.floor: critical is never shed by pressure, so it has no floor; bound it with `ceiling`",
            ),
            (
                "[classes]\ncritical = { sources = [] }\n",
                "line 2, column 12: classes.critical.ceiling: critical needs a finite ceiling (never shed by pressure is not unbounded: a flood marked critical must still stop somewhere)",
            ),
            (
                "[classes]\nhigh = { floor = 1.5 }\n",
                "line 2, column 18: classes.high.floor: 1.5 is outside [0, 1]",
            ),
            (
                "[classes]\nhigh = { floor = 0.7 }\nmedium = { floor = 0.5 }\n",
                "line 1, column 1: classes: the floors add up to 1.20, more than the whole limit",
            ),
            (
                "[classes]\nhigh = { sources = [\"198.18.20.1/24\"] }\n",
                "line 2, column 21: classes.high.sources[0]: `198.18.20.1/24` has host bits set (did you mean 198.18.20.0/24?)",
            ),
            (
                "[classes]\nhigh = { sources = [\"198.18.20.0/33\"] }\n",
                "line 2, column 21: classes.high.sources[0]: `198.18.20.0/33`: prefix length must be 0..=32",
            ),
            (
                "[classes]\nhigh = { sources = [\"10.0.0.0/8\"] }\nsheddable = { sources = [\"10.0.0.0/8\"] }\n",
                "line 3, column 26: classes.sheddable.sources[0]: 10.0.0.0/8 is already listed under classes.high",
            ),
            (
                "[[service]]\nname = \"a b\"\nports = [1]\n",
                "line 2, column 8: service[0].name: `a b`: use 1 to 64 characters from [A-Za-z0-9._-] (it becomes a metric label)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = []\n",
                "line 3, column 9: service[0] (a).ports: at least one port is needed",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [80]\n",
                "line 6, column 10: service[1] (b).ports[0]: TCP port 80 on any address is already protected by service `a`",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmin_limit = 10\nmax_limit = 5\n",
                "line 5, column 13: service[0] (a).max_limit: 5 is below min_limit (10)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmax_limit = 100\nfallback_limit = 500\n",
                "line 5, column 18: service[0] (a).fallback_limit: 500 is outside [min_limit, max_limit] = [8, 100]",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmin_limit = 0\n",
                "line 4, column 13: service[0] (a).min_limit: must be at least 1, so some traffic always flows and the controller can learn",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nrate = { vip = { per_second = 1, burst = 1 } }\n",
                "line 4, column 16: service[0] (a).rate.vip: unknown class; use one of [\"critical\", \"high\", \"medium\", \"sheddable\"]",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nrate = { high = { per_second = 0, burst = 1 } }\n",
                "line 4, column 17: service[0] (a).rate.high: per_second must be 1..=1e9 and burst at least 1 (got 0 and 1)",
            ),
            (
                "[daemon]\nsyn_retransmit_window_ms = 600001\n",
                "line 2, column 28: daemon.syn_retransmit_window_ms: 600001 is outside 0..=600000 (0 disables retransmit recognition)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 3600001\n",
                "line 4, column 19: service[0] (a).retry_window_ms: 3600001 is outside 0..=3600000 (0 disables retry recognition)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\ndemote_retries = true\nretry_window_ms = 0\n",
                "line 4, column 18: service[0] (a).demote_retries: true has no effect with retry_window_ms = 0 (no attempt is recognised as a retry); give retry_window_ms a window or remove demote_retries",
            ),
        ];
        for (toml, expected) in cases {
            let got = error_of(toml);
            assert_eq!(&got, expected, "for\n{toml}");
        }
    }

    /// A file that attaches to nothing sheds nothing: it must say that it means it.
    #[test]
    fn no_interface_needs_measure_only() {
        const SVC: &str = "[[service]]\nname = \"a\"\nports = [80]\n";
        let cases: &[(String, &str)] = &[
            (
                SVC.into(),
                "daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\ntick_ms = 100\ninterfaces = []\n{SVC}"),
                "line 3, column 14: daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\nmeasure_only = false\n{SVC}"),
                "line 1, column 1: daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\ninterfaces = [\"eth0\"]\nmeasure_only = true\n{SVC}"),
                "line 3, column 16: daemon.measure_only: true attaches to no interface, but daemon.interfaces lists [\"eth0\"]; remove measure_only to shed on them, or the interfaces to measure only",
            ),
            (
                format!("[daemon]\nmeasure_only = \"yes\"\n{SVC}"),
                "line 2, column 16: daemon.measure_only: invalid type: string \"yes\", expected a boolean",
            ),
            (
                // A more specific mistake is reported first.
                "[daemon]\ntick_ms = 5\n".into(),
                "line 2, column 11: daemon.tick_ms: 5 is outside 10..=60000",
            ),
        ];
        for (toml, expected) in cases {
            assert_eq!(&error_of(toml), expected, "for\n{toml}");
        }
        let c = Config::parse(&format!("[daemon]\nmeasure_only = true\n{SVC}")).unwrap();
        assert!(c.daemon.measure_only && c.daemon.interfaces.is_empty());
        let c = Config::parse(&format!("[daemon]\ninterfaces = [\"eth0\"]\n{SVC}")).unwrap();
        assert!(!c.daemon.measure_only, "shedding is the default");
        // Without services too: a daemon that only serves its status.
        assert!(Config::parse("[daemon]\nmeasure_only = true\n").is_ok());
        assert!(Config::parse("").is_err());
    }

    #[test]
    fn tunnels_to_decapsulate() {
        let c = Config::parse(&format!(
            "{IFACE}[daemon.decapsulate]\nipip = true\ngre = true\nvxlan_ports = [4789]\n\
             gue_ports = [6080]\nfou_ports = [5555]\n"
        ))
        .expect("every kind");
        assert_eq!(c.daemon.decapsulate.entries().len(), 6);
        // A TCP service may use the number of a tunnel's UDP port.
        let tcp = "[[service]]\nname = \"web\"\nports = [4789]\n";
        Config::parse(&format!(
            "{IFACE}[daemon.decapsulate]\nvxlan_ports = [4789]\n{tcp}"
        ))
        .expect("TCP 4789 beside VXLAN on UDP 4789");
        for (text, refusal) in [
            (
                "vxlan_ports = [0]",
                "line 8, column 16: daemon.decapsulate.vxlan_ports[0]: port 0 is not a port",
            ),
            (
                "vxlan_ports = [4789]\nfou_ports = [5555, 4789]",
                "line 9, column 20: daemon.decapsulate.fou_ports[1]: 4789 is listed twice (also in vxlan_ports): a UDP port carries one kind of tunnel",
            ),
            (
                "gue_ports = [443]",
                "line 8, column 14: daemon.decapsulate.gue_ports[0]: UDP port 443 is a port of QUIC service `h3`: a datagram to it would be both a tunnel's and a connection attempt",
            ),
            (
                "vxlan_ports = [70000]",
                "line 8, column 16: daemon.decapsulate.vxlan_ports[0]: invalid value: integer `70000`, expected an integer in 0..=65535",
            ),
            (
                "gre = \"yes\"",
                "line 8, column 7: daemon.decapsulate.gre: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "geneve_ports = [6081]",
                "line 8, column 1: daemon.decapsulate.geneve_ports: unknown key, expected one of `ipip`, `gre`, `vxlan_ports`, `gue_ports`, `fou_ports`",
            ),
        ] {
            let quic = "[[service]]\nname = \"h3\"\nprotocol = \"quic\"\nports = [443]\n";
            let e = Config::parse(&format!("{quic}{IFACE}[daemon.decapsulate]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.ends_with(refusal), "{text}:\n  {e}\n  expected {refusal}");
        }
        let many: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        let e = Config::parse(&format!(
            "{IFACE}[daemon.decapsulate]\nvxlan_ports = [{}]\n",
            many.join(", ")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.ends_with("daemon.decapsulate.vxlan_ports: 65 ports; at most 64"),
            "{e}"
        );
    }

    #[test]
    fn address_bound_services_may_share_a_port() {
        let c = Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"a\"\nports = [80]\naddresses = [\"198.18.0.2\"]\n\
             [[service]]\nname = \"b\"\nports = [80]\naddresses = [\"198.18.0.3\"]\n\
             [[service]]\nname = \"q\"\nprotocol = \"quic\"\nports = [80]\n",
        ));
        assert!(c.is_ok(), "{c:?}");
    }

    /// docs/configuration.md: an empty `addresses` covers every address, so a service on
    /// any address and one on an address may not share a port, in either order.
    #[test]
    fn a_wildcard_service_and_an_address_bound_one_may_not_share_a_port() {
        let bound = "[[service]]\nname = \"a\"\nports = [80, 81]\naddresses = [\"198.18.0.2\"]\n";
        let any = "[[service]]\nname = \"c\"\nports = [81]\n";
        let e = error_of(&format!("{IFACE}{bound}{any}"));
        assert!(
            e.ends_with(
                "service[1] (c).ports[0]: TCP port 81 is protected on any address by service `c` \
                 and on 198.18.0.2 by service `a`: an empty `addresses` covers every address, so \
                 both would claim the same attempts; give `c` its addresses, or make them one \
                 service"
            ),
            "{e}"
        );
        let e = error_of(&format!("{IFACE}{any}{bound}"));
        assert!(
            e.ends_with(
                "service[1] (a).ports[1]: TCP port 81 is protected on any address by service `c` \
                 and on 198.18.0.2 by service `a`: an empty `addresses` covers every address, so \
                 both would claim the same attempts; give `c` its addresses, or make them one \
                 service"
            ),
            "{e}"
        );
    }

    /// A file with several mistakes hears of all of them in one run, each placed.
    #[test]
    fn every_problem_of_a_file_is_reported() {
        let e = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\ntick_ms = 5\n\
             [[service]]\nname = \"a\"\nports = [0]\n\
             [[service]]\nname = \"b\"\nports = [81]\nmin_limit = 50\nmax_limit = 10\n",
        )
        .unwrap_err();
        let all: Vec<String> = e.each().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            all,
            [
                "line 3, column 11: daemon.tick_ms: 5 is outside 10..=60000",
                "line 6, column 10: service[0] (a).ports[0]: port 0 is not a port",
                "line 11, column 13: service[1] (b).max_limit: 10 is below min_limit (50)",
            ],
            "{e}"
        );
        // The whole text names them one a line, in that order.
        assert_eq!(e.to_string(), all.join("\n"));
    }

    #[test]
    fn a_quic_service_may_share_a_port_number_with_a_tcp_one_but_not_with_a_quic_one() {
        let tcp = "[[service]]\nname = \"web\"\nports = [443]\n";
        let quic = "[[service]]\nname = \"h3\"\nprotocol = \"quic\"\nports = [443]\n";
        let c = Config::parse(&format!("{IFACE}{tcp}{quic}")).expect("TCP and UDP 443");
        assert_eq!(c.services[1].protocol, Protocol::Quic);
        assert_eq!(c.services[0].protocol, Protocol::Tcp);
        let e = Config::parse(&format!(
            "{IFACE}{quic}[[service]]\nname = \"h3b\"\nprotocol = \"quic\"\nports = [443]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.ends_with("service[1] (h3b).ports[0]: UDP port 443 on any address is already protected by service `h3`"),
            "{e}"
        );
        let e = Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"a\"\nprotocol = \"sctp\"\nports = [1]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown value"), "{e}");
        let e = Config::parse(&format!("{IFACE}{tcp}active_window_ms = 5000\n"))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("service[0] (web).active_window_ms: only a QUIC service (protocol = \"quic\") has an active window"), "{e}");
        let e = Config::parse(&format!("{IFACE}{quic}active_window_ms = 60000\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("service[0] (h3).active_window_ms: 60000 is outside 100..=8000"),
            "{e}"
        );
        let c = Config::parse(&format!("{IFACE}{quic}active_window_ms = 5000\n")).expect("5 s");
        assert_eq!(c.services[0].active_window_ms(), 5_000);
        // `refuse` names the explicit refusal of either protocol.
        let c = Config::parse(&format!("{IFACE}{quic}action = \"refuse\"\n")).expect("refuse");
        assert_eq!(c.services[0].action, crate::config::Action::Rst);
    }
}
