//! The standard policy the fixture table and the namespace tests install.
//!
//! | service | port | action | mode | notes |
//! |---|---|---|---|---|
//! | 0 | 8080 | drop | enforce | |
//! | 1 | 8443 | rst | enforce | |
//! | 2 | 9090 | drop | dry-run | |
//! | 3 | 7000 | rst | enforce | only for destination 198.18.0.2 / 2001:db8::2 |
//! | 4 | UDP 8080 | drop | enforce | QUIC |
//! | 5 | UDP 4433 | rst (Version Negotiation) | enforce | QUIC |
//!
//! Sources: 198.18.10.0/24 and 2001:db8:10::/48 are CRITICAL, 198.18.20.0/24 and
//! 2001:db8:20::/48 HIGH, 198.18.99.0/24 and 2001:db8:99::/48 SHEDDABLE, 198.18.10.128/25
//! SHEDDABLE (a longer prefix inside the critical /24); everything else takes the
//! service default, MEDIUM.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use shedder::{
    config::{Prefix, Protocol},
    kernel::Shedder,
};
use shedder_common::{
    ACTION_DROP, ACTION_RST, CLASS_CRITICAL, CLASS_HIGH, CLASS_MEDIUM, CLASS_SHEDDABLE,
    ClassPolicy, Globals, MODE_DRY_RUN, MODE_ENFORCE, POLICY_CONFIGURED, ServicePolicy,
};

pub const SVC_DROP: u32 = 0;
pub const SVC_RST: u32 = 1;
pub const SVC_DRY: u32 = 2;
pub const SVC_ADDR: u32 = 3;
/// QUIC on UDP 8080 (the same number as the TCP drop service's port), dropping.
pub const SVC_QUIC_DROP: u32 = 4;
/// QUIC on UDP 4433, refusing with Version Negotiation.
pub const SVC_QUIC_VN: u32 = 5;
pub const PORT_DROP: u16 = 8080;
pub const PORT_RST: u16 = 8443;
pub const PORT_DRY: u16 = 9090;
pub const PORT_ADDR: u16 = 7000;
pub const PORT_QUIC_DROP: u16 = 8080;
pub const PORT_QUIC_VN: u16 = 4433;
/// A port no service protects.
pub const PORT_OPEN: u16 = 5000;

pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
/// A source in no class prefix (service default: MEDIUM).
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
pub const CRITICAL_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 1);
pub const HIGH_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 1);
pub const SHEDDABLE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 99, 1);
/// Inside the critical /24 but matched by the longer sheddable /25.
pub const NESTED_SHEDDABLE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 200);
pub const CRITICAL_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 1);
pub const HIGH_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 1);
pub const SHEDDABLE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 1);

/// Ceiling of CRITICAL in the open policy.
pub const CRITICAL_CEILING: u32 = 50;
/// Limits of the open policy: nothing close to being reached.
pub const OPEN_LIMIT: u32 = 1000;

/// A policy that admits everything short of CRITICAL's ceiling.
pub fn open_policy(action: u8, mode: u8) -> ServicePolicy {
    let open = ClassPolicy {
        limit: OPEN_LIMIT,
        fallback_limit: OPEN_LIMIT,
        floor: 0,
        fallback_floor: 0,
        ceiling: OPEN_LIMIT,
        // Every address its own source.
        source_mask_v4: u32::MAX,
        source_mask_v6: [u32::MAX; 4],
        unproven_cap: OPEN_LIMIT,
        ..Default::default()
    };
    let mut classes = [open; 4];
    classes[CLASS_CRITICAL as usize].ceiling = CRITICAL_CEILING;
    ServicePolicy {
        classes,
        total_limit: OPEN_LIMIT,
        fallback_total: OPEN_LIMIT,
        action,
        mode,
        default_class: CLASS_MEDIUM as u8,
        configured: POLICY_CONFIGURED,
        ..Default::default()
    }
}

/// A policy whose every non-critical class has limit 0 (CRITICAL keeps its ceiling).
pub fn closed_policy(action: u8, mode: u8) -> ServicePolicy {
    let mut p = open_policy(action, mode);
    for c in &mut p.classes[1..] {
        c.limit = 0;
        c.fallback_limit = 0;
    }
    p.total_limit = 0;
    p.fallback_total = 0;
    p
}

/// Install the standard services, class rules, open policies and a fresh heartbeat.
pub fn install_standard(s: &mut Shedder) {
    let services = [
        (SVC_DROP, PORT_DROP, ACTION_DROP, MODE_ENFORCE),
        (SVC_RST, PORT_RST, ACTION_RST, MODE_ENFORCE),
        (SVC_DRY, PORT_DRY, ACTION_DROP, MODE_DRY_RUN),
        (SVC_ADDR, PORT_ADDR, ACTION_RST, MODE_ENFORCE),
    ];
    for (id, port, action, mode) in services {
        s.set_policy(id, &open_policy(action, mode))
            .expect("policy");
        if id == SVC_ADDR {
            s.set_addr_service(IpAddr::V4(SERVER_V4), port, Protocol::Tcp, id)
                .expect("addr service v4");
            s.set_addr_service(IpAddr::V6(SERVER_V6), port, Protocol::Tcp, id)
                .expect("addr service v6");
        } else {
            s.set_port(port, Some(id)).expect("port");
        }
    }
    for (id, port, action) in [
        (SVC_QUIC_DROP, PORT_QUIC_DROP, ACTION_DROP),
        (SVC_QUIC_VN, PORT_QUIC_VN, ACTION_RST),
    ] {
        s.set_policy(id, &open_policy(action, MODE_ENFORCE))
            .expect("policy");
        s.set_quic_port(port, Some(id)).expect("quic port");
    }
    let rules: [(IpAddr, u32, u32); 7] = [
        (
            IpAddr::V4(Ipv4Addr::new(198, 18, 10, 0)),
            24,
            CLASS_CRITICAL,
        ),
        (
            IpAddr::V4(Ipv4Addr::new(198, 18, 10, 128)),
            25,
            CLASS_SHEDDABLE,
        ),
        (IpAddr::V4(Ipv4Addr::new(198, 18, 20, 0)), 24, CLASS_HIGH),
        (
            IpAddr::V4(Ipv4Addr::new(198, 18, 99, 0)),
            24,
            CLASS_SHEDDABLE,
        ),
        (
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 0)),
            48,
            CLASS_CRITICAL,
        ),
        (
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 0)),
            48,
            CLASS_HIGH,
        ),
        (
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 0)),
            48,
            CLASS_SHEDDABLE,
        ),
    ];
    let rules: Vec<(Prefix, u32)> = rules
        .into_iter()
        .map(|(addr, len, class)| (Prefix { addr, len }, class))
        .collect();
    s.replace_class_rules(&rules).expect("class rules");
    fresh_heartbeat(s);
}

/// Heartbeat now, timeout of 2^32 jiffies (weeks at any HZ): the adaptive limits are in force.
/// Retransmits are not recognised (a repeated SYN is a new attempt each time).
pub fn fresh_heartbeat(s: &mut Shedder) {
    retransmit_window(s, 0);
}

/// A retry or retransmit window no test outlives (2^32 - 1 jiffies: weeks at any HZ).
pub const LONG_WINDOW: u32 = u32::MAX;

/// A fresh heartbeat, as [`fresh_heartbeat`], and a SYN repeating an attempt within
/// `jiffies` of it recognised as a retransmit (0: never).
pub fn retransmit_window(s: &mut Shedder, jiffies: u64) {
    s.set_globals(&standard_globals(jiffies)).expect("globals");
    s.heartbeat().expect("heartbeat");
}

/// The globals of the standard policy with a retransmit window of `jiffies`: a heartbeat
/// timeout of 2^32 jiffies, attempts held the longest the packet path holds them (one to
/// two slots of 2^8 jiffies: a test's setup is long done before they lapse), standing
/// kept half a day or more, replies unbounded.
pub fn standard_globals(jiffies: u64) -> Globals {
    Globals {
        heartbeat_timeout_jiffies: 1 << 32,
        retransmit_window_jiffies: jiffies,
        hold_bits: shedder_common::MAX_HOLD_BITS,
        standing_window: u32::from(u16::MAX / 2),
        ..Default::default()
    }
}

/// Retry recognition for `p`: a new attempt from a source shed within `jiffies` is a retry
/// (0: never), decided one class lower when `demote`.
pub fn retries(p: &mut ServicePolicy, jiffies: u32, demote: bool) {
    p.retry_window_jiffies = jiffies;
    p.demote_retries = demote as u32;
}

/// A heartbeat from long ago with a one-jiffy timeout: the fallback limits are in force.
pub fn stale_heartbeat(s: &mut Shedder) {
    s.set_globals(&Globals {
        heartbeat_jiffies: 1,
        heartbeat_timeout_jiffies: 1,
        ..standard_globals(0)
    })
    .expect("globals");
}
